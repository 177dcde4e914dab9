//! Device memory in use, sampled: what a GPU provider's session holds on the device is outside
//! the process's RSS, so the budget's calibration and a run's summary read it from the driver
//! (`cuMemGetInfo`: every allocation on the device, this process's context, arena and workspaces
//! included).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use cudarc::driver::CudaContext;

use super::{GpuError, driver};

/// How often [`PeakSampler`] reads the device's free memory.
pub const SAMPLE_PERIOD: Duration = Duration::from_millis(1);

/// Device memory in use now (total less free), bytes.
pub fn used_bytes(ctx: &CudaContext) -> Result<u64, GpuError> {
    let (free, total) = ctx.mem_get_info().map_err(driver("cuMemGetInfo"))?;
    Ok(total.saturating_sub(free) as u64)
}

/// A thread reading the device memory in use every [`SAMPLE_PERIOD`] until stopped; the highest
/// reading is the peak of what ran meanwhile (an arena's growth and its release by shrinkage
/// both happen inside a run, so a reading after it would miss the peak).
pub struct PeakSampler {
    stop: Arc<AtomicBool>,
    peak: Arc<AtomicU64>,
    start: u64,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for PeakSampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeakSampler")
            .field("start", &self.start)
            .finish_non_exhaustive()
    }
}

impl PeakSampler {
    /// Starts sampling device `ordinal`: `Ok(None)` where there is no CUDA driver or no such device.
    pub fn start(ordinal: usize) -> Result<Option<Self>, GpuError> {
        if super::probe(ordinal)?.is_none() {
            return Ok(None);
        }
        let ctx = CudaContext::new(ordinal).map_err(driver("cuDevicePrimaryCtxRetain"))?;
        let start = used_bytes(&ctx)?;
        let stop = Arc::new(AtomicBool::new(false));
        let peak = Arc::new(AtomicU64::new(start));
        let (s, p) = (stop.clone(), peak.clone());
        let thread = std::thread::Builder::new()
            .name("device-memory".into())
            .spawn(move || {
                while !s.load(Ordering::Relaxed) {
                    if let Ok(u) = used_bytes(&ctx) {
                        p.fetch_max(u, Ordering::Relaxed);
                    }
                    std::thread::sleep(SAMPLE_PERIOD);
                }
                if let Ok(u) = used_bytes(&ctx) {
                    p.fetch_max(u, Ordering::Relaxed);
                }
            })
            .ok();
        Ok(Some(Self {
            stop,
            peak,
            start,
            thread,
        }))
    }

    /// Stops sampling: what the highest reading added to the first, bytes.
    pub fn stop_added(self) -> u64 {
        let start = self.start;
        self.stop().saturating_sub(start)
    }

    /// Stops sampling: the highest reading (at least the first), bytes.
    pub fn stop(mut self) -> u64 {
        self.finish()
    }

    fn finish(&mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.peak.load(Ordering::Relaxed)
    }
}

impl Drop for PeakSampler {
    fn drop(&mut self) {
        self.finish();
    }
}
