//! Uploads straight from the mapped scene, with no copy on the host: the mapping's pages are
//! registered with the device once (read-only, for as long as the cube keeps its mapping), each
//! batch's windows are copied as boxes of the file by the copy engine, and the preprocessing
//! kernel reads each window out of its box through the tile grid's indices (the reflections at
//! the scene's borders included).

use std::ops::Range;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream, sys};

use crate::cube::{Cube, Interleave};
use crate::gpu::GpuError;
use crate::gpu::kernels::BoxShape;
use crate::tile::{TileGrid, TileRect};

/// A registration of a cube's mapped pages with one device context; dropping it unregisters
/// them. Kept by the cube ([`Cube::keep_while_mapped`]), so it ends before the unmap.
pub struct Registration {
    ctx: Arc<CudaContext>,
    ptr: usize,
    len: usize,
}

impl Registration {
    /// Registers `bytes` (a read-only file mapping) with `ctx` for the copy engine to read.
    pub fn new(ctx: &Arc<CudaContext>, bytes: &[u8]) -> Result<Self, GpuError> {
        ctx.bind_to_thread().map_err(crate::gpu::driver("cuCtxSetCurrent"))?;
        // SAFETY: `bytes` is a live mapping of `bytes.len()` bytes; READ_ONLY registration only
        // lets the device read it, which a read-only (PROT_READ) mapping requires. The pages stay
        // registered until `Drop`, which the cube runs before it unmaps them.
        unsafe {
            sys::cuMemHostRegister_v2(
                bytes.as_ptr() as *mut std::ffi::c_void,
                bytes.len(),
                sys::CU_MEMHOSTREGISTER_READ_ONLY,
            )
        }
        .result()
        .map_err(crate::gpu::driver("cuMemHostRegister"))?;
        Ok(Self {
            ctx: ctx.clone(),
            ptr: bytes.as_ptr() as usize,
            len: bytes.len(),
        })
    }

    /// Whether this registers `bytes` with `ctx`'s CUDA context (each `Resident` holds its own
    /// handle of the device's primary context, so the handles are not compared).
    pub fn covers(&self, ctx: &Arc<CudaContext>, bytes: &[u8]) -> bool {
        self.ctx.cu_ctx() == ctx.cu_ctx() && self.ptr == bytes.as_ptr() as usize && self.len == bytes.len()
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // A run that stopped on an error may have left a copy from these pages in flight. A
            // context too broken to synchronise runs no copies either: unregister regardless, so
            // no registration outlives the mapping.
            let _ = self.ctx.synchronize();
            // SAFETY: `ptr` was registered by `new` in this context and not unregistered since;
            // the context is synchronised, so no copy reads it any more.
            let _ = unsafe { sys::cuMemHostUnregister(self.ptr as *mut std::ffi::c_void) };
        }
    }
}

/// Registers `cube`'s mapping with `ctx` unless it already is; returns the seconds it took (0
/// when it was registered before), or why it is not registered ([`room_to_pin`], or the
/// driver's refusal).
pub fn ensure_registered(cube: &Cube, ctx: &Arc<CudaContext>) -> Result<f64, String> {
    let bytes = cube.mapped_bytes();
    if cube.kept_any::<Registration>(|r| r.covers(ctx, bytes)) {
        return Ok(0.0);
    }
    room_to_pin(cube)?;
    let t0 = std::time::Instant::now();
    let r = Registration::new(ctx, bytes).map_err(|e| format!("{}: {e}", cube.data_path().display()))?;
    cube.keep_while_mapped(Box::new(r));
    Ok(t0.elapsed().as_secs_f64())
}

/// Whether the system can give the cube's mapping as pinned memory: registering makes its page
/// cache unreclaimable for the job's life, so it is allowed up to half of what the system (and
/// the cgroup) can still give; otherwise the reason, naming the sizes.
pub fn room_to_pin(cube: &Cube) -> Result<(), String> {
    let bytes = cube.mapped_bytes().len() as u64;
    let m = crate::platform::memory::read_memory(std::path::Path::new("/")).map_err(|e| e.to_string())?;
    let cgroup = match (m.cgroup_limit_bytes, m.cgroup_usage_bytes) {
        (Some(limit), Some(used)) => limit.saturating_sub(used),
        _ => u64::MAX,
    };
    let room = m.available_bytes.min(cgroup) / 2;
    if bytes > room {
        return Err(format!(
            "{} ({} MiB) is more than half of the {} MiB the system can give; pinning it would take \
             that memory for the whole run",
            cube.data_path().display(),
            bytes >> 20,
            (room * 2) >> 20
        ));
    }
    Ok(())
}

/// A box of the scene holding the windows of consecutive tiles of one tile row, and where it
/// goes in the device's raw slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    /// The box: first scene line and line count, first sample and sample count.
    pub l0: usize,
    /// See `l0`.
    pub lines: usize,
    /// See `l0`.
    pub c0: usize,
    /// See `l0`.
    pub samples: usize,
    /// Byte offset of the box in the raw slot.
    pub offset: usize,
    /// The batch's tiles (indices into it) whose windows the box holds.
    pub tiles: Range<usize>,
}

impl Segment {
    /// The box's bytes.
    pub fn bytes(&self, bands: usize, size: usize) -> usize {
        self.lines * self.samples * bands * size
    }

    /// Where a window of this box lies, for the preprocessing kernel.
    pub fn shape(&self, bands: usize, window: (usize, usize)) -> BoxShape {
        BoxShape {
            dims: (self.lines, self.samples, bands),
            l0: self.l0,
            c0: self.c0,
            window,
        }
    }
}

/// The boxes of `tiles` (a batch, in grid order): one per run of consecutive tiles of a tile row,
/// the smallest that holds their windows' lines and samples. Together they are never larger than
/// the tiles' windows (a box is at most a window high and the run's windows wide).
pub fn segments(grid: &TileGrid, tiles: &[TileRect], bands: usize, size: usize) -> Vec<Segment> {
    let mut out: Vec<Segment> = Vec::new();
    let mut offset = 0;
    let mut i = 0;
    while i < tiles.len() {
        let row = tiles[i].row;
        let mut j = i + 1;
        while j < tiles.len() && tiles[j].row == row && tiles[j].col == tiles[j - 1].col + 1 {
            j += 1;
        }
        let lines = grid.window_lines(row);
        let (l0, l1) = span(&lines);
        let (mut c0, mut c1) = (usize::MAX, 0);
        for t in &tiles[i..j] {
            let (a, b) = span(&grid.window_samples(t.col));
            c0 = c0.min(a);
            c1 = c1.max(b);
        }
        let s = Segment {
            l0,
            lines: l1 - l0,
            c0,
            samples: c1.saturating_sub(c0),
            offset,
            tiles: i..j,
        };
        offset += s.bytes(bands, size);
        out.push(s);
        i = j;
    }
    out
}

/// The first index and one past the last of `v`.
fn span(v: &[usize]) -> (usize, usize) {
    let lo = v.iter().copied().min().unwrap_or(0);
    let hi = v.iter().copied().max().map_or(0, |m| m + 1);
    (lo, hi)
}

/// One 2D copy of a box: source byte offset in the scene's data, source pitch, width in bytes,
/// rows, and destination offset in the box.
pub type Copy2d = (usize, usize, usize, usize, usize);

/// The 2D copies that lay box `seg` of a scene with header `h` out as the preprocessing kernel
/// reads it: (line, band, sample) rows for BIL, (line, sample x band) rows for BIP, and one copy
/// of (line, sample) rows per band for BSQ.
pub fn copy_plan(h: &crate::cube::Header, seg: &Segment) -> Vec<Copy2d> {
    let (s, b, l) = (h.samples, h.bands, h.lines);
    let size = h.data_type.size();
    let row = seg.samples * size;
    match h.interleave {
        Interleave::Bil => vec![((seg.l0 * b * s + seg.c0) * size, s * size, row, seg.lines * b, 0)],
        Interleave::Bip => vec![((seg.l0 * s + seg.c0) * b * size, s * b * size, row * b, seg.lines, 0)],
        Interleave::Bsq => (0..b)
            .map(|band| {
                (
                    ((band * l + seg.l0) * s + seg.c0) * size,
                    s * size,
                    row,
                    seg.lines,
                    band * seg.lines * row,
                )
            })
            .collect(),
    }
}

/// Queues on `stream` the copy of box `seg` of `cube` (whose mapping is registered) into the
/// device memory at `dst`: one 2D copy for BIL and BIP files, one per band for BSQ.
///
/// # Safety
/// `dst` must hold `seg.bytes(..)` bytes of device memory of the stream's context, not used by
/// another stream until this copy has run, and `cube`'s mapping must stay registered and mapped
/// until then.
pub unsafe fn copy_box(stream: &CudaStream, cube: &Cube, seg: &Segment, dst: u64) -> Result<(), GpuError> {
    let h = cube.header();
    let data = cube.data_bytes();
    let copies = copy_plan(h, seg);
    for (src, pitch, width, height, at) in copies {
        if height == 0 || width == 0 {
            continue;
        }
        let last = src + (height - 1) * pitch + width;
        if last > data.len() {
            return Err(GpuError::Shape {
                kernel: "copy_box",
                message: format!("a box ending at byte {last} is past the scene's {} bytes", data.len()),
            });
        }
        let copy = sys::CUDA_MEMCPY2D {
            srcXInBytes: 0,
            srcY: 0,
            srcMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_HOST,
            srcHost: data[src..].as_ptr().cast(),
            srcDevice: 0,
            srcArray: std::ptr::null_mut(),
            srcPitch: pitch,
            dstXInBytes: 0,
            dstY: 0,
            dstMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
            dstHost: std::ptr::null_mut(),
            dstDevice: dst + at as u64,
            dstArray: std::ptr::null_mut(),
            dstPitch: width,
            WidthInBytes: width,
            Height: height,
        };
        // SAFETY: the source rows lie inside the registered mapping (checked above); the
        // destination holds the box by this function's contract; the copy is queued on `stream`.
        unsafe { sys::cuMemcpy2DAsync_v2(&copy, stream.cu_stream()) }
            .result()
            .map_err(crate::gpu::driver("cuMemcpy2DAsync"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cube::{DataType, Header};
    use crate::gpu::reference;
    use crate::tile::fill_window;

    /// Emulates `copy_box` on the host from the same plan: the box's bytes as the device would
    /// hold them.
    fn host_box(cube: &Cube, seg: &Segment) -> Vec<u8> {
        let data = cube.data_bytes();
        let plan = copy_plan(cube.header(), seg);
        let len = seg.bytes(cube.bands(), cube.header().data_type.size());
        let mut out = vec![0xAAu8; len];
        for (src, pitch, width, height, at) in plan {
            for r in 0..height {
                let d = at + r * width;
                out[d..d + width].copy_from_slice(&data[src + r * pitch..src + r * pitch + width]);
            }
        }
        out
    }

    #[test]
    fn windows_read_out_of_their_boxes_are_the_host_windows() {
        let dir = tempfile::tempdir().unwrap();
        let (s, l, b) = (23usize, 19usize, 3usize);
        let mean = [1.5f32, -2.0, 40.0];
        let inv_std = [0.5f32, 0.25, 2.0];
        for (il, offset) in [
            (Interleave::Bil, 0),
            (Interleave::Bip, 0),
            (Interleave::Bsq, 0),
            (Interleave::Bil, 7),
            (Interleave::Bsq, 7),
        ] {
            let mut h = Header::new(s, l, b, DataType::I16, il);
            h.header_offset = offset;
            let name = format!("{il:?}_{offset}");
            let mut bytes = vec![0xEEu8; offset];
            bytes.extend((0..s * l * b).flat_map(|v| (v as i16 - 50).to_le_bytes()));
            std::fs::write(dir.path().join(format!("{name}.hdr")), h.to_text()).unwrap();
            std::fs::write(dir.path().join(format!("{name}.img")), bytes).unwrap();
            let cube = Cube::open(&dir.path().join(format!("{name}.hdr"))).unwrap();
            // Tiles of 8 with a halo of 3 (windows reflect at every border), and tiles larger
            // than the scene.
            for (tile, halo) in [(8, 3), (6, 2), (32, 4)] {
                let grid = TileGrid::new(l, s, tile, halo);
                let all: Vec<TileRect> = (0..grid.rows)
                    .flat_map(|r| (0..grid.cols).map(move |c| (r, c)))
                    .map(|(r, c)| grid.rect(r, c))
                    .collect();
                let wb = crate::gpu::resident::gather::window_bytes(&cube, grid.window_h(), grid.window_w());
                for batch in [1, 2, 3, all.len()] {
                    for chunk in all.chunks(batch) {
                        let segs = segments(&grid, chunk, b, 2);
                        let total: usize = segs.iter().map(|g| g.bytes(b, 2)).sum();
                        assert!(
                            total <= chunk.len() * wb,
                            "{il:?} boxes {total} > windows {}",
                            chunk.len() * wb
                        );
                        assert_eq!(segs.iter().map(|g| g.tiles.len()).sum::<usize>(), chunk.len());
                        for seg in &segs {
                            let raw: Vec<i16> = host_box(&cube, seg)
                                .chunks_exact(2)
                                .map(|v| i16::from_le_bytes([v[0], v[1]]))
                                .collect();
                            for t in &chunk[seg.tiles.clone()] {
                                let (lines, cols) = (grid.window_lines(t.row), grid.window_samples(t.col));
                                let mut want = Vec::new();
                                fill_window(&cube, &lines, &cols, &mean, &inv_std, &mut want);
                                let got = reference::preprocess_box(
                                    &raw,
                                    il,
                                    (seg.lines, seg.samples, b),
                                    (seg.l0, seg.c0),
                                    (&lines, &cols),
                                    &mean,
                                    &inv_std,
                                );
                                assert_eq!(got, want, "{il:?} tile {tile} batch {batch} ({}, {})", t.row, t.col);
                            }
                        }
                    }
                }
            }
        }
    }
}
