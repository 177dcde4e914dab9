//! `hsiedge gpu check`: every kernel on fresh random inputs, into outputs poisoned beforehand,
//! against [`super::reference`]; plus the bytes a pixel moves to the device with and without
//! device preprocessing, and what each path costs.

use std::time::Instant;

use rand::{Rng, SeedableRng};
use serde::Serialize;

use super::kernels::{BoxShape, DeviceSample, Kernels};
use super::reference;
use super::{DeviceInfo, GpuError, driver};
use crate::cube::Interleave;

/// Largest relative error allowed for normalisation.
pub const NORMALISE_REL_TOL: f64 = 1e-6;
/// Largest relative error allowed for a confidence (the device's `expf` against the host's `exp`).
pub const CONFIDENCE_REL_TOL: f64 = 1e-5;

/// One kernel case.
#[derive(Debug, Clone, Serialize)]
pub struct Case {
    /// Kernel name.
    pub kernel: String,
    /// What was varied: type, interleave, byte order, or sizes.
    pub variant: String,
    /// Values compared.
    pub values: usize,
    /// Values outside tolerance (for argmax: labels that differ).
    pub mismatches: usize,
    /// Largest relative error seen (normalisation or confidence).
    pub max_rel_err: f64,
    /// Whether the case passed.
    pub pass: bool,
}

/// Time and bytes of getting one tile onto the device normalised.
#[derive(Debug, Clone, Serialize)]
pub struct Transfer {
    /// Tile (lines, samples, bands).
    pub tile: (usize, usize, usize),
    /// Host-to-device bytes per pixel when the host normalises (float32 values).
    pub host_normalised_bytes_per_pixel: usize,
    /// Host-to-device bytes per pixel when the device normalises (raw int16 values).
    pub device_normalised_bytes_per_pixel: usize,
    /// Median seconds: float32 upload of a host-normalised tile.
    pub host_path_s: f64,
    /// Median seconds: int16 upload plus the preprocessing kernel.
    pub device_path_s: f64,
}

/// The check's report.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The device.
    pub device: DeviceInfo,
    /// Seed of the random inputs.
    pub seed: u64,
    /// Every case.
    pub cases: Vec<Case>,
    /// The transfer comparison.
    pub transfer: Transfer,
    /// All cases passed.
    pub pass: bool,
}

fn rel(got: f32, want: f32) -> f64 {
    let d = f64::from((got - want).abs());
    d / f64::from(want.abs()).max(f64::from(f32::MIN_POSITIVE))
}

/// Values of `got` outside the normalisation tolerance of `want` (NaN counts as outside), and the
/// largest relative error.
fn normalised_errors(got: &[f32], want: &[f32]) -> (usize, f64) {
    let mut mismatches = 0;
    let mut max_rel_err = 0f64;
    for (g, w) in got.iter().zip(want) {
        let e = if g.is_nan() { f64::INFINITY } else { rel(*g, *w) };
        max_rel_err = max_rel_err.max(e);
        mismatches += usize::from(e > NORMALISE_REL_TOL);
    }
    (mismatches, max_rel_err)
}

fn preprocess_case<T: DeviceSample>(
    k: &Kernels,
    rng: &mut rand::rngs::StdRng,
    gen_value: impl Fn(&mut rand::rngs::StdRng) -> T,
    interleave: Interleave,
    swap: bool,
) -> Result<Case, GpuError> {
    let dims = (
        rng.random_range(3..40),
        rng.random_range(3..50),
        rng.random_range(1..210),
    );
    let n = dims.0 * dims.1 * dims.2;
    let raw: Vec<T> = (0..n).map(|_| gen_value(rng)).collect();
    let mean: Vec<f32> = (0..dims.2).map(|_| rng.random_range(-500.0..3000.0)).collect();
    let inv_std: Vec<f32> = (0..dims.2).map(|_| 1.0 / rng.random_range(0.5..900.0f32)).collect();
    let want = reference::preprocess(&raw, interleave, dims, &mean, &inv_std);
    let upload: Vec<T> = if swap {
        raw.iter().map(|v| v.swapped()).collect()
    } else {
        raw
    };
    let s = k.stream();
    let d_raw = s.clone_htod(&upload).map_err(driver("cuMemcpyHtoD"))?;
    let d_mean = s.clone_htod(&mean).map_err(driver("cuMemcpyHtoD"))?;
    let d_inv = s.clone_htod(&inv_std).map_err(driver("cuMemcpyHtoD"))?;
    let mut out = s.clone_htod(&vec![f32::NAN; n]).map_err(driver("cuMemcpyHtoD"))?;
    k.preprocess(&d_raw, interleave, swap, dims, &d_mean, &d_inv, &mut out)?;
    let got = s.clone_dtoh(&out).map_err(driver("cuMemcpyDtoH"))?;
    let (mismatches, max_rel_err) = normalised_errors(&got, &want);
    Ok(Case {
        kernel: T::KERNEL.into(),
        variant: format!("{interleave:?} swap={swap} {}x{}x{}", dims.0, dims.1, dims.2),
        values: n,
        mismatches,
        max_rel_err,
        pass: mismatches == 0,
    })
}

fn box_case<T: DeviceSample>(
    k: &Kernels,
    rng: &mut rand::rngs::StdRng,
    gen_value: impl Fn(&mut rand::rngs::StdRng) -> T,
    interleave: Interleave,
    swap: bool,
) -> Result<Case, GpuError> {
    let (bl, bs, bands) = (
        rng.random_range(1..30),
        rng.random_range(1..40),
        rng.random_range(1..120),
    );
    let (l0, c0) = (rng.random_range(0..500), rng.random_range(0..500));
    let (wh, ww) = (rng.random_range(1..40), rng.random_range(1..50));
    // Window indices anywhere in the box, repeats included (as the reflections at borders give).
    let lines: Vec<usize> = (0..wh).map(|_| l0 + rng.random_range(0..bl)).collect();
    let cols: Vec<usize> = (0..ww).map(|_| c0 + rng.random_range(0..bs)).collect();
    let raw: Vec<T> = (0..bl * bs * bands).map(|_| gen_value(rng)).collect();
    let mean: Vec<f32> = (0..bands).map(|_| rng.random_range(-500.0..3000.0)).collect();
    let inv_std: Vec<f32> = (0..bands).map(|_| 1.0 / rng.random_range(0.5..900.0f32)).collect();
    let want = reference::preprocess_box(
        &raw,
        interleave,
        (bl, bs, bands),
        (l0, c0),
        (&lines, &cols),
        &mean,
        &inv_std,
    );
    let upload: Vec<T> = if swap {
        raw.iter().map(|v| v.swapped()).collect()
    } else {
        raw
    };
    let s = k.stream();
    let d_raw = s.clone_htod(&upload).map_err(driver("cuMemcpyHtoD"))?;
    let as_i32 = |v: &[usize]| v.iter().map(|&i| i as i32).collect::<Vec<i32>>();
    let d_lines = s.clone_htod(&as_i32(&lines)).map_err(driver("cuMemcpyHtoD"))?;
    let d_cols = s.clone_htod(&as_i32(&cols)).map_err(driver("cuMemcpyHtoD"))?;
    let d_mean = s.clone_htod(&mean).map_err(driver("cuMemcpyHtoD"))?;
    let d_inv = s.clone_htod(&inv_std).map_err(driver("cuMemcpyHtoD"))?;
    let out = s
        .clone_htod(&vec![f32::NAN; want.len()])
        .map_err(driver("cuMemcpyHtoD"))?;
    let shape = BoxShape {
        dims: (bl, bs, bands),
        l0,
        c0,
        window: (wh, ww),
    };
    {
        let (ptr, _sync) = cudarc::driver::DevicePtr::device_ptr(&out, s);
        // SAFETY: `out` holds wh * ww * bands floats of this context, used by nothing else until
        // the copy back below on the same stream; every index lies inside the box (drawn so).
        unsafe {
            k.preprocess_box_into(
                &d_raw.as_view(),
                interleave,
                swap,
                &shape,
                &d_lines.as_view(),
                &d_cols.as_view(),
                &d_mean,
                &d_inv,
                ptr,
            )?
        };
    }
    let got = s.clone_dtoh(&out).map_err(driver("cuMemcpyDtoH"))?;
    let (mismatches, max_rel_err) = normalised_errors(&got, &want);
    Ok(Case {
        kernel: format!("{}_box", T::KERNEL),
        variant: format!("{interleave:?} swap={swap} box {bl}x{bs}x{bands} window {wh}x{ww}"),
        values: want.len(),
        mismatches,
        max_rel_err,
        pass: mismatches == 0,
    })
}

fn gather_case(k: &Kernels, rng: &mut rand::rngs::StdRng) -> Result<Case, GpuError> {
    let halo = rng.random_range(0..6);
    let p = 2 * halo + 1;
    let (th, tw, bands) = (
        rng.random_range(1..20),
        rng.random_range(1..20),
        rng.random_range(1..60),
    );
    let (wh, ww) = (th + 2 * halo, tw + 2 * halo);
    let window: Vec<f32> = (0..bands * wh * ww).map(|_| rng.random_range(-3.0..3.0)).collect();
    let first = rng.random_range(0..th * tw);
    let n = rng.random_range(1..=th * tw - first);
    let want = reference::gather_patches(&window, (bands, wh, ww), p, tw, first, n);
    let s = k.stream();
    let d_window = s.clone_htod(&window).map_err(driver("cuMemcpyHtoD"))?;
    let out = s
        .clone_htod(&vec![f32::NAN; want.len()])
        .map_err(driver("cuMemcpyHtoD"))?;
    {
        let (ptr, _sync) = cudarc::driver::DevicePtr::device_ptr(&out, s);
        // SAFETY: `out` holds n * bands * p * p floats of this context, and nothing else uses it
        // until the copy back below, on the same stream.
        unsafe { k.gather_patches_into(&d_window, (bands, wh, ww), p, tw, first, n, ptr)? };
    }
    let got = s.clone_dtoh(&out).map_err(driver("cuMemcpyDtoH"))?;
    let mismatches = got
        .iter()
        .zip(&want)
        .filter(|(g, w)| g.to_bits() != w.to_bits())
        .count();
    Ok(Case {
        kernel: "gather_patches".into(),
        variant: format!("p={p} tile {th}x{tw} bands={bands} pixels {first}+{n}"),
        values: want.len(),
        mismatches,
        max_rel_err: if mismatches == 0 { 0.0 } else { f64::INFINITY },
        pass: mismatches == 0,
    })
}

fn argmax_case(k: &Kernels, rng: &mut rand::rngs::StdRng, logits: bool) -> Result<Case, GpuError> {
    let (n, classes, pixels) = (
        rng.random_range(1..9),
        rng.random_range(2..20),
        rng.random_range(1..5000),
    );
    let mut scores: Vec<f32> = (0..n * classes * pixels)
        .map(|_| rng.random_range(-20.0..20.0))
        .collect();
    // A few ties and non-finite scores: the first maximum wins, a non-finite pixel is flagged.
    for _ in 0..8 {
        let i = rng.random_range(0..scores.len());
        scores[i] = if rng.random_bool(0.5) { f32::NAN } else { f32::INFINITY };
    }
    if pixels > 1 && classes > 1 {
        scores[1] = scores[0].max(scores[pixels]);
        scores[pixels + 1] = scores[1];
    }
    let (want_c, want_p) = reference::argmax_confidence(&scores, n, classes, pixels, logits);
    let s = k.stream();
    let d_scores = s.clone_htod(&scores).map_err(driver("cuMemcpyHtoD"))?;
    let mut cls = s
        .clone_htod(&vec![0xDEAD_BEEFu32; n * pixels])
        .map_err(driver("cuMemcpyHtoD"))?;
    let mut conf = s.clone_htod(&vec![-1f32; n * pixels]).map_err(driver("cuMemcpyHtoD"))?;
    k.argmax(&d_scores, (n, classes, pixels), logits, &mut cls, &mut conf)?;
    let got_c = s.clone_dtoh(&cls).map_err(driver("cuMemcpyDtoH"))?;
    let got_p = s.clone_dtoh(&conf).map_err(driver("cuMemcpyDtoH"))?;
    let mut mismatches = got_c.iter().zip(&want_c).filter(|(a, b)| a != b).count();
    let mut max_rel_err = 0f64;
    for (g, w) in got_p.iter().zip(&want_p) {
        if w.is_nan() {
            mismatches += usize::from(!g.is_nan());
            continue;
        }
        let e = rel(*g, *w);
        max_rel_err = max_rel_err.max(e);
        mismatches += usize::from(e > CONFIDENCE_REL_TOL);
    }
    Ok(Case {
        kernel: "argmax_confidence".into(),
        variant: format!(
            "{} {n}x{classes}x{pixels}",
            if logits { "logits" } else { "probabilities" }
        ),
        values: n * pixels,
        mismatches,
        max_rel_err,
        pass: mismatches == 0,
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn transfer(k: &Kernels, rng: &mut rand::rngs::StdRng) -> Result<Transfer, GpuError> {
    let tile = (512, 512, 204);
    let n = tile.0 * tile.1 * tile.2;
    let raw: Vec<i16> = (0..n).map(|_| rng.random_range(0..8000)).collect();
    let mean = vec![1500f32; tile.2];
    let inv = vec![1.0 / 700f32; tile.2];
    let host: Vec<f32> = reference::preprocess(&raw, Interleave::Bil, tile, &mean, &inv);
    let s = k.stream();
    let d_mean = s.clone_htod(&mean).map_err(driver("cuMemcpyHtoD"))?;
    let d_inv = s.clone_htod(&inv).map_err(driver("cuMemcpyHtoD"))?;
    let mut d_raw = s.alloc_zeros::<i16>(n).map_err(driver("cuMemAlloc"))?;
    let mut d_out = s.alloc_zeros::<f32>(n).map_err(driver("cuMemAlloc"))?;
    let (mut host_t, mut dev_t) = (Vec::new(), Vec::new());
    for _ in 0..7 {
        let t = Instant::now();
        s.memcpy_htod(&host, &mut d_out).map_err(driver("cuMemcpyHtoD"))?;
        s.synchronize().map_err(driver("cuStreamSynchronize"))?;
        host_t.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        s.memcpy_htod(&raw, &mut d_raw).map_err(driver("cuMemcpyHtoD"))?;
        k.preprocess(&d_raw, Interleave::Bil, false, tile, &d_mean, &d_inv, &mut d_out)?;
        s.synchronize().map_err(driver("cuStreamSynchronize"))?;
        dev_t.push(t.elapsed().as_secs_f64());
    }
    Ok(Transfer {
        tile,
        host_normalised_bytes_per_pixel: 4 * tile.2,
        device_normalised_bytes_per_pixel: 2 * tile.2,
        host_path_s: median(host_t),
        device_path_s: median(dev_t),
    })
}

/// Runs every case on device `ordinal` with inputs drawn from `seed`.
pub fn run(ordinal: usize, seed: u64) -> Result<Report, GpuError> {
    let k = Kernels::new(ordinal)?;
    let device = super::info(k.context(), ordinal)?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut cases = Vec::new();
    for il in [Interleave::Bsq, Interleave::Bil, Interleave::Bip] {
        for swap in [false, true] {
            cases.push(preprocess_case::<i16>(&k, &mut rng, |r| r.random(), il, swap)?);
            cases.push(preprocess_case::<u16>(&k, &mut rng, |r| r.random(), il, swap)?);
            cases.push(preprocess_case::<f32>(
                &k,
                &mut rng,
                |r| r.random_range(-1e4..1e4),
                il,
                swap,
            )?);
            cases.push(box_case::<i16>(&k, &mut rng, |r| r.random(), il, swap)?);
            cases.push(box_case::<u16>(&k, &mut rng, |r| r.random(), il, swap)?);
            cases.push(box_case::<f32>(&k, &mut rng, |r| r.random_range(-1e4..1e4), il, swap)?);
        }
    }
    for logits in [true, false] {
        for _ in 0..3 {
            cases.push(argmax_case(&k, &mut rng, logits)?);
        }
    }
    for _ in 0..4 {
        cases.push(gather_case(&k, &mut rng)?);
    }
    let transfer = transfer(&k, &mut rng)?;
    let pass = cases.iter().all(|c| c.pass);
    Ok(Report {
        device,
        seed,
        cases,
        transfer,
        pass,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernels_match_the_cpu_reference_on_random_inputs() {
        if !super::super::driver_present() || matches!(super::super::probe(0), Ok(None)) {
            eprintln!("skipped: no CUDA driver or device here; `hsiedge gpu check` runs this on a GPU");
            return;
        }
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64);
        let report = run(0, seed).unwrap();
        let failed: Vec<&Case> = report.cases.iter().filter(|c| !c.pass).collect();
        assert!(failed.is_empty(), "seed {seed}: {failed:?}");
    }
}
