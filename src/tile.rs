//! Tiles with halos: geometry, reflection at scene borders, and gathering of tile and patch inputs.
//!
//! A scene of `lines x samples` is cut into a grid of equal tiles of `tile_h x tile_w` output pixels
//! (the last row and column may reach past the scene; those pixels are computed from reflected data
//! and never written). Each tile's input window carries an `r`-pixel halo on every side, and every
//! coordinate outside the scene is reflected without repeating the edge (`-1 -> 1`, numpy's
//! `mode="reflect"`), so each pixel sees exactly the neighbourhood a per-pixel patch model would.

use crate::cube::Cube;

/// Reflects index `i` into `0..n` without repeating the edge sample, for any distance outside.
pub fn reflect(i: isize, n: usize) -> usize {
    if n <= 1 {
        return 0;
    }
    let period = 2 * (n as isize - 1);
    let m = i.rem_euclid(period);
    if m < n as isize {
        m as usize
    } else {
        (period - m) as usize
    }
}

/// One tile of the grid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct TileRect {
    /// Grid row.
    pub row: usize,
    /// Grid column.
    pub col: usize,
    /// First scene line of the tile's output.
    pub y0: usize,
    /// First scene sample of the tile's output.
    pub x0: usize,
    /// Output lines inside the scene.
    pub h: usize,
    /// Output samples inside the scene.
    pub w: usize,
}

/// `lines` (and `rows`) of a [`TileGrid::streaming`] grid before the scene has ended: far more
/// than any scene, so reflection never reaches a bottom border that is not there yet.
pub const UNKNOWN_LINES: usize = usize::MAX >> 8;

/// The tiling of one scene.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct TileGrid {
    /// Scene lines.
    pub lines: usize,
    /// Scene samples.
    pub samples: usize,
    /// Output lines per tile.
    pub tile_h: usize,
    /// Output samples per tile.
    pub tile_w: usize,
    /// Halo r on each side.
    pub halo: usize,
    /// Tile rows.
    pub rows: usize,
    /// Tile columns.
    pub cols: usize,
}

impl TileGrid {
    /// Cuts `lines x samples` into tiles of at most `tile x tile`, balanced so the last row and column
    /// waste as little as possible (83 lines at tile 64 gives two rows of 42, not 64 + 19).
    pub fn new(lines: usize, samples: usize, tile: usize, halo: usize) -> Self {
        let tile = tile.max(1);
        let split = |n: usize| {
            let count = n.div_ceil(tile).max(1);
            (count, n.div_ceil(count))
        };
        let (rows, tile_h) = split(lines);
        let (cols, tile_w) = split(samples);
        Self {
            lines,
            samples,
            tile_h,
            tile_w,
            halo,
            rows,
            cols,
        }
    }

    /// The grid of a scene whose line count is not known yet (a stream): tile rows of exactly
    /// `tile` lines from the top, columns balanced as [`TileGrid::new`] does. `lines` and `rows`
    /// stay [`UNKNOWN_LINES`] until [`TileGrid::with_lines`] gives the count; meanwhile tile rows
    /// are whole and reflection reaches only the top border.
    pub fn streaming(samples: usize, tile: usize, halo: usize) -> Self {
        let cols = Self::new(1, samples, tile, halo);
        Self {
            lines: UNKNOWN_LINES,
            tile_h: tile.max(1),
            rows: UNKNOWN_LINES,
            ..cols
        }
    }

    /// This grid with tile rows of exactly `tile_h` lines from the top (a resumed scene keeps the
    /// rows of its first run, `LineSource::tile_rows`); columns stay as they are.
    pub fn with_tile_h(self, tile_h: usize) -> Self {
        let tile_h = tile_h.max(1);
        let rows = if self.lines == UNKNOWN_LINES {
            UNKNOWN_LINES
        } else {
            self.lines.div_ceil(tile_h)
        };
        Self { tile_h, rows, ..self }
    }

    /// This grid once the scene is known to have `lines` lines; tile sizes stay as they are.
    pub fn with_lines(self, lines: usize) -> Self {
        Self {
            lines,
            rows: lines.div_ceil(self.tile_h),
            ..self
        }
    }

    /// Input window height (`tile_h + 2r`).
    pub fn window_h(&self) -> usize {
        self.tile_h + 2 * self.halo
    }

    /// Input window width (`tile_w + 2r`).
    pub fn window_w(&self) -> usize {
        self.tile_w + 2 * self.halo
    }

    /// Number of tiles.
    pub fn len(&self) -> usize {
        self.rows * self.cols
    }

    /// Whether the grid has no tiles (never, for a valid scene).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The tile at grid position (`row`, `col`).
    pub fn rect(&self, row: usize, col: usize) -> TileRect {
        let y0 = row * self.tile_h;
        let x0 = col * self.tile_w;
        TileRect {
            row,
            col,
            y0,
            x0,
            h: self.tile_h.min(self.lines.saturating_sub(y0)),
            w: self.tile_w.min(self.samples.saturating_sub(x0)),
        }
    }

    /// Scene lines (reflected) that the input windows of tile row `row` read, top to bottom.
    pub fn window_lines(&self, row: usize) -> Vec<usize> {
        let y0 = (row * self.tile_h) as isize - self.halo as isize;
        (0..self.window_h())
            .map(|dy| reflect(y0 + dy as isize, self.lines))
            .collect()
    }

    /// Scene samples (reflected) that the input window of tile column `col` reads, left to right.
    pub fn window_samples(&self, col: usize) -> Vec<usize> {
        let x0 = (col * self.tile_w) as isize - self.halo as isize;
        (0..self.window_w())
            .map(|dx| reflect(x0 + dx as isize, self.samples))
            .collect()
    }
}

/// Appends to `out` the normalised input window of one tile (`bands x window_h x window_w`, in
/// that order), read straight from the mapped `cube`.
///
/// `lines` and `cols` are the reflected scene line and sample of each window row and column
/// ([`TileGrid::window_lines`], [`TileGrid::window_samples`]); band `b` is normalised as
/// `(v - mean[b]) * inv_std[b]`. Each row's runs of consecutive columns are decoded straight
/// from the file into `out`: the window, megabytes, is written once, and no decoded copy of the
/// scene exists.
pub fn fill_window(cube: &Cube, lines: &[usize], cols: &[usize], mean: &[f32], inv_std: &[f32], out: &mut Vec<f32>) {
    let Some(&lo) = cols.iter().min() else {
        return;
    };
    // Runs of consecutive source columns (the interior; reflected borders are runs of one), as
    // (offset from the leftmost column, length).
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for &x in cols {
        match runs.last_mut() {
            Some((src, len)) if lo + *src + *len == x => *len += 1,
            _ => runs.push((x - lo, 1)),
        }
    }
    cube.append_runs(lines, lo, &runs, mean, inv_std, out);
}

/// The shape of an input window buffer: `bands x h x w`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowShape {
    /// Spectral bands.
    pub bands: usize,
    /// Rows.
    pub h: usize,
    /// Columns.
    pub w: usize,
}

/// Writes into `out` (exactly `bands x p x p` values) the `p x p` patch whose top-left corner is
/// window position (`y`, `x`). The patch of output pixel (i, j) of a tile starts at window (i, j).
///
/// The patch is written in place, into a batch buffer that keeps its length from batch to batch,
/// so each value is written once, with no capacity check or length update per row. The shipped
/// patch sizes copy rows of a length known at compile time: a patch is `bands x p` short copies
/// (2,244 for 204 bands at p = 11), and a call to `memcpy` for each of them made the tiling
/// thread's time several times the copy itself.
pub fn gather_patch(window: &[f32], shape: WindowShape, y: usize, x: usize, p: usize, out: &mut [f32]) {
    debug_assert_eq!(out.len(), shape.bands * p * p);
    match p {
        1 => gather_rows(window, shape, y, x, 1, out),
        3 => gather_rows(window, shape, y, x, 3, out),
        5 => gather_rows(window, shape, y, x, 5, out),
        7 => gather_rows(window, shape, y, x, 7, out),
        9 => gather_rows(window, shape, y, x, 9, out),
        11 => gather_rows(window, shape, y, x, 11, out),
        13 => gather_rows(window, shape, y, x, 13, out),
        15 => gather_rows(window, shape, y, x, 15, out),
        _ => gather_rows(window, shape, y, x, p, out),
    }
}

/// Inlined into each arm of [`gather_patch`], so a literal `p` becomes a fixed-length copy.
#[inline(always)]
fn gather_rows(window: &[f32], shape: WindowShape, y: usize, x: usize, p: usize, out: &mut [f32]) {
    let WindowShape { h: wh, w: ww, .. } = shape;
    for (band, dst) in out.chunks_exact_mut(p * p).enumerate() {
        let top = (band * wh + y) * ww + x;
        for (i, d) in dst.chunks_exact_mut(p).enumerate() {
            let src = top + i * ww;
            d.copy_from_slice(&window[src..src + p]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cube::{DataType, Header, Interleave};

    #[test]
    fn reflect_matches_numpy() {
        // numpy.pad(np.arange(4), 5, mode="reflect")
        let want = [1, 2, 3, 2, 1, 0, 1, 2, 3, 2, 1, 0, 1, 2];
        let got: Vec<usize> = (-5..9).map(|i| reflect(i, 4)).collect();
        assert_eq!(got, want);
        assert_eq!(reflect(-3, 1), 0);
        assert_eq!(reflect(2, 2), 0);
    }

    #[test]
    fn a_streaming_grid_keeps_whole_rows_until_the_end_is_known() {
        let g = TileGrid::streaming(17, 8, 2);
        assert_eq!((g.tile_h, g.tile_w, g.cols), (8, 6, 3));
        assert_eq!(
            g.rect(5, 2),
            TileRect {
                row: 5,
                col: 2,
                y0: 40,
                x0: 12,
                h: 8,
                w: 5
            }
        );
        assert_eq!(g.window_lines(0), [2, 1, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9]);
        let g = g.with_lines(19);
        assert_eq!(g.rows, 3);
        assert_eq!(g.rect(2, 0).h, 3);
        assert_eq!(g.window_lines(2), [14, 15, 16, 17, 18, 17, 16, 15, 14, 13, 12, 11]);
    }

    #[test]
    fn grid_covers_every_pixel_once() {
        for (lines, samples, tile) in [(83, 86, 64), (1, 1, 8), (10, 3, 4), (7, 7, 7), (100, 5, 1)] {
            let g = TileGrid::new(lines, samples, tile, 2);
            let mut hits = vec![0u8; lines * samples];
            for row in 0..g.rows {
                for col in 0..g.cols {
                    let r = g.rect(row, col);
                    assert!(r.h <= g.tile_h && r.w <= g.tile_w);
                    for y in r.y0..r.y0 + r.h {
                        for x in r.x0..r.x0 + r.w {
                            hits[y * samples + x] += 1;
                        }
                    }
                }
            }
            assert!(hits.iter().all(|&h| h == 1), "{lines}x{samples} tile {tile}");
            assert!(g.tile_h <= tile && g.tile_w <= tile);
        }
        let g = TileGrid::new(83, 86, 64, 5);
        assert_eq!((g.rows, g.tile_h, g.cols, g.tile_w), (2, 42, 2, 43));
    }

    #[test]
    fn patches_from_windows_equal_patches_from_the_padded_scene() {
        // r = 0, 2, 5 take the fixed-size copies (p = 1, 5, 11), r = 8 the general one (p = 17).
        for r in [0, 2, 5, 8] {
            patches_equal_padded_scene(r);
        }
    }

    /// A `lines x samples x bands` int16 cube in `interleave` whose value at (y, x, b) is
    /// `b * 100 + y * 10 + x`.
    fn small_cube(dir: &std::path::Path, lines: usize, samples: usize, bands: usize, interleave: Interleave) -> Cube {
        let value = |y: usize, x: usize, b: usize| (b * 100 + y * 10 + x) as i16;
        let mut bytes = Vec::new();
        let mut put = |y, x, b| bytes.extend_from_slice(&value(y, x, b).to_le_bytes());
        match interleave {
            Interleave::Bsq => {
                (0..bands).for_each(|b| (0..lines).for_each(|y| (0..samples).for_each(|x| put(y, x, b))))
            }
            Interleave::Bil => {
                (0..lines).for_each(|y| (0..bands).for_each(|b| (0..samples).for_each(|x| put(y, x, b))))
            }
            Interleave::Bip => {
                (0..lines).for_each(|y| (0..samples).for_each(|x| (0..bands).for_each(|b| put(y, x, b))))
            }
        }
        let hdr = dir.join(format!("c{interleave:?}.hdr"));
        std::fs::write(dir.join(format!("c{interleave:?}.img")), bytes).unwrap();
        let h = Header::new(samples, lines, bands, DataType::I16, interleave);
        std::fs::write(&hdr, h.to_text()).unwrap();
        Cube::open(&hdr).unwrap()
    }

    #[test]
    fn windows_are_normalised_reflected_reads_in_every_interleave() {
        let dir = tempfile::tempdir().unwrap();
        let (lines, samples, bands) = (5usize, 7usize, 3usize);
        let (mean, inv_std) = ([1.0f32, -2.0, 0.5], [0.5f32, 0.25, 2.0]);
        for il in [Interleave::Bsq, Interleave::Bil, Interleave::Bip] {
            let cube = small_cube(dir.path(), lines, samples, bands, il);
            let g = TileGrid::new(lines, samples, 4, 3);
            for row in 0..g.rows {
                for col in 0..g.cols {
                    let (ls, cs) = (g.window_lines(row), g.window_samples(col));
                    let mut win = Vec::new();
                    fill_window(&cube, &ls, &cs, &mean, &inv_std, &mut win);
                    assert_eq!(win.len(), bands * ls.len() * cs.len());
                    for b in 0..bands {
                        for (dy, &y) in ls.iter().enumerate() {
                            for (dx, &x) in cs.iter().enumerate() {
                                let raw = (b * 100 + y * 10 + x) as f32;
                                let want = (raw - mean[b]) * inv_std[b];
                                assert_eq!(win[(b * ls.len() + dy) * cs.len() + dx], want, "{il:?}");
                            }
                        }
                    }
                }
            }
        }
    }

    fn patches_equal_padded_scene(r: usize) {
        let (lines, samples, bands) = (5usize, 6usize, 2usize);
        let value = |y: usize, x: usize, b: usize| (b * 100 + y * 10 + x) as f32;
        let dir = tempfile::tempdir().unwrap();
        let cube = small_cube(dir.path(), lines, samples, bands, Interleave::Bil);
        let (mean, inv_std) = (vec![0.0; bands], vec![1.0; bands]);
        let g = TileGrid::new(lines, samples, 4, r);
        let p = 2 * r + 1;
        for row in 0..g.rows {
            let ls = g.window_lines(row);
            for col in 0..g.cols {
                let cols = g.window_samples(col);
                let mut win = Vec::new();
                fill_window(&cube, &ls, &cols, &mean, &inv_std, &mut win);
                assert_eq!(win.len(), bands * g.window_h() * g.window_w());
                let rect = g.rect(row, col);
                for i in 0..rect.h {
                    for j in 0..rect.w {
                        let mut patch = vec![f32::NAN; bands * p * p];
                        gather_patch(
                            &win,
                            WindowShape {
                                bands,
                                h: g.window_h(),
                                w: g.window_w(),
                            },
                            i,
                            j,
                            p,
                            &mut patch,
                        );
                        let (y, x) = ((rect.y0 + i) as isize, (rect.x0 + j) as isize);
                        for b in 0..bands {
                            for di in 0..p {
                                for dj in 0..p {
                                    let sy = reflect(y - r as isize + di as isize, lines);
                                    let sx = reflect(x - r as isize + dj as isize, samples);
                                    assert_eq!(patch[(b * p + di) * p + dj], value(sy, sx, b), "r {r}");
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}
