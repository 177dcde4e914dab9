//! One classification (or unmixing) job: settings parsed and validated without I/O
//! ([`JobSpec::validate`]), resolved into runtime objects ([`Job::resolve`]), run, and written.

use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::cube::{Cube, CubeError};
use crate::engine::{EngineError, EngineOptions, Graph, Runtime};
use crate::map::{MapError, Staged, Written};
use crate::model::{Manifest, ModelError, Role, Task};
use crate::pipeline::{self, Maps, Mode, PipelineError, RunOptions, RunStats};

/// Default patches per batch when `--batch auto` has no memory budget to go by.
pub const DEFAULT_PATCH_BATCH: usize = 256;
/// Default tiles per batch in dense mode.
pub const DEFAULT_DENSE_BATCH: usize = 1;
/// Default tile side.
pub const DEFAULT_TILE: usize = 64;

/// Errors of a job, each naming what failed.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    /// A setting could not be parsed.
    #[error("invalid value `{value}` for {name}: {message}")]
    Setting {
        /// The setting (`--batch`, ...).
        name: &'static str,
        /// The value given.
        value: String,
        /// What is accepted.
        message: String,
    },
    /// The scene.
    #[error(transparent)]
    Cube(#[from] CubeError),
    /// The model.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// ONNX Runtime.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// The run.
    #[error(transparent)]
    Pipeline(#[from] PipelineError),
    /// Writing outputs.
    #[error(transparent)]
    Map(#[from] MapError),
    /// A label map does not fit the scene.
    #[error("{path}: label map is {got_lines} x {got_samples}, scene is {lines} x {samples}")]
    Labels {
        /// The label map.
        path: PathBuf,
        /// Its lines.
        got_lines: usize,
        /// Its samples.
        got_samples: usize,
        /// Scene lines.
        lines: usize,
        /// Scene samples.
        samples: usize,
    },
}

/// `--mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModeChoice {
    /// Dense when the model has a dense twin, else patch.
    Auto,
    /// Force one mode.
    Fixed(Mode),
}

/// `--batch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchChoice {
    /// Chosen by the runtime.
    Auto,
    /// Exactly this many.
    Fixed(usize),
}

/// A job as given by the user, validated but not yet touching any file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobSpec {
    /// The scene's header or data file.
    pub scene: PathBuf,
    /// The model manifest.
    pub manifest: PathBuf,
    /// Output folder.
    pub out: PathBuf,
    /// Execution mode.
    pub mode: ModeChoice,
    /// Batch size.
    pub batch: BatchChoice,
    /// Tile side.
    pub tile: usize,
    /// Engine settings.
    pub engine: EngineOptions,
    /// Optional reference label map for accuracy.
    pub labels: Option<PathBuf>,
    /// Keep every output channel in `scores.img`.
    pub keep_scores: bool,
}

/// Parses `auto|dense|patch`.
pub fn parse_mode(s: &str) -> Result<ModeChoice, JobError> {
    match s {
        "auto" => Ok(ModeChoice::Auto),
        "dense" => Ok(ModeChoice::Fixed(Mode::Dense)),
        "patch" => Ok(ModeChoice::Fixed(Mode::Patch)),
        _ => Err(JobError::Setting {
            name: "--mode",
            value: s.into(),
            message: "expected auto, dense or patch".into(),
        }),
    }
}

/// Parses `auto|N` with N >= 1.
pub fn parse_batch(s: &str) -> Result<BatchChoice, JobError> {
    if s == "auto" {
        return Ok(BatchChoice::Auto);
    }
    match s.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(BatchChoice::Fixed(n)),
        _ => Err(JobError::Setting {
            name: "--batch",
            value: s.into(),
            message: "expected auto or a whole number >= 1".into(),
        }),
    }
}

impl JobSpec {
    /// Validates settings that need no I/O.
    pub fn validate(&self) -> Result<(), JobError> {
        if self.tile == 0 {
            return Err(JobError::Setting {
                name: "--tile",
                value: "0".into(),
                message: "expected a tile side >= 1".into(),
            });
        }
        Ok(())
    }
}

/// A resolved job: scene mapped, manifest loaded, graph built.
#[derive(Debug)]
pub struct Job {
    /// What was asked.
    pub spec: JobSpec,
    /// The scene.
    pub cube: Cube,
    /// The model.
    pub manifest: Manifest,
    /// The runtime.
    pub runtime: Runtime,
    /// The graph for the chosen mode.
    pub graph: Graph,
    /// Settings of the pipeline.
    pub run: RunOptions,
    /// Seconds spent resolving (mapping, loading ONNX Runtime, building the session).
    pub load_s: f64,
}

impl Job {
    /// Opens the scene and the model, checks them against each other, and builds the session.
    pub fn resolve(spec: JobSpec) -> Result<Self, JobError> {
        spec.validate()?;
        let t0 = Instant::now();
        let manifest = Manifest::load(&spec.manifest)?;
        let cube = Cube::open(&spec.scene)?;
        let mode = match spec.mode {
            ModeChoice::Fixed(m) => m,
            ModeChoice::Auto if manifest.files.dense.is_some() => Mode::Dense,
            ModeChoice::Auto => Mode::Patch,
        };
        let batch = match (spec.batch, mode) {
            (BatchChoice::Fixed(n), _) => n,
            (BatchChoice::Auto, Mode::Patch) => DEFAULT_PATCH_BATCH,
            (BatchChoice::Auto, Mode::Dense) => DEFAULT_DENSE_BATCH,
        };
        let run = RunOptions {
            mode,
            batch,
            tile: spec.tile,
            queue: 2,
            keep_scores: spec.keep_scores || manifest.task == Task::Abundance,
        };
        pipeline::check(&cube, &manifest, &run)?;
        let runtime = Runtime::new(spec.engine.clone())?;
        let graph = match mode {
            Mode::Patch => runtime.graph(&manifest, Role::Patch, &manifest.patch_path())?,
            Mode::Dense => {
                let path = manifest.dense_path().ok_or_else(|| PipelineError::NoDense {
                    manifest: manifest.path.clone(),
                })?;
                runtime.graph(&manifest, Role::Dense, &path)?
            }
        };
        Ok(Self {
            spec,
            cube,
            manifest,
            runtime,
            graph,
            run,
            load_s: t0.elapsed().as_secs_f64(),
        })
    }

    /// Runs the pipeline; `progress` gets pixels done.
    pub fn infer(&mut self, progress: &mut dyn FnMut(usize)) -> Result<(Maps, RunStats), JobError> {
        Ok(pipeline::run(
            &self.cube,
            &self.manifest,
            &mut self.graph,
            &self.run,
            progress,
        )?)
    }

    /// Writes the maps and `summary.json` atomically into the output folder and returns the summary.
    pub fn write(&self, maps: &Maps, stats: &RunStats) -> Result<Summary, JobError> {
        let t0 = Instant::now();
        let accuracy = match &self.spec.labels {
            Some(p) => Some(accuracy(maps, p)?),
            None => None,
        };
        let mut staged = Staged::new(&self.spec.out)?;
        let written = crate::map::stage_maps(&mut staged, maps, &self.manifest, self.cube.header())?;
        let mut summary = Summary {
            scene: self.cube.header_path().to_path_buf(),
            model: self.manifest.name.clone(),
            task: self.manifest.task,
            mode: self.run.mode,
            batch: self.run.batch,
            tile: stats.tile_shape,
            tiles: stats.tiles,
            batches: stats.batches,
            pixels: stats.pixels,
            elapsed_s: stats.elapsed_s,
            pixels_per_s: stats.pixels as f64 / stats.elapsed_s.max(1e-9),
            inference_s: stats.inference_s,
            wait_s: stats.wait_s,
            first_batch_s: stats.first_batch_s,
            load_s: self.load_s,
            write_s: 0.0,
            provider: self.runtime.provider().ort_name().into(),
            ort_library: self.runtime.location().path.clone(),
            threads: self.spec.engine.threads,
            peak_rss_bytes: peak_rss_bytes(),
            class_map: written.class_map.clone(),
            confidence_map: written.confidence_map.clone(),
            scores_map: written.scores_map.clone(),
            quicklook: written.quicklook.clone(),
            accuracy,
        };
        summary.write_s = t0.elapsed().as_secs_f64();
        let json = serde_json::to_vec_pretty(&summary).unwrap_or_default();
        staged.add("summary.json", &json)?;
        staged.commit()?;
        Ok(summary)
    }
}

/// Agreement of a class map with a reference label map.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Accuracy {
    /// The label map.
    pub labels: PathBuf,
    /// Pixels with a non-zero label.
    pub labelled_pixels: usize,
    /// Of those, predicted correctly.
    pub correct: usize,
    /// Overall accuracy, `correct / labelled_pixels`.
    pub overall_accuracy: f64,
}

/// Compares `maps` with the ENVI label map at `path` over its labelled (non-zero) pixels.
pub fn accuracy(maps: &Maps, path: &Path) -> Result<Accuracy, JobError> {
    let cube = Cube::open(path)?;
    if cube.lines() != maps.lines || cube.samples() != maps.samples {
        return Err(JobError::Labels {
            path: path.to_path_buf(),
            got_lines: cube.lines(),
            got_samples: cube.samples(),
            lines: maps.lines,
            samples: maps.samples,
        });
    }
    let labels = cube.read_all();
    let (mut n, mut ok) = (0usize, 0usize);
    for (truth, pred) in labels.iter().zip(&maps.class_ids) {
        if *truth > 0.0 {
            n += 1;
            if (*truth - f32::from(*pred)).abs() < 0.5 {
                ok += 1;
            }
        }
    }
    Ok(Accuracy {
        labels: path.to_path_buf(),
        labelled_pixels: n,
        correct: ok,
        overall_accuracy: if n == 0 { 0.0 } else { ok as f64 / n as f64 },
    })
}

/// The process's peak resident set (`VmHWM`), 0 where `/proc` is unavailable.
pub fn peak_rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse::<u64>().ok()))
        })
        .map_or(0, |kib| kib * 1024)
}

/// What a job did, as written to `summary.json` and printed by `--json`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Summary {
    /// Scene header.
    pub scene: PathBuf,
    /// Model name.
    pub model: String,
    /// Task.
    pub task: Task,
    /// Mode used.
    pub mode: Mode,
    /// Batch used (patches or tiles).
    pub batch: usize,
    /// Tile shape (lines, samples).
    pub tile: (usize, usize),
    /// Tiles in the grid.
    pub tiles: usize,
    /// Batches run.
    pub batches: usize,
    /// Pixels written.
    pub pixels: usize,
    /// Pipeline wall time (read, tile, infer, stitch).
    pub elapsed_s: f64,
    /// `pixels / elapsed_s`.
    pub pixels_per_s: f64,
    /// Time inside the engine.
    pub inference_s: f64,
    /// Time the engine waited for input.
    pub wait_s: f64,
    /// Time to the first batch's result.
    pub first_batch_s: f64,
    /// Time to open scene and model and build the session.
    pub load_s: f64,
    /// Time to write the maps.
    pub write_s: f64,
    /// Execution provider.
    pub provider: String,
    /// The ONNX Runtime library used.
    pub ort_library: PathBuf,
    /// Intra-op threads (0 = ONNX Runtime default).
    pub threads: usize,
    /// Peak resident set of the process.
    pub peak_rss_bytes: u64,
    /// Class map path.
    pub class_map: Option<PathBuf>,
    /// Confidence map path.
    pub confidence_map: Option<PathBuf>,
    /// Abundance/score map path.
    pub scores_map: Option<PathBuf>,
    /// Quick-look path.
    pub quicklook: PathBuf,
    /// Accuracy against `--labels`.
    pub accuracy: Option<Accuracy>,
}

impl Summary {
    /// The written map paths.
    pub fn written(&self) -> Written {
        Written {
            class_map: self.class_map.clone(),
            confidence_map: self.confidence_map.clone(),
            scores_map: self.scores_map.clone(),
            quicklook: self.quicklook.clone(),
        }
    }
}
