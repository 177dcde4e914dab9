//! Benchmarks run by `hsiedge bench`: medians of repeated runs, and ratios against baselines
//! measured in the same invocation.
//!
//! `classify` times, on one scene and model: patch and dense mode end to end (read, tile, infer,
//! stitch, write), the pure inference time of exactly the batches each mode sends, and optionally a
//! bare onnxruntime Python loop over the same patches and batch size (`benches/ort_patch_loop.py`).

use std::path::{Path, PathBuf};
use std::time::Instant;

pub mod sweep;

use crate::cube::Cube;
use crate::job::{BatchChoice, Job, JobError, JobSpec, ModeChoice};
use crate::model::Manifest;
use crate::pipeline::{self, Batch, Mode, RunOptions};

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
    /// A temporary output folder could not be made.
    #[error("temporary folder: {0}")]
    Temp(std::io::Error),
    /// A benchmark setting is out of range or does not fit the model.
    #[error("{0}")]
    Setting(String),
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
    /// Every end-to-end sample.
    pub end_to_end_samples_s: Vec<f64>,
    /// Every inference sample.
    pub inference_samples_s: Vec<f64>,
}

/// The Python baseline's result.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct PythonBaseline {
    /// Median seconds of the bare `sess.run` loop over all patch batches.
    pub run_loop_s: f64,
    /// Median seconds including the peer-style per-pixel window copy into each batch.
    pub with_gather_s: f64,
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
    /// Repetitions per measurement.
    pub repeat: usize,
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
    /// Patch end-to-end time over its pure inference time.
    pub patch_e2e_over_inference: Option<f64>,
    /// Dense end-to-end time over its pure inference time.
    pub dense_e2e_over_inference: Option<f64>,
    /// hsiedge patch end-to-end time over the Python bare loop time (1.0 = equal; below is faster).
    pub patch_over_python_loop: Option<f64>,
    /// Peak resident set of this process over the whole benchmark.
    pub peak_rss_bytes: u64,
}

/// Settings of `bench classify`.
#[derive(Debug, Clone)]
pub struct ClassifyBenchOptions {
    /// The job template (mode and batch are set per measurement).
    pub spec: JobSpec,
    /// Patch batch size.
    pub patch_batch: usize,
    /// Dense tiles per batch.
    pub dense_batch: usize,
    /// Repetitions.
    pub repeat: usize,
    /// Python interpreter for the baseline, `None` to skip it.
    pub python: Option<String>,
    /// The baseline script (`benches/ort_patch_loop.py` in the source tree).
    pub script: PathBuf,
    /// Time only this mode (patch mode takes minutes on large scenes); `None`: both.
    pub only: Option<Mode>,
}

/// Builds every batch of a run on this thread and hands each to `f` (stopping when it returns
/// `false`), its buffer going back to `pool` (the job's, reopened for two), as a run's would.
fn each_batch(
    cube: &Cube,
    manifest: &Manifest,
    run: &RunOptions,
    pool: &pipeline::BufferPool,
    mut f: impl FnMut(&Batch) -> bool,
) {
    pool.reopen(2);
    let target = std::sync::atomic::AtomicUsize::new(run.batch);
    pipeline::produce_with(cube, manifest, run, &target, Some(pool), |b: Batch| {
        let go = f(&b);
        pool.give(b.data);
        go
    });
}

fn time_mode(opts: &ClassifyBenchOptions, mode: Mode, batch: usize) -> Result<(ModeResult, usize, Job), BenchError> {
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
    let (mut e2e, mut waits, mut writes) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..opts.repeat {
        let t = Instant::now();
        let (maps, stats) = job.infer(&mut |_| {})?;
        let w = Instant::now();
        job.write(&maps, &stats)?;
        e2e.push(t.elapsed().as_secs_f64());
        writes.push(w.elapsed().as_secs_f64());
        waits.push(stats.wait_s);
    }
    // The same batches again, produced on this thread with only `run` inside the clock, so holding
    // every batch in memory at once is not needed.
    let mut inf = Vec::new();
    let mut batches = 0;
    for _ in 0..opts.repeat {
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
    }
    let mut tiling = Vec::new();
    for _ in 0..opts.repeat {
        let t = Instant::now();
        each_batch(&job.cube, &job.manifest, &job.run, &job.buffers, |_| true);
        tiling.push(t.elapsed().as_secs_f64());
    }
    let pixels = stats.pixels;
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
        end_to_end_samples_s: e2e,
        inference_samples_s: inf,
    };
    Ok((result, pixels, job))
}

fn python_baseline(
    python: &str,
    script: &Path,
    job: &Job,
    batch: usize,
    repeat: usize,
) -> Result<PythonBaseline, BenchError> {
    let args: Vec<String> = vec![
        script.display().to_string(),
        "--manifest".into(),
        job.manifest.path.display().to_string(),
        "--scene".into(),
        job.cube.header_path().display().to_string(),
        "--batch".into(),
        batch.to_string(),
        "--threads".into(),
        job.spec.engine.threads.to_string(),
        "--repeat".into(),
        repeat.to_string(),
        "--spin".into(),
        u8::from(job.spec.engine.spin).to_string(),
    ];
    let command = format!("{python} {}", args.join(" "));
    let err = |message: String| BenchError::Baseline {
        command: command.clone(),
        message,
    };
    let out = std::process::Command::new(python)
        .args(&args)
        .output()
        .map_err(|e| err(e.to_string()))?;
    if !out.status.success() {
        return Err(err(String::from_utf8_lossy(&out.stderr).into_owned()));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| err(format!("{e}: {}", String::from_utf8_lossy(&out.stdout))))
}

/// Runs `bench classify`.
pub fn classify(opts: &ClassifyBenchOptions) -> Result<ClassifyBench, BenchError> {
    let mut pixels = 0;
    let mut has_dense = None;
    let (patch, python) = if opts.only == Some(Mode::Dense) {
        (None, None)
    } else {
        let (patch, px, job) = time_mode(opts, Mode::Patch, opts.patch_batch)?;
        pixels = px;
        has_dense = Some(job.manifest.files.dense.is_some());
        let python = match &opts.python {
            Some(py) => Some(python_baseline(py, &opts.script, &job, opts.patch_batch, opts.repeat)?),
            None => None,
        };
        (Some(patch), python)
    };
    let dense = if opts.only != Some(Mode::Patch) && has_dense != Some(false) {
        let (d, px, _) = time_mode(opts, Mode::Dense, opts.dense_batch)?;
        pixels = px;
        Some(d)
    } else {
        None
    };
    let ratio = |a: Option<f64>, b: Option<f64>| a.zip(b).map(|(a, b)| a / b);
    Ok(ClassifyBench {
        scene: opts.spec.scene.clone(),
        model: opts.spec.manifest.display().to_string(),
        pixels,
        repeat: opts.repeat,
        threads: opts.spec.engine.threads,
        dense_over_patch: ratio(
            dense.as_ref().map(|d| d.pixels_per_s),
            patch.as_ref().map(|p| p.pixels_per_s),
        ),
        patch_e2e_over_inference: patch.as_ref().map(|p| p.end_to_end_s / p.inference_s),
        dense_e2e_over_inference: dense.as_ref().map(|d| d.end_to_end_s / d.inference_s),
        patch_over_python_loop: ratio(
            patch.as_ref().map(|p| p.end_to_end_s),
            python.as_ref().map(|p| p.run_loop_s),
        ),
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
            "scene {} ({} pixels), model {}, {} repeats, threads {}",
            self.scene.display(),
            self.pixels,
            self.model,
            self.repeat,
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
        if let Some(r) = self.patch_e2e_over_inference {
            writeln!(f, "patch end-to-end / pure inference:   {r:.3}")?;
        }
        if let Some(r) = self.dense_e2e_over_inference {
            writeln!(f, "dense end-to-end / pure inference:   {r:.3}")?;
        }
        if let Some(r) = self.patch_over_python_loop {
            writeln!(f, "patch end-to-end / python run loop:  {r:.3}")?;
        }
        write!(f, "peak RSS {:.1} MiB", self.peak_rss_bytes as f64 / 1048576.0)
    }
}
