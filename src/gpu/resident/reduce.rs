//! Session runs and their reductions, one in flight: run r's argmax and copy back are queued
//! behind it, and the host waits for run r - 1's labels only after queuing run r, so the device
//! always has the next run while the host stitches the last.

use std::time::{Duration, Instant};

use cudarc::driver::CudaEvent;
use cudarc::driver::sys::CUevent_flags;

use super::run::Out;
use super::stitch::{Place, Stitch};
use super::{Resident, ResidentError};
use crate::engine::Graph;
use crate::gpu::driver;
use crate::pipeline::BatchDone;

/// A session run whose labels are on their way back.
pub(super) struct Reduction {
    /// The label buffers (device and pinned host) it uses.
    slot: usize,
    units: usize,
    pixels: usize,
    place: Place,
    time: RunTime,
}

/// How long a run took.
enum RunTime {
    /// Timed on the host around a run that returned when it had finished.
    Host(Duration),
    /// Events recorded on the stream before and after a queued run: its time on the device.
    Device(CudaEvent, CudaEvent),
}

impl Resident {
    /// Runs the session on the bound buffers (the first `n` units hold `pixels` output pixels
    /// that go to `place`), and queues the argmax of its output and the copy of labels and
    /// confidence into pinned memory behind it; then finishes the run before it.
    ///
    /// On the kernels' stream the run is only queued (`queued`): the stream orders it after the
    /// preprocessing and before the argmax. Otherwise the session runs on a stream of its own
    /// and returns when done, so the kernels' stream is synchronised before it.
    pub(super) fn infer_and_reduce(
        &mut self,
        graph: &mut Graph,
        n: usize,
        pixels: usize,
        place: Place,
        out: &mut Out<'_>,
        progress: &mut dyn FnMut(&BatchDone),
    ) -> Result<(), ResidentError> {
        let s = self.k.stream().clone();
        let bound = self.bound.as_ref().ok_or(ResidentError::Unbound)?;
        let time = if self.queued {
            let timed = Some(CUevent_flags::CU_EVENT_DEFAULT);
            let t0 = s.record_event(timed).map_err(driver("cuEventRecord"))?;
            bound.run(graph, self.cuda_graph, true)?;
            RunTime::Device(t0, s.record_event(timed).map_err(driver("cuEventRecord"))?)
        } else {
            s.synchronize().map_err(driver("cuStreamSynchronize"))?;
            RunTime::Host(bound.run(graph, self.cuda_graph, false)?)
        };
        let (units, out_ptr) = (bound.units, bound.output_ptr());
        out.io.host_path_h2d_bytes += (units * self.in_per_unit * 4) as u64;
        let m = n * self.pixels_per_unit;
        let slot = self.reductions % 2;
        self.reductions += 1;
        // SAFETY: the bound output holds units x classes x pixels_per_unit floats (n <= units),
        // written by the run queued above on this stream (or finished, when not queued).
        unsafe {
            self.k.argmax_from(
                out_ptr,
                (n, self.classes, self.pixels_per_unit),
                self.logits,
                &mut self.cls[slot],
                &mut self.conf[slot],
            )
        }?;
        s.memcpy_dtoh(&self.cls[slot].slice(0..m), &mut self.h_cls[slot])
            .map_err(driver("cuMemcpyDtoHAsync"))?;
        s.memcpy_dtoh(&self.conf[slot].slice(0..m), &mut self.h_conf[slot])
            .map_err(driver("cuMemcpyDtoHAsync"))?;
        out.io.d2h_bytes += (m * 8) as u64;
        self.pending.push_back(Reduction {
            slot,
            units: n,
            pixels,
            place,
            time,
        });
        while self.pending.len() > 1 {
            self.finish_oldest(out, progress)?;
        }
        Ok(())
    }

    /// Finishes every run in flight (before a re-bind, and at the end of the scene).
    pub(super) fn drain(
        &mut self,
        out: &mut Out<'_>,
        progress: &mut dyn FnMut(&BatchDone),
    ) -> Result<(), ResidentError> {
        while !self.pending.is_empty() {
            self.finish_oldest(out, progress)?;
        }
        Ok(())
    }

    /// Waits for the oldest run's labels, hands them to the stitcher with where they go, and
    /// records the batch.
    fn finish_oldest(&mut self, out: &mut Out<'_>, progress: &mut dyn FnMut(&BatchDone)) -> Result<(), ResidentError> {
        let Some(r) = self.pending.pop_front() else {
            return Ok(());
        };
        let m = r.units * self.pixels_per_unit;
        // Waits for the copy into the pinned buffers.
        let cls = self.h_cls[r.slot].as_slice().map_err(driver("cuEventSynchronize"))?;
        let conf = self.h_conf[r.slot].as_slice().map_err(driver("cuEventSynchronize"))?;
        let (mut c, mut f) = out.stitch.back.recv().map_err(|_| ResidentError::Stitcher)?;
        c[..m].copy_from_slice(&cls[..m]);
        f[..m].copy_from_slice(&conf[..m]);
        out.stitch
            .jobs
            .send(Stitch {
                cls: c,
                conf: f,
                place: r.place,
            })
            .map_err(|_| ResidentError::Stitcher)?;
        let ran = match r.time {
            RunTime::Host(d) => d,
            RunTime::Device(a, b) => {
                let ms = a.elapsed_ms(&b).map_err(driver("cuEventElapsedTime"))?;
                out.marks.ran(a, b);
                Duration::from_secs_f64(f64::from(ms) / 1e3)
            }
        };
        out.infer += ran;
        let stats = &mut *out.stats;
        if stats.batches == 0 {
            stats.first_batch_s = out.start.elapsed().as_secs_f64();
        }
        stats.batches += 1;
        stats.pixels += r.pixels;
        progress(&BatchDone {
            batches: stats.batches,
            pixels_done: stats.pixels,
            units: r.units,
            pixels: r.pixels,
            infer_s: ran.as_secs_f64(),
            wait_s: 0.0,
            queued: 0,
            batch: self.bound.as_ref().map_or(self.bucket, |b| b.units),
        });
        Ok(())
    }

    /// Pure inference: `runs` session runs on the bound buffers back to back, nothing else
    /// queued between them, timed on the host from an idle stream to the last run's end.
    pub fn pure_inference(&mut self, graph: &mut Graph, runs: usize) -> Result<Duration, ResidentError> {
        let s = self.k.stream().clone();
        s.synchronize().map_err(driver("cuStreamSynchronize"))?;
        let bound = self.bound.as_ref().ok_or(ResidentError::Unbound)?;
        let t0 = Instant::now();
        let ran = (0..runs).try_for_each(|_| bound.run(graph, self.cuda_graph, self.queued).map(drop));
        // Waited for on an error too: nothing queued outlives the call.
        let synced = s.synchronize().map_err(driver("cuStreamSynchronize"));
        ran?;
        synced?;
        Ok(t0.elapsed())
    }
}
