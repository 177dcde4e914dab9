//! The CPU definition of each kernel in `kernels/`: what the device must reproduce.

use crate::cube::Interleave;

/// A raw sample type the preprocessing kernel reads.
pub trait RawSample: Copy + Send + Sync + 'static {
    /// The value as float32.
    fn to_f32(self) -> f32;
    /// The value with its bytes reversed (the other byte order).
    fn swapped(self) -> Self;
}

impl RawSample for i16 {
    fn to_f32(self) -> f32 {
        f32::from(self)
    }
    fn swapped(self) -> Self {
        self.swap_bytes()
    }
}

impl RawSample for u16 {
    fn to_f32(self) -> f32 {
        f32::from(self)
    }
    fn swapped(self) -> Self {
        self.swap_bytes()
    }
}

impl RawSample for f32 {
    fn to_f32(self) -> f32 {
        self
    }
    fn swapped(self) -> Self {
        f32::from_bits(self.to_bits().swap_bytes())
    }
}

/// Index of (line `y`, sample `x`, band `b`) in a tile of `interleave`.
pub fn raw_index(
    interleave: Interleave,
    lines: usize,
    samples: usize,
    bands: usize,
    y: usize,
    x: usize,
    b: usize,
) -> usize {
    match interleave {
        Interleave::Bsq => (b * lines + y) * samples + x,
        Interleave::Bil => (y * bands + b) * samples + x,
        Interleave::Bip => (y * samples + x) * bands + b,
    }
}

/// `out[b][y][x] = (raw(y, x, b) - mean[b]) * inv_std[b]`: planar float32 (band, line, sample).
pub fn preprocess<T: RawSample>(
    raw: &[T],
    interleave: Interleave,
    (lines, samples, bands): (usize, usize, usize),
    mean: &[f32],
    inv_std: &[f32],
) -> Vec<f32> {
    let mut out = Vec::with_capacity(lines * samples * bands);
    for b in 0..bands {
        for y in 0..lines {
            for x in 0..samples {
                let v = raw[raw_index(interleave, lines, samples, bands, y, x, b)].to_f32();
                out.push((v - mean[b]) * inv_std[b]);
            }
        }
    }
    out
}

/// [`preprocess`] of a window read out of a box of the scene (`preprocess_box` in
/// `kernels/preprocess.cu`): `raw` holds `dims` (lines, samples, bands) of the file from scene
/// line `l0` and sample `c0` in `interleave`; window line `y`, sample `x` is scene line
/// `lines[y]`, sample `cols[x]`. Indices outside the box are the caller's error (they panic).
pub fn preprocess_box<T: RawSample>(
    raw: &[T],
    interleave: Interleave,
    (box_lines, box_samples, bands): (usize, usize, usize),
    (l0, c0): (usize, usize),
    (lines, cols): (&[usize], &[usize]),
    mean: &[f32],
    inv_std: &[f32],
) -> Vec<f32> {
    let mut out = Vec::with_capacity(lines.len() * cols.len() * bands);
    for b in 0..bands {
        for &y in lines {
            for &x in cols {
                let at = raw_index(interleave, box_lines, box_samples, bands, y - l0, x - c0, b);
                out.push((raw[at].to_f32() - mean[b]) * inv_std[b]);
            }
        }
    }
    out
}

/// Per (image, pixel) of `scores` laid out `[n][k][pixels]`: the first class with the largest
/// score and its confidence (softmax of the top logit when `logits`, else the top score);
/// `u32::MAX` and NaN when a score is not finite.
pub fn argmax_confidence(scores: &[f32], n: usize, k: usize, pixels: usize, logits: bool) -> (Vec<u32>, Vec<f32>) {
    let mut cls = Vec::with_capacity(n * pixels);
    let mut conf = Vec::with_capacity(n * pixels);
    for img in 0..n {
        for px in 0..pixels {
            let s = |c: usize| scores[(img * k + c) * pixels + px];
            let (mut best, mut top) = (0u32, s(0));
            let mut finite = top.is_finite();
            for c in 1..k {
                let v = s(c);
                finite &= v.is_finite();
                if v > top {
                    (best, top) = (c as u32, v);
                }
            }
            if !finite {
                cls.push(u32::MAX);
                conf.push(f32::NAN);
                continue;
            }
            cls.push(best);
            conf.push(if logits {
                1.0 / (0..k).map(|c| (s(c) - top).exp()).sum::<f32>()
            } else {
                top
            });
        }
    }
    (cls, conf)
}

/// The patches of output pixels `first .. first + n` of a tile `tw` wide, from its planar window
/// `window` (`bands x wh x ww`), as `[n][bands][p][p]`: pixel `q`'s patch starts at window
/// `(q / tw, q % tw)`.
#[allow(clippy::too_many_arguments)]
pub fn gather_patches(
    window: &[f32],
    (bands, wh, ww): (usize, usize, usize),
    p: usize,
    tw: usize,
    first: usize,
    n: usize,
) -> Vec<f32> {
    let mut out = Vec::with_capacity(n * bands * p * p);
    for q in first..first + n {
        let (y0, x0) = (q / tw, q % tw);
        for b in 0..bands {
            for dy in 0..p {
                let row = (b * wh + y0 + dy) * ww + x0;
                out.extend_from_slice(&window[row..row + p]);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_three_interleaves_address_the_same_value() {
        // A 2 x 3 x 4 (lines, samples, bands) tile whose value encodes its coordinates.
        let (l, s, b) = (2, 3, 4);
        for il in [Interleave::Bsq, Interleave::Bil, Interleave::Bip] {
            let mut raw = vec![0i16; l * s * b];
            for y in 0..l {
                for x in 0..s {
                    for k in 0..b {
                        raw[raw_index(il, l, s, b, y, x, k)] = (100 * y + 10 * x + k) as i16;
                    }
                }
            }
            let out = preprocess(&raw, il, (l, s, b), &[0.0; 4], &[1.0; 4]);
            // planar: band 3, line 1, sample 2
            assert_eq!(out[(3 * l + 1) * s + 2], 123.0, "{il:?}");
        }
    }

    #[test]
    fn argmax_takes_the_first_maximum_and_flags_non_finite_pixels() {
        // n = 1, k = 3, pixels = 2: pixel 0 scores (1, 3, 3), pixel 1 (0, NaN, 0).
        let scores = [1.0, 0.0, 3.0, f32::NAN, 3.0, 0.0];
        let (cls, conf) = argmax_confidence(&scores, 1, 3, 2, true);
        assert_eq!(cls, vec![1, u32::MAX]);
        let want = 1.0 / ((-2f32).exp() + 2.0);
        assert!((conf[0] - want).abs() < 1e-7 && conf[1].is_nan());
        let (_, p) = argmax_confidence(&scores, 1, 3, 2, false);
        assert_eq!(p[0], 3.0);
    }

    #[test]
    fn swapped_bytes_round_trip() {
        assert_eq!(0x1234i16.swapped(), 0x3412);
        assert_eq!(1.5f32.swapped().swapped(), 1.5);
    }
}
