//! Running a scene on the device path: batches taken from the prefetch in order, uploaded,
//! preprocessed, run and reduced, with the governor's cuts applied between batches.

use std::sync::mpsc::sync_channel;
use std::time::{Duration, Instant};

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaEvent, DevicePtr, DevicePtrMut, PinnedHostSlice};

use super::stitch::{Canvas, Place, Stitch, Stitcher, StripSender};
use super::{DeviceIo, Resident, ResidentError, Timeline, bound, mapped, prefetch};
use crate::cube::{Cube, DataType};
use crate::engine::Graph;
use crate::gpu::kernels::DeviceSample;
use crate::gpu::{GpuError, driver};
use crate::pipeline::{Adapt, BatchDone, Maps, Mode, PipelineError, RunStats};
use crate::tile::TileRect;

impl Resident {
    /// Runs the whole scene: class map and confidence, what the run measured, and what the
    /// device path moved. `progress` gets each batch's record; `adapt` (the memory governor) may
    /// cut the batch after each one: it then runs at [`bound::size_for`] the governor's batch
    /// (the largest engine bucket at or below it), re-bound (not with CUDA graphs, whose capture has one shape).
    /// Each tile row goes to `strips` as soon as all its pixels are in.
    pub fn run(
        &mut self,
        cube: &Cube,
        graph: &mut Graph,
        progress: &mut dyn FnMut(&BatchDone),
        mut adapt: Option<&mut dyn Adapt>,
        strips: Option<StripSender>,
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
        let mapped = self.choose_upload(cube, &mut io)?;
        let m = self.bucket * self.pixels_per_unit;
        let canvas = Canvas::new(
            &mut maps,
            &mut written,
            self.ids.clone(),
            &grid,
            self.pixels_per_unit,
            strips,
        );
        self.pending.clear();
        let mut marks = Marks::default();
        if self.queued {
            // On an idle stream the event's device time is the host's time of recording it (a
            // first run may still have its binding's work queued).
            self.k.stream().synchronize().map_err(driver("cuStreamSynchronize"))?;
            let timed = Some(CUevent_flags::CU_EVENT_DEFAULT);
            let origin = self.k.stream().record_event(timed).map_err(driver("cuEventRecord"))?;
            marks.origin = Some((origin, start.elapsed().as_secs_f64()));
        }
        let ran: Result<(Duration, Marks), ResidentError> = std::thread::scope(|sc| {
            // Stitching runs beside the next batch: two label buffers go round between this
            // thread, which fills one, and the stitcher, which empties the other.
            let (jobs, job_rx) = sync_channel::<Stitch>(1);
            let (back_tx, back) = sync_channel::<(Vec<u32>, Vec<f32>)>(2);
            // One pair for the stitcher, one for the run's thread to fill.
            for _ in 0..2 {
                let _ = back_tx.send((vec![0; m], vec![0.0; m]));
            }
            let stitcher = sc.spawn(move || canvas.stitch_all(job_rx, back_tx));
            let mut out = Out {
                stitch: Stitcher { jobs, back },
                stats: &mut stats,
                io: &mut io,
                infer: Duration::ZERO,
                start,
                marks,
            };
            let ran = if mapped {
                self.run_batches(&Feed::Mapped, &batches, cube, graph, &mut out, progress, &mut adapt)
            } else {
                self.gathered(cube, &batches, graph, &mut out, progress, &mut adapt)
            };
            if ran.is_err() {
                // Nothing queued may still use the buffers, or read the scene's mapping, once
                // the run returns.
                self.settle();
            }
            let (infer, marks) = (out.infer, out.marks);
            // Closing the job channel ends the stitcher after the jobs sent.
            drop(out.stitch);
            let joined = stitcher.join();
            // The run's own error first: a stitcher that stopped is then only its consequence.
            ran?;
            joined.map_err(|_| ResidentError::Stitcher)?;
            Ok((infer, marks))
        });
        let (infer, marks) = ran?;
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
        io.timeline = marks.timeline(infer, stats.elapsed_s);
        stats.inference_s = infer.as_secs_f64();
        io.inference_s = stats.inference_s;
        let px = stats.pixels.max(1) as f64;
        io.h2d_bytes_per_pixel = io.h2d_bytes as f64 / px;
        io.host_path_h2d_bytes_per_pixel = io.host_path_h2d_bytes as f64 / px;
        io.d2h_bytes_per_pixel = io.d2h_bytes as f64 / px;
        Ok((maps, stats, io))
    }

    /// [`Resident::run_batches`] with a prefetch thread copying raw windows on the host.
    #[allow(clippy::too_many_arguments)]
    fn gathered(
        &mut self,
        cube: &Cube,
        batches: &[&[TileRect]],
        graph: &mut Graph,
        out: &mut Out<'_>,
        progress: &mut dyn FnMut(&BatchDone),
        adapt: &mut Option<&mut dyn Adapt>,
    ) -> Result<(), ResidentError> {
        self.fill_pool()?;
        let mut pool = std::mem::take(&mut self.pool);
        let (grid, threads) = (self.grid, self.gather_threads);
        let fill =
            |tiles: &[TileRect], units: &mut [PinnedHostSlice<u8>]| prefetch::fill(cube, &grid, tiles, units, threads);
        // With CUDA graphs the copy runs on this thread, between session runs: no other thread
        // makes driver calls while ONNX Runtime captures.
        let ran = prefetch::with_prefetch(batches, &mut pool, self.cuda_graph, &fill, |p| {
            self.run_batches(&Feed::Gathered(p), batches, cube, graph, out, progress, adapt)
        });
        self.pool = pool;
        ran
    }

    /// The batches in order: batch b + 1 is uploaded on the copy stream while batch b runs.
    #[allow(clippy::too_many_arguments)]
    fn run_batches(
        &mut self,
        p: &Feed<'_, '_>,
        batches: &[&[TileRect]],
        cube: &Cube,
        graph: &mut Graph,
        out: &mut Out<'_>,
        progress: &mut dyn FnMut(&BatchDone),
        adapt: &mut Option<&mut dyn Adapt>,
    ) -> Result<(), ResidentError> {
        let grid = self.grid;
        if let Some(first) = batches.first() {
            self.take_and_upload(p, cube, first, 0, out.io)?;
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
                            let at = in_ptr + (i * self.in_per_unit * 4) as u64;
                            self.preprocess(slot, first + i, &chunk[first + i], at)?;
                        }
                        if first == 0
                            && let Some(next) = batches.get(b + 1)
                        {
                            self.take_and_upload(p, cube, next, 1 - slot, out.io)?;
                        }
                        let done = &chunk[first..first + n];
                        let pixels = done.iter().map(|t| t.h * t.w).sum();
                        self.infer_and_reduce(graph, n, pixels, Place::Tiles(done.to_vec()), out, progress)?;
                        self.adapt(graph, adapt, out, progress)?;
                        first += n;
                    }
                }
                Mode::Patch => {
                    let t = &chunk[0];
                    let window = {
                        let (ptr, _sync) = self.d_window.device_ptr(self.k.stream());
                        ptr
                    };
                    self.preprocess(slot, 0, t, window)?;
                    if let Some(next) = batches.get(b + 1) {
                        self.take_and_upload(p, cube, next, 1 - slot, out.io)?;
                    }
                    let count = t.h * t.w;
                    let mut first = 0;
                    while first < count {
                        let n = self.units()?.min(count - first);
                        let in_ptr = self.bound_mut()?.input_ptr();
                        // SAFETY: the bound input holds `units * bands * p * p` floats and
                        // n <= units; the session reads it only in the run below, queued after
                        // this on the same stream or run after this stream is synchronised.
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
                        self.infer_and_reduce(graph, n, n, Place::Patches { tile: *t, first, n }, out, progress)?;
                        self.adapt(graph, adapt, out, progress)?;
                        first += n;
                    }
                }
            }
        }
        self.drain(out, progress)
    }

    /// Waits for everything queued on the kernels' and the upload stream (after an error) and
    /// forgets the runs in flight.
    pub(super) fn settle(&mut self) {
        let _ = self.k.stream().synchronize();
        let _ = self.up.synchronize();
        self.pending.clear();
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
        out: &mut Out<'_>,
        progress: &mut dyn FnMut(&BatchDone),
    ) -> Result<(), ResidentError> {
        let Some(a) = adapt.as_mut() else {
            return Ok(());
        };
        let current = self.units()?;
        let want = bound::size_for(self.bucket, a.after_batch(out.stats.batches as u64, current));
        if want == current {
            return Ok(());
        }
        // The old buffers go only once nothing queued uses them.
        self.drain(out, progress)?;
        self.k.stream().synchronize().map_err(driver("cuStreamSynchronize"))?;
        self.bound = None;
        if want < current {
            graph.shrink_arena_after_next_run();
        }
        let (input, output) = (&self.in_unit, &self.out_unit);
        let s = self.k.stream().clone();
        self.bound = match bound::Bound::new(graph, &self.allocator, want, input, output, &s) {
            Ok(b) => Some(b),
            // Growing back found the memory gone again: keep the batch it had.
            Err(e) if want > current => {
                eprintln!(
                    "hsiedge: warning: device path: batch {want} could not be bound ({e}); it stays at {current}"
                );
                Some(bound::Bound::new(graph, &self.allocator, current, input, output, &s)?)
            }
            Err(e) => return Err(e),
        };
        Ok(())
    }

    /// Whether this run uploads straight from the mapped scene (registering its pages the first
    /// time), or copies windows on the host: by `HSIEDGE_DEVICE_UPLOAD`, and on the host when
    /// registering fails (said once, and recorded in `io`).
    fn choose_upload(&mut self, cube: &Cube, io: &mut DeviceIo) -> Result<bool, ResidentError> {
        let want = crate::config::device_upload().map_err(|value| ResidentError::Setting {
            name: crate::config::HSIEDGE_DEVICE_UPLOAD.name,
            value,
        })?;
        io.upload = "gathered";
        if want == crate::config::DeviceUpload::Gathered {
            return Ok(false);
        }
        match mapped::ensure_registered(cube, self.k.context()) {
            Ok(s) => {
                io.register_s = s;
                io.upload = "mapped";
                io.gather_threads = 0;
                Ok(true)
            }
            Err(e) => {
                if !self.told_unmapped {
                    eprintln!(
                        "hsiedge: warning: device path: the scene's pages are not registered with the device \
                         ({e}); windows are copied on the host instead"
                    );
                    self.told_unmapped = true;
                }
                io.upload_fallback = Some(e);
                Ok(false)
            }
        }
    }

    /// Starts the upload of the raw windows of `tiles` into raw slot `slot` on the copy stream:
    /// straight from the mapped scene as boxes, or from the next batch the prefetch thread filled
    /// (waiting for it when the copy is behind), whose buffers then go back at once.
    fn take_and_upload(
        &mut self,
        feed: &Feed<'_, '_>,
        cube: &Cube,
        tiles: &[TileRect],
        slot: usize,
        io: &mut DeviceIo,
    ) -> Result<(), ResidentError> {
        // The slot was last read by preprocessing queued on the kernels' stream, which may not
        // have run yet: the copy waits for what that stream has queued so far.
        self.up.join(self.k.stream()).map_err(driver("cuStreamWaitEvent"))?;
        let p = match feed {
            Feed::Gathered(p) => p,
            Feed::Mapped => {
                let size = self.dtype.size();
                let segs = mapped::segments(&self.grid, tiles, self.bands, size);
                let total: usize = segs.iter().map(|s| s.bytes(self.bands, size)).sum();
                if total > self.d_raw[slot].len() {
                    return Err(GpuError::Shape {
                        kernel: "copy_box",
                        message: format!("{total} bytes of boxes for a raw slot of {}", self.d_raw[slot].len()),
                    }
                    .into());
                }
                let (dst, _written) = self.d_raw[slot].device_ptr_mut(&self.up);
                for seg in &segs {
                    // SAFETY: the boxes fit the raw slot (checked above), which only this stream
                    // writes until the preprocessing joins it; the cube's mapping was registered
                    // by `choose_upload` and stays mapped while `cube` is borrowed by this run,
                    // whose streams are synchronised before it returns.
                    unsafe { mapped::copy_box(&self.up, cube, seg, dst + seg.offset as u64) }?;
                }
                io.h2d_bytes += total as u64;
                self.segs[slot] = segs;
                return Ok(());
            }
        };
        self.segs[slot].clear();
        let n = tiles.len();
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

    /// Decodes and normalises the raw window of tile `t`, the batch's `i`-th, in raw slot `slot`
    /// (read out of its box when the slot was filled from the mapped scene) into the float32
    /// planar window at device address `out`.
    fn preprocess(&self, slot: usize, i: usize, t: &TileRect, out: u64) -> Result<(), ResidentError> {
        let (wh, ww) = (self.grid.window_h(), self.grid.window_w());
        let dims = (wh, ww, self.bands);
        let seg = self.segs[slot].iter().find(|s| s.tiles.contains(&i));
        let (view, bytes) = match seg {
            Some(s) => {
                let n = s.bytes(self.bands, self.dtype.size());
                (self.d_raw[slot].slice(s.offset..s.offset + n), n)
            }
            None => {
                let wb = self.window_bytes;
                (self.d_raw[slot].slice(i * wb..(i + 1) * wb), wb)
            }
        };
        let lines = self.d_lines.slice(t.row * wh..(t.row + 1) * wh);
        let cols = self.d_cols.slice(t.col * ww..(t.col + 1) * ww);
        macro_rules! typed {
            ($t:ty) => {{
                // SAFETY: the window or box holds `bytes / size_of::<T>()` samples of type T (the
                // cube's data type), starting at a multiple of its size; any bit pattern is a
                // valid T.
                let raw = unsafe { view.transmute::<$t>(bytes / std::mem::size_of::<$t>()) }.ok_or_else(|| {
                    GpuError::Shape {
                        kernel: <$t as DeviceSample>::KERNEL,
                        message: format!("a window of {bytes} bytes is not whole samples"),
                    }
                })?;
                match seg {
                    // SAFETY: `out` is a float32 planar window of `dims` in device memory of this
                    // context (the bound input's unit `i`, or `d_window`), used by no other stream
                    // before this one is synchronised; the box holds the lines and samples of
                    // tile `t`'s window (`mapped::segments`), which `lines` and `cols` index.
                    Some(s) => unsafe {
                        self.k.preprocess_box_into(
                            &raw,
                            self.interleave,
                            self.swap,
                            &s.shape(self.bands, (wh, ww)),
                            &lines,
                            &cols,
                            &self.d_mean,
                            &self.d_inv,
                            out,
                        )
                    }?,
                    // SAFETY: as above; the raw window is exactly `dims`.
                    None => unsafe {
                        self.k.preprocess_into(
                            &raw,
                            self.interleave,
                            self.swap,
                            dims,
                            &self.d_mean,
                            &self.d_inv,
                            out,
                        )
                    }?,
                }
            }};
        }
        match self.dtype {
            DataType::I16 => typed!(i16),
            DataType::U16 => typed!(u16),
            _ => typed!(f32),
        }
        Ok(())
    }
}

/// Where a batch's raw windows come from.
enum Feed<'p, 'a> {
    /// Copied on the host into pinned buffers by the prefetch thread.
    Gathered(&'p prefetch::Prefetch<'a, PinnedHostSlice<u8>>),
    /// Copied by the device straight from the registered mapping.
    Mapped,
}

/// What a run writes as its batches finish.
pub(super) struct Out<'a> {
    pub stitch: Stitcher,
    pub stats: &'a mut RunStats,
    pub io: &'a mut DeviceIo,
    /// The session runs' own time.
    pub infer: Duration,
    /// When the run started.
    pub start: Instant,
    /// The device's marks of queued runs, for [`DeviceIo::timeline`].
    pub marks: Marks,
}

/// Events on the kernels' stream: one recorded on the idle stream at the run's start (with the
/// host's seconds since the start then), the first session run's start and the last one's end.
#[derive(Default)]
pub(super) struct Marks {
    pub origin: Option<(CudaEvent, f64)>,
    pub first: Option<CudaEvent>,
    pub last: Option<CudaEvent>,
}

impl Marks {
    /// Records a queued run's start and end events.
    pub fn ran(&mut self, start: CudaEvent, end: CudaEvent) {
        if self.first.is_none() {
            self.first = Some(start);
        }
        self.last = Some(end);
    }

    /// The timeline of a run that took `runs` in session runs and `total` seconds, or `None`
    /// without every mark (waiting runs) or when the device cannot say.
    fn timeline(&self, runs: Duration, total: f64) -> Option<Timeline> {
        let ((origin, at), first, last) = (self.origin.as_ref()?, self.first.as_ref()?, self.last.as_ref()?);
        let to_first = origin.elapsed_ms(first).ok()?;
        let to_last = origin.elapsed_ms(last).ok()?;
        Some(Timeline::from_marks(
            *at,
            f64::from(to_first) / 1e3,
            f64::from(to_last) / 1e3,
            runs.as_secs_f64(),
            total,
        ))
    }
}
