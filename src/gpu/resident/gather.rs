//! The host's part of the device-resident path: a tile's input window copied from the mapped
//! file as raw samples, in the file's own interleave and byte order (no decoding, no
//! normalisation), for the preprocessing kernel to turn into the model's input on the device.

use crate::cube::{Cube, Interleave};

/// Runs of consecutive source columns in `cols` as (first column, length): the interior of a
/// window is one run, each reflected border column a run of one.
pub fn runs(cols: &[usize]) -> Vec<(usize, usize)> {
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for &x in cols {
        match runs.last_mut() {
            Some((start, len)) if *start + *len == x => *len += 1,
            _ => runs.push((x, 1)),
        }
    }
    runs
}

/// Bytes of one raw window of `lines x cols` of `cube`.
pub fn window_bytes(cube: &Cube, lines: usize, cols: usize) -> usize {
    lines * cols * cube.bands() * cube.header().data_type.size()
}

/// Copies into `out` (exactly [`window_bytes`] long) the raw samples of the window whose rows are
/// scene lines `lines` and whose columns are the runs `runs` ([`runs`]), as a tile of
/// `lines.len() x width x bands` in the file's interleave: BSQ (band, line, sample), BIL (line,
/// band, sample) or BIP (line, sample, band). The indices are the caller's invariants (the tile
/// grid derives them from this cube's header).
pub fn raw_window(cube: &Cube, lines: &[usize], runs: &[(usize, usize)], out: &mut [u8]) {
    let h = cube.header();
    let (s, b, l) = (h.samples, h.bands, h.lines);
    let size = h.data_type.size();
    let data = cube.data_bytes();
    let mut o = 0;
    let mut copy = |from: usize, n: usize| {
        out[o..o + n].copy_from_slice(&data[from..from + n]);
        o += n;
    };
    match h.interleave {
        Interleave::Bil | Interleave::Bsq => {
            let row = |y: usize, band: usize| match h.interleave {
                Interleave::Bil => (y * b + band) * s,
                _ => (band * l + y) * s,
            };
            let bands_outer = h.interleave == Interleave::Bsq;
            let (outer, inner) = if bands_outer {
                (b, lines.len())
            } else {
                (lines.len(), b)
            };
            for i in 0..outer {
                for j in 0..inner {
                    let (y, band) = if bands_outer { (lines[j], i) } else { (lines[i], j) };
                    let start = row(y, band);
                    for &(x, len) in runs {
                        copy((start + x) * size, len * size);
                    }
                }
            }
        }
        Interleave::Bip => {
            for &y in lines {
                for &(x, len) in runs {
                    copy((y * s + x) * b * size, len * b * size);
                }
            }
        }
    }
    debug_assert_eq!(o, out.len());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cube::{ByteOrder, DataType, Header};
    use crate::gpu::reference;
    use crate::tile::{TileGrid, fill_window};

    /// A 9 x 7 x 3 (lines, samples, bands) cube of int16 in `interleave` and `order`.
    fn cube(dir: &std::path::Path, interleave: Interleave, order: ByteOrder) -> Cube {
        let (s, l, b) = (7usize, 9usize, 3usize);
        let mut h = Header::new(s, l, b, DataType::I16, interleave);
        h.byte_order = order;
        let value = |y: usize, x: usize, k: usize| (y * 100 + x * 10 + k) as i16 - 300;
        let mut bytes = Vec::new();
        for a in 0..l * s * b {
            let (y, k, x) = match interleave {
                Interleave::Bsq => ((a / s) % l, a / (s * l), a % s),
                Interleave::Bil => (a / (s * b), (a / s) % b, a % s),
                Interleave::Bip => (a / (s * b), a % b, (a / b) % s),
            };
            let v = value(y, x, k);
            bytes.extend(match order {
                ByteOrder::Little => v.to_le_bytes(),
                ByteOrder::Big => v.to_be_bytes(),
            });
        }
        let name = format!("{interleave:?}_{order:?}");
        std::fs::write(dir.join(format!("{name}.hdr")), h.to_text()).unwrap();
        std::fs::write(dir.join(format!("{name}.img")), bytes).unwrap();
        Cube::open(&dir.join(format!("{name}.hdr"))).unwrap()
    }

    #[test]
    fn a_raw_window_preprocessed_is_the_host_window() {
        let dir = tempfile::tempdir().unwrap();
        let mean = [1.5f32, -2.0, 40.0];
        let inv_std = [0.5f32, 0.25, 2.0];
        for il in [Interleave::Bsq, Interleave::Bil, Interleave::Bip] {
            for order in [ByteOrder::Little, ByteOrder::Big] {
                let c = cube(dir.path(), il, order);
                // Tiles of 4 with a halo of 2: every window reflects at some border.
                let grid = TileGrid::new(c.lines(), c.samples(), 4, 2);
                for row in 0..grid.rows {
                    for col in 0..grid.cols {
                        let (lines, cols) = (grid.window_lines(row), grid.window_samples(col));
                        let mut want = Vec::new();
                        fill_window(&c, &lines, &cols, &mean, &inv_std, &mut want);
                        let mut raw = vec![0u8; window_bytes(&c, lines.len(), cols.len())];
                        raw_window(&c, &lines, &runs(&cols), &mut raw);
                        let values: Vec<i16> = raw
                            .chunks_exact(2)
                            .map(|v| match order {
                                ByteOrder::Little => i16::from_le_bytes([v[0], v[1]]),
                                ByteOrder::Big => i16::from_be_bytes([v[0], v[1]]),
                            })
                            .collect();
                        let got =
                            reference::preprocess(&values, il, (lines.len(), cols.len(), c.bands()), &mean, &inv_std);
                        assert_eq!(got, want, "{il:?} {order:?} tile ({row}, {col})");
                    }
                }
            }
        }
    }

    #[test]
    fn runs_join_consecutive_columns_only() {
        assert_eq!(runs(&[2, 1, 0, 1, 2, 3, 4, 3]), vec![(2, 1), (1, 1), (0, 5), (3, 1)]);
        assert!(runs(&[]).is_empty());
    }
}
