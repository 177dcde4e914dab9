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
pub mod mapped;
pub mod prefetch;
mod reduce;
mod run;
mod stitch;

pub use stitch::StripSender;

use std::collections::VecDeque;
use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, PinnedHostSlice};
use ort::memory::{AllocationDevice, Allocator, AllocatorType, MemoryInfo, MemoryType};

use super::kernels::Kernels;
use super::{GpuError, driver};
use crate::cube::{ByteOrder, Cube, DataType, Interleave};
use crate::engine::{Graph, Provider};
use crate::model::{Layout, Manifest, OutputKind, Task};
use crate::pipeline::{Mode, PipelineError, RunOptions};
use crate::tile::TileGrid;

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
    /// A setting of the device path has a value it does not know.
    #[error("{name}={value:?}: expected `mapped` or `gathered`")]
    Setting {
        /// The environment variable.
        name: &'static str,
        /// Its value.
        value: String,
    },
    /// The thread stitching labels into the maps stopped (it panicked).
    #[error("the device path's stitching thread stopped before the maps were complete")]
    Stitcher,
    /// A prefetch thread stopped without handing over its batch (it panicked).
    #[error("the device path's prefetch thread stopped before its batch was copied")]
    Prefetch,
}

/// Sets of pinned raw-window buffers going round between the prefetch thread and the uploads:
/// one being filled while the other waits or is uploaded.
const PREFETCH_DEPTH: usize = 2;

/// What the device path moved and where its time went, for `summary.json` and `hsiedge gpu bench`.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
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
    /// How raw windows reached the device: `mapped` (boxes copied by the device straight from
    /// the registered mapping of the scene) or `gathered` (copied on the host into pinned
    /// buffers first).
    pub upload: &'static str,
    /// Why the run copied on the host although it asked for mapped uploads.
    pub upload_fallback: Option<String>,
    /// Seconds registering the scene's mapping with the device in this run (0 when an earlier
    /// run of the same cube did).
    pub register_s: f64,
    /// Where the run's time went, when its session runs were queued on the kernels' stream
    /// (`None` with waiting runs, or when an event could not be read).
    pub timeline: Option<Timeline>,
}

/// A queued run's seconds from its start to its maps being complete, in four parts that add up
/// to the whole: before the first session run starts on the device, the session runs
/// themselves, the rest of the device's time between the first run's start and the last run's
/// end, and after the last run's end.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct Timeline {
    /// Start to the first session run's start: setting up, the first batch's upload and
    /// preprocessing.
    pub lead_s: f64,
    /// The session runs' own time on the device.
    pub runs_s: f64,
    /// First run's start to last run's end less `runs_s`: the later batches' preprocessing,
    /// argmax and label copies, and the device idle between runs.
    pub between_s: f64,
    /// Last run's end to the maps being complete: the last labels back, stitched and handed on.
    pub tail_s: f64,
}

impl Timeline {
    /// From host and device marks: `origin_s`, host seconds from the run's start to recording
    /// an event on the idle stream; `to_first_s` and `to_last_s`, device seconds from that event
    /// to the first run's start and to the last run's end; `runs_s`; and `total_s`, host seconds
    /// from start to finish.
    pub fn from_marks(origin_s: f64, to_first_s: f64, to_last_s: f64, runs_s: f64, total_s: f64) -> Self {
        Self {
            lead_s: origin_s + to_first_s,
            runs_s,
            between_s: to_last_s - to_first_s - runs_s,
            tail_s: total_s - origin_s - to_last_s,
        }
    }
}

/// Why `manifest` over `cube` with `provider` cannot take the device path, or `None` when it can.
/// `keep_scores`: the run was asked for every class's score map, which the device path (labels
/// and confidence only) does not make.
pub fn unsupported(cube: &Cube, manifest: &Manifest, provider: Provider, keep_scores: bool) -> Option<String> {
    if provider != Provider::Cuda {
        return Some(format!("needs the cuda provider; the session runs on {provider}"));
    }
    if manifest.task != Task::Classification {
        return Some("serves classification models; abundance maps keep every channel".into());
    }
    if manifest.input.layout == Layout::Nc {
        return Some("needs a spatial input layout (n1chw or nchw), not nc".into());
    }
    if keep_scores {
        return Some("makes labels and confidence only; --keep-scores needs every class's scores".into());
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
    /// The stream the uploads run on, beside the kernels' stream (which the session shares when
    /// its runs are queued).
    up: Arc<CudaStream>,
    d_window: CudaSlice<f32>,
    d_mean: CudaSlice<f32>,
    d_inv: CudaSlice<f32>,
    /// Labels and confidence of the last two runs, on the device and in pinned host memory.
    cls: [CudaSlice<u32>; 2],
    conf: [CudaSlice<f32>; 2],
    h_cls: [PinnedHostSlice<u32>; 2],
    h_conf: [PinnedHostSlice<f32>; 2],
    /// Runs reduced so far in this run (which label buffers the next one takes).
    reductions: usize,
    /// The run whose labels are on their way back.
    pending: VecDeque<reduce::Reduction>,
    cuda_graph: bool,
    /// The session runs on the kernels' stream and its runs are only queued.
    queued: bool,
    /// Each tile row's window lines and each tile column's window samples (scene indices).
    d_lines: CudaSlice<i32>,
    d_cols: CudaSlice<i32>,
    /// The boxes each raw slot holds when it was filled from the mapped scene (empty when its
    /// windows were copied on the host).
    segs: [Vec<mapped::Segment>; 2],
    /// Whether the warning that mapped uploads fell back was printed.
    told_unmapped: bool,
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
    /// says whether the session was built to capture CUDA graphs: its runs then wait, as they do
    /// when the session was not given the kernels' stream.
    pub fn new(
        cube: &Cube,
        manifest: &Manifest,
        graph: &mut Graph,
        opts: &RunOptions,
        device_id: u32,
        cuda_graph: bool,
    ) -> Result<Self, ResidentError> {
        if let Some(what) = unsupported(cube, manifest, graph.provider(), opts.keep_scores) {
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
        let bound = bound::Bound::new(graph, &allocator, bucket, &in_unit, &out_unit, k.stream())?;
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
        let index = |v: Vec<usize>| -> Result<Vec<i32>, ResidentError> {
            v.into_iter()
                .map(|i| {
                    i32::try_from(i).map_err(|_| ResidentError::Unsupported {
                        what: format!("indexes scenes with 32-bit indices; {i} is beyond them"),
                    })
                })
                .collect()
        };
        let mut lines = Vec::new();
        for row in 0..grid.rows {
            lines.extend(index(grid.window_lines(row))?);
        }
        let mut cols = Vec::new();
        for col in 0..grid.cols {
            cols.extend(index(grid.window_samples(col))?);
        }
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
            cls: [
                s.alloc_zeros::<u32>(m).map_err(driver("cuMemAlloc"))?,
                s.alloc_zeros::<u32>(m).map_err(driver("cuMemAlloc"))?,
            ],
            conf: [
                s.alloc_zeros::<f32>(m).map_err(driver("cuMemAlloc"))?,
                s.alloc_zeros::<f32>(m).map_err(driver("cuMemAlloc"))?,
            ],
            h_cls: [pinned(&k, m)?, pinned(&k, m)?],
            h_conf: [pinned(&k, m)?, pinned(&k, m)?],
            reductions: 0,
            pending: VecDeque::new(),
            queued: !cuda_graph
                && graph
                    .compute_stream()
                    .is_some_and(|c| c == crate::gpu::ComputeStream::of(k.stream())),
            cuda_graph,
            d_lines: s.clone_htod(&lines).map_err(driver("cuMemcpyHtoD"))?,
            d_cols: s.clone_htod(&cols).map_err(driver("cuMemcpyHtoD"))?,
            segs: [Vec::new(), Vec::new()],
            told_unmapped: false,
            k,
        };
        Ok(r)
    }

    /// Allocates the pinned buffer sets the pool lacks (all at first; those an error dropped).
    pub(super) fn fill_pool(&mut self) -> Result<(), ResidentError> {
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
}

/// Pinned host memory for `len` values that the device writes before the host reads them.
fn pinned<T: cudarc::driver::DeviceRepr>(k: &Kernels, len: usize) -> Result<PinnedHostSlice<T>, ResidentError> {
    // SAFETY: the buffer's values are read only after a copy from the device wrote them (the
    // label copy of each run covers the part read back). Cacheable (flags 0), not
    // write-combined: the host reads every batch's labels out of it.
    Ok(unsafe { k.context().alloc_pinned_with_flags::<T>(len, 0) }.map_err(driver("cuMemHostAlloc"))?)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cube::Header;

    #[test]
    fn the_device_path_is_refused_where_it_would_drop_what_was_asked_for() {
        let dir = tempfile::tempdir().unwrap();
        let h = Header::new(4, 3, 2, DataType::I16, Interleave::Bil);
        std::fs::write(dir.path().join("s.hdr"), h.to_text()).unwrap();
        std::fs::write(dir.path().join("s.img"), vec![0u8; 4 * 3 * 2 * 2]).unwrap();
        let cube = Cube::open(&dir.path().join("s.hdr")).unwrap();
        let manifest = Manifest::load(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("models/hybridsn_salinas_a/manifest.json"),
        )
        .unwrap();
        assert_eq!(unsupported(&cube, &manifest, Provider::Cuda, false), None);
        let scores = unsupported(&cube, &manifest, Provider::Cuda, true).unwrap();
        assert!(scores.contains("--keep-scores"), "{scores}");
        let cpu = unsupported(&cube, &manifest, Provider::Cpu, true).unwrap();
        assert!(cpu.contains("needs the cuda provider"), "{cpu}");
    }

    #[test]
    fn a_timeline_splits_the_whole_run_into_parts_that_add_up() {
        // Origin recorded 2 ms into the run; first run starts 1 ms later on the device, the last
        // ends 20 ms after the origin; the runs took 16 ms; the run returned at 25 ms.
        let t = Timeline::from_marks(0.002, 0.001, 0.020, 0.016, 0.025);
        let close = |a: f64, b: f64| (a - b).abs() < 1e-12;
        assert!(close(t.lead_s, 0.003), "{t:?}");
        assert!(close(t.runs_s, 0.016), "{t:?}");
        assert!(close(t.between_s, 0.003), "{t:?}");
        assert!(close(t.tail_s, 0.003), "{t:?}");
        assert!(close(t.lead_s + t.runs_s + t.between_s + t.tail_s, 0.025), "{t:?}");
    }
}
