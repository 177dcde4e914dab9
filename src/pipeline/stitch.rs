//! Stitching engine outputs into maps: every pixel written exactly once.

use super::{Batch, Maps, PipelineError};
use crate::model::{Manifest, OutputKind, Task};
use crate::tile::TileGrid;

/// Accumulates outputs into maps, counting writes per pixel.
#[derive(Debug)]
pub struct Stitcher {
    maps: Maps,
    /// The scene line of the maps' first line (a strip's place in the scene).
    y0: usize,
    written: Vec<u8>,
    task: Task,
    kind: OutputKind,
    ids: Vec<u8>,
    grid: TileGrid,
    /// One output row's per-pixel working values (see [`Stitcher::put_row`]).
    row: RowScratch,
}

/// Per-pixel working values of one output row, kept so a run allocates them once.
#[derive(Debug, Default)]
struct RowScratch {
    top: Vec<f32>,
    best: Vec<u32>,
    sum: Vec<f32>,
    finite: Vec<bool>,
}

impl Stitcher {
    /// A stitcher for `manifest` over `grid`, its outputs poisoned (NaN confidence, class 0) until written.
    pub fn new(manifest: &Manifest, grid: TileGrid, keep_scores: bool) -> Self {
        Self::strip(manifest, grid, 0, grid.lines, keep_scores)
    }

    /// A stitcher for the `h` scene lines from `y0` on (a strip of tile rows) of `grid`.
    pub fn strip(manifest: &Manifest, grid: TileGrid, y0: usize, h: usize, keep_scores: bool) -> Self {
        let n = h * grid.samples;
        let k = manifest.classes();
        let classify = manifest.task == Task::Classification;
        Self {
            y0,
            maps: Maps {
                lines: h,
                samples: grid.samples,
                channels: k,
                class_ids: if classify { vec![0; n] } else { Vec::new() },
                confidence: if classify { vec![f32::NAN; n] } else { Vec::new() },
                scores: (keep_scores || !classify).then(|| vec![f32::NAN; k * n]),
                nonfinite_pixels: 0,
            },
            written: vec![0; n],
            task: manifest.task,
            kind: manifest.output_kind,
            ids: manifest
                .outputs
                .iter()
                .map(|o| u8::try_from(o.id).unwrap_or(0))
                .collect(),
            grid,
            row: RowScratch::default(),
        }
    }

    /// Writes pixel (`y`, `x`) from `k` scores read as `scores(c)`.
    pub fn put(&mut self, y: usize, x: usize, scores: impl Fn(usize) -> f32) {
        let n = self.maps.lines * self.grid.samples;
        let at = (y - self.y0) * self.grid.samples + x;
        self.written[at] = self.written[at].saturating_add(1);
        let k = self.maps.channels;
        let mut finite = true;
        if let Some(all) = &mut self.maps.scores {
            for c in 0..k {
                let v = scores(c);
                finite &= v.is_finite();
                all[c * n + at] = v;
            }
        }
        if self.task == Task::Classification {
            let (mut best, mut top) = (0, f32::NEG_INFINITY);
            for c in 0..k {
                let v = scores(c);
                finite &= v.is_finite();
                if v > top {
                    (best, top) = (c, v);
                }
            }
            if !finite {
                // No class can be read from it; a class id here would look like a prediction.
                self.maps.class_ids[at] = 0;
                self.maps.confidence[at] = f32::NAN;
                self.maps.nonfinite_pixels += 1;
                return;
            }
            let confidence = match self.kind {
                OutputKind::Probabilities => top,
                OutputKind::Logits => 1.0 / (0..k).map(|c| exp_nonpositive(scores(c) - top)).sum::<f32>(),
            };
            self.maps.class_ids[at] = self.ids[best];
            self.maps.confidence[at] = confidence;
        } else if !finite {
            self.maps.nonfinite_pixels += 1;
        }
    }

    /// Writes the `w` pixels of line `y` from sample `x0` on, class `c`'s scores for them being
    /// the first `w` values of `row(c)`: the same result as [`Stitcher::put`] for each pixel, with
    /// every step a loop over the row's pixels (a dense tile's output holds each class's scores
    /// of a row contiguously), so it vectorises, where pixel by pixel each class is a strided
    /// read and each exponential a call.
    pub fn put_row<'o>(&mut self, y: usize, x0: usize, w: usize, row: impl Fn(usize) -> &'o [f32]) {
        let n = self.maps.lines * self.grid.samples;
        let at = (y - self.y0) * self.grid.samples + x0;
        let k = self.maps.channels;
        for c in &mut self.written[at..at + w] {
            *c = c.saturating_add(1);
        }
        let RowScratch { top, best, sum, finite } = &mut self.row;
        finite.clear();
        finite.resize(w, true);
        for c in 0..k {
            for (f, v) in finite.iter_mut().zip(&row(c)[..w]) {
                *f &= v.is_finite();
            }
        }
        if let Some(all) = &mut self.maps.scores {
            for c in 0..k {
                all[c * n + at..c * n + at + w].copy_from_slice(&row(c)[..w]);
            }
        }
        if self.task != Task::Classification {
            self.maps.nonfinite_pixels += finite.iter().filter(|f| !**f).count();
            return;
        }
        top.clear();
        top.extend_from_slice(&row(0)[..w]);
        best.clear();
        best.resize(w, 0);
        for c in 1..k {
            for ((t, b), &v) in top.iter_mut().zip(best.iter_mut()).zip(&row(c)[..w]) {
                if v > *t {
                    *t = v;
                    *b = c as u32;
                }
            }
        }
        if self.kind == OutputKind::Logits {
            sum.clear();
            sum.resize(w, 0.0);
            for c in 0..k {
                for ((s, &t), &v) in sum.iter_mut().zip(top.iter()).zip(&row(c)[..w]) {
                    *s += exp_nonpositive(v - t);
                }
            }
            for (t, &s) in top.iter_mut().zip(sum.iter()) {
                *t = 1.0 / s;
            }
        }
        let ids = &self.ids;
        let classes = &mut self.maps.class_ids[at..at + w];
        let confidence = &mut self.maps.confidence[at..at + w];
        for j in 0..w {
            if finite[j] {
                classes[j] = ids[best[j] as usize];
                confidence[j] = top[j];
            } else {
                // No class can be read from it; a class id here would look like a prediction.
                classes[j] = 0;
                confidence[j] = f32::NAN;
                self.maps.nonfinite_pixels += 1;
            }
        }
    }

    /// Stitches one engine result for `batch`.
    pub fn put_batch(
        &mut self,
        batch: &Batch,
        out_shape: &[usize],
        out: &[f32],
        graph: &std::path::Path,
    ) -> Result<(), PipelineError> {
        self.put_range(batch, 0..batch.units(), out_shape, out, graph)
    }

    /// Stitches the engine result for samples `range` of `batch`.
    pub fn put_range(
        &mut self,
        batch: &Batch,
        range: std::ops::Range<usize>,
        out_shape: &[usize],
        out: &[f32],
        graph: &std::path::Path,
    ) -> Result<(), PipelineError> {
        let k = self.maps.channels;
        let shape_err = |expected: String| PipelineError::OutputShape {
            graph: graph.to_path_buf(),
            got: out_shape.to_vec(),
            input: batch.shape.clone(),
            expected,
        };
        if !batch.tiles.is_empty() {
            let (th, tw) = (self.grid.tile_h, self.grid.tile_w);
            let n = range.len();
            if out_shape != [n, k, th, tw] {
                return Err(shape_err(format!("{n} x {k} x {th} x {tw}")));
            }
            for (t, rect) in batch.tiles[range].iter().enumerate() {
                for i in 0..rect.h {
                    self.put_row(rect.y0 + i, rect.x0, rect.w, |c| {
                        let first = ((t * k + c) * th + i) * tw;
                        &out[first..first + tw]
                    });
                }
            }
        } else {
            let n = range.len();
            if out.len() != n * k || out_shape.first() != Some(&n) {
                return Err(shape_err(format!("{n} x {k}")));
            }
            for (s, &(y, x)) in batch.pixels[range].iter().enumerate() {
                self.put(y, x, |c| out[s * k + c]);
            }
        }
        Ok(())
    }

    /// The maps, once every pixel has been written exactly once.
    pub fn finish(self) -> Result<Maps, PipelineError> {
        if let Some(at) = self.written.iter().position(|&c| c != 1) {
            let (line, sample) = (self.y0 + at / self.grid.samples, at % self.grid.samples);
            return Err(PipelineError::Coverage {
                line,
                sample,
                count: self.written[at],
                row: line / self.grid.tile_h,
                col: sample / self.grid.tile_w,
            });
        }
        Ok(self.maps)
    }
}

/// `e^x` for `x <= 0` (a logit less the row's largest), within 2 ulp of `f32::exp` down to
/// `x = -87`; below, `e^-87` (1.6e-38), which no sum of a softmax that includes `e^0` can see.
///
/// Written out (Cephes' `expf`: `x = n ln 2 + r`, a degree-6 polynomial in `r`, `2^n` built in the
/// exponent bits) so a loop over a row of pixels vectorises; `f32::exp` is a call per value.
#[inline(always)]
fn exp_nonpositive(x: f32) -> f32 {
    // Rounds to nearest through the float format: adding 1.5 * 2^23 leaves no fraction bits.
    const ROUND: f32 = 12_582_912.0;
    let x = x.clamp(-87.0, 0.0);
    let n = (x * std::f32::consts::LOG2_E + ROUND) - ROUND;
    let r = x - n * 0.693_359_4 + n * 2.121_944_4e-4;
    let mut p = 1.987_569_1e-4_f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let e = p * r * r + r + 1.0;
    e * f32::from_bits((((n as i32) + 127) as u32) << 23)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Manifest;

    fn manifest() -> Manifest {
        let v = |x: f32| serde_json::to_string(&vec![x; 2]).unwrap();
        let text = format!(
            r#"{{"name":"t","task":"classification","input":{{"bands":2,"layout":"nchw","mean":{},"std":{}}},
            "patch":3,"halo":1,"outputs":[{{"id":3,"name":"a"}},{{"id":9,"name":"b"}}],
            "files":{{"patch":"p.onnx","dense":"d.onnx"}},"output_kind":"logits"}}"#,
            v(0.0),
            v(1.0)
        );
        Manifest::parse(&text, std::path::Path::new("m.json")).unwrap()
    }

    #[test]
    fn poisoned_maps_are_fully_overwritten_by_dense_batches() {
        let m = manifest();
        let grid = TileGrid::new(7, 9, 4, 1);
        let mut s = Stitcher::new(&m, grid, true);
        for row in 0..grid.rows {
            for col in 0..grid.cols {
                let rect = grid.rect(row, col);
                let (th, tw) = (grid.tile_h, grid.tile_w);
                let out: Vec<f32> = (0..2 * th * tw).map(|i| if i < th * tw { 1.0 } else { 0.0 }).collect();
                let b = Batch {
                    data: vec![],
                    shape: vec![1, 2, th + 2, tw + 2],
                    pixels: vec![],
                    tiles: vec![rect],
                    strips: vec![],
                };
                s.put_batch(&b, &[1, 2, th, tw], &out, std::path::Path::new("d.onnx"))
                    .unwrap();
            }
        }
        let maps = s.finish().unwrap();
        assert!(maps.confidence.iter().all(|c| c.is_finite()));
        assert!(maps.class_ids.iter().all(|&c| c == 3));
        assert!(maps.scores.unwrap().iter().all(|v| v.is_finite()));
    }

    #[test]
    fn a_missing_or_repeated_pixel_fails_the_run() {
        let m = manifest();
        let grid = TileGrid::new(2, 2, 2, 1);
        let mut s = Stitcher::new(&m, grid, false);
        for (y, x) in [(0, 0), (0, 1), (1, 0)] {
            s.put(y, x, |c| c as f32);
        }
        let err = s.finish().unwrap_err();
        assert!(
            matches!(
                err,
                PipelineError::Coverage {
                    line: 1,
                    sample: 1,
                    count: 0,
                    ..
                }
            ),
            "{err}"
        );
        let mut s = Stitcher::new(&m, grid, false);
        for (y, x) in [(0, 0), (0, 1), (1, 0), (1, 1), (0, 1)] {
            s.put(y, x, |c| c as f32);
        }
        assert!(matches!(
            s.finish(),
            Err(PipelineError::Coverage {
                line: 0,
                sample: 1,
                count: 2,
                ..
            })
        ));
    }

    #[test]
    fn a_nonfinite_output_is_unclassified_and_counted() {
        let m = manifest();
        let mut s = Stitcher::new(&m, TileGrid::new(1, 2, 2, 0), false);
        s.put(0, 0, |c| [f32::NAN, f32::NAN][c]);
        s.put(0, 1, |c| [1.0, f32::INFINITY][c]);
        let maps = s.finish().unwrap();
        assert_eq!(maps.class_ids, vec![0, 0]);
        assert!(maps.confidence.iter().all(|c| c.is_nan()));
        assert_eq!(maps.nonfinite_pixels, 2);
    }

    #[test]
    fn exp_nonpositive_is_within_two_ulp_of_exp() {
        let mut x = 0.0f32;
        while x > -87.0 {
            let (got, want) = (exp_nonpositive(x), x.exp());
            let ulps = (i64::from(got.to_bits()) - i64::from(want.to_bits())).abs();
            assert!(ulps <= 2, "e^{x}: {got} vs {want}, {ulps} ulp");
            x -= 0.001_37;
        }
        assert_eq!(exp_nonpositive(0.0), 1.0);
        assert!(exp_nonpositive(f32::NEG_INFINITY) < 1e-37);
        assert!(exp_nonpositive(-1e30) >= 0.0);
    }

    #[test]
    fn rows_stitch_as_pixels_do() {
        let classify = manifest();
        let mut unmix = classify.clone();
        unmix.task = Task::Abundance;
        for m in [classify, unmix] {
            rows_stitch_as_pixels_do_for(&m);
        }
    }

    fn rows_stitch_as_pixels_do_for(m: &Manifest) {
        let k = m.classes();
        let grid = TileGrid::new(1, 5, 8, 1);
        let value = |c: usize, j: usize| match (c, j) {
            (_, 3) => f32::NAN,
            (1, 4) => f32::INFINITY,
            _ => (c as f32 * 1.7 - j as f32).sin() * 30.0,
        };
        let rows: Vec<Vec<f32>> = (0..k).map(|c| (0..5).map(|j| value(c, j)).collect()).collect();
        for keep in [false, true] {
            let mut by_row = Stitcher::new(m, grid, keep);
            by_row.put_row(0, 0, 5, |c| &rows[c]);
            let mut by_pixel = Stitcher::new(m, grid, keep);
            for j in 0..5 {
                by_pixel.put(0, j, |c| value(c, j));
            }
            let (a, b) = (by_row.finish().unwrap(), by_pixel.finish().unwrap());
            assert_eq!(a.class_ids, b.class_ids);
            assert_eq!(a.nonfinite_pixels, 2);
            assert_eq!(a.nonfinite_pixels, b.nonfinite_pixels);
            for (x, y) in a.confidence.iter().zip(&b.confidence) {
                assert!(x == y || (x.is_nan() && y.is_nan()), "{x} vs {y}");
            }
            assert_eq!(a.scores.is_some(), keep || m.task == Task::Abundance);
            if let (Some(x), Some(y)) = (a.scores, b.scores) {
                assert_eq!(
                    x.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    y.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
                );
            }
        }
    }

    #[test]
    fn softmax_confidence() {
        let m = manifest();
        let mut s = Stitcher::new(&m, TileGrid::new(1, 1, 1, 1), false);
        s.put(0, 0, |c| [0.0f32, 2.0f32.ln()][c]);
        let maps = s.finish().unwrap();
        assert_eq!(maps.class_ids, vec![9]);
        assert!((maps.confidence[0] - 2.0 / 3.0).abs() < 1e-6);
    }
}
