//! The device-resident path of the CUDA provider for classification models (`--io device`).
//!
//! The host copies each tile's input window from the mapped file as raw samples
//! ([`gather::raw_window`], the file's own type, interleave and byte order) into pinned memory on
//! prefetch threads ([`prefetch`]), batches ahead of the device, and uploads it on a copy stream
//! while the session runs the previous batch (two raw buffers on the device); on the device the preprocessing kernel decodes and normalises it straight into
//! the input tensor bound to the session with ONNX Runtime's IoBinding (dense mode), or into a
//! planar window from which `gather_patches` writes the bound input (patch mode); the session
//! runs into a bound device output; the argmax kernel reduces it, and only labels and confidence
//! come back to the host. Every run has the same shape (`bucket` units, the last batch padded)
//! and the same buffers, which is what CUDA graphs need. Abundance models keep the host path.

pub mod bound;
pub mod gather;
pub mod prefetch;

use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, PinnedHostSlice};
use ort::memory::{AllocationDevice, Allocator, AllocatorType, MemoryInfo, MemoryType};

use super::kernels::{DeviceSample, Kernels};
use super::{GpuError, driver};
use crate::cube::{ByteOrder, Cube, DataType, Interleave};
use crate::engine::{Graph, Provider};
use crate::model::{Layout, Manifest, OutputKind, Task};
use crate::pipeline::{Adapt, BatchDone, Maps, Mode, PipelineError, RunOptions, RunStats};
use crate::tile::{TileGrid, TileRect};

/// Errors of the device-resident path.
#[derive(Debug, thiserror::Error)]
pub enum ResidentError {
    /// The run cannot take the device path (the host path can).
    #[error("the device-resident path (--io device) {what}; use --io host")]
    Unsupported {
        /// What does not fit it.
        what: String,
    },
    /// A CUDA call or kernel failed.
    #[error(transparent)]
    Gpu(#[from] GpuError),
    /// ONNX Runtime refused a device buffer, a binding or a run.
    #[error("{graph}: ONNX Runtime {call} on device buffers: {message}")]
    Ort {
        /// The ONNX file.
        graph: std::path::PathBuf,
        /// What was being done.
        call: &'static str,
        /// ONNX Runtime's message.
        message: String,
    },
    /// The maps do not cover the scene exactly once (an internal error, with its place).
    #[error(transparent)]
    Pipeline(#[from] PipelineError),
    /// Re-binding the session at a new batch size failed, and the run has no bound buffers.
    #[error("the device path has no bound buffers after a failed re-bind at a new batch size")]
    Unbound,
    /// A prefetch thread stopped without handing over its batch (it panicked).
    #[error("the device path's prefetch thread stopped before its batch was copied")]
    Prefetch,
}

/// Sets of pinned raw-window buffers going round between the prefetch thread and the uploads:
/// one being filled while the other waits or is uploaded.
const PREFETCH_DEPTH: usize = 2;

/// What the device path moved and where its time went, for `summary.json` and `hsiedge gpu bench`.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct DeviceIo {
    /// Units (tiles or patches) per session run as planned, a partial batch padded to it (the
    /// governor may cut it to a half, a quarter...: `BatchDone::batch` says which ran).
    pub bucket: usize,
    /// Whether the session replays a captured CUDA graph.
    pub cuda_graph: bool,
    /// Raw window bytes uploaded.
    pub h2d_bytes: u64,
    /// Bytes the host path uploads for the same batches: their float32 input tensors.
    pub host_path_h2d_bytes: u64,
    /// Labels and confidence brought back.
    pub d2h_bytes: u64,
    /// `h2d_bytes` per output pixel.
    pub h2d_bytes_per_pixel: f64,
    /// `host_path_h2d_bytes` per output pixel.
    pub host_path_h2d_bytes_per_pixel: f64,
    /// `d2h_bytes` per output pixel.
    pub d2h_bytes_per_pixel: f64,
    /// Seconds copying raw windows on the host (prefetch threads, beside the device's work).
    pub gather_s: f64,
    /// Seconds the device loop waited for a batch's raw windows: the copy's share of the run
    /// that did not overlap the device.
    pub prefetch_wait_s: f64,
    /// Threads copying a batch's raw windows.
    pub gather_threads: usize,
    /// Seconds in the session's runs alone (pure inference on resident buffers).
    pub inference_s: f64,
}

/// Why `manifest` over `cube` with `provider` cannot take the device path, or `None` when it can.
pub fn unsupported(cube: &Cube, manifest: &Manifest, provider: Provider) -> Option<String> {
    if provider != Provider::Cuda {
        return Some(format!("needs the cuda provider; the session runs on {provider}"));
    }
    if manifest.task != Task::Classification {
        return Some("serves classification models; abundance maps keep every channel".into());
    }
    if manifest.input.layout == Layout::Nc {
        return Some("needs a spatial input layout (n1chw or nchw), not nc".into());
    }
    let dt = cube.header().data_type;
    if !matches!(dt, DataType::I16 | DataType::U16 | DataType::F32) {
        return Some(format!(
            "decodes int16, uint16 and float32 samples; {} has {dt:?}",
            cube.header_path().display()
        ));
    }
    None
}

/// The device buffers and bound session of one run's shape.
pub struct Resident {
    k: Kernels,
    mode: Mode,
    grid: TileGrid,
    bucket: usize,
    /// Input floats per unit.
    in_per_unit: usize,
    /// Output pixels per unit (a dense tile's, or 1).
    pixels_per_unit: usize,
    classes: usize,
    logits: bool,
    ids: Vec<u8>,
    patch: usize,
    bands: usize,
    window_bytes: usize,
    /// Raw windows per upload (a batch's tiles, or one window in patch mode).
    units_raw: usize,
    gather_threads: usize,
    interleave: Interleave,
    dtype: DataType,
    swap: bool,
    /// The session's input and output bound at the current batch size (`None` only after a
    /// failed re-bind). Declared before the allocator its tensors come from.
    bound: Option<bound::Bound>,
    /// One unit's input and output shape after the batch dimension.
    in_unit: Vec<usize>,
    out_unit: Vec<usize>,
    allocator: Allocator,
    /// Pinned raw-window buffers, `PREFETCH_DEPTH` sets of `units_raw`.
    pool: Vec<Vec<PinnedHostSlice<u8>>>,
    /// The raw windows on the device: one pair being preprocessed, one being uploaded.
    d_raw: [CudaSlice<u8>; 2],
    /// The stream the uploads run on, beside the kernels' stream and the session's.
    up: Arc<CudaStream>,
    d_window: CudaSlice<f32>,
    d_mean: CudaSlice<f32>,
    d_inv: CudaSlice<f32>,
    cls: CudaSlice<u32>,
    conf: CudaSlice<f32>,
    h_cls: Vec<u32>,
    h_conf: Vec<f32>,
    cuda_graph: bool,
}

impl std::fmt::Debug for Resident {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resident")
            .field("mode", &self.mode)
            .field("bucket", &self.bucket)
            .finish_non_exhaustive()
    }
}

impl Resident {
    /// Allocates the device buffers of a run of `graph` over `cube` at `opts` (tile, batch, mode)
    /// on CUDA device `device_id`, and binds the session's input and output to them. `cuda_graph`
    /// says whether the session was built to capture CUDA graphs (recorded only).
    pub fn new(
        cube: &Cube,
        manifest: &Manifest,
        graph: &mut Graph,
        opts: &RunOptions,
        device_id: u32,
        cuda_graph: bool,
    ) -> Result<Self, ResidentError> {
        if let Some(what) = unsupported(cube, manifest, graph.provider()) {
            return Err(ResidentError::Unsupported { what });
        }
        let grid = crate::pipeline::grid_for(cube, manifest, opts);
        let (wh, ww) = (grid.window_h(), grid.window_w());
        let bands = cube.bands();
        let (bucket, pixels_per_unit, in_shape, out_shape) = match opts.mode {
            Mode::Dense => {
                let b = opts.batch.clamp(1, grid.len().max(1));
                let px = grid.tile_h * grid.tile_w;
                let i = manifest.input.layout.shape(b, bands, wh, ww);
                (b, px, i, vec![b, manifest.classes(), grid.tile_h, grid.tile_w])
            }
            Mode::Patch => {
                let b = opts.batch.clamp(1, (grid.tile_h * grid.tile_w).max(1));
                let p = manifest.patch;
                if p != 2 * manifest.halo + 1 {
                    return Err(ResidentError::Unsupported {
                        what: format!(
                            "gathers patches of 2 x halo + 1; the manifest has patch {p}, halo {}",
                            manifest.halo
                        ),
                    });
                }
                let i = manifest.input.layout.shape(b, bands, p, p);
                (b, 1, i, vec![b, manifest.classes()])
            }
        };
        if out_shape.len() != graph.output().dims.len() {
            return Err(ResidentError::Unsupported {
                what: format!(
                    "expects an output of rank {} ({out_shape:?}); {} has rank {}",
                    out_shape.len(),
                    graph.path().display(),
                    graph.output().dims.len()
                ),
            });
        }
        let graph_path = graph.path().to_path_buf();
        let ort = |call| ort_error(&graph_path, call);
        let ort_device = i32::try_from(device_id).map_err(|_| ResidentError::Unsupported {
            what: format!("CUDA device id {device_id} is out of range"),
        })?;
        let k = Kernels::new(device_id as usize)?;
        let session = graph.session_mut();
        let info = MemoryInfo::new(
            AllocationDevice::CUDA,
            ort_device,
            AllocatorType::Device,
            MemoryType::Default,
        )
        .map_err(ort("MemoryInfo"))?;
        let allocator = Allocator::new(session, info).map_err(ort("CreateAllocator (CUDA)"))?;
        let in_floats: usize = in_shape.iter().product();
        let (in_unit, out_unit) = (in_shape[1..].to_vec(), out_shape[1..].to_vec());
        let bound = bound::Bound::new(graph, &allocator, bucket, &in_unit, &out_unit)?;
        let size = cube.header().data_type.size();
        let units_raw = match opts.mode {
            Mode::Dense => bucket,
            Mode::Patch => 1,
        };
        let window_bytes = wh * ww * bands * size;
        let s = k.stream().clone();
        let up = k.context().new_stream().map_err(driver("cuStreamCreate"))?;
        // A pinned buffer is given back to the copy threads as soon as its upload is queued: that
        // is safe only while cudarc records each upload in the buffer's event, which it does when
        // it manages synchronisation between streams (event tracking, a second stream).
        if !k.context().is_managing_stream_synchronization() {
            return Err(ResidentError::Unsupported {
                what: "needs cudarc's event tracking between streams to reuse pinned buffers".into(),
            });
        }
        let d_raw = [
            s.alloc_zeros::<u8>(units_raw * window_bytes)
                .map_err(driver("cuMemAlloc"))?,
            s.alloc_zeros::<u8>(units_raw * window_bytes)
                .map_err(driver("cuMemAlloc"))?,
        ];
        // Every core copies: a batch's windows are split into line pieces beyond one per window.
        let gather_threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let d_window = s
            .alloc_zeros::<f32>(if opts.mode == Mode::Patch { bands * wh * ww } else { 1 })
            .map_err(driver("cuMemAlloc"))?;
        let mean = manifest.input.mean.clone();
        let inv: Vec<f32> = manifest.input.std.iter().map(|v| 1.0 / v).collect();
        let m = bucket * pixels_per_unit;
        let mut r = Self {
            mode: opts.mode,
            grid,
            bucket,
            in_per_unit: in_floats / bucket,
            pixels_per_unit,
            classes: manifest.classes(),
            logits: manifest.output_kind == OutputKind::Logits,
            ids: manifest
                .outputs
                .iter()
                // The manifest's validation keeps class ids within 1..=255.
                .map(|o| u8::try_from(o.id).unwrap_or(0))
                .collect(),
            patch: manifest.patch,
            bands,
            window_bytes,
            units_raw,
            gather_threads,
            interleave: cube.header().interleave,
            dtype: cube.header().data_type,
            swap: (cube.header().byte_order == ByteOrder::Big) == cfg!(target_endian = "little"),
            bound: Some(bound),
            in_unit,
            out_unit,
            allocator,
            pool: Vec::new(),
            d_raw,
            up,
            d_window,
            d_mean: s.clone_htod(&mean).map_err(driver("cuMemcpyHtoD"))?,
            d_inv: s.clone_htod(&inv).map_err(driver("cuMemcpyHtoD"))?,
            cls: s.alloc_zeros::<u32>(m).map_err(driver("cuMemAlloc"))?,
            conf: s.alloc_zeros::<f32>(m).map_err(driver("cuMemAlloc"))?,
            h_cls: vec![0; m],
            h_conf: vec![0.0; m],
            cuda_graph,
            k,
        };
        r.fill_pool()?;
        Ok(r)
    }

    /// Allocates the pinned buffer sets the pool lacks (all at first; those an error dropped).
    fn fill_pool(&mut self) -> Result<(), ResidentError> {
        while self.pool.len() < PREFETCH_DEPTH {
            let set = (0..self.units_raw)
                .map(|_| {
                    // SAFETY: pinned host memory for one raw window (cacheable: the copy writes it
                    // in short runs); `gather::raw_window` writes every byte before it is uploaded.
                    unsafe { self.k.context().alloc_pinned_with_flags::<u8>(self.window_bytes, 0) }
                        .map_err(driver("cuMemHostAlloc"))
                })
                .collect::<Result<Vec<_>, _>>()?;
            self.pool.push(set);
        }
        Ok(())
    }

    /// Units per session run.
    pub fn bucket(&self) -> usize {
        self.bucket
    }

    /// Runs the whole scene: class map and confidence, what the run measured, and what the
    /// device path moved. `progress` gets each batch's record; `adapt` (the memory governor) may
    /// cut the batch after each one: it then runs at the largest of [`bound::sizes`] at or below
    /// the governor's batch, re-bound (not with CUDA graphs, whose capture has one shape).
    pub fn run(
        &mut self,
        cube: &Cube,
        graph: &mut Graph,
        progress: &mut dyn FnMut(&BatchDone),
        mut adapt: Option<&mut dyn Adapt>,
    ) -> Result<(Maps, RunStats, DeviceIo), ResidentError> {
        let start = Instant::now();
        let grid = self.grid;
        let n_px = cube.lines() * cube.samples();
        let mut maps = Maps {
            lines: cube.lines(),
            samples: cube.samples(),
            channels: self.classes,
            class_ids: vec![0; n_px],
            confidence: vec![f32::NAN; n_px],
            scores: None,
            nonfinite_pixels: 0,
        };
        let mut written = vec![0u8; n_px];
        let mut stats = RunStats {
            tile_shape: (grid.tile_h, grid.tile_w),
            tiles: grid.len(),
            ..RunStats::default()
        };
        let mut io = DeviceIo {
            bucket: self.bucket,
            cuda_graph: self.cuda_graph,
            ..DeviceIo::default()
        };
        let tiles: Vec<TileRect> = (0..grid.rows)
            .flat_map(|r| (0..grid.cols).map(move |c| (r, c)))
            .map(|(r, c)| grid.rect(r, c))
            .collect();
        let batches: Vec<&[TileRect]> = tiles.chunks(self.units_raw).collect();
        io.gather_threads = self.gather_threads;
        self.fill_pool()?;
        let mut pool = std::mem::take(&mut self.pool);
        let threads = self.gather_threads;
        let fill =
            |tiles: &[TileRect], units: &mut [PinnedHostSlice<u8>]| prefetch::fill(cube, &grid, tiles, units, threads);
        // With CUDA graphs the copy runs on this thread, between session runs: no other thread
        // makes driver calls while ONNX Runtime captures.
        let ran = prefetch::with_prefetch(&batches, &mut pool, self.cuda_graph, &fill, |p| {
            let mut out = Out {
                maps: &mut maps,
                written: &mut written,
                stats: &mut stats,
                io: &mut io,
                infer: Duration::ZERO,
            };
            self.run_batches(p, &batches, cube, graph, &mut out, start, progress, &mut adapt)?;
            Ok(out.infer)
        });
        self.pool = pool;
        let infer = ran?;
        if let Some(at) = written.iter().position(|&c| c != 1) {
            let (line, sample) = (at / cube.samples(), at % cube.samples());
            return Err(PipelineError::Coverage {
                line,
                sample,
                count: written[at],
                row: line / grid.tile_h.max(1),
                col: sample / grid.tile_w.max(1),
            }
            .into());
        }
        stats.lines = cube.lines();
        stats.elapsed_s = start.elapsed().as_secs_f64();
        stats.inference_s = infer.as_secs_f64();
        io.inference_s = stats.inference_s;
        let px = stats.pixels.max(1) as f64;
        io.h2d_bytes_per_pixel = io.h2d_bytes as f64 / px;
        io.host_path_h2d_bytes_per_pixel = io.host_path_h2d_bytes as f64 / px;
        io.d2h_bytes_per_pixel = io.d2h_bytes as f64 / px;
        Ok((maps, stats, io))
    }

    /// The batches in order: batch b + 1 is uploaded on the copy stream while batch b runs.
    #[allow(clippy::too_many_arguments)]
    fn run_batches(
        &mut self,
        p: &prefetch::Prefetch<'_, PinnedHostSlice<u8>>,
        batches: &[&[TileRect]],
        cube: &Cube,
        graph: &mut Graph,
        out: &mut Out<'_>,
        start: Instant,
        progress: &mut dyn FnMut(&BatchDone),
        adapt: &mut Option<&mut dyn Adapt>,
    ) -> Result<(), ResidentError> {
        let grid = self.grid;
        if let Some(first) = batches.first() {
            self.take_and_upload(p, first.len(), 0, out.io)?;
        }
        for (b, chunk) in batches.iter().enumerate() {
            let slot = b % 2;
            // The preprocessing reads what the copy stream uploaded.
            self.k.stream().join(&self.up).map_err(driver("cuStreamWaitEvent"))?;
            match self.mode {
                Mode::Dense => {
                    // The uploaded windows run in session batches of the bound size (all of them
                    // unless the governor cut it).
                    let mut first = 0;
                    while first < chunk.len() {
                        let n = self.units()?.min(chunk.len() - first);
                        let in_ptr = self.bound_mut()?.input_ptr();
                        for i in 0..n {
                            self.preprocess(slot, first + i, in_ptr + (i * self.in_per_unit * 4) as u64)?;
                        }
                        if first == 0
                            && let Some(next) = batches.get(b + 1)
                        {
                            self.take_and_upload(p, next.len(), 1 - slot, out.io)?;
                        }
                        let ran = self.infer_and_reduce(graph, n, out.io)?;
                        out.infer += ran;
                        let mut pixels = 0;
                        for (i, t) in chunk[first..first + n].iter().enumerate() {
                            for y in 0..t.h {
                                for x in 0..t.w {
                                    let at = i * self.pixels_per_unit + y * grid.tile_w + x;
                                    self.put(out, (t.y0 + y) * cube.samples() + t.x0 + x, at);
                                }
                            }
                            pixels += t.h * t.w;
                        }
                        self.done(out.stats, start, n, pixels, ran, progress);
                        self.adapt(graph, adapt, out.stats.batches)?;
                        first += n;
                    }
                }
                Mode::Patch => {
                    let t = &chunk[0];
                    let window = {
                        let (ptr, _sync) = self.d_window.device_ptr(self.k.stream());
                        ptr
                    };
                    self.preprocess(slot, 0, window)?;
                    if let Some(next) = batches.get(b + 1) {
                        self.take_and_upload(p, next.len(), 1 - slot, out.io)?;
                    }
                    let count = t.h * t.w;
                    let mut first = 0;
                    while first < count {
                        let n = self.units()?.min(count - first);
                        let in_ptr = self.bound_mut()?.input_ptr();
                        // SAFETY: the bound input holds `units * bands * p * p` floats and
                        // n <= units; the session reads it only in the run below, after this
                        // stream is synchronised.
                        unsafe {
                            self.k.gather_patches_into(
                                &self.d_window,
                                (self.bands, grid.window_h(), grid.window_w()),
                                self.patch,
                                t.w,
                                first,
                                n,
                                in_ptr,
                            )?;
                        }
                        let ran = self.infer_and_reduce(graph, n, out.io)?;
                        out.infer += ran;
                        for i in 0..n {
                            let q = first + i;
                            let scene = (t.y0 + q / t.w) * cube.samples() + t.x0 + q % t.w;
                            self.put(out, scene, i);
                        }
                        self.done(out.stats, start, n, n, ran, progress);
                        self.adapt(graph, adapt, out.stats.batches)?;
                        first += n;
                    }
                }
            }
        }
        Ok(())
    }

    /// Units of the bound shape.
    fn units(&self) -> Result<usize, ResidentError> {
        self.bound.as_ref().map(|b| b.units).ok_or(ResidentError::Unbound)
    }

    fn bound_mut(&mut self) -> Result<&mut bound::Bound, ResidentError> {
        self.bound.as_mut().ok_or(ResidentError::Unbound)
    }

    /// Asks the governor for the next batch and re-binds at the size it maps to: the old
    /// buffers are released first, and a smaller size has the arena give back what the larger
    /// runs held after its first run.
    fn adapt(
        &mut self,
        graph: &mut Graph,
        adapt: &mut Option<&mut dyn Adapt>,
        done: usize,
    ) -> Result<(), ResidentError> {
        let Some(a) = adapt.as_mut() else {
            return Ok(());
        };
        let current = self.units()?;
        let want = bound::size_for(self.bucket, a.after_batch(done as u64, current));
        if want == current {
            return Ok(());
        }
        self.bound = None;
        if want < current {
            graph.shrink_arena_after_next_run();
        }
        let (input, output) = (&self.in_unit, &self.out_unit);
        self.bound = match bound::Bound::new(graph, &self.allocator, want, input, output) {
            Ok(b) => Some(b),
            // Growing back found the memory gone again: keep the batch it had.
            Err(e) if want > current => {
                eprintln!(
                    "hsiedge: warning: device path: batch {want} could not be bound ({e}); it stays at {current}"
                );
                Some(bound::Bound::new(graph, &self.allocator, current, input, output)?)
            }
            Err(e) => return Err(e),
        };
        Ok(())
    }

    /// Takes the next filled batch of `n` raw windows from the prefetch thread (waiting for it
    /// when the copy is behind), starts its upload into raw slot `slot` and gives the buffers back.
    fn take_and_upload(
        &mut self,
        p: &prefetch::Prefetch<'_, PinnedHostSlice<u8>>,
        n: usize,
        slot: usize,
        io: &mut DeviceIo,
    ) -> Result<(), ResidentError> {
        let t0 = Instant::now();
        let filled = p.next()?;
        io.prefetch_wait_s += t0.elapsed().as_secs_f64();
        io.gather_s += filled.gather_s;
        let wb = self.window_bytes;
        let mut r = Ok(());
        for (i, unit) in filled.units.iter().take(n).enumerate() {
            let mut dst = self.d_raw[slot].slice_mut(i * wb..(i + 1) * wb);
            // The pinned buffer's event is recorded after the copy: the prefetch thread waits for
            // it before writing the buffer again.
            r = self.up.memcpy_htod(unit, &mut dst).map_err(driver("cuMemcpyHtoDAsync"));
            if r.is_err() {
                break;
            }
            io.h2d_bytes += wb as u64;
        }
        p.give_back(filled.units);
        Ok(r?)
    }

    /// Decodes and normalises raw window `i` of raw slot `slot` into the float32 planar window at
    /// device address `out`.
    fn preprocess(&self, slot: usize, i: usize, out: u64) -> Result<(), ResidentError> {
        let wb = self.window_bytes;
        let dims = (self.grid.window_h(), self.grid.window_w(), self.bands);
        let view = self.d_raw[slot].slice(i * wb..(i + 1) * wb);
        macro_rules! typed {
            ($t:ty) => {{
                // SAFETY: the window holds `wb / size_of::<T>()` samples of type T (the cube's
                // data type), starting at a multiple of its size; any bit pattern is a valid T.
                let raw =
                    unsafe { view.transmute::<$t>(wb / std::mem::size_of::<$t>()) }.ok_or_else(|| GpuError::Shape {
                        kernel: <$t as DeviceSample>::KERNEL,
                        message: format!("a window of {wb} bytes is not whole samples"),
                    })?;
                // SAFETY: `out` is a float32 planar window of `dims` in device memory of this
                // context (the bound input's unit `i`, or `d_window`), used by no other stream
                // before this one is synchronised.
                unsafe {
                    self.k.preprocess_into(
                        &raw,
                        self.interleave,
                        self.swap,
                        dims,
                        &self.d_mean,
                        &self.d_inv,
                        out,
                    )
                }?;
            }};
        }
        match self.dtype {
            DataType::I16 => typed!(i16),
            DataType::U16 => typed!(u16),
            _ => typed!(f32),
        }
        Ok(())
    }

    /// Runs the session on the bound buffers and reduces the first `n` units' outputs to labels
    /// and confidence on the host; returns the run's own time.
    fn infer_and_reduce(&mut self, graph: &mut Graph, n: usize, io: &mut DeviceIo) -> Result<Duration, ResidentError> {
        let s = self.k.stream().clone();
        // The session runs on its own stream: the input must be complete before it starts.
        s.synchronize().map_err(driver("cuStreamSynchronize"))?;
        let bound = self.bound.as_ref().ok_or(ResidentError::Unbound)?;
        let ran = bound.run(graph, self.cuda_graph)?;
        let (units, out_ptr) = (bound.units, bound.output_ptr());
        io.host_path_h2d_bytes += (units * self.in_per_unit * 4) as u64;
        let m = n * self.pixels_per_unit;
        // SAFETY: the bound output holds units x classes x pixels_per_unit floats (n <= units),
        // written by the run that has returned above.
        unsafe {
            self.k.argmax_from(
                out_ptr,
                (n, self.classes, self.pixels_per_unit),
                self.logits,
                &mut self.cls,
                &mut self.conf,
            )
        }?;
        s.memcpy_dtoh(&self.cls.slice(0..m), &mut self.h_cls[..m])
            .map_err(driver("cuMemcpyDtoH"))?;
        s.memcpy_dtoh(&self.conf.slice(0..m), &mut self.h_conf[..m])
            .map_err(driver("cuMemcpyDtoH"))?;
        s.synchronize().map_err(driver("cuStreamSynchronize"))?;
        io.d2h_bytes += (m * 8) as u64;
        Ok(ran)
    }

    /// Writes unit output `at` (of the last reduction) to scene pixel `scene`.
    fn put(&self, out: &mut Out<'_>, scene: usize, at: usize) {
        let maps = &mut *out.maps;
        out.written[scene] = out.written[scene].saturating_add(1);
        match self.h_cls[at] {
            u32::MAX => {
                maps.class_ids[scene] = 0;
                maps.confidence[scene] = f32::NAN;
                maps.nonfinite_pixels += 1;
            }
            c => {
                maps.class_ids[scene] = self.ids.get(c as usize).copied().unwrap_or(0);
                maps.confidence[scene] = self.h_conf[at];
            }
        }
    }

    fn done(
        &self,
        stats: &mut RunStats,
        start: Instant,
        units: usize,
        pixels: usize,
        ran: Duration,
        progress: &mut dyn FnMut(&BatchDone),
    ) {
        if stats.batches == 0 {
            stats.first_batch_s = start.elapsed().as_secs_f64();
        }
        stats.batches += 1;
        stats.pixels += pixels;
        progress(&BatchDone {
            batches: stats.batches,
            pixels_done: stats.pixels,
            units,
            pixels,
            infer_s: ran.as_secs_f64(),
            wait_s: 0.0,
            queued: 0,
            batch: self.bound.as_ref().map_or(self.bucket, |b| b.units),
        });
    }
}

/// Turns ONNX Runtime's error in `call` on `graph`'s session into [`ResidentError::Ort`].
fn ort_error(graph: &std::path::Path, call: &'static str) -> impl FnOnce(ort::Error) -> ResidentError {
    let graph = graph.to_path_buf();
    move |e| ResidentError::Ort {
        graph,
        call,
        message: e.to_string(),
    }
}

/// What a run writes as its batches finish.
struct Out<'a> {
    maps: &'a mut Maps,
    /// How many times each scene pixel was written (exactly once at the end).
    written: &'a mut [u8],
    stats: &'a mut RunStats,
    io: &'a mut DeviceIo,
    /// The session runs' own time.
    infer: Duration,
}
