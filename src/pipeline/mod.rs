//! The tiled inference pipeline: a producer thread reads, normalises and tiles the cube into ready
//! batches through a bounded queue while the caller's thread runs the engine and stitches outputs.
//!
//! Patch mode gathers the `p x p` neighbourhood of every pixel (B per batch); dense mode runs the
//! fully convolutional twin on N whole tile windows and keeps each tile's centre. Both read the same
//! reflected windows, so they see the same numbers. The stitcher counts writes per pixel and fails
//! the run unless every pixel was written exactly once.

mod error;
mod pool;
mod produce;
mod ring;
mod stitch;
mod strips;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::cube::Cube;
use crate::engine::Graph;
use crate::model::{Layout, Manifest, Task};
use crate::tile::{TileGrid, TileRect};

pub use error::PipelineError;
pub use pool::BufferPool;
use pool::CloseOnDrop;
pub use produce::{Input, StripStart, produce, produce_with};
pub use ring::LineRing;
pub use stitch::Stitcher;
pub use strips::{MapsSink, RowSink, Strips};

/// How pixels reach the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// One `p x p` patch per pixel.
    Patch,
    /// Whole tiles through the dense twin.
    Dense,
}

/// Settings of one run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunOptions {
    /// Execution mode.
    pub mode: Mode,
    /// Patches per batch (patch mode) or tiles per batch (dense mode).
    pub batch: usize,
    /// Tile side in output pixels (at most; balanced over the scene).
    pub tile: usize,
    /// Batches the producer may run ahead of the engine.
    pub queue: usize,
    /// Keep every output channel (abundances are always kept).
    pub keep_scores: bool,
    /// Nice increment of the producer thread (0: none).
    pub producer_nice: i32,
}

/// A batch ready for the engine, with where each of its samples lands.
#[derive(Debug, Clone, Default)]
pub struct Batch {
    /// Input values in the graph's layout.
    pub data: Vec<f32>,
    /// Input shape.
    pub shape: Vec<usize>,
    /// Patch mode: the scene pixel (line, sample) of each sample.
    pub pixels: Vec<(usize, usize)>,
    /// Dense mode: the tile of each sample.
    pub tiles: Vec<TileRect>,
    /// The tile rows whose first unit is in this batch.
    pub strips: Vec<StripStart>,
}

impl Batch {
    /// Samples in the batch: pixels (patch mode) or tiles (dense mode).
    pub fn units(&self) -> usize {
        if self.tiles.is_empty() {
            self.pixels.len()
        } else {
            self.tiles.len()
        }
    }
}

/// The stitched maps of a run.
#[derive(Debug, Clone)]
pub struct Maps {
    /// Scene lines.
    pub lines: usize,
    /// Scene samples.
    pub samples: usize,
    /// Output channels.
    pub channels: usize,
    /// Classification: class id per pixel (row-major); empty for abundance.
    pub class_ids: Vec<u8>,
    /// Classification: softmax maximum per pixel; empty for abundance.
    pub confidence: Vec<f32>,
    /// Every channel, `channels x lines x samples` (band sequential), when kept.
    pub scores: Option<Vec<f32>>,
    /// Pixels whose model output held a NaN or an infinity (a non-finite input value, or a model
    /// that overflowed): class 0 (unclassified) and NaN confidence in a classification.
    pub nonfinite_pixels: usize,
}

/// What a run measured.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct RunStats {
    /// Scene lines.
    pub lines: usize,
    /// From a line source: seconds from each output row's last input line's arrival to the row's
    /// hand-over to the sink, as median, 99th percentile and maximum.
    pub row_latency_s: Option<Latency>,
    /// Pixels written.
    pub pixels: usize,
    /// Batches run.
    pub batches: usize,
    /// Tiles in the grid.
    pub tiles: usize,
    /// Tile size used (lines x samples of output per tile).
    pub tile_shape: (usize, usize),
    /// Wall time from start to stitched maps.
    pub elapsed_s: f64,
    /// Time inside the engine.
    pub inference_s: f64,
    /// Time the engine thread waited for the producer.
    pub wait_s: f64,
    /// Time from start to the first batch's result.
    pub first_batch_s: f64,
}

/// What the engine thread reports after each batch (the telemetry's per-batch record).
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct BatchDone {
    /// Batches run so far, this one included.
    pub batches: usize,
    /// Pixels stitched so far.
    pub pixels_done: usize,
    /// Units (patches or tiles) in this batch.
    pub units: usize,
    /// Pixels this batch stitched.
    pub pixels: usize,
    /// Seconds this batch spent in the engine.
    pub infer_s: f64,
    /// Seconds the engine thread waited for this batch's input.
    pub wait_s: f64,
    /// Batches ready in the queue when this one finished.
    pub queued: usize,
    /// The batch size in force (units) after this batch.
    pub batch: usize,
}

/// A latency distribution.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct Latency {
    /// Rows measured.
    pub rows: usize,
    /// Median, seconds.
    pub p50: f64,
    /// 99th percentile, seconds.
    pub p99: f64,
    /// Largest, seconds.
    pub max: f64,
}

impl Latency {
    /// The distribution of `values` (seconds), `None` when empty.
    pub fn of(values: &[f32]) -> Option<Self> {
        let mut v = values.to_vec();
        v.sort_by(f32::total_cmp);
        let at = |q: f64| f64::from(v[((v.len() - 1) as f64 * q).round() as usize]);
        (!v.is_empty()).then(|| Self {
            rows: v.len(),
            p50: at(0.5),
            p99: at(0.99),
            max: at(1.0),
        })
    }
}

/// Adapts the batch while a run goes on (the memory governor implements it).
pub trait Adapt {
    /// Called after every batch with the batches done so far and the current batch (units);
    /// returns the batch to use from now on.
    fn after_batch(&mut self, batches_done: u64, current: usize) -> usize;
}

/// The batch buffers a run over `cube` at `opts.batch` may hold at once.
pub fn buffer_limit(cube: &Cube, manifest: &Manifest, opts: &RunOptions) -> usize {
    run_buffers(cube, manifest, opts).0
}

/// The buffers a run over `cube` at `opts.batch` may hold, and the values in one of them.
fn run_buffers(cube: &Cube, manifest: &Manifest, opts: &RunOptions) -> (usize, usize) {
    let grid = grid_for(cube, manifest, opts);
    let (units, per_unit) = match opts.mode {
        Mode::Patch => (
            cube.lines() * cube.samples(),
            cube.bands() * manifest.patch * manifest.patch,
        ),
        Mode::Dense => (grid.len(), cube.bands() * grid.window_h() * grid.window_w()),
    };
    (
        BufferPool::run_limit(opts.queue, units, opts.batch),
        opts.batch.max(1) * per_unit,
    )
}

/// The units (pixels in patch mode, tiles in dense mode) a run over `cube` sends to the engine.
pub fn units(cube: &Cube, manifest: &Manifest, opts: &RunOptions) -> usize {
    match opts.mode {
        Mode::Patch => cube.lines() * cube.samples(),
        Mode::Dense => grid_for(cube, manifest, opts).len(),
    }
}

/// The tile grid a run over `cube` uses.
pub fn grid_for(cube: &Cube, manifest: &Manifest, opts: &RunOptions) -> TileGrid {
    TileGrid::new(cube.lines(), cube.samples(), opts.tile, manifest.halo)
}

/// Checks the run can start: bands match, settings in range, dense twin present for dense mode.
pub fn check(cube: &Cube, manifest: &Manifest, opts: &RunOptions) -> Result<(), PipelineError> {
    check_bands(cube.bands(), cube.header_path(), manifest, opts)
}

/// [`check`] for a scene of `bands` bands from `origin` (a file or a stream).
pub fn check_bands(
    bands: usize,
    origin: &std::path::Path,
    manifest: &Manifest,
    opts: &RunOptions,
) -> Result<(), PipelineError> {
    if bands != manifest.input.bands {
        return Err(PipelineError::Bands {
            cube: origin.to_path_buf(),
            bands,
            manifest: manifest.path.clone(),
            expected: manifest.input.bands,
        });
    }
    if opts.mode == Mode::Dense && manifest.files.dense.is_none() {
        return Err(PipelineError::NoDense {
            manifest: manifest.path.clone(),
        });
    }
    if opts.mode == Mode::Dense && manifest.input.layout == Layout::Nc {
        return Err(PipelineError::Setting {
            name: "mode",
            message: "per-pixel (\"nc\") models run in patch mode".into(),
        });
    }
    for (name, v) in [("batch", opts.batch), ("tile", opts.tile), ("queue", opts.queue)] {
        if v == 0 {
            return Err(PipelineError::Setting {
                name,
                message: "must be at least 1".into(),
            });
        }
    }
    Ok(())
}

/// Runs `graph` over `cube`: the producer thread fills a queue of `opts.queue` batches while this
/// thread infers and stitches. `progress` gets a [`BatchDone`] after each batch. With `adapt`, the
/// batch may change between batches: the producer builds new batches at the new size, and batches
/// already queued are run in pieces no larger than it. Batch buffers come from `pool`, reopened
/// for this run and closed when it ends; the buffers it made stay in it for the next run.
pub fn run(
    cube: &Cube,
    manifest: &Manifest,
    graph: &mut Graph,
    opts: &RunOptions,
    pool: &BufferPool,
    progress: &mut dyn FnMut(&BatchDone),
    adapt: Option<&mut dyn Adapt>,
) -> Result<(Maps, RunStats), PipelineError> {
    check(cube, manifest, opts)?;
    let classify = manifest.task == Task::Classification;
    let mut sink = MapsSink::new(
        cube.samples(),
        manifest.classes(),
        cube.lines(),
        classify,
        opts.keep_scores || !classify,
    );
    let stats = run_with(
        Input::Mapped(cube),
        manifest,
        graph,
        opts,
        pool,
        progress,
        adapt,
        &mut sink,
    )?;
    Ok((sink.into_maps(), stats))
}

/// The tile grid a run over `input` starts with: balanced over the scene when its line count is
/// known, whole tile rows from the top ([`TileGrid::streaming`]) when it is not.
pub fn input_grid(input: &Input<'_, '_>, manifest: &Manifest, opts: &RunOptions) -> TileGrid {
    match input {
        Input::Mapped(cube) => grid_for(cube, manifest, opts),
        Input::Lines(ring) => {
            let info = ring.source().info();
            let grid = match info.lines {
                Some(lines) => TileGrid::new(lines, info.samples, opts.tile, manifest.halo),
                None => TileGrid::streaming(info.samples, opts.tile, manifest.halo),
            };
            match ring.source().tile_rows() {
                Some(h) => grid.with_tile_h(h),
                None => grid,
            }
        }
    }
}

/// [`run`] over any [`Input`], each tile row's maps handed to `sink` as soon as the row is done:
/// a streamed scene is never held whole. Returns what the run measured; `stats.lines` is the
/// scene's line count.
#[allow(clippy::too_many_arguments)]
pub fn run_with(
    input: Input<'_, '_>,
    manifest: &Manifest,
    graph: &mut Graph,
    opts: &RunOptions,
    pool: &BufferPool,
    progress: &mut dyn FnMut(&BatchDone),
    mut adapt: Option<&mut dyn Adapt>,
    sink: &mut dyn RowSink,
) -> Result<RunStats, PipelineError> {
    let (bands, origin) = match &input {
        Input::Mapped(cube) => (cube.bands(), cube.header_path().to_path_buf()),
        Input::Lines(ring) => (ring.bands(), ring.source().info().origin.clone()),
    };
    check_bands(bands, &origin, manifest, opts)?;
    let start = Instant::now();
    let grid = input_grid(&input, manifest, opts);
    let mut strips = Strips::new(
        manifest,
        grid,
        opts.keep_scores || manifest.task != Task::Classification,
    );
    let mut stats = RunStats {
        tile_shape: (grid.tile_h, grid.tile_w),
        ..RunStats::default()
    };
    let target = AtomicUsize::new(opts.batch);
    let (tx, rx) = crossbeam_channel::bounded::<Batch>(opts.queue);
    let units = match (&input, opts.mode) {
        (Input::Mapped(cube), Mode::Patch) => cube.lines() * cube.samples(),
        (Input::Mapped(_), Mode::Dense) => grid.len(),
        // A stream's length is unknown: as many buffers as a long scene holds.
        (Input::Lines(_), _) => usize::MAX,
    };
    let per_unit = match opts.mode {
        Mode::Patch => bands * manifest.patch * manifest.patch,
        Mode::Dense => bands * grid.window_h() * grid.window_w(),
    };
    let (limit, need) = (
        BufferPool::run_limit(opts.queue, units, opts.batch),
        opts.batch.max(1) * per_unit,
    );
    pool.reopen(limit);
    let mut inference = Duration::ZERO;
    let mut wait = Duration::ZERO;
    let mut shrunk = false;
    let (result, produced) = std::thread::scope(|scope| {
        let target = &target;
        let producer = scope.spawn(move || {
            // The producer steps back so it fills the engine threads' idle gaps instead of
            // preempting them mid-operator (a preempted intra-op thread stalls the whole operator).
            if opts.producer_nice > 0 {
                let _ = crate::ffi::lower_thread_priority(opts.producer_nice);
            }
            produce_with(input, manifest, opts, target, Some(pool), |b| tx.send(b).is_ok())
        });
        let result = (|| -> Result<(), PipelineError> {
            // Declared after `rx`, so dropped first: on an early return the producer is released
            // both from waiting for a buffer and from waiting for room in the queue.
            let rx = rx;
            let _close = CloseOnDrop(pool);
            // The other buffers are made while the producer builds the first batch.
            pool.fill(need);
            loop {
                let t0 = Instant::now();
                let Ok(batch) = rx.recv() else { break };
                let waited = t0.elapsed();
                wait += waited;
                let units = batch.units();
                let per_unit = batch.data.len() / units.max(1);
                let mut from = 0;
                while from < units {
                    let to = (from + target.load(Ordering::Relaxed).max(1)).min(units);
                    let mut shape = batch.shape.clone();
                    shape[0] = to - from;
                    let t1 = Instant::now();
                    let (out_shape, out) =
                        graph
                            .run(&batch.data[from * per_unit..to * per_unit], &shape)
                            .map_err(|source| PipelineError::Engine {
                                batch: stats.batches,
                                first_tile: batch
                                    .tiles
                                    .get(from)
                                    .map(|t| (t.row, t.col))
                                    .or_else(|| {
                                        batch.pixels.get(from).map(|&(y, x)| (y / grid.tile_h, x / grid.tile_w))
                                    })
                                    .unwrap_or_default(),
                                source,
                            })?;
                    let inferred = t1.elapsed();
                    inference += inferred;
                    if stats.batches == 0 {
                        stats.first_batch_s = start.elapsed().as_secs_f64();
                    }
                    strips.put_range(&batch, from..to, &out_shape, &out, graph.path(), sink)?;
                    stats.batches += 1;
                    let pixels = if batch.tiles.is_empty() {
                        to - from
                    } else {
                        batch.tiles[from..to].iter().map(|t| t.h * t.w).sum()
                    };
                    stats.pixels += pixels;
                    if let Some(a) = adapt.as_deref_mut() {
                        let now = target.load(Ordering::Relaxed);
                        let next = a.after_batch(stats.batches as u64, now).max(1);
                        if next != now {
                            target.store(next, Ordering::Relaxed);
                        }
                        if next < now {
                            graph.shrink_arena_after_next_run();
                            shrunk = true;
                        }
                    }
                    progress(&BatchDone {
                        batches: stats.batches,
                        pixels_done: stats.pixels,
                        units: to - from,
                        pixels,
                        infer_s: inferred.as_secs_f64(),
                        wait_s: if from == 0 { waited.as_secs_f64() } else { 0.0 },
                        queued: rx.len(),
                        batch: target.load(Ordering::Relaxed),
                    });
                    from = to;
                }
                // Given back before the next `recv`: the producer takes its next buffer only after
                // the queue had room, so this one is free by then and no extra buffer is made.
                pool.give(batch.data);
                if shrunk {
                    // Memory is being taken: the spare buffers of the old size go back to the
                    // system now, not when the producer next looks for one.
                    shrunk = false;
                    pool.drop_spares();
                }
            }
            Ok(())
        })();
        let produced = producer.join().unwrap_or_else(|_| {
            Err(PipelineError::Setting {
                name: "producer",
                message: "the tiling thread panicked".into(),
            })
        });
        (result, produced)
    });
    // The engine's error first: it explains why the producer stopped early.
    result?;
    let lines = produced?;
    let done = strips.lines_done();
    stats.row_latency_s = Latency::of(strips.row_latencies());
    strips.finish()?;
    if done != lines {
        return Err(PipelineError::Coverage {
            line: done,
            sample: 0,
            count: 0,
            row: done / grid.tile_h.max(1),
            col: 0,
        });
    }
    stats.lines = lines;
    stats.tiles = grid.with_lines(lines).len();
    stats.elapsed_s = start.elapsed().as_secs_f64();
    stats.inference_s = inference.as_secs_f64();
    stats.wait_s = wait.as_secs_f64();
    Ok(stats)
}

/// Runs the first `batches` batches of a run at `opts.batch` through the real pipeline (producer
/// thread, queue, engine) and discards the results: the memory plan's calibration measures a
/// run's peak in place this way, in-flight batches included. Returns each batch's seconds on the
/// engine thread (waiting for it, then running it), in order: the in-run batch sweep's timings.
pub fn probe(
    cube: &Cube,
    manifest: &Manifest,
    graph: &mut Graph,
    opts: &RunOptions,
    batches: usize,
) -> Result<Vec<f64>, PipelineError> {
    check(cube, manifest, opts)?;
    let (tx, rx) = crossbeam_channel::bounded::<Batch>(opts.queue);
    let (limit, need) = run_buffers(cube, manifest, opts);
    let pool = BufferPool::new(limit);
    let target = AtomicUsize::new(opts.batch);
    let last = batches.min(units(cube, manifest, opts).div_ceil(opts.batch.max(1)));
    let mut times = Vec::with_capacity(last);
    std::thread::scope(|scope| -> Result<(), PipelineError> {
        let (target, pool) = (&target, &pool);
        // The producer keeps its normal priority here, unlike in `run`: calibration measures the
        // worst case, in which the producer keeps up and every buffer is in flight.
        scope.spawn(move || {
            produce_with(Input::Mapped(cube), manifest, opts, target, Some(pool), |b| {
                tx.send(b).is_ok()
            })
        });
        let rx = rx;
        let _close = CloseOnDrop(pool);
        pool.fill(need);
        for i in 0..last {
            let t0 = Instant::now();
            let Ok(batch) = rx.recv() else { break };
            // The probe leaves the arena as it found it, so what it held does not count in the
            // next probe's peak; its batches are all one size, so the arena is reused until then.
            if i + 1 == last {
                graph.shrink_arena_after_next_run();
            }
            graph
                .run(&batch.data, &batch.shape)
                .map_err(|source| PipelineError::Engine {
                    batch: i,
                    first_tile: batch.tiles.first().map(|t| (t.row, t.col)).unwrap_or_default(),
                    source,
                })?;
            times.push(t0.elapsed().as_secs_f64());
            pool.give(batch.data);
        }
        Ok(())
    })?;
    Ok(times)
}
