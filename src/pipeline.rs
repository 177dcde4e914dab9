//! The tiled inference pipeline: a producer thread reads, normalises and tiles the cube into ready
//! batches through a bounded queue while the caller's thread runs the engine and stitches outputs.
//!
//! Patch mode gathers the `p x p` neighbourhood of every pixel (B per batch); dense mode runs the
//! fully convolutional twin on N whole tile windows and keeps each tile's centre. Both read the same
//! reflected windows, so they see the same numbers. The stitcher counts writes per pixel and fails
//! the run unless every pixel was written exactly once.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::cube::Cube;
use crate::engine::{EngineError, Graph};
use crate::model::{Layout, Manifest, OutputKind, Task};
use crate::tile::{TileGrid, TileRect, WindowShape, fill_window, gather_patch};

/// Errors from a pipeline run.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    /// The cube's bands do not match the model.
    #[error("{cube}: {bands} bands, but {manifest} field `input.bands` says {expected}")]
    Bands {
        /// The cube's header.
        cube: std::path::PathBuf,
        /// Bands in the cube.
        bands: usize,
        /// The manifest.
        manifest: std::path::PathBuf,
        /// Bands the model expects.
        expected: usize,
    },
    /// Dense mode was asked for a model without a dense twin.
    #[error("{manifest}: dense mode needs `files.dense`, which this manifest does not have (use --mode patch)")]
    NoDense {
        /// The manifest.
        manifest: std::path::PathBuf,
    },
    /// A setting is out of range.
    #[error("invalid setting `{name}`: {message}")]
    Setting {
        /// The setting.
        name: &'static str,
        /// Why.
        message: String,
    },
    /// The engine failed on a batch.
    #[error("batch {batch} (from tile row, col {first_tile:?})")]
    Engine {
        /// Batch index.
        batch: usize,
        /// The first tile in it.
        first_tile: (usize, usize),
        /// The engine error.
        source: EngineError,
    },
    /// The graph returned a shape the pipeline cannot stitch.
    #[error("{graph}: output shape {got:?} for input {input:?}, expected {expected}")]
    OutputShape {
        /// The ONNX file.
        graph: std::path::PathBuf,
        /// What came back.
        got: Vec<usize>,
        /// The input shape sent.
        input: Vec<usize>,
        /// What was expected.
        expected: String,
    },
    /// A pixel was written twice or never: an internal error, reported with its place.
    #[error("pixel (line {line}, sample {sample}) written {count} times (tile row {row}, col {col})")]
    Coverage {
        /// Scene line.
        line: usize,
        /// Scene sample.
        sample: usize,
        /// Times written.
        count: u8,
        /// Tile row holding it.
        row: usize,
        /// Tile column holding it.
        col: usize,
    },
}

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

/// Adapts the batch while a run goes on (the memory governor implements it).
pub trait Adapt {
    /// Called after every batch with the batches done so far and the current batch (units);
    /// returns the batch to use from now on.
    fn after_batch(&mut self, batches_done: u64, current: usize) -> usize;
}

/// Builds batches for `manifest` over `cube` and hands each to `sink`; stops early when `sink`
/// returns `false`. Runs on the calling thread.
pub fn produce(cube: &Cube, manifest: &Manifest, opts: &RunOptions, sink: impl FnMut(Batch) -> bool) {
    produce_with(cube, manifest, opts, &AtomicUsize::new(opts.batch), None, sink)
}

/// [`produce`], with the batch size read from `target` as each batch starts, so a governor on
/// another thread can change it, and batch buffers taken from `pool` (see [`BufferPool`]).
///
/// Stops when `sink` returns `false` or the pool is closed.
pub fn produce_with(
    cube: &Cube,
    manifest: &Manifest,
    opts: &RunOptions,
    target: &AtomicUsize,
    pool: Option<&BufferPool>,
    mut sink: impl FnMut(Batch) -> bool,
) {
    let grid = grid_for(cube, manifest, opts);
    let bands = cube.bands();
    let mean = &manifest.input.mean;
    let inv_std: Vec<f32> = manifest.input.std.iter().map(|s| 1.0 / s).collect();
    let layout = manifest.input.layout;
    let p = manifest.patch;
    let (wh, ww) = (grid.window_h(), grid.window_w());
    let shape = WindowShape { bands, h: wh, w: ww };
    let fill = |lines: &[usize], col: usize, out: &mut Vec<f32>| {
        fill_window(cube, lines, &grid.window_samples(col), mean, &inv_std, out);
    };
    let mut window: Vec<f32> = match opts.mode {
        Mode::Patch => Vec::with_capacity(bands * wh * ww),
        Mode::Dense => Vec::new(),
    };
    let per_unit = match opts.mode {
        Mode::Patch => bands * p * p,
        Mode::Dense => bands * wh * ww,
    };
    let cap_now = || target.load(Ordering::Relaxed).max(1);
    let mut cap = cap_now();
    // The next batch's buffer is taken only when its first unit is written, after the finished
    // batch has been handed over: by then the consumer has returned the buffer it ran before it
    // took the queued one, so the producer never waits on the pool with a finished batch in hand.
    // `false` when the pool has closed: the consumer is gone.
    let start = |b: &mut Batch, cap: &mut usize| -> bool {
        if b.data.capacity() == 0 {
            *cap = cap_now();
            let need = *cap * per_unit;
            b.data = match pool {
                Some(pool) => match pool.take(need) {
                    Some(v) => v,
                    None => return false,
                },
                None => Vec::with_capacity(need),
            };
            match opts.mode {
                // Patches are written in place: a buffer back from the engine is already this long,
                // so in a steady run no value of the batch is written twice (a new buffer, or the
                // one that held a partial last batch, is zeroed first, once).
                Mode::Patch => {
                    b.data.resize(need, 0.0);
                    b.pixels.reserve(*cap);
                }
                Mode::Dense => b.data.clear(),
            }
        }
        true
    };
    let mut batch = Batch::default();
    let finish = |b: &mut Batch| {
        let n = match opts.mode {
            Mode::Patch => b.pixels.len(),
            Mode::Dense => b.tiles.len(),
        };
        b.shape = match opts.mode {
            Mode::Patch => layout.shape(n, bands, p, p),
            Mode::Dense => layout.shape(n, bands, wh, ww),
        };
        // A last, partial batch of patches holds only the patches written.
        b.data.truncate(n * per_unit);
        std::mem::take(b)
    };
    for row in 0..grid.rows {
        let lines = grid.window_lines(row);
        for col in 0..grid.cols {
            let rect = grid.rect(row, col);
            match opts.mode {
                Mode::Dense => {
                    if !start(&mut batch, &mut cap) {
                        return;
                    }
                    // Appended straight to the batch: a window is megabytes, and a copy through a
                    // scratch buffer (or zeroing first) would write it twice.
                    fill(&lines, col, &mut batch.data);
                    batch.tiles.push(rect);
                    if batch.tiles.len() >= cap && !sink(finish(&mut batch)) {
                        return;
                    }
                }
                Mode::Patch => {
                    window.clear();
                    fill(&lines, col, &mut window);
                    for i in 0..rect.h {
                        for j in 0..rect.w {
                            if !start(&mut batch, &mut cap) {
                                return;
                            }
                            let at = batch.pixels.len() * per_unit;
                            gather_patch(&window, shape, i, j, p, &mut batch.data[at..at + per_unit]);
                            batch.pixels.push((rect.y0 + i, rect.x0 + j));
                            if batch.pixels.len() >= cap && !sink(finish(&mut batch)) {
                                return;
                            }
                        }
                    }
                }
            }
        }
    }
    if !batch.pixels.is_empty() || !batch.tiles.is_empty() {
        sink(finish(&mut batch));
    }
}

/// The batch buffers of one run: at most `limit` exist at once, so a run's batch memory is
/// bounded by construction, not by how the producer and the engine happen to be timed.
///
/// Reusing the engine's spent buffers also keeps a steady run off the allocator: a fresh batch
/// buffer is a fresh mapping, faulted and zeroed by the kernel page by page and unmapped after its
/// run, which costs the engine's threads TLB shootdowns. A free buffer that does not fit the size
/// asked for (smaller, or more than a quarter larger) is dropped and replaced, so memory given back
/// when the governor shrinks the batch stays given.
///
/// A [`crate::job::Job`] keeps its pool from run to run, as the session keeps its arena: a run
/// then starts with its buffers resident instead of faulting megabytes in before the first batch.
#[derive(Debug)]
pub struct BufferPool {
    state: Mutex<PoolState>,
    returned: Condvar,
}

#[derive(Debug, Default)]
struct PoolState {
    free: Vec<Vec<f32>>,
    made: usize,
    limit: usize,
    closed: bool,
}

impl BufferPool {
    /// A pool that lets at most `limit` (at least 1) buffers exist.
    pub fn new(limit: usize) -> Self {
        Self {
            state: Mutex::new(PoolState {
                limit: limit.max(1),
                ..PoolState::default()
            }),
            returned: Condvar::new(),
        }
    }

    /// Opens the pool (again) for a run that may hold `limit` (at least 1) buffers: buffers kept
    /// from an earlier run are reused, and those beyond the new limit are freed now.
    pub fn reopen(&self, limit: usize) {
        let extra = {
            let mut s = self.lock();
            s.closed = false;
            s.limit = limit.max(1);
            let keep = s.free.len().saturating_sub(s.made.saturating_sub(s.limit));
            let extra = s.free.split_off(keep);
            s.made -= extra.len();
            extra
        };
        drop(extra);
    }

    /// The buffers a run over `units` units at `batch` per batch can have in flight: one running,
    /// `queue` queued and one being built, but no more than the scene has batches.
    pub fn run_limit(queue: usize, units: usize, batch: usize) -> usize {
        (queue + 2).min(units.div_ceil(batch.max(1))).max(1)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PoolState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A buffer with room for `need` values, holding whatever it held when given back (the caller
    /// clears or overwrites it): a free one that fits, else a new (empty) one while fewer than
    /// `limit` exist, else the next one given back. `None` once the pool is closed.
    pub fn take(&self, need: usize) -> Option<Vec<f32>> {
        let mut s = self.lock();
        loop {
            if s.closed {
                return None;
            }
            if let Some(at) = s.free.iter().position(|v| fits(v, need)) {
                let v = s.free.swap_remove(at);
                drop(s);
                return Some(v);
            }
            let misfit = s.free.pop();
            if misfit.is_some() {
                s.made -= 1;
            }
            if s.made < s.limit {
                s.made += 1;
                drop(s);
                drop(misfit);
                return Some(Vec::with_capacity(need));
            }
            s = self.returned.wait(s).unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Gives a buffer back for reuse.
    pub fn give(&self, v: Vec<f32>) {
        self.lock().free.push(v);
        self.returned.notify_one();
    }

    /// Frees every buffer not in use now (the governor shrank the batch: give memory back at once).
    pub fn drop_spares(&self) {
        let spares = {
            let mut s = self.lock();
            s.made -= s.free.len();
            std::mem::take(&mut s.free)
        };
        drop(spares);
        self.returned.notify_all();
    }

    /// Makes buffers of `need` values, each page touched so it is resident, until `limit` exist.
    ///
    /// A run's memory then reaches its worst case at the start, as the memory plan counts it,
    /// instead of whenever the producer happens to get ahead: if it does not fit, that shows before
    /// the first batch, and calibration probes measure the same peak a long run reaches. Called on
    /// the engine's thread while the producer builds the first batch.
    pub fn fill(&self, need: usize) {
        let misfits = {
            let mut s = self.lock();
            let (fit, misfit): (Vec<_>, Vec<_>) = std::mem::take(&mut s.free).into_iter().partition(|v| fits(v, need));
            s.free = fit;
            s.made -= misfit.len();
            misfit
        };
        drop(misfits);
        loop {
            {
                let mut s = self.lock();
                if s.closed || s.made >= s.limit {
                    return;
                }
                s.made += 1;
            }
            let mut v: Vec<f32> = Vec::with_capacity(need);
            // One write per page makes it resident; the producer overwrites it all anyway.
            for slot in v
                .spare_capacity_mut()
                .iter_mut()
                .step_by(4096 / std::mem::size_of::<f32>())
            {
                slot.write(0.0);
            }
            self.give(v);
        }
    }

    /// Closes the pool: `take` returns `None` from now on, so a producer waiting for a buffer stops.
    pub fn close(&self) {
        self.lock().closed = true;
        self.returned.notify_all();
    }
}

/// Whether a free buffer serves a request for `need` values: large enough, and not more than a
/// quarter larger (memory given back when the batch shrinks stays given).
fn fits(v: &Vec<f32>, need: usize) -> bool {
    v.capacity() >= need && v.capacity() <= need + need / 4
}

/// Closes a pool when dropped, so the producer never waits on an engine thread that has left.
struct CloseOnDrop<'a>(&'a BufferPool);

impl Drop for CloseOnDrop<'_> {
    fn drop(&mut self) {
        self.0.close();
    }
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
    if cube.bands() != manifest.input.bands {
        return Err(PipelineError::Bands {
            cube: cube.header_path().to_path_buf(),
            bands: cube.bands(),
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

/// Accumulates outputs into maps, counting writes per pixel.
#[derive(Debug)]
pub struct Stitcher {
    maps: Maps,
    written: Vec<u8>,
    task: Task,
    kind: OutputKind,
    ids: Vec<u8>,
    grid: TileGrid,
    /// One output row's per-pixel working values (see [`Stitcher::put_row`]).
    row: RowScratch,
}

/// Per-pixel working values of one output row, kept so a run allocates them once.
#[derive(Debug, Default)]
struct RowScratch {
    top: Vec<f32>,
    best: Vec<u32>,
    sum: Vec<f32>,
    finite: Vec<bool>,
}

impl Stitcher {
    /// A stitcher for `manifest` over `grid`, its outputs poisoned (NaN confidence, class 0) until written.
    pub fn new(manifest: &Manifest, grid: TileGrid, keep_scores: bool) -> Self {
        let n = grid.lines * grid.samples;
        let k = manifest.classes();
        let classify = manifest.task == Task::Classification;
        Self {
            maps: Maps {
                lines: grid.lines,
                samples: grid.samples,
                channels: k,
                class_ids: if classify { vec![0; n] } else { Vec::new() },
                confidence: if classify { vec![f32::NAN; n] } else { Vec::new() },
                scores: (keep_scores || !classify).then(|| vec![f32::NAN; k * n]),
                nonfinite_pixels: 0,
            },
            written: vec![0; n],
            task: manifest.task,
            kind: manifest.output_kind,
            ids: manifest
                .outputs
                .iter()
                .map(|o| u8::try_from(o.id).unwrap_or(0))
                .collect(),
            grid,
            row: RowScratch::default(),
        }
    }

    /// Writes pixel (`y`, `x`) from `k` scores read as `scores(c)`.
    pub fn put(&mut self, y: usize, x: usize, scores: impl Fn(usize) -> f32) {
        let n = self.grid.lines * self.grid.samples;
        let at = y * self.grid.samples + x;
        self.written[at] = self.written[at].saturating_add(1);
        let k = self.maps.channels;
        let mut finite = true;
        if let Some(all) = &mut self.maps.scores {
            for c in 0..k {
                let v = scores(c);
                finite &= v.is_finite();
                all[c * n + at] = v;
            }
        }
        if self.task == Task::Classification {
            let (mut best, mut top) = (0, f32::NEG_INFINITY);
            for c in 0..k {
                let v = scores(c);
                finite &= v.is_finite();
                if v > top {
                    (best, top) = (c, v);
                }
            }
            if !finite {
                // No class can be read from it; a class id here would look like a prediction.
                self.maps.class_ids[at] = 0;
                self.maps.confidence[at] = f32::NAN;
                self.maps.nonfinite_pixels += 1;
                return;
            }
            let confidence = match self.kind {
                OutputKind::Probabilities => top,
                OutputKind::Logits => 1.0 / (0..k).map(|c| exp_nonpositive(scores(c) - top)).sum::<f32>(),
            };
            self.maps.class_ids[at] = self.ids[best];
            self.maps.confidence[at] = confidence;
        } else if !finite {
            self.maps.nonfinite_pixels += 1;
        }
    }

    /// Writes the `w` pixels of line `y` from sample `x0` on, class `c`'s scores for them being
    /// the first `w` values of `row(c)`: the same result as [`Stitcher::put`] for each pixel, with
    /// every step a loop over the row's pixels (a dense tile's output holds each class's scores
    /// of a row contiguously), so it vectorises, where pixel by pixel each class is a strided
    /// read and each exponential a call.
    pub fn put_row<'o>(&mut self, y: usize, x0: usize, w: usize, row: impl Fn(usize) -> &'o [f32]) {
        let n = self.grid.lines * self.grid.samples;
        let at = y * self.grid.samples + x0;
        let k = self.maps.channels;
        for c in &mut self.written[at..at + w] {
            *c = c.saturating_add(1);
        }
        let RowScratch { top, best, sum, finite } = &mut self.row;
        finite.clear();
        finite.resize(w, true);
        for c in 0..k {
            for (f, v) in finite.iter_mut().zip(&row(c)[..w]) {
                *f &= v.is_finite();
            }
        }
        if let Some(all) = &mut self.maps.scores {
            for c in 0..k {
                all[c * n + at..c * n + at + w].copy_from_slice(&row(c)[..w]);
            }
        }
        if self.task != Task::Classification {
            self.maps.nonfinite_pixels += finite.iter().filter(|f| !**f).count();
            return;
        }
        top.clear();
        top.extend_from_slice(&row(0)[..w]);
        best.clear();
        best.resize(w, 0);
        for c in 1..k {
            for ((t, b), &v) in top.iter_mut().zip(best.iter_mut()).zip(&row(c)[..w]) {
                if v > *t {
                    *t = v;
                    *b = c as u32;
                }
            }
        }
        if self.kind == OutputKind::Logits {
            sum.clear();
            sum.resize(w, 0.0);
            for c in 0..k {
                for ((s, &t), &v) in sum.iter_mut().zip(top.iter()).zip(&row(c)[..w]) {
                    *s += exp_nonpositive(v - t);
                }
            }
            for (t, &s) in top.iter_mut().zip(sum.iter()) {
                *t = 1.0 / s;
            }
        }
        let ids = &self.ids;
        let classes = &mut self.maps.class_ids[at..at + w];
        let confidence = &mut self.maps.confidence[at..at + w];
        for j in 0..w {
            if finite[j] {
                classes[j] = ids[best[j] as usize];
                confidence[j] = top[j];
            } else {
                // No class can be read from it; a class id here would look like a prediction.
                classes[j] = 0;
                confidence[j] = f32::NAN;
                self.maps.nonfinite_pixels += 1;
            }
        }
    }

    /// Stitches one engine result for `batch`.
    pub fn put_batch(
        &mut self,
        batch: &Batch,
        out_shape: &[usize],
        out: &[f32],
        graph: &std::path::Path,
    ) -> Result<(), PipelineError> {
        self.put_range(batch, 0..batch.units(), out_shape, out, graph)
    }

    /// Stitches the engine result for samples `range` of `batch`.
    pub fn put_range(
        &mut self,
        batch: &Batch,
        range: std::ops::Range<usize>,
        out_shape: &[usize],
        out: &[f32],
        graph: &std::path::Path,
    ) -> Result<(), PipelineError> {
        let k = self.maps.channels;
        let shape_err = |expected: String| PipelineError::OutputShape {
            graph: graph.to_path_buf(),
            got: out_shape.to_vec(),
            input: batch.shape.clone(),
            expected,
        };
        if !batch.tiles.is_empty() {
            let (th, tw) = (self.grid.tile_h, self.grid.tile_w);
            let n = range.len();
            if out_shape != [n, k, th, tw] {
                return Err(shape_err(format!("{n} x {k} x {th} x {tw}")));
            }
            for (t, rect) in batch.tiles[range].iter().enumerate() {
                for i in 0..rect.h {
                    self.put_row(rect.y0 + i, rect.x0, rect.w, |c| {
                        let first = ((t * k + c) * th + i) * tw;
                        &out[first..first + tw]
                    });
                }
            }
        } else {
            let n = range.len();
            if out.len() != n * k || out_shape.first() != Some(&n) {
                return Err(shape_err(format!("{n} x {k}")));
            }
            for (s, &(y, x)) in batch.pixels[range].iter().enumerate() {
                self.put(y, x, |c| out[s * k + c]);
            }
        }
        Ok(())
    }

    /// The maps, once every pixel has been written exactly once.
    pub fn finish(self) -> Result<Maps, PipelineError> {
        if let Some(at) = self.written.iter().position(|&c| c != 1) {
            let (line, sample) = (at / self.grid.samples, at % self.grid.samples);
            return Err(PipelineError::Coverage {
                line,
                sample,
                count: self.written[at],
                row: line / self.grid.tile_h,
                col: sample / self.grid.tile_w,
            });
        }
        Ok(self.maps)
    }
}

/// `e^x` for `x <= 0` (a logit less the row's largest), within 2 ulp of `f32::exp` down to
/// `x = -87`; below, `e^-87` (1.6e-38), which no sum of a softmax that includes `e^0` can see.
///
/// Written out (Cephes' `expf`: `x = n ln 2 + r`, a degree-6 polynomial in `r`, `2^n` built in the
/// exponent bits) so a loop over a row of pixels vectorises; `f32::exp` is a call per value.
#[inline(always)]
fn exp_nonpositive(x: f32) -> f32 {
    // Rounds to nearest through the float format: adding 1.5 * 2^23 leaves no fraction bits.
    const ROUND: f32 = 12_582_912.0;
    let x = x.clamp(-87.0, 0.0);
    let n = (x * std::f32::consts::LOG2_E + ROUND) - ROUND;
    let r = x - n * 0.693_359_4 + n * 2.121_944_4e-4;
    let mut p = 1.987_569_1e-4_f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let e = p * r * r + r + 1.0;
    e * f32::from_bits((((n as i32) + 127) as u32) << 23)
}

/// Runs `graph` over `cube`: the producer thread fills a queue of `opts.queue` batches while this
/// thread infers and stitches. `progress` gets the pixels done after each batch. With `adapt`, the
/// batch may change between batches: the producer builds new batches at the new size, and batches
/// already queued are run in pieces no larger than it. Batch buffers come from `pool`, reopened
/// for this run and closed when it ends; the buffers it made stay in it for the next run.
pub fn run(
    cube: &Cube,
    manifest: &Manifest,
    graph: &mut Graph,
    opts: &RunOptions,
    pool: &BufferPool,
    progress: &mut dyn FnMut(usize),
    mut adapt: Option<&mut dyn Adapt>,
) -> Result<(Maps, RunStats), PipelineError> {
    check(cube, manifest, opts)?;
    let start = Instant::now();
    let grid = grid_for(cube, manifest, opts);
    let mut stitcher = Stitcher::new(manifest, grid, opts.keep_scores);
    let mut stats = RunStats {
        tiles: grid.len(),
        tile_shape: (grid.tile_h, grid.tile_w),
        ..RunStats::default()
    };
    let target = AtomicUsize::new(opts.batch);
    let (tx, rx) = crossbeam_channel::bounded::<Batch>(opts.queue);
    let (limit, need) = run_buffers(cube, manifest, opts);
    pool.reopen(limit);
    let mut inference = Duration::ZERO;
    let mut wait = Duration::ZERO;
    let mut shrunk = false;
    let result = std::thread::scope(|scope| -> Result<(), PipelineError> {
        let target = &target;
        scope.spawn(move || {
            // The producer steps back so it fills the engine threads' idle gaps instead of
            // preempting them mid-operator (a preempted intra-op thread stalls the whole operator).
            if opts.producer_nice > 0 {
                let _ = crate::ffi::lower_thread_priority(opts.producer_nice);
            }
            produce_with(cube, manifest, opts, target, Some(pool), |b| tx.send(b).is_ok())
        });
        // Declared after `rx`, so dropped first: on an early return the producer is released
        // both from waiting for a buffer and from waiting for room in the queue.
        let rx = rx;
        let _close = CloseOnDrop(pool);
        // The other buffers are made while the producer builds the first batch.
        pool.fill(need);
        loop {
            let t0 = Instant::now();
            let Ok(batch) = rx.recv() else { break };
            wait += t0.elapsed();
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
                                .or_else(|| batch.pixels.get(from).map(|&(y, x)| (y / grid.tile_h, x / grid.tile_w)))
                                .unwrap_or_default(),
                            source,
                        })?;
                inference += t1.elapsed();
                if stats.batches == 0 {
                    stats.first_batch_s = start.elapsed().as_secs_f64();
                }
                stitcher.put_range(&batch, from..to, &out_shape, &out, graph.path())?;
                stats.batches += 1;
                stats.pixels += if batch.tiles.is_empty() {
                    to - from
                } else {
                    batch.tiles[from..to].iter().map(|t| t.h * t.w).sum()
                };
                progress(stats.pixels);
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
                from = to;
            }
            // Given back before the next `recv`: the producer takes its next buffer only after
            // the queue had room, so this one is free by then and no extra buffer is made.
            pool.give(batch.data);
            if shrunk {
                // Memory is being taken: the spare buffers of the old size go back to the system
                // now, not when the producer next looks for one.
                shrunk = false;
                pool.drop_spares();
            }
        }
        Ok(())
    });
    result?;
    let maps = stitcher.finish()?;
    stats.elapsed_s = start.elapsed().as_secs_f64();
    stats.inference_s = inference.as_secs_f64();
    stats.wait_s = wait.as_secs_f64();
    Ok((maps, stats))
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
        scope.spawn(move || produce_with(cube, manifest, opts, target, Some(pool), |b| tx.send(b).is_ok()));
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Manifest;

    fn manifest() -> Manifest {
        let v = |x: f32| serde_json::to_string(&vec![x; 2]).unwrap();
        let text = format!(
            r#"{{"name":"t","task":"classification","input":{{"bands":2,"layout":"nchw","mean":{},"std":{}}},
            "patch":3,"halo":1,"outputs":[{{"id":3,"name":"a"}},{{"id":9,"name":"b"}}],
            "files":{{"patch":"p.onnx","dense":"d.onnx"}},"output_kind":"logits"}}"#,
            v(0.0),
            v(1.0)
        );
        Manifest::parse(&text, std::path::Path::new("m.json")).unwrap()
    }

    #[test]
    fn pool_never_holds_more_than_its_limit_and_close_frees_a_waiter() {
        let pool = BufferPool::new(2);
        let a = pool.take(100).unwrap();
        pool.fill(100);
        let b = pool.take(100).unwrap();
        assert_eq!(pool.lock().made, 2);
        // A third take waits until one comes back.
        std::thread::scope(|s| {
            let waiter = s.spawn(|| pool.take(100).map(|v| v.capacity()));
            std::thread::sleep(std::time::Duration::from_millis(50));
            assert!(!waiter.is_finished());
            pool.give(a);
            assert!(waiter.join().unwrap().unwrap() >= 100);
        });
        // A free buffer of the wrong size is replaced, not added to.
        pool.give(b);
        let c = pool.take(1000).unwrap();
        assert!(c.capacity() >= 1000);
        assert_eq!(pool.lock().made, 2);
        pool.give(c);
        pool.drop_spares();
        assert_eq!(pool.lock().made, 1);
        std::thread::scope(|s| {
            let _one = pool.take(10).unwrap();
            let waiter = s.spawn(|| pool.take(10));
            std::thread::sleep(std::time::Duration::from_millis(50));
            pool.close();
            assert!(waiter.join().unwrap().is_none());
        });
        assert_eq!(BufferPool::run_limit(1, 100, 40), 3);
        assert_eq!(BufferPool::run_limit(1, 100, 60), 2);
        assert_eq!(BufferPool::run_limit(1, 0, 60), 1);
    }

    #[test]
    fn batches_from_reused_buffers_equal_batches_from_fresh_ones() {
        use crate::cube::{DataType, Header, Interleave};
        let dir = tempfile::tempdir().unwrap();
        let (lines, samples, bands) = (5usize, 6usize, 2usize);
        let bytes: Vec<u8> = (0..lines * bands * samples)
            .flat_map(|i| ((i * 37 % 101) as i16).to_le_bytes())
            .collect();
        std::fs::write(dir.path().join("c.img"), bytes).unwrap();
        let hdr = dir.path().join("c.hdr");
        std::fs::write(
            &hdr,
            Header::new(samples, lines, bands, DataType::I16, Interleave::Bil).to_text(),
        )
        .unwrap();
        let cube = Cube::open(&hdr).unwrap();
        let m = manifest();
        for mode in [Mode::Patch, Mode::Dense] {
            let opts = RunOptions {
                mode,
                batch: 4,
                tile: 4,
                queue: 1,
                keep_scores: false,
                producer_nice: 0,
            };
            let collect = |pool: Option<&BufferPool>| {
                let mut got = Vec::new();
                produce_with(&cube, &m, &opts, &AtomicUsize::new(opts.batch), pool, |b| {
                    got.push((b.data.clone(), b.shape.clone(), b.pixels.clone(), b.tiles.clone()));
                    if let Some(pool) = pool {
                        pool.give(b.data);
                    }
                    true
                });
                got
            };
            let fresh = collect(None);
            // Buffers back from earlier batches hold stale values, some shorter than a batch.
            let pool = BufferPool::new(buffer_limit(&cube, &m, &opts));
            let need =
                opts.batch * bands * grid_for(&cube, &m, &opts).window_h() * grid_for(&cube, &m, &opts).window_w();
            pool.reopen(2);
            let (mut a, mut b) = (pool.take(need).unwrap(), pool.take(need).unwrap());
            a.resize(need, f32::NAN);
            b.resize(3, f32::NAN);
            pool.give(a);
            pool.give(b);
            for _ in 0..2 {
                let reused = collect(Some(&pool));
                assert_eq!(reused.len(), fresh.len(), "{mode:?}");
                for (a, b) in reused.iter().zip(&fresh) {
                    assert_eq!(
                        a.0.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        b.0.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        "{mode:?}"
                    );
                    assert_eq!((&a.1, &a.2, &a.3), (&b.1, &b.2, &b.3), "{mode:?}");
                }
            }
        }
    }

    #[test]
    fn poisoned_maps_are_fully_overwritten_by_dense_batches() {
        let m = manifest();
        let grid = TileGrid::new(7, 9, 4, 1);
        let mut s = Stitcher::new(&m, grid, true);
        for row in 0..grid.rows {
            for col in 0..grid.cols {
                let rect = grid.rect(row, col);
                let (th, tw) = (grid.tile_h, grid.tile_w);
                let out: Vec<f32> = (0..2 * th * tw).map(|i| if i < th * tw { 1.0 } else { 0.0 }).collect();
                let b = Batch {
                    data: vec![],
                    shape: vec![1, 2, th + 2, tw + 2],
                    pixels: vec![],
                    tiles: vec![rect],
                };
                s.put_batch(&b, &[1, 2, th, tw], &out, std::path::Path::new("d.onnx"))
                    .unwrap();
            }
        }
        let maps = s.finish().unwrap();
        assert!(maps.confidence.iter().all(|c| c.is_finite()));
        assert!(maps.class_ids.iter().all(|&c| c == 3));
        assert!(maps.scores.unwrap().iter().all(|v| v.is_finite()));
    }

    #[test]
    fn a_missing_or_repeated_pixel_fails_the_run() {
        let m = manifest();
        let grid = TileGrid::new(2, 2, 2, 1);
        let mut s = Stitcher::new(&m, grid, false);
        for (y, x) in [(0, 0), (0, 1), (1, 0)] {
            s.put(y, x, |c| c as f32);
        }
        let err = s.finish().unwrap_err();
        assert!(
            matches!(
                err,
                PipelineError::Coverage {
                    line: 1,
                    sample: 1,
                    count: 0,
                    ..
                }
            ),
            "{err}"
        );
        let mut s = Stitcher::new(&m, grid, false);
        for (y, x) in [(0, 0), (0, 1), (1, 0), (1, 1), (0, 1)] {
            s.put(y, x, |c| c as f32);
        }
        assert!(matches!(
            s.finish(),
            Err(PipelineError::Coverage {
                line: 0,
                sample: 1,
                count: 2,
                ..
            })
        ));
    }

    #[test]
    fn a_nonfinite_output_is_unclassified_and_counted() {
        let m = manifest();
        let mut s = Stitcher::new(&m, TileGrid::new(1, 2, 2, 0), false);
        s.put(0, 0, |c| [f32::NAN, f32::NAN][c]);
        s.put(0, 1, |c| [1.0, f32::INFINITY][c]);
        let maps = s.finish().unwrap();
        assert_eq!(maps.class_ids, vec![0, 0]);
        assert!(maps.confidence.iter().all(|c| c.is_nan()));
        assert_eq!(maps.nonfinite_pixels, 2);
    }

    #[test]
    fn exp_nonpositive_is_within_two_ulp_of_exp() {
        let mut x = 0.0f32;
        while x > -87.0 {
            let (got, want) = (exp_nonpositive(x), x.exp());
            let ulps = (i64::from(got.to_bits()) - i64::from(want.to_bits())).abs();
            assert!(ulps <= 2, "e^{x}: {got} vs {want}, {ulps} ulp");
            x -= 0.001_37;
        }
        assert_eq!(exp_nonpositive(0.0), 1.0);
        assert!(exp_nonpositive(f32::NEG_INFINITY) < 1e-37);
        assert!(exp_nonpositive(-1e30) >= 0.0);
    }

    #[test]
    fn rows_stitch_as_pixels_do() {
        let classify = manifest();
        let mut unmix = classify.clone();
        unmix.task = Task::Abundance;
        for m in [classify, unmix] {
            rows_stitch_as_pixels_do_for(&m);
        }
    }

    fn rows_stitch_as_pixels_do_for(m: &Manifest) {
        let k = m.classes();
        let grid = TileGrid::new(1, 5, 8, 1);
        let value = |c: usize, j: usize| match (c, j) {
            (_, 3) => f32::NAN,
            (1, 4) => f32::INFINITY,
            _ => (c as f32 * 1.7 - j as f32).sin() * 30.0,
        };
        let rows: Vec<Vec<f32>> = (0..k).map(|c| (0..5).map(|j| value(c, j)).collect()).collect();
        for keep in [false, true] {
            let mut by_row = Stitcher::new(m, grid, keep);
            by_row.put_row(0, 0, 5, |c| &rows[c]);
            let mut by_pixel = Stitcher::new(m, grid, keep);
            for j in 0..5 {
                by_pixel.put(0, j, |c| value(c, j));
            }
            let (a, b) = (by_row.finish().unwrap(), by_pixel.finish().unwrap());
            assert_eq!(a.class_ids, b.class_ids);
            assert_eq!(a.nonfinite_pixels, 2);
            assert_eq!(a.nonfinite_pixels, b.nonfinite_pixels);
            for (x, y) in a.confidence.iter().zip(&b.confidence) {
                assert!(x == y || (x.is_nan() && y.is_nan()), "{x} vs {y}");
            }
            assert_eq!(a.scores.is_some(), keep || m.task == Task::Abundance);
            if let (Some(x), Some(y)) = (a.scores, b.scores) {
                assert_eq!(
                    x.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    y.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
                );
            }
        }
    }

    #[test]
    fn softmax_confidence() {
        let m = manifest();
        let mut s = Stitcher::new(&m, TileGrid::new(1, 1, 1, 1), false);
        s.put(0, 0, |c| [0.0f32, 2.0f32.ln()][c]);
        let maps = s.finish().unwrap();
        assert_eq!(maps.class_ids, vec![9]);
        assert!((maps.confidence[0] - 2.0 / 3.0).abs() < 1e-6);
    }
}
