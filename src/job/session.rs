//! A model ready to run many streamed scenes: the session is built once and reused, each scene's
//! rows written as they finish.

use std::path::{Path, PathBuf};

use super::auto::{AutoBatch, SWEEP_SCENE_BATCHES, SceneGeometry, auto_batch};
use super::governor::BudgetGovernor;
use super::{BudgetSettings, DEFAULT_DENSE_BATCH, DEFAULT_PATCH_BATCH, JobError, ModeChoice, QUEUE_DEPTH};
use crate::budget::{Adjustment, Limit};
use crate::cube::{Cube, DataType, Header, Interleave};
use crate::engine::{EngineOptions, Graph, Runtime};
use crate::map::{SegmentOptions, SegmentRecord, SegmentWriter};
use crate::model::{Manifest, Task};
use crate::pipeline::{self, BufferPool, Input, LineRing, Mode, PipelineError, RunOptions, RunStats};
use crate::source::{LineSource, SourceStats};

/// The tiling thread's nice increment for streamed scenes: 0. It also reads the stream, and lowered
/// on a busy machine it is starved while lines wait in the socket (docs/benchmarks.md, bench stream).
pub const STREAM_PRODUCER_NICE: i32 = 0;

/// What a model session is built from.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionSpec {
    /// The model manifest.
    pub manifest: PathBuf,
    /// Execution mode.
    pub mode: ModeChoice,
    /// Units per batch (patches, or tiles in dense mode).
    pub batch: SessionBatch,
    /// Tile side.
    pub tile: usize,
    /// Engine settings. Keep `producer_nice` at 0 for streams ([`STREAM_PRODUCER_NICE`]).
    pub engine: EngineOptions,
    /// Keep every output channel.
    pub keep_scores: bool,
}

/// How a session's batch is set.
#[derive(Debug, Clone, PartialEq)]
pub enum SessionBatch {
    /// The mode's default (1 tile, 32 patches).
    ModeDefault,
    /// Exactly this many units.
    Fixed(usize),
    /// Chosen by the memory budget and the plateau knee, calibrated on a synthetic strip of the
    /// first scene of each width (`--batch auto` for streams), capped at one tile row, and
    /// governed while each scene runs.
    Auto(BudgetSettings),
}

/// A loaded model: its manifest, ONNX Runtime session and batch buffers, kept from scene to scene.
#[derive(Debug)]
pub struct ModelSession {
    manifest: Manifest,
    runtime: Runtime,
    graph: Graph,
    run: RunOptions,
    buffers: BufferPool,
    auto: Option<AutoState>,
}

/// The budget settings of an auto-batch session and the plans made so far, one per scene width.
#[derive(Debug)]
struct AutoState {
    settings: BudgetSettings,
    plans: Vec<(usize, StreamPlan)>,
}

/// How an auto-batch session chose the batch for scenes of one width.
#[derive(Debug, Clone, serde::Serialize)]
pub struct StreamPlan {
    /// Scene samples (width) the plan is for.
    pub samples: usize,
    /// The batch the scenes start at.
    pub batch: usize,
    /// What bounded it (`strip`: one tile row of the stream).
    pub limited_by: Limit,
    /// Units one tile row of such a scene holds.
    pub strip_units: u64,
    /// The plan behind it: budget, calibrated cost, `batch_safe`, the knee.
    #[serde(skip)]
    auto: AutoBatch,
    /// The largest batch memory allows.
    pub memory_units: u64,
    /// What the budget allows the process.
    pub budget_bytes: u64,
    /// The calibrated peak at `batch`.
    pub predicted_peak_bytes: u64,
    /// The calibration runs' and the sweep's seconds.
    pub calibration_s: f64,
}

/// What an auto-batch scene reports of its batch.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SceneBatch {
    /// The plan the scene started from.
    pub plan: StreamPlan,
    /// Whether this scene made the plan (its start waited for the calibration).
    pub calibrated_now: bool,
    /// The governor's changes during the scene.
    pub adjustments: Vec<Adjustment>,
}

/// Only one session calibrates at a time: a calibration measures the process's peak memory,
/// which another's probes would inflate.
static CALIBRATING: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// What one streamed scene gave.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SceneOutcome {
    /// The scene id.
    pub scene_id: String,
    /// What the run measured (`lines` is the scene's line count).
    pub run: RunStats,
    /// What the source saw: missing lines, duplicates.
    pub source: SourceStats,
    /// The sets written.
    pub segments: Vec<SegmentRecord>,
    /// How the batch was chosen, for an auto-batch session.
    pub batch: Option<SceneBatch>,
    /// The scene line this run started from: 0, or the first line after the segments an earlier
    /// run had committed ([`Resume`]).
    pub resumed_from_line: usize,
    /// Lines the source handed over before the first line run again for a resumed scene (read
    /// and dropped).
    pub lines_skipped: usize,
}

/// Where a scene an earlier run left is taken up again: after the segments it committed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resume {
    /// The segments committed before, in order, each folder still holding its set.
    pub segments: Vec<SegmentRecord>,
}

impl Resume {
    /// The first scene line not committed.
    pub fn line(&self) -> usize {
        self.segments.last().map_or(0, |s| s.first_line + s.lines)
    }
}

/// Where a resumed run starts reading, and how many output lines it drops, to go on at scene
/// line `line` with tile rows of `tile_h` lines and a halo of `halo` lines: the tile row holding
/// `line` needs the `halo` lines above it, so the run starts whole tile rows earlier (at a
/// multiple of `tile_h`, so its rows are the first run's) and drops their output. Returns
/// `(first line read, output lines dropped)`.
pub fn resume_start(line: usize, tile_h: usize, halo: usize) -> (usize, usize) {
    let tile_h = tile_h.max(1);
    let row = line / tile_h * tile_h;
    let start = row.saturating_sub(halo.div_ceil(tile_h) * tile_h);
    (start, line - start)
}

/// A scene's source read from line `start` on, with the first run's tile rows.
struct Resumed<'a> {
    inner: &'a mut dyn LineSource,
    info: crate::source::SceneInfo,
    skip: usize,
    tile_h: usize,
}

impl LineSource for Resumed<'_> {
    fn info(&self) -> &crate::source::SceneInfo {
        &self.info
    }

    fn next_line(&mut self, line: &mut [u8]) -> Result<Option<crate::source::LineStatus>, crate::source::SourceError> {
        while self.skip > 0 {
            if self.inner.next_line(line)?.is_none() {
                return Ok(None);
            }
            self.skip -= 1;
        }
        self.inner.next_line(line)
    }

    fn stats(&self) -> SourceStats {
        self.inner.stats()
    }

    fn tile_rows(&self) -> Option<usize> {
        Some(self.tile_h)
    }
}

/// The batch sizes a GPU session's runs are padded to when its scenes run at `batches` (one per
/// planned scene width): up to the largest, so neither a governor's re-cut batch nor a scene's
/// partial last batch meets the provider with a new shape. `None` on the CPU, which takes any shape.
pub fn stream_buckets(on_gpu: bool, batches: &[usize]) -> Option<crate::engine::Buckets> {
    on_gpu.then(|| crate::engine::Buckets::up_to(batches.iter().copied().max().unwrap_or(1)))
}

impl ModelSession {
    /// Loads the manifest and builds the session for the chosen mode (dense when the model has a
    /// dense twin and the mode is auto).
    pub fn open(spec: &SessionSpec) -> Result<Self, JobError> {
        if spec.tile == 0 {
            return Err(JobError::Setting {
                name: "tile",
                value: "0".into(),
                message: "expected a tile side >= 1".into(),
            });
        }
        let manifest = Manifest::load(&spec.manifest)?;
        let mode = match spec.mode {
            ModeChoice::Fixed(m) => m,
            ModeChoice::Auto if manifest.files.dense.is_some() => Mode::Dense,
            ModeChoice::Auto => Mode::Patch,
        };
        // A GPU provider's arena is bounded by the device's free memory, as a job's is.
        let frag = match &spec.batch {
            SessionBatch::Auto(settings) => settings.clone(),
            _ => BudgetSettings::default(),
        };
        let runtime = Runtime::new(super::gpu_bounded(&spec.engine, &frag))?;
        if let SessionBatch::Fixed(b) = &spec.batch {
            super::gpu_batch_fits(&runtime, *b, "models.batch")?;
        }
        let mut graph = super::open_graph(&runtime, &manifest, mode)?;
        let default = match mode {
            Mode::Patch => DEFAULT_PATCH_BATCH,
            Mode::Dense => DEFAULT_DENSE_BATCH,
        };
        let (batch, auto) = match &spec.batch {
            SessionBatch::ModeDefault => (default, None),
            SessionBatch::Fixed(b) => (*b, None),
            SessionBatch::Auto(settings) => {
                settings.validate()?;
                let state = AutoState {
                    settings: settings.clone(),
                    plans: Vec::new(),
                };
                (default, Some(state))
            }
        };
        if let Some(b) = stream_buckets(runtime.provider().on_gpu(), &[batch]) {
            graph.use_buckets(b);
        }
        let run = RunOptions {
            mode,
            batch,
            tile: spec.tile,
            queue: QUEUE_DEPTH,
            keep_scores: spec.keep_scores || manifest.task == Task::Abundance,
            producer_nice: spec.engine.producer_nice,
        };
        Ok(Self {
            manifest,
            runtime,
            graph,
            run,
            buffers: BufferPool::new(1),
            auto,
        })
    }

    /// The plan for scenes `samples` wide, made now (on a synthetic strip) if there is none yet;
    /// `None` for a session of a fixed batch. The flag says whether it was made now.
    pub fn stream_plan(&mut self, samples: usize) -> Result<Option<(StreamPlan, bool)>, JobError> {
        let Some(state) = &self.auto else {
            return Ok(None);
        };
        if let Some((_, p)) = state.plans.iter().find(|(w, _)| *w == samples) {
            return Ok(Some((p.clone(), false)));
        }
        let settings = state.settings.clone();
        let plan = self.calibrate(samples, &settings)?;
        if let Some(state) = &mut self.auto {
            state.plans.push((samples, plan.clone()));
            let batches: Vec<usize> = state.plans.iter().map(|(_, p)| p.batch).collect();
            if let Some(b) = stream_buckets(self.runtime.provider().on_gpu(), &batches) {
                self.graph.use_buckets(b);
            }
        }
        Ok(Some((plan, true)))
    }

    /// Calibrates the memory cost and times batch sizes on a synthetic strip `samples` wide:
    /// enough tile rows for the in-run sweep to time a whole row's batch, drawn around the
    /// model's input mean (the cost and the timing do not depend on the values).
    fn calibrate(&mut self, samples: usize, settings: &BudgetSettings) -> Result<StreamPlan, JobError> {
        let _one = CALIBRATING.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let started = std::time::Instant::now();
        let lines = self.run.tile * usize::try_from(SWEEP_SCENE_BATCHES).unwrap_or(10);
        let dir = tempfile::Builder::new()
            .prefix("hsiedge-strip-")
            .tempdir()
            .map_err(|source| crate::map::MapError::Io {
                path: std::env::temp_dir(),
                source,
            })?;
        let strip = write_strip(dir.path(), &self.manifest, lines, samples)?;
        let cube = Cube::open(&strip)?;
        // A stream's tile rows are `tile` lines high, its columns those of the whole scene.
        let grid = crate::tile::TileGrid::streaming(samples, self.run.tile, self.manifest.halo);
        let strip_units = match self.run.mode {
            Mode::Patch => (grid.tile_h * samples) as u64,
            Mode::Dense => grid.cols as u64,
        };
        let geometry = SceneGeometry::of(&cube);
        let auto = auto_batch(
            &geometry,
            Some(&cube),
            &self.manifest,
            &mut self.graph,
            &self.run,
            settings,
            None,
        )?;
        let (mut batch, mut limited_by) = (auto.plan.batch_safe, auto.plan.limited_by);
        if batch > strip_units {
            (batch, limited_by) = (strip_units, Limit::Strip);
        }
        let batch = usize::try_from(batch).unwrap_or(usize::MAX);
        if batch == 0 {
            return Err(JobError::Setting {
                name: "batch",
                value: "auto".into(),
                message: format!("not one unit fits the memory budget ({} bytes)", auto.plan.budget_bytes),
            });
        }
        Ok(StreamPlan {
            samples,
            batch,
            limited_by,
            strip_units,
            memory_units: auto.plan.memory_limit_units,
            budget_bytes: auto.plan.budget_bytes,
            predicted_peak_bytes: auto.plan.predicted_peak_bytes,
            calibration_s: started.elapsed().as_secs_f64(),
            auto,
        })
    }

    /// Starts the batch buffers afresh, after a run that failed mid-way: the batches it had in
    /// flight were dropped, not given back, and would count against the next run's bound.
    pub fn reset_buffers(&mut self) {
        self.buffers = BufferPool::new(1);
    }

    /// The model.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// Whether the batch is planned by the budget (`batch = "auto"`).
    pub fn is_auto_batch(&self) -> bool {
        self.auto.is_some()
    }

    /// The run settings every scene uses.
    pub fn run_options(&self) -> &RunOptions {
        &self.run
    }

    /// The loaded ONNX Runtime.
    pub fn runtime(&self) -> &Runtime {
        &self.runtime
    }

    /// Times the engine alone over the batches a stream from `source` makes: the batches are built
    /// on this thread, between engine runs, so nothing else competes with them. Returns the
    /// seconds inside the engine and the batches run (what `bench stream` compares with).
    pub fn time_inference(&mut self, source: &mut dyn LineSource) -> Result<(f64, usize), JobError> {
        let inv_std: Vec<f32> = self.manifest.input.std.iter().map(|s| 1.0 / s).collect();
        let mut ring = LineRing::new(source, &self.manifest.input.mean, &inv_std);
        let target = std::sync::atomic::AtomicUsize::new(self.run.batch);
        let (mut seconds, mut batches, mut failed) = (0.0, 0usize, None);
        let graph = &mut self.graph;
        pipeline::produce_with(Input::Lines(&mut ring), &self.manifest, &self.run, &target, None, |b| {
            let t0 = std::time::Instant::now();
            match graph.run(&b.data, &b.shape) {
                Ok(_) => {
                    seconds += t0.elapsed().as_secs_f64();
                    batches += 1;
                    true
                }
                Err(e) => {
                    failed = Some(e);
                    false
                }
            }
        })?;
        match failed {
            Some(e) => Err(e.into()),
            None => Ok((seconds, batches)),
        }
    }

    /// Runs the scene `source` delivers into `root` (a folder of its own), each finished row
    /// written as it comes and each segment committed whole (see [`SegmentWriter`]). `progress`
    /// gets each batch's record.
    pub fn run_stream(
        &mut self,
        source: &mut dyn LineSource,
        root: &Path,
        segments: SegmentOptions,
        progress: &mut dyn FnMut(&pipeline::BatchDone),
    ) -> Result<SceneOutcome, JobError> {
        self.run_stream_with(source, root, segments, progress, &mut |_, _| {})
    }

    /// [`ModelSession::run_stream`], with `on_segment` told of each segment as it is committed
    /// (and whether it is the scene's last).
    pub fn run_stream_with(
        &mut self,
        source: &mut dyn LineSource,
        root: &Path,
        segments: SegmentOptions,
        progress: &mut dyn FnMut(&pipeline::BatchDone),
        on_segment: &mut dyn FnMut(&SegmentRecord, bool),
    ) -> Result<SceneOutcome, JobError> {
        self.run_stream_resumed(source, root, segments, &Resume::default(), progress, on_segment)
    }

    /// [`ModelSession::run_stream_with`] going on with a scene an earlier run left in `root`
    /// after committing `resume.segments`: `source` hands the scene from its first line again;
    /// the lines above the halo of the first row to run are read and dropped, that row's tile
    /// rows are run again only for their halo, and segments are committed from
    /// `resume.segments.len()` on, exactly as an uninterrupted run commits them.
    pub fn run_stream_resumed(
        &mut self,
        source: &mut dyn LineSource,
        root: &Path,
        segments: SegmentOptions,
        resume: &Resume,
        progress: &mut dyn FnMut(&pipeline::BatchDone),
        on_segment: &mut dyn FnMut(&SegmentRecord, bool),
    ) -> Result<SceneOutcome, JobError> {
        let info = source.info().clone();
        info.validate().map_err(PipelineError::Source)?;
        pipeline::check_bands(info.bands, &info.origin, &self.manifest, &self.run)?;
        let mut run = self.run.clone();
        let planned = self.stream_plan(info.samples)?;
        let mut governor = match (&planned, &self.auto) {
            (Some((plan, _)), Some(state)) => {
                run.batch = plan.batch;
                let settings = BudgetSettings {
                    max_units: state.settings.max_units.min(plan.strip_units.max(1)),
                    ..state.settings.clone()
                };
                match settings.adapt {
                    true => Some(BudgetGovernor::new(
                        &plan.auto,
                        &settings,
                        self.graph.device().map(|(d, _)| d as usize),
                    )?),
                    false => None,
                }
            }
            _ => None,
        };
        let segments = SegmentOptions {
            keep_scores: segments.keep_scores || run.keep_scores,
            ..segments
        };
        let line = resume.line();
        // The first run's tile rows: balanced over an announced length, whole rows otherwise.
        let tile_h = match info.lines {
            Some(lines) => crate::tile::TileGrid::new(lines, info.samples, run.tile, self.manifest.halo).tile_h,
            None => run.tile.max(1),
        };
        let (start, skip) = resume_start(line, tile_h, self.manifest.halo);
        let mut sink = if resume.segments.is_empty() {
            SegmentWriter::new(root, &self.manifest, &info.header, &info.id, segments)
        } else {
            SegmentWriter::resume(
                root,
                &self.manifest,
                &info.header,
                &info.id,
                segments,
                resume.segments.clone(),
                skip,
            )
        };
        sink.on_commit(Box::new(|r, last| on_segment(r, last)));
        let extra = |source: &SourceStats| {
            serde_json::json!({
                "source": source,
                "origin": info.origin,
                "mode": run.mode,
                "batch": run.batch,
                "provider": self.runtime.provider().ort_name(),
                "provider_fallbacks": self.runtime.fallbacks(),
            })
        };
        // Segments closed mid-scene say what the source had seen by then; the last, all of it.
        sink.set_extra(extra(&SourceStats::default()));
        let inv_std: Vec<f32> = self.manifest.input.std.iter().map(|s| 1.0 / s).collect();
        let result = {
            let mut resumed = (line > 0).then(|| Resumed {
                info: crate::source::SceneInfo {
                    lines: info.lines.map(|l| l.saturating_sub(start)),
                    ..info.clone()
                },
                inner: &mut *source,
                skip: start,
                tile_h,
            });
            let input: &mut dyn LineSource = match resumed.as_mut() {
                Some(r) => r,
                None => &mut *source,
            };
            let mut ring = LineRing::new(input, &self.manifest.input.mean, &inv_std);
            let adapt = governor.as_mut().map(|g| g as &mut dyn pipeline::Adapt);
            pipeline::run_with(
                Input::Lines(&mut ring),
                &self.manifest,
                &mut self.graph,
                &run,
                &self.buffers,
                progress,
                adapt,
                &mut sink,
            )?
        };
        let stats = source.stats();
        sink.set_extra(extra(&stats));
        let segments = sink.finish()?;
        let batch = planned.map(|(plan, calibrated_now)| SceneBatch {
            plan,
            calibrated_now,
            adjustments: governor.map(|g| g.changes).unwrap_or_default(),
        });
        Ok(SceneOutcome {
            scene_id: info.id,
            run: result,
            source: stats,
            segments,
            batch,
            resumed_from_line: line,
            lines_skipped: if line > 0 { start } else { 0 },
        })
    }
}

/// Writes a float32 BIL strip `lines x samples` of the model's band count into `dir`: each value
/// the band's input mean plus Gaussian noise of its standard deviation (fixed seed).
fn write_strip(dir: &Path, manifest: &Manifest, lines: usize, samples: usize) -> Result<PathBuf, JobError> {
    use rand::{Rng, SeedableRng};
    let bands = manifest.input.bands;
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed);
    let mut values = vec![0f32; lines * bands * samples];
    for (i, v) in values.iter_mut().enumerate() {
        let b = (i / samples) % bands;
        let e: f32 = rng.sample(rand_distr::StandardNormal);
        *v = manifest.input.mean[b] + manifest.input.std[b] * e;
    }
    let io = |path: PathBuf| move |source| crate::map::MapError::Io { path, source };
    let data = dir.join("strip.img");
    std::fs::write(&data, crate::cube::encode_f32(&values)).map_err(io(data.clone()))?;
    let mut header = Header::new(samples, lines, bands, DataType::F32, Interleave::Bil);
    header.description = Some(format!(
        "SYNTHETIC calibration strip for model {} (input mean + noise)",
        manifest.name
    ));
    let path = dir.join("strip.hdr");
    std::fs::write(&path, header.to_text()).map_err(io(path.clone()))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resume_starts_whole_tile_rows_early_enough_to_read_the_halo_of_its_row() {
        // Line 60 in rows of 25 lies in row 50..75, whose halo of 1 needs line 49: start at 25.
        assert_eq!(resume_start(60, 25, 1), (25, 35));
        // In the first row or the one after it, with a halo: from the scene's top.
        assert_eq!(resume_start(16, 32, 1), (0, 16));
        assert_eq!(resume_start(48, 32, 1), (0, 48));
        assert_eq!(resume_start(64, 32, 1), (32, 32));
        // A halo deeper than a row takes as many rows as it needs.
        assert_eq!(resume_start(100, 10, 15), (80, 20));
        // No halo: the row itself.
        assert_eq!(resume_start(64, 32, 0), (64, 0));
        assert_eq!(resume_start(70, 32, 0), (64, 6));
    }

    #[test]
    fn a_gpu_stream_pads_to_buckets_up_to_its_largest_planned_batch() {
        assert!(stream_buckets(false, &[16, 64]).is_none(), "the CPU takes any shape");
        let b = stream_buckets(true, &[16, 64, 8]).unwrap();
        assert_eq!(b.largest(), 64);
        // A re-cut batch of 20 and a scene's last batch of 3 run padded.
        assert_eq!(b.bucket_for(20), Some(32));
        assert_eq!(b.bucket_for(3), Some(4));
        assert_eq!(stream_buckets(true, &[]).unwrap().largest(), 1);
    }
}
