//! One classification (or unmixing) job: settings parsed and validated without I/O
//! ([`JobSpec::validate`]), resolved into runtime objects ([`Job::resolve`]), run, and written.

use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::budget::{self, Adjustment, BudgetConfig, BudgetError, Calibration, ChooseConfig, CostModel, Plan, Unit};
use crate::cube::{Cube, CubeError};
use crate::engine::{EngineError, EngineOptions, Graph, Runtime};
use crate::graph::{self, GraphError, ShapeBindings};
use crate::map::{Contention, MapError, MapShape, OutputDir, Staged};
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
    /// The device-resident path (`--io device`).
    #[error(transparent)]
    Resident(#[from] crate::gpu::resident::ResidentError),
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
    /// What to do when another process is writing `out`.
    pub contention: Contention,
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
    /// Without a cached knee, time a few batch sizes before the run and stop at the plateau.
    pub sweep: bool,
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
            sweep: true,
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
    /// The output folder, locked for this job's lifetime (declared after `staged`, so a set
    /// abandoned on drop is removed before the lock goes).
    out: OutputDir,
    /// Unlinking the files the last write replaced.
    unlinking: Option<std::thread::JoinHandle<()>>,
    /// The device-resident path's buffers, when batches take it (`--io`).
    resident: Option<crate::gpu::resident::Resident>,
    /// Why a CUDA job under `--io auto` runs on the host path.
    io_fallback: Option<String>,
    /// What the last device-resident run moved.
    device_io: Option<crate::gpu::resident::DeviceIo>,
    /// Device memory in use at the last run's peak (a GPU provider's).
    device_peak_bytes: Option<u64>,
}

impl Drop for Job {
    fn drop(&mut self) {
        if let Some(h) = self.unlinking.take() {
            let _ = h.join();
        }
    }
}

impl Job {
    /// Opens the scene and the model, checks them against each other, and builds the session.
    pub fn resolve(spec: JobSpec) -> Result<Self, JobError> {
        spec.validate()?;
        // Locked first, so a folder that cannot be made or is being written fails the job before
        // the scene is read; a failure from here on removes the folder if this made it.
        let out = OutputDir::lock(&spec.out, spec.contention)?;
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
        let mut inputs = vec![
            spec.scene.clone(),
            cube.header_path().to_path_buf(),
            cube.data_path().to_path_buf(),
            manifest.path.clone(),
            manifest.patch_path(),
        ];
        inputs.extend(manifest.dense_path());
        if let (Some(p), Some(l)) = (&spec.labels, &labels) {
            inputs.extend([p.clone(), l.header_path().to_path_buf(), l.data_path().to_path_buf()]);
        }
        crate::map::check_inputs_spared(&out, &inputs)?;
        // A batch larger than the scene holds only empty room (and `--batch 100000000` would
        // ask the allocator for it up front).
        run.batch = run.batch.min(pipeline::units(&cube, &manifest, &run).max(1));
        let runtime = Runtime::new(gpu_bounded(&spec.engine, &spec.budget))?;
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
        if runtime.provider().on_gpu() {
            // The governor's re-cut batches and the partial last batch run padded to a bucket.
            graph.use_buckets(crate::engine::Buckets::up_to(run.batch));
        }
        let (resident, io_fallback) = device::choose(&cube, &manifest, &mut graph, &run, &runtime)?;
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
            out,
            unlinking: None,
            resident,
            io_fallback,
            device_io: None,
            device_peak_bytes: None,
        })
    }

    /// Runs the pipeline; `progress` gets each batch's record.
    pub fn infer(&mut self, progress: &mut dyn FnMut(&pipeline::BatchDone)) -> Result<(Maps, RunStats), JobError> {
        let mut governor = match (&self.plan, self.spec.budget.adapt) {
            (Some(auto), true) => Some(BudgetGovernor::new(
                auto,
                &self.spec.budget,
                self.graph.device().map(|(d, _)| d as usize),
            )?),
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
        let mut sampling = |done: &pipeline::BatchDone| {
            if sampled_at.elapsed() >= PEAK_SAMPLE_PERIOD {
                peak = peak.max(anon_bytes(&root));
                sampled_at = Instant::now();
            }
            progress(done);
        };
        // A GPU provider's device memory, sampled through the run (its peak is inside it); not
        // while CUDA graphs are captured, which another thread's driver calls may invalidate.
        let device = match self.graph.device() {
            Some((d, _)) if !self.runtime.options().gpu.cuda_graph => {
                crate::gpu::memory::PeakSampler::start(d as usize).ok().flatten()
            }
            _ => None,
        };
        let shape = self.map_shape();
        let (out, manifest, scene) = (&self.out, &self.manifest, self.cube.header());
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
            let result = match &mut self.resident {
                Some(r) => r
                    .run(&self.cube, &mut self.graph, &mut sampling)
                    .map(|(maps, stats, io)| (maps, stats, Some(io)))
                    .map_err(JobError::from),
                None => pipeline::run(
                    &self.cube,
                    &self.manifest,
                    &mut self.graph,
                    &self.run,
                    &self.buffers,
                    &mut sampling,
                    adapt,
                )
                .map(|(maps, stats)| (maps, stats, None))
                .map_err(JobError::from),
            };
            let staged = headers.join().unwrap_or_else(|_| {
                Err(MapError::Io {
                    path: out.path().to_path_buf(),
                    source: std::io::Error::other("the header staging thread panicked"),
                })
            });
            (result, staged)
        });
        // The run's buffers and the session's arena are still held, so the end is sampled too.
        self.peak_anon_bytes = peak.max(anon_bytes(&root)).max(hwm_anon_bound(&root).unwrap_or(0));
        self.adjustments = governor.map(|g| g.changes).unwrap_or_default();
        self.device_peak_bytes = device.map(|d| d.stop());
        let (maps, stats, io) = result?;
        self.device_io = io;
        self.staged = Some(staged?);
        Ok((maps, stats))
    }

    /// Whether batches take the device-resident path (`--io`).
    pub fn device_resident(&self) -> bool {
        self.resident.is_some()
    }

    /// What the last device-resident run moved (`None` on the host path).
    pub fn device_io(&self) -> Option<crate::gpu::resident::DeviceIo> {
        self.device_io
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
                let mut s = Staged::new(&self.out)?;
                crate::map::stage_headers(&mut s, MapShape::of(maps), &self.manifest, self.cube.header())?;
                s
            }
        };
        let written = crate::map::stage_maps(&mut staged, maps, &self.manifest)?;
        let mut summary = Summary {
            run_id: staged.run_id().to_string(),
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
            provider_fallbacks: self.runtime.fallbacks().to_vec(),
            precision: self.runtime.options().precision,
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
            io: if self.resident.is_some() { "device" } else { "host" },
            io_fallback: self.io_fallback.clone(),
            device_io: self.device_io,
            device_peak_bytes: self.device_peak_bytes,
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
    for w in cube.warnings() {
        eprintln!("hsiedge: warning: {w}");
    }
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

/// `engine` with the CUDA provider's arena bounded by the budget when no bound was given: the
/// device's free memory less the fragmentation margin, on a discrete GPU. An integrated GPU (a
/// Jetson) shares the host's memory, which the host-side budget already governs, so it is left as
/// given.
pub fn gpu_bounded(engine: &EngineOptions, budget: &BudgetSettings) -> EngineOptions {
    let mut e = engine.clone();
    if e.gpu.mem_limit.is_none()
        && e.providers.first().on_gpu()
        && let Ok(Some(d)) = crate::gpu::probe(e.gpu.device_id as usize)
        && let Some(free) = d.budget_bytes()
    {
        e.gpu.mem_limit = Some((free as f64 * (1.0 - budget.frag_margin)) as u64);
    }
    e
}

/// What a job did, as written to `summary.json` and printed by `--json`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Summary {
    /// The output set's run id, also in each map header (`hsiedge run id`) and the quick-look.
    pub run_id: String,
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
    /// Providers preferred over `provider` that did not register, with why (empty: the first
    /// choice ran).
    pub provider_fallbacks: Vec<crate::engine::Fallback>,
    /// The model files' precision.
    pub precision: crate::engine::Precision,
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
    /// Where batches were prepared and reduced: `host` or `device` (`--io`).
    pub io: &'static str,
    /// Why a CUDA run under `--io auto` took the host path.
    pub io_fallback: Option<String>,
    /// What the device-resident path moved and where its time went.
    pub device_io: Option<crate::gpu::resident::DeviceIo>,
    /// Device memory in use at the run's peak, sampled every millisecond (`cuMemGetInfo`: the
    /// whole device), on a GPU provider: what `batch_plan.device.predicted_peak_bytes` predicts.
    pub device_peak_bytes: Option<u64>,
}

mod auto;
mod device;
mod plan;
mod session;

pub use auto::*;
pub use plan::*;
pub use session::{
    ModelSession, Resume, STREAM_PRODUCER_NICE, SceneBatch, SceneOutcome, SessionBatch, SessionSpec, StreamPlan,
    resume_start,
};
