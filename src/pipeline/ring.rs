//! The lines of a streamed scene the tiler still needs: decoded and normalised as they arrive,
//! dropped once no window reads them.

use std::collections::VecDeque;

use crate::cube::{ByteOrder, DataType, Interleave, decode_scaled};
use crate::source::{LineSource, LineStatus, SourceError};

/// A window onto a [`LineSource`]: the lines still needed, up to those received, each
/// `bands x samples` (band-major), normalised as `(v - mean[b]) * inv_std[b]`; a missing line is
/// all NaN.
///
/// The tiler asks for lines up to the bottom of a tile row's windows ([`LineRing::fill_to`]) and
/// releases those above the next row's windows ([`LineRing::release_below`]), so a ring holds at
/// most one row of windows (`tile + 2 halo` lines) plus what a reflection at the scene's end reads.
pub struct LineRing<'a> {
    source: &'a mut dyn LineSource,
    bands: usize,
    samples: usize,
    data_type: DataType,
    interleave: Interleave,
    byte_order: ByteOrder,
    mean: Vec<f32>,
    inv_std: Vec<f32>,
    raw: Vec<u8>,
    /// Decoded lines `first ..`, kept with their buffers for reuse.
    lines: VecDeque<Vec<f32>>,
    /// When each held line arrived.
    arrived: VecDeque<std::time::Instant>,
    spare: Vec<Vec<f32>>,
    first: usize,
    ended: Option<usize>,
    /// Scratch for one BIP pixel.
    pixel: Vec<f32>,
}

impl std::fmt::Debug for LineRing<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LineRing")
            .field("scene", &self.source.info().id)
            .field("first", &self.first)
            .field("held", &self.lines.len())
            .field("ended", &self.ended)
            .finish()
    }
}

impl<'a> LineRing<'a> {
    /// A ring over `source`, normalising band `b` by `mean[b]` and `inv_std[b]`.
    pub fn new(source: &'a mut dyn LineSource, mean: &[f32], inv_std: &[f32]) -> Self {
        let info = source.info().clone();
        Self {
            bands: info.bands,
            samples: info.samples,
            data_type: info.data_type,
            interleave: info.interleave,
            byte_order: info.byte_order,
            mean: mean.to_vec(),
            inv_std: inv_std.to_vec(),
            raw: vec![0; info.line_bytes()],
            lines: VecDeque::new(),
            arrived: VecDeque::new(),
            spare: Vec::new(),
            first: 0,
            ended: None,
            pixel: vec![0.0; info.bands],
            source,
        }
    }

    /// Pixels per line.
    pub fn samples(&self) -> usize {
        self.samples
    }

    /// Bands per pixel.
    pub fn bands(&self) -> usize {
        self.bands
    }

    /// The lines received so far (the first not yet received).
    pub fn received(&self) -> usize {
        self.first + self.lines.len()
    }

    /// The scene's line count, once the source has said it ended.
    pub fn ended(&self) -> Option<usize> {
        self.ended
    }

    /// The source.
    pub fn source(&self) -> &dyn LineSource {
        &*self.source
    }

    /// Reads lines until `end` lines have been received or the scene has ended.
    pub fn fill_to(&mut self, end: usize) -> Result<(), SourceError> {
        while self.ended.is_none() && self.received() < end {
            match self.source.next_line(&mut self.raw)? {
                None => self.ended = Some(self.received()),
                Some(status) => {
                    let mut line = self.spare.pop().unwrap_or_default();
                    line.resize(self.bands * self.samples, 0.0);
                    match status {
                        LineStatus::Received => self.decode(&mut line),
                        LineStatus::Missing => line.fill(f32::NAN),
                    }
                    self.lines.push_back(line);
                    self.arrived.push_back(std::time::Instant::now());
                }
            }
        }
        Ok(())
    }

    /// When line `line` arrived, while the ring holds it.
    pub fn arrived(&self, line: usize) -> Option<std::time::Instant> {
        self.arrived.get(line.checked_sub(self.first)?).copied()
    }

    /// Drops the lines above `line`: no window reads them any more.
    pub fn release_below(&mut self, line: usize) {
        while self.first < line && !self.lines.is_empty() {
            if let Some(l) = self.lines.pop_front() {
                self.spare.push(l);
            }
            self.arrived.pop_front();
            self.first += 1;
        }
    }

    fn decode(&mut self, out: &mut [f32]) {
        let (s, b, size) = (self.samples, self.bands, self.data_type.size());
        match self.interleave {
            Interleave::Bip => {
                for x in 0..s {
                    let bytes = &self.raw[x * b * size..(x + 1) * b * size];
                    decode_scaled(bytes, self.data_type, self.byte_order, 0.0, 1.0, &mut self.pixel);
                    for (band, &v) in self.pixel.iter().enumerate() {
                        out[band * s + x] = (v - self.mean[band]) * self.inv_std[band];
                    }
                }
            }
            // A source sends BIL or BIP (`SceneInfo::validate`); BSQ files arrive as BIL.
            Interleave::Bil | Interleave::Bsq => {
                for band in 0..b {
                    decode_scaled(
                        &self.raw[band * s * size..(band + 1) * s * size],
                        self.data_type,
                        self.byte_order,
                        self.mean[band],
                        self.inv_std[band],
                        &mut out[band * s..(band + 1) * s],
                    );
                }
            }
        }
    }

    /// Writes into `out` the window of scene lines `lines` and samples `cols` (`bands x
    /// lines.len() x cols.len()`), as `tile::fill_window` does from a mapped file.
    ///
    /// A line outside the ring is one no written pixel reads (the far side of a reflection in a
    /// last, short tile row): the nearest line held stands in for it.
    pub fn fill_window(&self, lines: &[usize], cols: &[usize], out: &mut [f32]) {
        let (s, w, h) = (self.samples, cols.len(), lines.len());
        debug_assert_eq!(out.len(), self.bands * h * w);
        let last = self.lines.len().saturating_sub(1);
        let rows: Vec<&[f32]> = lines
            .iter()
            .map(|&y| self.lines[y.saturating_sub(self.first).min(last)].as_slice())
            .collect();
        for (band, out_band) in out.chunks_exact_mut(h * w).enumerate() {
            for (row, o) in rows.iter().zip(out_band.chunks_exact_mut(w)) {
                let src = &row[band * s..(band + 1) * s];
                for (v, &x) in o.iter_mut().zip(cols) {
                    *v = src[x];
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cube::{Cube, Header};
    use crate::source::FileSource;
    use crate::tile::{TileGrid, fill_window};

    fn cube(dir: &std::path::Path, il: Interleave) -> Cube {
        let (lines, samples, bands) = (13usize, 7usize, 3usize);
        let v = |l: usize, b: usize, s: usize| (l * 31 + b * 7 + s * 3) as i16 - 50;
        let mut bytes = Vec::new();
        let mut push = |l, b, s| bytes.extend(v(l, b, s).to_le_bytes());
        match il {
            Interleave::Bil => {
                (0..lines).for_each(|l| (0..bands).for_each(|b| (0..samples).for_each(|s| push(l, b, s))))
            }
            Interleave::Bsq => {
                (0..bands).for_each(|b| (0..lines).for_each(|l| (0..samples).for_each(|s| push(l, b, s))))
            }
            Interleave::Bip => {
                (0..lines).for_each(|l| (0..samples).for_each(|s| (0..bands).for_each(|b| push(l, b, s))))
            }
        }
        let h = Header::new(samples, lines, bands, DataType::I16, il);
        let hdr = dir.join(format!("c{il:?}.hdr"));
        std::fs::write(&hdr, h.to_text()).unwrap();
        std::fs::write(hdr.with_extension("img"), bytes).unwrap();
        Cube::open(&hdr).unwrap()
    }

    #[test]
    fn windows_from_the_ring_equal_windows_from_the_mapped_file_for_every_written_pixel() {
        let dir = tempfile::tempdir().unwrap();
        let (mean, inv_std) = ([1.0f32, -2.0, 0.5], [0.5f32, 2.0, 0.25]);
        for il in [Interleave::Bil, Interleave::Bsq, Interleave::Bip] {
            let mapped = cube(dir.path(), il);
            let mut src = FileSource::new(cube(dir.path(), il), None).unwrap();
            let mut ring = LineRing::new(&mut src, &mean, &inv_std);
            let (tile, halo) = (4, 2);
            let mut g = TileGrid::streaming(7, tile, halo);
            let mut row = 0;
            loop {
                ring.fill_to((row + 1) * tile + halo).unwrap();
                if let Some(l) = ring.ended() {
                    g = g.with_lines(l);
                }
                if row * tile >= g.lines {
                    break;
                }
                let full = g.with_lines(13);
                let rect = full.rect(row, 0);
                for col in 0..g.cols {
                    let (ls, cs) = (g.window_lines(row), g.window_samples(col));
                    let mut got = vec![f32::NAN; 3 * ls.len() * cs.len()];
                    ring.fill_window(&ls, &cs, &mut got);
                    let (fl, fc) = (full.window_lines(row), full.window_samples(col));
                    let mut want = Vec::new();
                    fill_window(&mapped, &fl, &fc, &mean, &inv_std, &mut want);
                    // The rows any written pixel reads: halo above to halo below the tile's lines.
                    let (wh, ww) = (ls.len(), cs.len());
                    for b in 0..3 {
                        for dy in 0..rect.h + 2 * halo {
                            for dx in 0..ww {
                                let at = (b * wh + dy) * ww + dx;
                                assert_eq!(got[at], want[at], "{il:?} row {row} col {col} band {b} ({dy}, {dx})");
                            }
                        }
                    }
                }
                ring.release_below((row + 1) * tile - halo);
                assert!(
                    ring.lines.len() <= tile + 2 * halo,
                    "the ring holds {} lines",
                    ring.lines.len()
                );
                row += 1;
            }
            assert_eq!(row, 4);
        }
    }
}
