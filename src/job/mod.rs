//! One classification (or unmixing) job: settings parsed and validated without I/O
//! ([`JobSpec::validate`]), resolved into runtime objects ([`Job::resolve`]), run, and written.

use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::budget::{self, Adjustment, BudgetConfig, BudgetError, Calibration, ChooseConfig, CostModel, Plan, Unit};
use crate::cube::{Cube, CubeError};
use crate::engine::{EngineError, EngineOptions, Graph, Runtime};
use crate::graph::{self, GraphError, ShapeBindings};
use crate::map::{MapError, MapShape, OutputDir, QuicklookStream, Staged};
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
    /// The output set of the last run, its headers staged while it ran (and on the device path
    /// the rows it finished).
    staged: Option<Streamed>,
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
    /// The files the run reads.
    inputs: Vec<PathBuf>,
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
        let mut engine = gpu_bounded(&spec.engine, &spec.budget);
        engine.gpu.compute_stream = device::provider_stream(&engine);
        let runtime = Runtime::new(engine)?;
        gpu_batch_fits(&runtime, run.batch, "--batch")?;
        let mut graph = open_graph(&runtime, &manifest, mode)?;
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
            BatchChoice::Fixed(_) => {
                fixed::check(&SceneGeometry::of(&cube), &manifest, &graph, &run, &spec.budget)?;
                None
            }
        };
        if runtime.provider().on_gpu() {
            // The governor's re-cut batches and the partial last batch run padded to a bucket.
            graph.use_buckets(crate::engine::Buckets::up_to(run.batch));
        }
        let (resident, io_fallback) = device::choose(&cube, &manifest, &mut graph, &run, &runtime)?;
        if resident.is_none() && runtime.options().gpu.cuda_graph && runtime.provider().on_gpu() {
            eprintln!(
                "hsiedge: note: --cuda-graph: the host I/O path runs without CUDA graphs (its buffers move from run to run); only the device path replays them"
            );
        }
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
            inputs,
        })
    }

    /// Refuses `path`, a file the run is to write beside its maps under option `flag`, where it
    /// would overwrite an input or a file of the output set (before it is created).
    pub fn check_side_file(&self, flag: &'static str, path: &Path) -> Result<(), JobError> {
        Ok(crate::map::check_side_file(&self.out, &self.inputs, flag, path)?)
    }

    /// Runs the pipeline; `progress` gets each batch's record. The output set is staged while it
    /// runs: its headers, and on the device path every tile row as it is finished; [`Job::write`]
    /// finishes it.
    pub fn infer(&mut self, progress: &mut dyn FnMut(&pipeline::BatchDone)) -> Result<(Maps, RunStats), JobError> {
        let mut governor = match (&self.plan, self.spec.budget.adapt) {
            (Some(auto), true) => Some(BudgetGovernor::new(
                auto,
                &self.spec.budget,
                self.graph.device().map(|(d, _)| d as usize),
            )?),
            _ => None,
        };
        if self.resident.is_some() && governor.is_some() && self.runtime.options().gpu.cuda_graph {
            // A captured graph replays one shape.
            eprintln!(
                "hsiedge: note: --cuda-graph: the batch stays at the planned {}; the budget governor does not re-cut it",
                self.run.batch
            );
        }
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
        let mut retries = Vec::new();
        let shape = self.map_shape();
        let (out, manifest, scene) = (&self.out, &self.manifest, self.cube.header());
        // The headers depend only on the run's shape, so they are staged and synced while it runs,
        // and the data files made, so after the last batch they are only written.
        // On the device path each tile row's maps are written as soon as it is finished.
        let (strips, strip_rx) = match self.resident.is_some() && !shape.scores && manifest.task == Task::Classification
        {
            true => {
                let (tx, rx) = std::sync::mpsc::sync_channel::<(usize, Maps)>(2);
                (Some(tx), Some(rx))
            }
            false => (None, None),
        };
        let (result, staged) = std::thread::scope(|scope| {
            let headers = scope.spawn(move || -> Result<Streamed, MapError> {
                let mut staged = Staged::new(out)?;
                crate::map::stage_headers(&mut staged, shape, manifest, scene)?;
                crate::map::reserve_maps(&mut staged, shape, manifest)?;
                staged.reserve("summary.json")?;
                let png = |message| MapError::Png {
                    path: out.path().join("quicklook.png"),
                    message,
                };
                let mut quicklook = match strip_rx {
                    Some(_) => {
                        QuicklookStream::new(manifest, shape.lines, shape.samples, staged.run_id()).map_err(png)?
                    }
                    None => None,
                };
                let mut lines = 0;
                for (y0, strip) in strip_rx.into_iter().flatten() {
                    crate::map::append_strip(&mut staged, y0, lines, &strip)?;
                    if let Some(q) = quicklook.as_mut() {
                        q.push(&strip.class_ids).map_err(png)?;
                    }
                    lines += strip.lines;
                }
                Ok(Streamed {
                    staged,
                    lines,
                    quicklook,
                })
            });
            let gpu = &self.runtime.options().gpu;
            let mode = self.run.mode;
            let result = match self.resident {
                Some(_) => device::run(
                    &mut self.resident,
                    &self.cube,
                    &self.manifest,
                    &mut self.graph,
                    &|| open_graph(&self.runtime, &self.manifest, mode),
                    &mut self.run,
                    gpu,
                    &mut sampling,
                    // A captured CUDA graph replays one shape: the governor is not asked.
                    adapt.filter(|_| !gpu.cuda_graph),
                    &mut retries,
                    strips,
                )
                .map(|(maps, stats, io)| (maps, stats, Some(io))),
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
        self.adjustments = retries;
        self.adjustments.extend(governor.map(|g| g.changes).unwrap_or_default());
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

    /// Pure inference on the device path, seconds: `runs` session runs on its bound buffers back
    /// to back with nothing between them (`None` on the host path).
    pub fn device_pure_inference(&mut self, runs: usize) -> Result<Option<f64>, JobError> {
        match self.resident.as_mut() {
            Some(r) => Ok(Some(r.pure_inference(&mut self.graph, runs)?.as_secs_f64())),
            None => Ok(None),
        }
    }

    /// What the last device-resident run moved (`None` on the host path).
    pub fn device_io(&self) -> Option<crate::gpu::resident::DeviceIo> {
        self.device_io.clone()
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
    /// `maps` are those the last [`Job::infer`] returned: on the device path the rows it
    /// finished are already in the staged files, and only the rest is written here.
    ///
    /// The files a write replaces are unlinked on a thread of their own after the commit; the next
    /// write, or dropping the job, waits for it.
    pub fn write(&mut self, maps: &Maps, stats: &RunStats) -> Result<Summary, JobError> {
        let t0 = Instant::now();
        let accuracy = self.labels.as_ref().map(|l| accuracy(maps, l));
        let (mut staged, from_line, quicklook) = match self.staged.take() {
            Some(s) if s.staged.dir() == self.spec.out && MapShape::of(maps) == self.map_shape() => {
                (s.staged, s.lines, s.quicklook)
            }
            _ => {
                let mut s = Staged::new(&self.out)?;
                crate::map::stage_headers(&mut s, MapShape::of(maps), &self.manifest, self.cube.header())?;
                (s, 0, None)
            }
        };
        let written = crate::map::stage_maps(&mut staged, maps, &self.manifest, from_line, quicklook)?;
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
            device_io: self.device_io.clone(),
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

/// The output set a run staged while it ran: headers, and on the device path the maps' first
/// `lines` lines, with the quick-look encoded that far.
#[derive(Debug)]
struct Streamed {
    staged: Staged,
    lines: usize,
    quicklook: Option<QuicklookStream>,
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

mod auto;
mod device;
mod fixed;
mod governor;
mod labels;
mod plan;
mod session;
mod spec;
mod summary;

pub use auto::*;
use governor::BudgetGovernor;
pub use governor::GOVERNOR_MIN_INTERVAL;
pub use labels::{Accuracy, accuracy, open_labels};
pub use plan::*;
pub use session::{
    ModelSession, Resume, STREAM_PRODUCER_NICE, SceneBatch, SceneOutcome, SessionBatch, SessionSpec, StreamPlan,
    resume_start,
};
pub use spec::{BatchChoice, BudgetSettings, JobSpec, ModeChoice, parse_batch, parse_mode};
pub use summary::Summary;

/// A fixed batch above what a GPU provider runs ([`budget::choose::GPU_MAX_BATCH`]) is refused
/// before the scene is read, naming the setting: cuDNN would fail at its first batch.
pub(crate) fn gpu_batch_fits(runtime: &Runtime, batch: usize, setting: &'static str) -> Result<(), JobError> {
    let max = budget::choose::GPU_MAX_BATCH;
    if runtime.provider().on_gpu() && batch as u64 > max {
        return Err(JobError::Setting {
            name: setting,
            value: batch.to_string(),
            message: format!(
                "the {} provider runs at most {max} a batch (on the CUDA provider cuDNN's convolutions fail at {})",
                runtime.provider(),
                max + 1
            ),
        });
    }
    Ok(())
}

/// A session for `mode`'s graph of `manifest`.
pub(super) fn open_graph(runtime: &Runtime, manifest: &Manifest, mode: Mode) -> Result<Graph, JobError> {
    Ok(match mode {
        Mode::Patch => runtime.graph(manifest, Role::Patch, &manifest.patch_path())?,
        Mode::Dense => {
            let path = manifest.dense_path().ok_or_else(|| PipelineError::NoDense {
                manifest: manifest.path.clone(),
            })?;
            runtime.graph(manifest, Role::Dense, &path)?
        }
    })
}
