//! The device-resident path of the CUDA provider for classification models (`--io device`).
//!
//! The host copies each tile's input window from the mapped file as raw samples
//! ([`gather::raw_window`], the file's own type, interleave and byte order) into pinned memory
//! and uploads it; on the device the preprocessing kernel decodes and normalises it straight into
//! the input tensor bound to the session with ONNX Runtime's IoBinding (dense mode), or into a
//! planar window from which `gather_patches` writes the bound input (patch mode); the session
//! runs into a bound device output; the argmax kernel reduces it, and only labels and confidence
//! come back to the host. Every run has the same shape (`bucket` units, the last batch padded)
//! and the same buffers, which is what CUDA graphs need. Abundance models keep the host path.

pub mod gather;

use std::time::{Duration, Instant};

use cudarc::driver::{CudaSlice, DevicePtr, PinnedHostSlice};
use ort::memory::{AllocationDevice, Allocator, AllocatorType, MemoryInfo, MemoryType};
use ort::session::IoBinding;
use ort::value::Tensor;

use super::kernels::{DeviceSample, Kernels};
use super::{GpuError, driver};
use crate::cube::{ByteOrder, Cube, DataType, Interleave};
use crate::engine::{Graph, Provider};
use crate::model::{Layout, Manifest, OutputKind, Task};
use crate::pipeline::{BatchDone, Maps, Mode, PipelineError, RunOptions, RunStats};
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
}

/// What the device path moved and where its time went, for `summary.json` and `hsiedge gpu bench`.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct DeviceIo {
    /// Units (tiles or patches) per session run, the last batch padded to it.
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
    /// Seconds copying raw windows on the host.
    pub gather_s: f64,
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
    interleave: Interleave,
    dtype: DataType,
    swap: bool,
    graph_path: std::path::PathBuf,
    // Declared before the tensors it binds, so it is released first.
    binding: IoBinding,
    input: Tensor<f32>,
    output: Tensor<f32>,
    _allocator: Allocator,
    staging: PinnedHostSlice<u8>,
    d_raw: CudaSlice<u8>,
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
        let ort = |call: &'static str| {
            let graph = graph_path.clone();
            move |e: ort::Error| ResidentError::Ort {
                graph: graph.clone(),
                call,
                message: e.to_string(),
            }
        };
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
        let mut input = Tensor::<f32>::new(&allocator, in_shape.clone()).map_err(ort("allocating the input"))?;
        let mut output = Tensor::<f32>::new(&allocator, out_shape).map_err(ort("allocating the output"))?;
        let in_floats: usize = in_shape.iter().product();
        let in_ptr = input.data_ptr_mut() as u64;
        // SAFETY: `in_ptr` is the input tensor's device allocation of `in_floats` float32 values
        // in this device's primary context (the CUDA provider's allocator); zeroing it once makes
        // the padded rows of a partial batch defined.
        unsafe { cudarc::driver::result::memset_d8_sync(in_ptr, 0, in_floats * 4) }.map_err(driver("cuMemsetD8"))?;
        let mut binding = session.create_binding().map_err(ort("CreateIoBinding"))?;
        binding
            .bind_input(graph_input_name(graph), &input)
            .map_err(ort("BindInput"))?;
        binding
            .bind_output(graph.output().name.clone(), &mut output)
            .map_err(ort("BindOutput"))?;
        let size = cube.header().data_type.size();
        let units_raw = match opts.mode {
            Mode::Dense => bucket,
            Mode::Patch => 1,
        };
        let window_bytes = wh * ww * bands * size;
        let s = k.stream().clone();
        // SAFETY: pinned host memory for the raw windows; every byte of it a run reads is written
        // by `gather::raw_window` before it is uploaded.
        let staging =
            unsafe { k.context().alloc_pinned::<u8>(units_raw * window_bytes) }.map_err(driver("cuMemHostAlloc"))?;
        let d_raw = s
            .alloc_zeros::<u8>(units_raw * window_bytes)
            .map_err(driver("cuMemAlloc"))?;
        let d_window = s
            .alloc_zeros::<f32>(if opts.mode == Mode::Patch { bands * wh * ww } else { 1 })
            .map_err(driver("cuMemAlloc"))?;
        let mean = manifest.input.mean.clone();
        let inv: Vec<f32> = manifest.input.std.iter().map(|v| 1.0 / v).collect();
        let m = bucket * pixels_per_unit;
        let r = Self {
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
            interleave: cube.header().interleave,
            dtype: cube.header().data_type,
            swap: (cube.header().byte_order == ByteOrder::Big) == cfg!(target_endian = "little"),
            graph_path: graph.path().to_path_buf(),
            binding,
            input,
            output,
            _allocator: allocator,
            staging,
            d_raw,
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
        Ok(r)
    }

    /// Units per session run.
    pub fn bucket(&self) -> usize {
        self.bucket
    }

    /// Runs the whole scene: class map and confidence, what the run measured, and what the
    /// device path moved. `progress` gets each batch's record.
    pub fn run(
        &mut self,
        cube: &Cube,
        graph: &mut Graph,
        progress: &mut dyn FnMut(&BatchDone),
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
        let mut infer = Duration::ZERO;
        let tiles: Vec<TileRect> = (0..grid.rows)
            .flat_map(|r| (0..grid.cols).map(move |c| (r, c)))
            .map(|(r, c)| grid.rect(r, c))
            .collect();
        // One session run over the units already written into the bound input, then the labels
        // of its first `n` units back into `h_cls` / `h_conf`.
        match self.mode {
            Mode::Dense => {
                for chunk in tiles.chunks(self.bucket) {
                    let t0 = Instant::now();
                    self.gather(cube, chunk)?;
                    io.gather_s += t0.elapsed().as_secs_f64();
                    self.upload(chunk.len(), &mut io)?;
                    let in_ptr = self.input.data_ptr_mut() as u64;
                    for i in 0..chunk.len() {
                        self.preprocess(i, in_ptr + (i * self.in_per_unit * 4) as u64)?;
                    }
                    let ran = self.infer_and_reduce(graph, chunk.len(), &mut io)?;
                    infer += ran;
                    let mut pixels = 0;
                    for (i, t) in chunk.iter().enumerate() {
                        for y in 0..t.h {
                            for x in 0..t.w {
                                let at = i * self.pixels_per_unit + y * grid.tile_w + x;
                                self.put(&mut maps, &mut written, (t.y0 + y) * cube.samples() + t.x0 + x, at);
                            }
                        }
                        pixels += t.h * t.w;
                    }
                    self.done(&mut stats, &mut io, start, chunk.len(), pixels, ran, progress);
                }
            }
            Mode::Patch => {
                for t in &tiles {
                    let t0 = Instant::now();
                    self.gather(cube, std::slice::from_ref(t))?;
                    io.gather_s += t0.elapsed().as_secs_f64();
                    self.upload(1, &mut io)?;
                    let window = {
                        let (ptr, _sync) = self.d_window.device_ptr(self.k.stream());
                        ptr
                    };
                    self.preprocess(0, window)?;
                    let count = t.h * t.w;
                    let mut first = 0;
                    while first < count {
                        let n = self.bucket.min(count - first);
                        let in_ptr = self.input.data_ptr_mut() as u64;
                        // SAFETY: the bound input holds `bucket * bands * p * p` floats and
                        // n <= bucket; the session reads it only in the run below, after this
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
                        let ran = self.infer_and_reduce(graph, n, &mut io)?;
                        infer += ran;
                        for i in 0..n {
                            let q = first + i;
                            let scene = (t.y0 + q / t.w) * cube.samples() + t.x0 + q % t.w;
                            self.put(&mut maps, &mut written, scene, i);
                        }
                        self.done(&mut stats, &mut io, start, n, n, ran, progress);
                        first += n;
                    }
                }
            }
        }
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

    /// Copies the raw windows of `tiles` into the pinned staging buffer, one after another.
    fn gather(&mut self, cube: &Cube, tiles: &[TileRect]) -> Result<(), ResidentError> {
        let wb = self.window_bytes;
        let staging = self.staging.as_mut_slice().map_err(driver("cuEventSynchronize"))?;
        for (i, t) in tiles.iter().enumerate() {
            let lines = self.grid.window_lines(t.row);
            let runs = gather::runs(&self.grid.window_samples(t.col));
            gather::raw_window(cube, &lines, &runs, &mut staging[i * wb..(i + 1) * wb]);
        }
        Ok(())
    }

    /// Uploads the first `n` raw windows.
    fn upload(&mut self, n: usize, io: &mut DeviceIo) -> Result<(), ResidentError> {
        let bytes = n * self.window_bytes;
        let s = self.k.stream().clone();
        let host = self.staging.as_slice().map_err(driver("cuEventSynchronize"))?;
        let mut dst = self.d_raw.slice_mut(0..bytes);
        s.memcpy_htod(&host[..bytes], &mut dst)
            .map_err(driver("cuMemcpyHtoDAsync"))?;
        io.h2d_bytes += bytes as u64;
        Ok(())
    }

    /// Decodes and normalises raw window `i` into the float32 planar window at device address `out`.
    fn preprocess(&self, i: usize, out: u64) -> Result<(), ResidentError> {
        let wb = self.window_bytes;
        let dims = (self.grid.window_h(), self.grid.window_w(), self.bands);
        let view = self.d_raw.slice(i * wb..(i + 1) * wb);
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
        let path = self.graph_path.clone();
        let fail = |call: &'static str| {
            let graph = path.clone();
            move |e: ort::Error| ResidentError::Ort {
                graph,
                call,
                message: e.to_string(),
            }
        };
        let t0 = Instant::now();
        drop(
            graph
                .session_mut()
                .run_binding(&self.binding)
                .map_err(fail("RunWithBinding"))?,
        );
        // A replayed CUDA graph may still be running on the provider's own stream when the run
        // returns: the output is read only once the provider has synchronised it.
        self.binding
            .synchronize_outputs()
            .map_err(fail("SynchronizeBoundOutputs"))?;
        let ran = t0.elapsed();
        io.host_path_h2d_bytes += (self.bucket * self.in_per_unit * 4) as u64;
        let m = n * self.pixels_per_unit;
        let out_ptr = self.output.data_ptr() as u64;
        // SAFETY: the bound output holds bucket x classes x pixels_per_unit floats (n <= bucket),
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
    fn put(&self, maps: &mut Maps, written: &mut [u8], scene: usize, at: usize) {
        written[scene] = written[scene].saturating_add(1);
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

    #[allow(clippy::too_many_arguments)]
    fn done(
        &self,
        stats: &mut RunStats,
        _io: &mut DeviceIo,
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
            batch: self.bucket,
        });
    }
}

/// The graph's input name.
fn graph_input_name(graph: &Graph) -> String {
    graph.input().name.clone()
}
