//! One classification (or unmixing) job: settings parsed and validated without I/O
//! ([`JobSpec::validate`]), resolved into runtime objects ([`Job::resolve`]), run, and written.

use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::budget::{self, Adjustment, BudgetConfig, BudgetError, Calibration, ChooseConfig, CostModel, Plan, Unit};
use crate::cube::{Cube, CubeError};
use crate::engine::{EngineError, EngineOptions, Graph, Runtime};
use crate::graph::{self, GraphError, ShapeBindings};
use crate::map::{MapError, MapShape, Staged};
use crate::model::{Manifest, ModelError, Role, Task};
use crate::pipeline::{self, Maps, Mode, PipelineError, RunOptions, RunStats};

/// Patches per batch when `hsiedge bench` is given none, and where `--batch auto` starts before
/// its memory plan (budget, calibration, cached sweep) sets the batch. A 32-patch batch (3 MB for
/// Salinas-A) is still in cache when the engine reads what the tiling thread wrote: patch mode
/// runs within 3 % of pure inference there, 8 % at 256.
pub const DEFAULT_PATCH_BATCH: usize = 32;
/// Default tiles per batch in dense mode.
pub const DEFAULT_DENSE_BATCH: usize = 1;
/// Default tile side (the grid splits a scene into equal tiles no larger than this).
pub const DEFAULT_TILE: usize = 64;

/// Batches the tiling thread may hold ready ahead of the engine. One is enough to hide tiling
/// (the tiling thread runs in the engine's idle gaps and is rarely further ahead), and every
/// extra batch in flight is memory the budget must set aside.
pub const QUEUE_DEPTH: usize = 1;

/// How often a run samples its anonymous memory for the summary's peak.
const PEAK_SAMPLE_PERIOD: std::time::Duration = std::time::Duration::from_millis(2);

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
    /// A file could not be read.
    #[error("reading {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The memory budget (including "not even batch 1 fits").
    #[error("memory budget")]
    Budget(#[from] BudgetError),
    /// The graph could not be sized for the budget.
    #[error("sizing the graph for the memory budget")]
    Graph(#[from] GraphError),
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
    /// A label map of the wrong kind.
    #[error(transparent)]
    LabelsKind(#[from] LabelsError),
}

/// A label map that cannot be scored against this job's maps.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {field}: {message}")]
pub struct LabelsError {
    /// The label map.
    pub path: PathBuf,
    /// The header field or setting at fault.
    pub field: &'static str,
    /// Why.
    pub message: String,
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
#[derive(Debug, Clone, PartialEq)]
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
    /// How `--batch auto` is bounded.
    pub budget: BudgetSettings,
}

/// Settings of the memory budget behind `--batch auto`.
#[derive(Debug, Clone, PartialEq)]
pub struct BudgetSettings {
    /// Root of `/proc` and `/sys` (`/` except in tests).
    pub root: PathBuf,
    /// Bytes left to the rest of the system.
    pub reserve_bytes: u64,
    /// Share of the budget kept for allocator fragmentation.
    pub frag_margin: f64,
    /// Largest batch ever chosen (units).
    pub max_units: u64,
    /// Batches between budget re-reads while running.
    pub check_every: u64,
    /// Adapt the batch while running.
    pub adapt: bool,
    /// Folder of cached batch sweeps whose plateau knee caps the batch (`None`: no cap).
    pub sweep_cache: Option<PathBuf>,
}

impl BudgetSettings {
    /// Checks the ranges (no I/O), naming the command-line flag of a value out of range.
    pub fn validate(&self) -> Result<(), JobError> {
        let bad = |name: &'static str, value: String, message: &str| {
            Err(JobError::Setting {
                name,
                value,
                message: message.into(),
            })
        };
        if !(0.0..1.0).contains(&self.frag_margin) {
            return bad(
                "--frag-margin",
                self.frag_margin.to_string(),
                "expected a share in [0, 1)",
            );
        }
        if self.max_units == 0 {
            return bad("--max-batch", "0".into(), "expected a whole number >= 1");
        }
        if self.check_every == 0 {
            return bad("check_every", "0".into(), "expected a whole number >= 1");
        }
        Ok(())
    }
}

impl Default for BudgetSettings {
    fn default() -> Self {
        Self {
            root: PathBuf::from("/"),
            reserve_bytes: budget::DEFAULT_RESERVE_BYTES,
            frag_margin: 0.10,
            max_units: 8192,
            check_every: 1,
            adapt: true,
            sweep_cache: None,
        }
    }
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
        self.budget.validate()
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
    /// The memory plan behind `--batch auto`.
    pub plan: Option<AutoBatch>,
    adjustments: Vec<Adjustment>,
    peak_anon_bytes: u64,
    /// Batch buffers kept from run to run (the next run starts with them resident).
    pub buffers: pipeline::BufferPool,
    /// The reference label map (`--labels`), opened and checked when the job is resolved.
    labels: Option<Cube>,
    /// The output set of the last run, its headers staged while it ran.
    staged: Option<Staged>,
    /// Unlinking the files the last write replaced.
    unlinking: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Job {
    fn drop(&mut self) {
        if let Some(h) = self.unlinking.take() {
            let _ = h.join();
        }
    }
}

/// How `--batch auto` chose: the calibrated cost, the plan, the budget sources.
#[derive(Debug, Clone, serde::Serialize)]
pub struct AutoBatch {
    /// The plan (budget sources, which binds, cost breakdown, `batch_safe`, predicted peak).
    pub plan: Plan,
    /// The measured runs the cost was fitted to.
    pub calibration: Option<Calibration>,
    /// Bytes per unit the pipeline adds besides one run (queued input batches), at `batch_safe`.
    pub pipeline_bytes_per_unit: u64,
    /// Bytes per unit of one run (its input, the engine's activations and workspaces, its output).
    pub run_bytes_per_unit: u64,
    /// Fixed bytes the pipeline adds (maps, tile window).
    pub pipeline_fixed_bytes: u64,
    /// The cached sweep whose knee capped the batch, when one applied.
    pub knee_file: Option<PathBuf>,
}

impl Job {
    /// Opens the scene and the model, checks them against each other, and builds the session.
    pub fn resolve(spec: JobSpec) -> Result<Self, JobError> {
        spec.validate()?;
        // Made first, so a folder that cannot be made fails the job before the scene is read.
        std::fs::create_dir_all(&spec.out).map_err(|source| MapError::Io {
            path: spec.out.clone(),
            source,
        })?;
        let t0 = Instant::now();
        let manifest = Manifest::load(&spec.manifest)?;
        let cube = Cube::open(&spec.scene)?;
        for w in cube.warnings() {
            eprintln!("hsiedge: warning: {w}");
        }
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
        let mut run = RunOptions {
            mode,
            batch,
            tile: spec.tile,
            queue: QUEUE_DEPTH,
            keep_scores: spec.keep_scores || manifest.task == Task::Abundance,
            producer_nice: spec.engine.producer_nice,
        };
        pipeline::check(&cube, &manifest, &run)?;
        let labels = match &spec.labels {
            Some(p) => Some(open_labels(p, cube.lines(), cube.samples(), manifest.task)?),
            None => None,
        };
        // A batch larger than the scene holds only empty room (and `--batch 100000000` would
        // ask the allocator for it up front).
        run.batch = run.batch.min(pipeline::units(&cube, &manifest, &run).max(1));
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
        let mut graph = graph;
        let plan = match spec.batch {
            BatchChoice::Auto => {
                let knee = cached_knee(&manifest, &graph, mode, &run, &spec.engine, &runtime, &spec.budget);
                let auto = auto_batch(
                    &SceneGeometry::of(&cube),
                    Some(&cube),
                    &manifest,
                    &mut graph,
                    &run,
                    &spec.budget,
                    knee,
                )?;
                run.batch = usize::try_from(auto.plan.batch_safe).unwrap_or(usize::MAX);
                Some(auto)
            }
            BatchChoice::Fixed(_) => None,
        };
        Ok(Self {
            spec,
            cube,
            manifest,
            runtime,
            graph,
            run,
            load_s: t0.elapsed().as_secs_f64(),
            plan,
            adjustments: Vec::new(),
            peak_anon_bytes: 0,
            buffers: pipeline::BufferPool::new(1),
            labels,
            staged: None,
            unlinking: None,
        })
    }

    /// Runs the pipeline; `progress` gets pixels done.
    pub fn infer(&mut self, progress: &mut dyn FnMut(usize)) -> Result<(Maps, RunStats), JobError> {
        let mut governor = match (&self.plan, self.spec.budget.adapt) {
            (Some(auto), true) => Some(BudgetGovernor::new(auto, &self.spec.budget)?),
            _ => None,
        };
        let adapt = governor.as_mut().map(|g| g as &mut dyn pipeline::Adapt);
        let root = self.spec.budget.root.clone();
        // The high-water mark then bounds this run's peak, not an earlier calibration's.
        let _ = budget::reset_process_hwm(&root);
        let mut peak = anon_bytes(&root);
        let mut sampled_at = Instant::now();
        // Sampled on the engine thread between batches, at most every 2 ms, rather than by a
        // sampling thread: its wake-ups preempted intra-op threads mid-operator and cost a 20 ms
        // run about 1 ms (`hsiedge bench classify`, dense Salinas-A).
        let mut sampling = |done: usize| {
            if sampled_at.elapsed() >= PEAK_SAMPLE_PERIOD {
                peak = peak.max(anon_bytes(&root));
                sampled_at = Instant::now();
            }
            progress(done);
        };
        let shape = self.map_shape();
        let (out, manifest, scene) = (&self.spec.out, &self.manifest, self.cube.header());
        // The headers depend only on the run's shape, so they are staged and synced while it runs,
        // and the data files made, so after the last batch they are only written.
        let (result, staged) = std::thread::scope(|scope| {
            let headers = scope.spawn(move || -> Result<Staged, MapError> {
                let mut staged = Staged::new(out)?;
                crate::map::stage_headers(&mut staged, shape, manifest, scene)?;
                crate::map::reserve_maps(&mut staged, shape, manifest)?;
                staged.reserve("summary.json")?;
                Ok(staged)
            });
            let result = pipeline::run(
                &self.cube,
                &self.manifest,
                &mut self.graph,
                &self.run,
                &self.buffers,
                &mut sampling,
                adapt,
            );
            let staged = headers.join().unwrap_or_else(|_| {
                Err(MapError::Io {
                    path: out.clone(),
                    source: std::io::Error::other("the header staging thread panicked"),
                })
            });
            (result, staged)
        });
        // The run's buffers and the session's arena are still held, so the end is sampled too.
        self.peak_anon_bytes = peak.max(anon_bytes(&root)).max(hwm_anon_bound(&root).unwrap_or(0));
        self.adjustments = governor.map(|g| g.changes).unwrap_or_default();
        let result = result?;
        self.staged = Some(staged?);
        Ok(result)
    }

    /// The shape of the maps a run of this job makes.
    fn map_shape(&self) -> MapShape {
        MapShape {
            lines: self.cube.lines(),
            samples: self.cube.samples(),
            channels: self.manifest.classes(),
            scores: self.run.keep_scores || self.manifest.task != Task::Classification,
        }
    }

    /// Writes the maps and `summary.json` atomically into the output folder and returns the summary.
    ///
    /// The files a write replaces are unlinked on a thread of their own after the commit; the next
    /// write, or dropping the job, waits for it.
    pub fn write(&mut self, maps: &Maps, stats: &RunStats) -> Result<Summary, JobError> {
        let t0 = Instant::now();
        let accuracy = self.labels.as_ref().map(|l| accuracy(maps, l));
        let mut staged = match self.staged.take() {
            Some(s) if s.dir() == self.spec.out && MapShape::of(maps) == self.map_shape() => s,
            _ => {
                let mut s = Staged::new(&self.spec.out)?;
                crate::map::stage_headers(&mut s, MapShape::of(maps), &self.manifest, self.cube.header())?;
                s
            }
        };
        let written = crate::map::stage_maps(&mut staged, maps, &self.manifest)?;
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
            peak_anon_bytes: self.peak_anon_bytes,
            class_map: written.class_map.clone(),
            confidence_map: written.confidence_map.clone(),
            scores_map: written.scores_map.clone(),
            quicklook: written.quicklook.clone(),
            nonfinite_pixels: maps.nonfinite_pixels,
            accuracy,
            batch_plan: self.plan.clone(),
            batch_changes: self.adjustments.clone(),
        };
        summary.write_s = t0.elapsed().as_secs_f64();
        let json = serde_json::to_vec_pretty(&summary).map_err(|e| crate::map::MapError::Io {
            path: self.spec.out.join("summary.json"),
            source: std::io::Error::other(e),
        })?;
        staged.add("summary.json", &json)?;
        let retired = staged.commit()?;
        if let Some(h) = self.unlinking.take() {
            let _ = h.join();
        }
        self.unlinking = retired.remove_in_background();
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
pub fn accuracy(maps: &Maps, labels: &Cube) -> Accuracy {
    let path = labels.header_path();
    let labels = labels.read_all();
    let (mut n, mut ok) = (0usize, 0usize);
    for (truth, pred) in labels.iter().zip(&maps.class_ids) {
        if *truth > 0.0 {
            n += 1;
            if (*truth - f32::from(*pred)).abs() < 0.5 {
                ok += 1;
            }
        }
    }
    Accuracy {
        labels: path.to_path_buf(),
        labelled_pixels: n,
        correct: ok,
        overall_accuracy: if n == 0 { 0.0 } else { ok as f64 / n as f64 },
    }
}

/// Opens the label map at `path` for a classification of a `lines x samples` scene by a model of
/// `task`: one band, the scene's size.
pub fn open_labels(path: &Path, lines: usize, samples: usize, task: Task) -> Result<Cube, JobError> {
    let err = |field, message: String| LabelsError {
        path: path.to_path_buf(),
        field,
        message,
    };
    if task != Task::Classification {
        return Err(err(
            "--labels",
            format!("scores class maps, and this model's task is {task:?}"),
        )
        .into());
    }
    let cube = Cube::open(path)?;
    if cube.bands() != 1 {
        return Err(err("bands", format!("a label map has 1 band, this one {}", cube.bands())).into());
    }
    if cube.lines() != lines || cube.samples() != samples {
        return Err(JobError::Labels {
            path: path.to_path_buf(),
            got_lines: cube.lines(),
            got_samples: cube.samples(),
            lines,
            samples,
        });
    }
    Ok(cube)
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
    /// Peak resident set of the process (includes the mapped scene's file pages).
    pub peak_rss_bytes: u64,
    /// Peak anonymous memory during inference, sampled every 2 ms: what the memory plan predicts.
    pub peak_anon_bytes: u64,
    /// Class map path.
    pub class_map: Option<PathBuf>,
    /// Confidence map path.
    pub confidence_map: Option<PathBuf>,
    /// Abundance/score map path.
    pub scores_map: Option<PathBuf>,
    /// Quick-look path.
    pub quicklook: PathBuf,
    /// Pixels whose model output was not finite (see [`Maps::nonfinite_pixels`]).
    pub nonfinite_pixels: usize,
    /// Accuracy against `--labels`.
    pub accuracy: Option<Accuracy>,
    /// How `--batch auto` chose the batch.
    pub batch_plan: Option<AutoBatch>,
    /// Batch changes made while running, with their causes.
    pub batch_changes: Vec<Adjustment>,
}

/// How much more than the graph's activation peak a run really holds per unit (im2col and
/// convolution workspaces): measured 2.2-4.3x on the shipped models by `hsiedge plan`, rounded up.
pub const PRIOR_WORKSPACE_FACTOR: u64 = 5;

/// The scene facts the memory plan needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SceneGeometry {
    /// Lines.
    pub lines: usize,
    /// Samples per line.
    pub samples: usize,
    /// Bands.
    pub bands: usize,
    /// Bytes of the mapped data file. Its pages are clean page cache the kernel reclaims under
    /// pressure, so the plan does not count them; they are reported only.
    pub data_bytes: u64,
}

impl SceneGeometry {
    /// The geometry of an opened cube.
    pub fn of(cube: &Cube) -> Self {
        Self {
            lines: cube.lines(),
            samples: cube.samples(),
            bands: cube.bands(),
            data_bytes: std::fs::metadata(cube.data_path()).map_or(0, |m| m.len()),
        }
    }
}

/// Plans `--batch auto`: sizes the graph, reads the system budget, measures two or three small
/// batches to fit `M(B) = M_fixed + a*B`, adds what the pipeline itself holds, and applies
/// `B_safe = floor((budget*(1 - r_frag) - M_fixed) / a)`. Fails before inference when not even one
/// unit fits.
pub fn auto_batch(
    cube: &SceneGeometry,
    scene: Option<&Cube>,
    manifest: &Manifest,
    graph: &mut Graph,
    run: &RunOptions,
    settings: &BudgetSettings,
    knee: Option<(u64, PathBuf)>,
) -> Result<AutoBatch, JobError> {
    let root = settings.root.as_path();
    let grid = crate::tile::TileGrid::new(cube.lines, cube.samples, run.tile, manifest.halo);
    let bands = cube.bands;
    let (unit, in_per_unit, bindings) = match run.mode {
        Mode::Patch => (
            Unit::Sample,
            bands * manifest.patch * manifest.patch,
            ShapeBindings::default(),
        ),
        Mode::Dense => {
            let model = graph::load_model(graph.path())?;
            let b = ShapeBindings::dense_tile(&model, grid.tile_h as u64, grid.tile_w as u64, grid.halo as u64);
            (Unit::Tile, bands * grid.window_h() * grid.window_w(), b)
        }
    };
    let gcost = graph::analyse_file(graph.path(), &bindings)?;
    let prior = CostModel::from_graph(&gcost, unit, budget::DEFAULT_RUNTIME_OVERHEAD_BYTES);
    let cfg = |own_bytes| BudgetConfig {
        reserve_bytes: settings.reserve_bytes,
        own_bytes,
        device: None,
    };
    let own = anon_bytes(root);
    let system = budget::read_system_budget(root, &cfg(own))?;
    // The graph prior misses runtime workspaces (measured 2-5x short on the shipped models), so a
    // calibration run is made only where eight times the prior's per-unit cost fits on top of what
    // the process holds now: calibration never nears the wall.
    // Samples are sized so each probe holds about 8, 32 and 96 MiB by the prior (at least 8, 32, 128
    // samples): a cheap per-pixel model needs thousands of samples before its slope rises above the
    // allocator's noise. No size exceeds the scene.
    let in_bytes = (in_per_unit * 4) as u64;
    let out_bytes = match run.mode {
        Mode::Patch => manifest.classes() as u64 * 4,
        Mode::Dense => (manifest.classes() * grid.tile_h * grid.tile_w * 4) as u64,
    };
    let pixels = (cube.lines * cube.samples) as u64;
    let scene_units = match run.mode {
        Mode::Patch => pixels,
        Mode::Dense => grid.len() as u64,
    };
    let in_flight_at = |b: u64| extra_buffers(run.queue, scene_units, b);
    let sample_sizes = {
        let per = prior.per_unit_bytes.saturating_mul(PRIOR_WORKSPACE_FACTOR).max(1);
        let room = pixels.max(1);
        let mut v: Vec<u64> = [(8u64 << 20, 8u64), (32 << 20, 32), (96 << 20, 128)]
            .iter()
            .map(|&(t, min)| (t / per).max(min).min(room))
            .collect();
        v.dedup();
        if v.len() < 3 {
            // A small scene caps every size at its room: spread them below it instead.
            v = [room / 9, room / 3, room].iter().map(|&b| b.max(1)).collect();
            v.dedup();
        }
        v
    };
    let sizes: Vec<u64> = match unit {
        Unit::Sample => sample_sizes,
        Unit::Tile => vec![1u64, 4, 8],
    }
    .into_iter()
    .filter(|&b| own.saturating_add(prior.per_unit_bytes.saturating_mul(8 * b)) <= system.budget_bytes)
    .collect();
    // Calibration runs the real pipeline (producer, queue, engine) for a few batches at each small
    // size on the scene itself, so in-flight batches, the tile window and allocator behaviour are
    // all in the measured peak.
    // Each probe runs long enough (at least `queue + 3` batches and 2048 samples or 8 tiles) for
    // the runtime's per-thread allocator heaps to reach their steady size.
    let probe_units: u64 = if unit == Unit::Sample { 2048 } else { 8 };
    let calibration = match (scene, sizes.len() >= 2) {
        (Some(cube), true) => {
            let cal = budget::calibrate(unit, &sizes, |b| -> Result<u64, JobError> {
                let opts = RunOptions {
                    batch: usize::try_from(b).unwrap_or(1),
                    ..run.clone()
                };
                budget::reset_process_hwm(root)?;
                let (result, sampled) = with_peak_anon(root, || {
                    let batches = (run.queue + 3).max(usize::try_from(probe_units.div_ceil(b)).unwrap_or(1));
                    pipeline::probe(cube, manifest, graph, &opts, batches)
                });
                result?;
                // The buffers in flight besides the running one (all faulted in at the start) are
                // taken out, so the fit is the run's own cost and the plan can add the count the
                // chosen batch will have.
                Ok(sampled
                    .max(hwm_anon_bound(root)?)
                    .saturating_sub(in_flight_at(b) * in_bytes * b))
            })?;
            Some(cal)
        }
        _ => None,
    };
    // Without calibration, the prior's per-unit cost is scaled by the largest workspace factor
    // measured on the shipped models, so the plan errs towards smaller batches.
    let (measured, measured_fixed_pipeline) = match &calibration {
        Some(c) => (
            CostModel {
                // A run holds at least its own input and output, whatever the fit's noise says.
                per_unit_bytes: c.model.per_unit_bytes.max(in_bytes + out_bytes),
                ..c.model.clone()
            },
            true,
        ),
        None => (
            CostModel {
                per_unit_bytes: prior.per_unit_bytes.saturating_mul(PRIOR_WORKSPACE_FACTOR),
                ..prior
            },
            false,
        ),
    };
    let k = manifest.classes() as u64;
    let keeps_scores = run.keep_scores || manifest.task == Task::Abundance;
    let maps = pixels * (1 + 4 + 1) + if keeps_scores { pixels * k * 4 } else { 0 };
    let window = (bands * grid.window_h() * grid.window_w() * 4) as u64;
    // In-place calibration measured the tile window already (maps come later, at run).
    let pipeline_fixed_bytes = maps + if measured_fixed_pipeline { 0 } else { window };
    let choose = ChooseConfig {
        frag_margin: settings.frag_margin,
        max_units: settings.max_units.min(scene_units.max(1)),
        knee: knee.as_ref().map(|(k, _)| *k),
    };
    // Besides the batch being run, `queue + 1` more batch buffers are held (queued, and one being
    // built; the pipeline faults them all in at the start), but no more than the scene has batches:
    // M(B) = F + B*run + in*B*(min(q+2, ceil(U/B)) - 1). It rises with B (a run holds at least its
    // own input), so the largest B that fits is found by bisection; the plan reports the straight
    // line through M(B_safe).
    let fixed = measured.fixed_bytes + pipeline_fixed_bytes;
    let run_bytes = measured.per_unit_bytes;
    let peak_at = |b: u64| {
        fixed.saturating_add(b.saturating_mul(run_bytes)).saturating_add(
            in_bytes
                .saturating_mul(b)
                .saturating_mul(extra_buffers(run.queue, scene_units, b)),
        )
    };
    let usable = system
        .budget_bytes
        .saturating_sub(((system.budget_bytes as f64) * settings.frag_margin).ceil() as u64);
    let (mut lo, mut hi) = (0u64, choose.max_units.min(choose.knee.unwrap_or(u64::MAX)));
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        if peak_at(mid) <= usable {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    let per_unit_bytes = if lo > 0 {
        (peak_at(lo) - fixed).div_ceil(lo)
    } else {
        run_bytes + (run.queue as u64 + 1) * in_bytes
    };
    let cost = CostModel {
        fixed_bytes: fixed,
        per_unit_bytes,
        ..measured.clone()
    };
    let mut plan = Plan::build(&system, &cost, Some(&gcost), &choose)?;
    let pipeline_bytes_per_unit = per_unit_bytes - run_bytes;
    plan.mode = match run.mode {
        Mode::Patch => "patch".into(),
        Mode::Dense => "dense".into(),
    };
    Ok(AutoBatch {
        plan,
        calibration,
        pipeline_bytes_per_unit,
        run_bytes_per_unit: run_bytes,
        pipeline_fixed_bytes,
        knee_file: knee.map(|(_, p)| p),
    })
}

/// Batch buffers a run holds besides the running batch's: the pipeline's pool limit less one.
fn extra_buffers(queue: usize, units: u64, b: u64) -> u64 {
    let (units, b) = (
        usize::try_from(units).unwrap_or(usize::MAX),
        usize::try_from(b).unwrap_or(usize::MAX),
    );
    pipeline::BufferPool::run_limit(queue, units, b) as u64 - 1
}

/// What a batch sweep of this model must match to apply here.
pub fn sweep_key(
    manifest: &Manifest,
    graph_path: &Path,
    mode: Mode,
    tile: usize,
    engine: &crate::engine::EngineOptions,
    runtime: &Runtime,
    root: &Path,
) -> Result<budget::knee::SweepKey, JobError> {
    let bytes = std::fs::read(graph_path).map_err(|source| JobError::Read {
        path: graph_path.to_path_buf(),
        source,
    })?;
    let (cpu, cpus) = budget::knee::cpu_identity(root);
    Ok(budget::knee::SweepKey {
        model: manifest.name.clone(),
        graph_hash: format!("{:016x}", budget::knee::fnv1a(&bytes)),
        mode: match mode {
            Mode::Patch => "patch".into(),
            Mode::Dense => "dense".into(),
        },
        tile: (mode == Mode::Dense).then_some(tile),
        provider: runtime.provider().ort_name().into(),
        threads: engine.threads,
        onnxruntime: runtime.build_info(),
        cpu,
        cpus,
        jetson: budget::detect_jetson(root).and_then(|j| j.model),
        power_mode: budget::knee::power_mode(root),
    })
}

/// The knee of the cached sweep for this run, if there is one. A cache that cannot be read is
/// reported on stderr and ignored: it only ever lowers the batch, so running without it is safe.
fn cached_knee(
    manifest: &Manifest,
    graph: &Graph,
    mode: Mode,
    run: &RunOptions,
    engine: &crate::engine::EngineOptions,
    runtime: &Runtime,
    settings: &BudgetSettings,
) -> Option<(u64, PathBuf)> {
    let dir = settings.sweep_cache.as_ref()?;
    let found = sweep_key(manifest, graph.path(), mode, run.tile, engine, runtime, &settings.root)
        .map_err(|e| e.to_string())
        .and_then(|key| budget::knee::load(dir, &key).map_err(|e| e.to_string()));
    match found {
        Ok(Some((record, path))) => record.knee.map(|k| (k, path)),
        Ok(None) => None,
        Err(e) => {
            eprintln!("hsiedge: warning: ignoring the batch sweep cache: {e}");
            None
        }
    }
}

/// This process's anonymous resident memory (`RssAnon`): what the cost model counts. File-backed
/// pages (the mapped scene, the ONNX Runtime library) are reclaimable and stay out of it.
pub fn anon_bytes(root: &Path) -> u64 {
    status_kib(root, "RssAnon:")
}

/// A `kB` field of `/proc/self/status`, in bytes (0 when absent).
fn status_kib(root: &Path, field: &str) -> u64 {
    std::fs::read_to_string(root.join("proc/self/status")).map_or(0, |text| kib_field(&text, field))
}

/// A `kB` field of the text of a `status` file, in bytes (0 when absent).
fn kib_field(text: &str, field: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kib| kib * 1024)
}

/// The resident high-water mark less the file and shared pages mapped now: a lower bound of the
/// anonymous peak since the mark was reset (the mapped scene's pages only grow during a run), which
/// catches a peak shorter than the sampling period.
fn hwm_anon_bound(root: &Path) -> Result<u64, BudgetError> {
    let hwm = budget::read_process_hwm(root)?;
    let text = std::fs::read_to_string(root.join("proc/self/status")).unwrap_or_default();
    Ok(hwm.saturating_sub(kib_field(&text, "RssFile:") + kib_field(&text, "RssShmem:")))
}

/// Runs `f` while a thread samples this process's `RssAnon` every 2 ms; returns its result and the
/// peak sampled. Sampling catches the peak without counting the mapped scene's (reclaimable)
/// pages; the calibration probes use it (a timed run samples on its own thread, see
/// [`Job::infer`]). The high-water-mark bound the callers add catches a peak between samples.
pub fn with_peak_anon<T>(root: &Path, f: impl FnOnce() -> T) -> (T, u64) {
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        let sampler = scope.spawn(|| {
            let mut peak = anon_bytes(root);
            while !done.load(std::sync::atomic::Ordering::Acquire) {
                peak = peak.max(anon_bytes(root));
                // Parked rather than asleep, so the end of `f` wakes it at once and the caller
                // does not wait out a sampling period.
                std::thread::park_timeout(PEAK_SAMPLE_PERIOD);
            }
            peak.max(anon_bytes(root))
        });
        let result = f();
        done.store(true, std::sync::atomic::Ordering::Release);
        sampler.thread().unpark();
        (result, sampler.join().unwrap_or(0))
    })
}

/// The memory governor as a pipeline [`pipeline::Adapt`]: re-reads the budget every few batches
/// and when memory pressure rises, and logs each change with its cause on stderr.
struct BudgetGovernor {
    governor: budget::Governor,
    root: PathBuf,
    reserve_bytes: u64,
    changes: Vec<Adjustment>,
}

impl BudgetGovernor {
    fn new(auto: &AutoBatch, settings: &BudgetSettings) -> Result<Self, JobError> {
        let cost = CostModel {
            unit: auto.plan.unit,
            fixed_bytes: auto.plan.fixed_bytes,
            per_unit_bytes: auto.plan.per_unit_bytes,
            source: auto.plan.cost_source,
            fit_rms_residual_bytes: auto.plan.fit_rms_residual_bytes,
        };
        let cfg = budget::GovernorConfig {
            check_every: settings.check_every.max(1),
            ..budget::GovernorConfig::from(&ChooseConfig {
                frag_margin: settings.frag_margin,
                max_units: settings.max_units,
                knee: None,
            })
        };
        Ok(Self {
            governor: budget::Governor::new(cost, auto.plan.batch_safe.max(1), cfg)?,
            root: settings.root.clone(),
            reserve_bytes: settings.reserve_bytes,
            changes: Vec::new(),
        })
    }

    fn check(&mut self) -> Option<Adjustment> {
        let cfg = BudgetConfig {
            reserve_bytes: self.reserve_bytes,
            own_bytes: anon_bytes(&self.root),
            device: None,
        };
        match self.governor.check(&self.root, &cfg) {
            Ok(change) => change,
            Err(e) => {
                eprintln!("hsiedge: warning: memory budget re-read failed, batch kept: {e}");
                None
            }
        }
    }
}

impl pipeline::Adapt for BudgetGovernor {
    fn after_batch(&mut self, batches_done: u64, current: usize) -> usize {
        let psi = budget::read_psi(&self.root).ok().flatten();
        if !self.governor.should_check(batches_done, psi.as_ref()) {
            return current;
        }
        let mut change = self.check();
        // Nothing fits: wait for memory to come back (up to 5 s) rather than run into the wall.
        let mut waits = 0;
        while change.as_ref().is_some_and(|c| c.cause == budget::Cause::Exhausted) && waits < 50 {
            if let Some(c) = change.take() {
                eprintln!("hsiedge: {c}; waiting for memory");
                self.changes.push(c);
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
            waits += 1;
            change = self.check();
        }
        if let Some(c) = change {
            eprintln!("hsiedge: {c}");
            self.changes.push(c);
        }
        usize::try_from(self.governor.current()).unwrap_or(current)
    }
}

/// What `hsiedge plan` is asked.
#[derive(Debug, Clone)]
pub struct PlanRequest {
    /// Model manifest.
    pub manifest: PathBuf,
    /// Scene to plan for; one tile of the model's bands when absent.
    pub scene: Option<PathBuf>,
    /// Mode.
    pub mode: ModeChoice,
    /// Tile side.
    pub tile: usize,
    /// Engine settings (the plan calibrates with a real session).
    pub engine: EngineOptions,
    /// Budget settings.
    pub budget: BudgetSettings,
    /// Plan training for this many classes with this optimizer instead of inference.
    pub train: Option<(u64, budget::Optimizer)>,
    /// After planning, run the scene at batches from 1 to `batch_safe` and compare each measured
    /// peak with the prediction.
    pub verify: bool,
    /// After planning, find the wall under a cgroup capped at the budget (`--probe-wall`).
    pub probe_wall: bool,
}

/// `plan --probe-wall`: the batch at which the plan predicts the wall against the one found.
#[derive(Debug, Clone, serde::Serialize)]
pub struct WallReport {
    /// The cap the probes ran under: the plan's budget.
    pub cap_bytes: u64,
    /// The largest batch whose predicted `M(B)` fits the cap (no fragmentation margin).
    pub predicted_largest_fit: u64,
    /// What the search found.
    pub search: budget::WallSearch,
    /// `(predicted - found) / found` for the largest fitting batch.
    pub error: f64,
    /// OOM kills in the cap's cgroup (the failed probes).
    pub oom_kills: u64,
    /// Why each failed probe failed (last stderr line), in probe order.
    pub failures: Vec<String>,
}

/// One row of `plan --verify`: predicted against measured peak at one batch.
#[derive(Debug, Clone, serde::Serialize)]
pub struct VerifyRow {
    /// Batch (units).
    pub batch: u64,
    /// Batches in flight besides the running one at this batch on this scene.
    pub in_flight: u64,
    /// `M(B)` with that many in flight.
    pub predicted_bytes: u64,
    /// Peak `RssAnon` of a full run at this batch.
    pub measured_bytes: u64,
    /// `(measured - predicted) / predicted`.
    pub error: f64,
}

/// `hsiedge plan`'s answer.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(untagged)]
pub enum PlanReport {
    /// Inference: the calibrated plan, the verification rows and the wall search when asked for.
    Inference(Box<AutoBatch>, Vec<VerifyRow>, Option<WallReport>),
    /// Training memory from the graph.
    Training(Box<budget::TrainingPlan>),
}

impl std::fmt::Display for PlanReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Inference(a, rows, wall) => {
                write!(f, "{}", a.plan)?;
                if let Some(w) = wall {
                    write!(
                        f,
                        "\n  wall            cap {:.1} MiB: predicted largest fit {}, found {} (first failure {}), {:+.1} %, {} probes {:?}",
                        w.cap_bytes as f64 / 1048576.0,
                        w.predicted_largest_fit,
                        w.search.largest_fit,
                        w.search.first_fail.map_or("none".into(), |b| b.to_string()),
                        w.error * 100.0,
                        w.search.probes,
                        w.search.history
                    )?;
                }
                if !rows.is_empty() {
                    write!(
                        f,
                        "\n  verify          batch  in-flight  predicted MiB  measured MiB   error"
                    )?;
                    for r in rows {
                        write!(
                            f,
                            "\n                  {:>5}  {:>9}  {:>13.1}  {:>12.1}  {:>+6.1} %",
                            r.batch,
                            r.in_flight,
                            r.predicted_bytes as f64 / 1048576.0,
                            r.measured_bytes as f64 / 1048576.0,
                            r.error * 100.0
                        )?;
                    }
                }
                if let Some(c) = &a.calibration {
                    let pts: Vec<String> = c
                        .samples
                        .iter()
                        .map(|(b, m)| format!("B={b}: {:.1} MiB", *m as f64 / 1048576.0))
                        .collect();
                    write!(
                        f,
                        "\n  calibration     {} (fit RMS residual {:.2} MiB)",
                        pts.join(", "),
                        c.rms_residual_bytes / 1048576.0
                    )?;
                }
                write!(
                    f,
                    "\n  pipeline        +{:.1} KiB per unit (queued inputs), +{:.1} MiB fixed (maps, tile window)",
                    a.pipeline_bytes_per_unit as f64 / 1024.0,
                    a.pipeline_fixed_bytes as f64 / 1048576.0
                )
            }
            Self::Training(t) => write!(f, "{t}"),
        }
    }
}

/// Builds the plan `hsiedge plan` prints.
pub fn plan(req: &PlanRequest) -> Result<PlanReport, JobError> {
    req.budget.validate()?;
    let manifest = Manifest::load(&req.manifest)?;
    let geometry = match &req.scene {
        Some(p) => {
            let cube = Cube::open(p)?;
            if cube.bands() != manifest.input.bands {
                return Err(PipelineError::Bands {
                    cube: cube.header_path().to_path_buf(),
                    bands: cube.bands(),
                    manifest: manifest.path.clone(),
                    expected: manifest.input.bands,
                }
                .into());
            }
            SceneGeometry::of(&cube)
        }
        None => SceneGeometry {
            lines: req.tile,
            samples: req.tile,
            bands: manifest.input.bands,
            data_bytes: 0,
        },
    };
    let mode = match req.mode {
        ModeChoice::Fixed(m) => m,
        ModeChoice::Auto if manifest.files.dense.is_some() => Mode::Dense,
        ModeChoice::Auto => Mode::Patch,
    };
    if let Some((classes, optimizer)) = req.train {
        let g = graph::analyse_file(&manifest.patch_path(), &ShapeBindings::default())?;
        let cfg = BudgetConfig {
            reserve_bytes: req.budget.reserve_bytes,
            own_bytes: 0,
            device: None,
        };
        let system = budget::read_system_budget(&req.budget.root, &cfg)?;
        let choose = ChooseConfig {
            frag_margin: req.budget.frag_margin,
            max_units: req.budget.max_units,
            knee: None,
        };
        let t = budget::TrainingPlan::build(
            &system,
            &g,
            classes,
            optimizer,
            budget::DEFAULT_RUNTIME_OVERHEAD_BYTES,
            &choose,
        )?;
        return Ok(PlanReport::Training(Box::new(t)));
    }
    let run = RunOptions {
        mode,
        batch: 1,
        tile: req.tile,
        queue: QUEUE_DEPTH,
        keep_scores: manifest.task == Task::Abundance,
        producer_nice: req.engine.producer_nice,
    };
    let runtime = Runtime::new(req.engine.clone())?;
    let mut graph = match mode {
        Mode::Patch => runtime.graph(&manifest, Role::Patch, &manifest.patch_path())?,
        Mode::Dense => {
            let path = manifest.dense_path().ok_or_else(|| PipelineError::NoDense {
                manifest: manifest.path.clone(),
            })?;
            runtime.graph(&manifest, Role::Dense, &path)?
        }
    };
    let scene_cube = match &req.scene {
        Some(p) => Some(Cube::open(p)?),
        None => None,
    };
    let knee = cached_knee(&manifest, &graph, mode, &run, &req.engine, &runtime, &req.budget);
    let auto = auto_batch(
        &geometry,
        scene_cube.as_ref(),
        &manifest,
        &mut graph,
        &run,
        &req.budget,
        knee,
    )?;
    let mut rows = Vec::new();
    let mut wall = None;
    if req.verify || req.probe_wall {
        let scene = req.scene.as_ref().ok_or(JobError::Setting {
            name: if req.verify { "--verify" } else { "--probe-wall" },
            value: "".into(),
            message: "needs --scene: it runs the scene at each batch".into(),
        })?;
        let cube = Cube::open(scene)?;
        let grid = crate::tile::TileGrid::new(cube.lines(), cube.samples(), run.tile, manifest.halo);
        let units = match mode {
            Mode::Patch => (cube.lines() * cube.samples()) as u64,
            Mode::Dense => grid.len() as u64,
        };
        let in_bytes = match mode {
            Mode::Patch => cube.bands() * manifest.patch * manifest.patch * 4,
            Mode::Dense => cube.bands() * grid.window_h() * grid.window_w() * 4,
        } as u64;
        let run_bytes = auto.run_bytes_per_unit;
        let safe = auto.plan.batch_safe.max(1);
        let mut batches: Vec<u64> = std::iter::successors(Some(1u64), |b| Some(b * 4))
            .take_while(|b| *b < safe)
            .collect();
        batches.push(safe);
        // Each batch runs in a fresh `hsiedge classify` process, so what one measurement leaves in
        // the allocator cannot inflate the next.
        let exe = std::env::current_exe().map_err(|source| {
            JobError::Map(crate::map::MapError::Io {
                path: PathBuf::from("/proc/self/exe"),
                source,
            })
        })?;
        let tmp = tempfile::tempdir().map_err(|source| {
            JobError::Map(crate::map::MapError::Io {
                path: std::env::temp_dir(),
                source,
            })
        })?;
        let classify = |cmd: &mut std::process::Command, b: u64| {
            cmd.arg("classify")
                .arg(scene)
                .arg("--model")
                .arg(&req.manifest)
                .arg("--out")
                .arg(tmp.path().join(format!("b{b}")))
                .args(["--mode", if mode == Mode::Dense { "dense" } else { "patch" }])
                .args(["--batch", &b.to_string(), "--tile", &req.tile.to_string(), "--json"]);
            if let Some(lib) = &req.engine.ort_lib {
                cmd.arg("--ort-lib").arg(lib);
            }
            if req.engine.threads > 0 {
                cmd.args(["--threads", &req.engine.threads.to_string()]);
            }
        };
        let predict =
            |b: u64| auto.plan.fixed_bytes + b * run_bytes + b * extra_buffers(run.queue, units, b) * in_bytes;
        if req.probe_wall {
            let cap_bytes = auto.plan.budget_bytes;
            let cap = budget::wall::MemoryCap::new(&req.budget.root, cap_bytes)?;
            let (mut lo, mut hi) = (0u64, units);
            while lo < hi {
                let mid = (lo + hi).div_ceil(2);
                if predict(mid) <= cap_bytes {
                    lo = mid;
                } else {
                    hi = mid - 1;
                }
            }
            let predicted = lo;
            let mut failures = Vec::new();
            let mut spawn_error = None;
            let search = budget::find_wall(auto.plan.batch_safe.max(1), units.max(1), 0.02, |b| {
                let mut cmd = cap.command(&exe);
                classify(&mut cmd, b);
                match cmd.output() {
                    Ok(o) if o.status.success() => true,
                    Ok(o) => {
                        let why = String::from_utf8_lossy(&o.stderr)
                            .lines()
                            .last()
                            .map_or_else(|| format!("{}", o.status), |l| format!("{}: {l}", o.status));
                        failures.push(format!("batch {b}: {why}"));
                        false
                    }
                    Err(e) => {
                        spawn_error.get_or_insert(e);
                        false
                    }
                }
            });
            if let Some(source) = spawn_error {
                return Err(JobError::Read {
                    path: exe.clone(),
                    source,
                });
            }
            let found = search.largest_fit.max(1);
            wall = Some(WallReport {
                cap_bytes,
                predicted_largest_fit: predicted,
                error: (predicted as f64 - found as f64) / found as f64,
                oom_kills: cap.oom_kills(),
                failures,
                search,
            });
        }
        if !req.verify {
            batches.clear();
        }
        for b in batches {
            let mut cmd = std::process::Command::new(&exe);
            classify(&mut cmd, b);
            let out = cmd.output().map_err(|source| {
                JobError::Map(crate::map::MapError::Io {
                    path: exe.clone(),
                    source,
                })
            })?;
            let measured = serde_json::from_slice::<serde_json::Value>(&out.stdout)
                .ok()
                .and_then(|v| v["peak_anon_bytes"].as_u64())
                .ok_or_else(|| JobError::Setting {
                    name: "--verify",
                    value: format!("batch {b}"),
                    message: format!(
                        "the classify run failed: {}",
                        String::from_utf8_lossy(&out.stderr).trim()
                    ),
                })?;
            let in_flight = extra_buffers(run.queue, units, b);
            let predicted = predict(b);
            rows.push(VerifyRow {
                batch: b,
                in_flight,
                predicted_bytes: predicted,
                measured_bytes: measured,
                error: (measured as f64 - predicted as f64) / predicted as f64,
            });
        }
    }
    Ok(PlanReport::Inference(Box::new(auto), rows, wall))
}
