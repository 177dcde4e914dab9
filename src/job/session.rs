//! A model ready to run many streamed scenes: the session is built once and reused, each scene's
//! rows written as they finish.

use std::path::{Path, PathBuf};

use super::{DEFAULT_DENSE_BATCH, DEFAULT_PATCH_BATCH, JobError, ModeChoice, QUEUE_DEPTH};
use crate::engine::{EngineOptions, Graph, Runtime};
use crate::map::{SegmentOptions, SegmentRecord, SegmentWriter};
use crate::model::{Manifest, Role, Task};
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
    /// Units per batch (patches, or tiles in dense mode); `None` for the mode's default.
    pub batch: Option<usize>,
    /// Tile side.
    pub tile: usize,
    /// Engine settings. Keep `producer_nice` at 0 for streams ([`STREAM_PRODUCER_NICE`]).
    pub engine: EngineOptions,
    /// Keep every output channel.
    pub keep_scores: bool,
}

/// A loaded model: its manifest, ONNX Runtime session and batch buffers, kept from scene to scene.
#[derive(Debug)]
pub struct ModelSession {
    manifest: Manifest,
    runtime: Runtime,
    graph: Graph,
    run: RunOptions,
    buffers: BufferPool,
}

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
        let batch = spec.batch.unwrap_or(match mode {
            Mode::Patch => DEFAULT_PATCH_BATCH,
            Mode::Dense => DEFAULT_DENSE_BATCH,
        });
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
        })
    }

    /// The model.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
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
        let info = source.info().clone();
        info.validate().map_err(PipelineError::Source)?;
        pipeline::check_bands(info.bands, &info.origin, &self.manifest, &self.run)?;
        let segments = SegmentOptions {
            keep_scores: segments.keep_scores || self.run.keep_scores,
            ..segments
        };
        let mut sink = SegmentWriter::new(root, &self.manifest, &info.header, &info.id, segments);
        sink.on_commit(Box::new(|r, last| on_segment(r, last)));
        let extra = |source: &SourceStats| {
            serde_json::json!({
                "source": source,
                "origin": info.origin,
                "mode": self.run.mode,
                "batch": self.run.batch,
                "provider": self.runtime.provider().ort_name(),
            })
        };
        // Segments closed mid-scene say what the source had seen by then; the last, all of it.
        sink.set_extra(extra(&SourceStats::default()));
        let inv_std: Vec<f32> = self.manifest.input.std.iter().map(|s| 1.0 / s).collect();
        let run = {
            let mut ring = LineRing::new(source, &self.manifest.input.mean, &inv_std);
            pipeline::run_with(
                Input::Lines(&mut ring),
                &self.manifest,
                &mut self.graph,
                &self.run,
                &self.buffers,
                progress,
                None,
                &mut sink,
            )?
        };
        let stats = source.stats();
        sink.set_extra(extra(&stats));
        let segments = sink.finish()?;
        Ok(SceneOutcome {
            scene_id: info.id,
            run,
            source: stats,
            segments,
        })
    }
}
