//! Benchmarks run by `hsiedge bench`: medians of repeated runs, and ratios against baselines
//! measured in the same invocation.
//!
//! `classify` times, on one scene and model: patch and dense mode end to end (read, tile, infer,
//! stitch, write), the pure inference time of exactly the batches each mode sends, and optionally a
//! bare onnxruntime Python loop over the same patches and batch size (`benches/ort_patch_loop.py`).
//!
//! `auto` (`bench::auto`) checks `--batch auto` against fixed batches up to B_safe; `sweep`
//! (`bench::sweep`) times batch sizes and caches the plateau knee.
//!
//! The measurements of a mode are interleaved, one of each per repetition, and each ratio is the
//! median of the per-repetition ratios, reported with their quartiles: on a shared machine whose
//! speed drifts by several per cent over a minute, two blocks of runs timed one after the other
//! compare the drift as much as the code.

use std::path::PathBuf;
use std::time::Instant;

pub mod auto;
mod python;
pub mod stream;
pub mod sweep;

use crate::cube::Cube;
use crate::job::{BatchChoice, Job, JobError, JobSpec, ModeChoice};
use crate::model::Manifest;
use crate::pipeline::{self, Batch, Mode, RunOptions};
use python::PythonLoop;

/// Errors of a benchmark.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A job failed.
    #[error(transparent)]
    Job(#[from] JobError),
    /// The Python baseline could not run or printed something unexpected.
    #[error("python baseline `{command}`: {message}")]
    Baseline {
        /// The command line.
        command: String,
        /// What went wrong (its stderr, or the parse error).
        message: String,
    },
    /// The baseline's interpreter cannot import a package the baseline needs.
    #[error(
        "python baseline: `{python}` has no Python package `{module}`; install the baseline's \
         packages with `{python} -m pip install onnxruntime=={} numpy` (`make test` puts them in \
         target/venv: pass `--python target/venv/bin/python`), or pass --no-python to skip the baseline",
        crate::engine::ORT_VERSION
    )]
    BaselineMissing {
        /// The interpreter.
        python: String,
        /// The top-level package it could not import.
        module: String,
    },
    /// A temporary output folder could not be made.
    #[error("temporary folder: {0}")]
    Temp(std::io::Error),
    /// A benchmark setting is out of range or does not fit the model.
    #[error("{0}")]
    Setting(String),
    /// A power-mode sweep could not read, switch or restore the mode.
    #[error(transparent)]
    Power(#[from] sweep::PowerError),
    /// The sweep's plot could not be drawn or written.
    #[error("plot {path}: {message}")]
    Plot {
        /// The SVG file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// The sweep cache could not be written.
    #[error("sweep cache")]
    Cache(#[source] crate::budget::knee::KneeError),
}

/// The median of `v` (upper median for even lengths); 0 for an empty slice.
pub fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s.get(s.len() / 2).copied().unwrap_or(0.0)
}

/// Timings of one mode.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ModeResult {
    /// Mode.
    pub mode: Mode,
    /// Batch (patches or tiles).
    pub batch: usize,
    /// Tile shape used.
    pub tile: (usize, usize),
    /// Batches per run.
    pub batches: usize,
    /// Median end-to-end seconds (read, tile, infer, stitch, write).
    pub end_to_end_s: f64,
    /// Median seconds of `session.run` over the same batches, inputs prepared beforehand.
    pub inference_s: f64,
    /// Median seconds of the tiling thread's work alone (read, normalise, tile into batches) on
    /// this thread, with no inference: what end to end must hide behind inference.
    pub tiling_s: f64,
    /// Median seconds the engine waited for the tiling thread in the end-to-end runs.
    pub wait_s: f64,
    /// Median seconds of writing and committing the output files in the end-to-end runs.
    pub write_s: f64,
    /// `pixels / end_to_end_s`.
    pub pixels_per_s: f64,
    /// Median over repetitions of end to end over the pure inference of the same repetition.
    pub e2e_over_inference: f64,
    /// The quartiles of those per-repetition ratios: how far one repetition is from the next.
    pub e2e_over_inference_quartiles: [f64; 2],
    /// Every end-to-end sample.
    pub end_to_end_samples_s: Vec<f64>,
    /// Every inference sample.
    pub inference_samples_s: Vec<f64>,
    /// On the device-resident path (`--io`): what its last run moved; pure inference is then
    /// the session's runs on bound device buffers.
    pub device_io: Option<crate::gpu::resident::DeviceIo>,
}

/// The Python baseline's result.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct PythonBaseline {
    /// Median seconds of the bare `sess.run` loop over all patch batches, one repetition after
    /// each of hsiedge's patch repetitions.
    pub run_loop_s: f64,
    /// Median seconds including the peer-style per-pixel window copy into each batch.
    pub with_gather_s: f64,
    /// Every run-loop sample, in repetition order (paired with the patch end-to-end samples).
    pub run_loop_samples_s: Vec<f64>,
    /// onnxruntime version.
    pub onnxruntime: String,
}

/// Result of `bench classify`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ClassifyBench {
    /// Scene header.
    pub scene: PathBuf,
    /// Model name.
    pub model: String,
    /// Pixels in the scene.
    pub pixels: usize,
    /// Repetitions per patch-mode measurement.
    pub repeat: usize,
    /// Repetitions per dense-mode measurement.
    pub dense_repeat: usize,
    /// Intra-op threads.
    pub threads: usize,
    /// Patch mode, unless skipped.
    pub patch: Option<ModeResult>,
    /// Dense mode, when the model has a dense twin.
    pub dense: Option<ModeResult>,
    /// The Python baseline, when asked for.
    pub python: Option<PythonBaseline>,
    /// dense px/s over patch px/s (end to end).
    pub dense_over_patch: Option<f64>,
    /// Patch end-to-end time over its pure inference time (median of per-repetition ratios).
    pub patch_e2e_over_inference: Option<f64>,
    /// Dense end-to-end time over its pure inference time (median of per-repetition ratios).
    pub dense_e2e_over_inference: Option<f64>,
    /// hsiedge patch end-to-end time over the Python bare loop time of the same repetition, median
    /// over repetitions (1.0 = equal; below is faster).
    pub patch_over_python_loop: Option<f64>,
    /// The quartiles of the per-repetition ratios behind `patch_over_python_loop`.
    pub patch_over_python_loop_quartiles: Option<[f64; 2]>,
    /// Peak resident set of this process over the whole benchmark.
    pub peak_rss_bytes: u64,
}

/// The fewest dense repetitions `bench classify` runs unless told a number: a dense run takes
/// milliseconds, so many more cost little and steady the median against a noisy machine.
pub const DENSE_MIN_REPEAT: usize = 51;

/// Settings of `bench classify`.
#[derive(Debug, Clone)]
pub struct ClassifyBenchOptions {
    /// The job template (mode and batch are set per measurement).
    pub spec: JobSpec,
    /// Patch batch size.
    pub patch_batch: usize,
    /// Dense tiles per batch.
    pub dense_batch: usize,
    /// Repetitions of patch mode.
    pub repeat: usize,
    /// Repetitions of dense mode; `None`: `repeat`, and at least [`DENSE_MIN_REPEAT`].
    pub dense_repeat: Option<usize>,
    /// Python interpreter for the baseline, `None` to skip it.
    pub python: Option<String>,
    /// The baseline script (`benches/ort_patch_loop.py` in the source tree).
    pub script: PathBuf,
    /// Time only this mode (patch mode takes minutes on large scenes); `None`: both.
    pub only: Option<Mode>,
}

/// Builds every batch of a run on this thread and hands each to `f` (stopping when it returns
/// `false`), its buffer going back to `pool` as a run's would. The pool is reopened at the run's
/// own limit, so the buffers the next end-to-end run reuses stay resident.
fn each_batch(
    cube: &Cube,
    manifest: &Manifest,
    run: &RunOptions,
    pool: &pipeline::BufferPool,
    mut f: impl FnMut(&Batch) -> bool,
) {
    pool.reopen(pipeline::buffer_limit(cube, manifest, run));
    let target = std::sync::atomic::AtomicUsize::new(run.batch);
    // A mapped scene has no source to fail.
    let _ = pipeline::produce_with(
        pipeline::Input::Mapped(cube),
        manifest,
        run,
        &target,
        Some(pool),
        |b: Batch| {
            let go = f(&b);
            pool.give(b.data);
            go
        },
    );
}

/// What [`time_mode`] measured.
struct Timed {
    result: ModeResult,
    pixels: usize,
    /// The Python baseline and hsiedge's end to end over it (median and quartiles of the
    /// per-repetition ratios).
    python: Option<(PythonBaseline, (f64, [f64; 2]))>,
    has_dense: bool,
}

/// The median and quartiles of the ratios `a[i] / b[i]` of paired samples.
fn ratio_summary(a: &[f64], b: &[f64]) -> (f64, [f64; 2]) {
    let r: Vec<f64> = a.iter().zip(b).map(|(a, b)| a / b.max(1e-12)).collect();
    (median(&r), quartiles(&r))
}

/// The lower and upper quartiles of `v` (nearest rank); zeros for an empty slice.
pub fn quartiles(v: &[f64]) -> [f64; 2] {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let at = |q: usize| {
        s.get((s.len() * q / 4).min(s.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0.0)
    };
    [at(1), at(3)]
}

/// Times `mode`: each repetition runs end to end, then the same batches' pure inference, then the
/// tiling alone (and the Python loop, when given), so every ratio compares samples taken under
/// the same machine conditions, not two blocks of runs minutes apart on a drifting shared machine.
fn time_mode(
    opts: &ClassifyBenchOptions,
    mode: Mode,
    batch: usize,
    repeat: usize,
    python: Option<&str>,
) -> Result<Timed, BenchError> {
    let tmp = tempfile::tempdir().map_err(BenchError::Temp)?;
    let spec = JobSpec {
        mode: ModeChoice::Fixed(mode),
        batch: BatchChoice::Fixed(batch),
        out: tmp.path().join("out"),
        labels: None,
        ..opts.spec.clone()
    };
    let mut job = Job::resolve(spec)?;
    // One untimed run warms the session's arena and kernels.
    let (maps, stats) = job.infer(&mut |_| {})?;
    job.write(&maps, &stats)?;
    // Started on the resolved job, so a bad scene or model is reported once, by hsiedge.
    let mut python = match python {
        Some(py) => Some(PythonLoop::start(py, &opts.script, &job, batch)?),
        None => None,
    };
    let (mut e2e, mut waits, mut writes, mut inf, mut tiling) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut reps = Vec::new();
    let mut batches = 0;
    let mut device_io = None;
    for _ in 0..repeat {
        let t = Instant::now();
        let (maps, stats) = job.infer(&mut |_| {})?;
        let w = Instant::now();
        job.write(&maps, &stats)?;
        e2e.push(t.elapsed().as_secs_f64());
        writes.push(w.elapsed().as_secs_f64());
        waits.push(stats.wait_s);
        if let Some(pure) = job.device_pure_inference(stats.batches)? {
            // On the device path the input never exists on the host: pure inference is as many
            // session runs on the bound device buffers, back to back with nothing between them.
            inf.push(pure);
            batches = stats.batches;
            let t = Instant::now();
            each_batch(&job.cube, &job.manifest, &job.run, &job.buffers, |_| true);
            tiling.push(t.elapsed().as_secs_f64());
            if let Some(py) = python.as_mut() {
                reps.push(py.rep()?);
            }
            device_io = job.device_io();
            continue;
        }
        // The same batches, produced on this thread with only `run` inside the clock, so holding
        // every batch in memory at once is not needed.
        let mut spent = std::time::Duration::ZERO;
        let mut failed = None;
        batches = 0;
        let (cube, manifest, run, graph) = (&job.cube, &job.manifest, &job.run, &mut job.graph);
        each_batch(cube, manifest, run, &job.buffers, |b| {
            let t = Instant::now();
            if let Err(e) = graph.run(&b.data, &b.shape) {
                failed = Some(e);
                return false;
            }
            spent += t.elapsed();
            batches += 1;
            true
        });
        if let Some(e) = failed {
            return Err(BenchError::Job(JobError::Engine(e)));
        }
        inf.push(spent.as_secs_f64());
        let t = Instant::now();
        each_batch(&job.cube, &job.manifest, &job.run, &job.buffers, |_| true);
        tiling.push(t.elapsed().as_secs_f64());
        if let Some(py) = python.as_mut() {
            reps.push(py.rep()?);
        }
    }
    let pixels = stats.pixels;
    let (e2e_over_inference, e2e_over_inference_quartiles) = ratio_summary(&e2e, &inf);
    let result = ModeResult {
        mode,
        batch,
        tile: stats.tile_shape,
        batches,
        end_to_end_s: median(&e2e),
        inference_s: median(&inf),
        tiling_s: median(&tiling),
        wait_s: median(&waits),
        write_s: median(&writes),
        pixels_per_s: pixels as f64 / median(&e2e).max(1e-12),
        e2e_over_inference,
        e2e_over_inference_quartiles,
        end_to_end_samples_s: e2e,
        inference_samples_s: inf,
        device_io,
    };
    let python = python.map(|py| {
        let run: Vec<f64> = reps.iter().map(|r| r.run_loop_s).collect();
        let gather: Vec<f64> = reps.iter().map(|r| r.with_gather_s).collect();
        let ratio = ratio_summary(&result.end_to_end_samples_s, &run);
        let baseline = PythonBaseline {
            run_loop_s: median(&run),
            with_gather_s: median(&gather),
            run_loop_samples_s: run,
            onnxruntime: py.onnxruntime.clone(),
        };
        (baseline, ratio)
    });
    Ok(Timed {
        result,
        pixels,
        python,
        has_dense: job.manifest.files.dense.is_some(),
    })
}

/// Runs `bench classify`.
pub fn classify(opts: &ClassifyBenchOptions) -> Result<ClassifyBench, BenchError> {
    let dense_repeat = opts.dense_repeat.unwrap_or(opts.repeat.max(DENSE_MIN_REPEAT)).max(1);
    let mut pixels = 0;
    let mut has_dense = None;
    let mut patch_over_python_loop = None;
    let mut patch_over_python_loop_quartiles = None;
    let (patch, python) = if opts.only == Some(Mode::Dense) {
        (None, None)
    } else {
        let t = time_mode(opts, Mode::Patch, opts.patch_batch, opts.repeat, opts.python.as_deref())?;
        pixels = t.pixels;
        has_dense = Some(t.has_dense);
        let python = t.python.map(|(baseline, (ratio, q))| {
            patch_over_python_loop = Some(ratio);
            patch_over_python_loop_quartiles = Some(q);
            baseline
        });
        let patch = t.result;
        (Some(patch), python)
    };
    let dense = if opts.only != Some(Mode::Patch) && has_dense != Some(false) {
        let t = time_mode(opts, Mode::Dense, opts.dense_batch, dense_repeat, None)?;
        pixels = t.pixels;
        Some(t.result)
    } else {
        None
    };
    let ratio = |a: Option<f64>, b: Option<f64>| a.zip(b).map(|(a, b)| a / b);
    Ok(ClassifyBench {
        scene: opts.spec.scene.clone(),
        model: opts.spec.manifest.display().to_string(),
        pixels,
        repeat: opts.repeat,
        dense_repeat,
        threads: opts.spec.engine.threads,
        dense_over_patch: ratio(
            dense.as_ref().map(|d| d.pixels_per_s),
            patch.as_ref().map(|p| p.pixels_per_s),
        ),
        patch_e2e_over_inference: patch.as_ref().map(|p| p.e2e_over_inference),
        dense_e2e_over_inference: dense.as_ref().map(|d| d.e2e_over_inference),
        patch_over_python_loop,
        patch_over_python_loop_quartiles,
        patch,
        dense,
        python,
        peak_rss_bytes: crate::job::peak_rss_bytes(),
    })
}

impl std::fmt::Display for ClassifyBench {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "scene {} ({} pixels), model {}, {} repeats (dense {}), threads {}",
            self.scene.display(),
            self.pixels,
            self.model,
            self.repeat,
            self.dense_repeat,
            self.threads
        )?;
        writeln!(
            f,
            "{:<7} {:>6} {:>9} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}",
            "mode", "batch", "tile", "e2e s", "infer s", "tiling s", "wait s", "write s", "px/s"
        )?;
        for m in self.patch.iter().chain(self.dense.as_ref()) {
            writeln!(
                f,
                "{:<7} {:>6} {:>9} {:>10.4} {:>10.4} {:>10.4} {:>10.4} {:>10.4} {:>10.0}",
                format!("{:?}", m.mode).to_lowercase(),
                m.batch,
                format!("{}x{}", m.tile.0, m.tile.1),
                m.end_to_end_s,
                m.inference_s,
                m.tiling_s,
                m.wait_s,
                m.write_s,
                m.pixels_per_s
            )?;
        }
        if let Some(p) = &self.python {
            writeln!(
                f,
                "python onnxruntime {} patch loop: run {:.4} s, with window copy {:.4} s",
                p.onnxruntime, p.run_loop_s, p.with_gather_s
            )?;
        }
        if let Some(r) = self.dense_over_patch {
            writeln!(f, "dense / patch throughput:            {r:.1}x")?;
        }
        let q = |q: Option<[f64; 2]>| {
            q.map(|[a, b]| format!(" (quartiles {a:.3}-{b:.3})"))
                .unwrap_or_default()
        };
        if let Some(r) = self.patch_e2e_over_inference {
            let qs = self.patch.as_ref().map(|p| p.e2e_over_inference_quartiles);
            writeln!(f, "patch end-to-end / pure inference:   {r:.3}{}", q(qs))?;
        }
        if let Some(r) = self.dense_e2e_over_inference {
            let qs = self.dense.as_ref().map(|d| d.e2e_over_inference_quartiles);
            writeln!(f, "dense end-to-end / pure inference:   {r:.3}{}", q(qs))?;
        }
        if let Some(r) = self.patch_over_python_loop {
            writeln!(
                f,
                "patch end-to-end / python run loop:  {r:.3}{}",
                q(self.patch_over_python_loop_quartiles)
            )?;
        }
        write!(f, "peak RSS {:.1} MiB", self.peak_rss_bytes as f64 / 1048576.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_quartiles_are_nearest_rank_and_bracket_each_other() {
        let v = [5.0, 1.0, 4.0, 2.0, 3.0, 8.0, 7.0, 6.0];
        assert_eq!(median(&v), 5.0);
        assert_eq!(quartiles(&v), [3.0, 7.0]);
        assert_eq!(quartiles(&[2.0]), [2.0, 2.0]);
        assert_eq!(quartiles(&[]), [0.0, 0.0]);
        // Ratios 2.0, 1.5, 2.0.
        let (a, b) = ([2.0, 3.0, 8.0], [1.0, 2.0, 4.0]);
        assert_eq!(ratio_summary(&a, &b), (2.0, [1.5, 2.0]));
    }
}
