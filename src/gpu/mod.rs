//! The GPU, through the CUDA driver API and NVRTC loaded at run time (`cudarc` with dynamic
//! loading), so CPU-only builds and machines run unchanged: [`probe`] answers `None` where no
//! driver library exists.
//!
//! * [`probe`]: name, compute capability, SM count, memory, integrated or discrete; it feeds the
//!   budget (free device memory on a discrete GPU; on a Jetson the Tegra estimate of
//!   [`crate::budget::system`] applies instead, `cudaMemGetInfo` does not see reclaimable memory).
//! * [`kernels`]: `kernels/*.cu`, compiled once with NVRTC: raw tile to normalised planar float32,
//!   argmax and confidence on the device.
//! * [`reference`](mod@reference): the CPU definition of each kernel; [`check`] runs the kernels on fresh random
//!   inputs into poisoned outputs and compares them with it.
//!
//! The crate's `unsafe` outside `ffi` lives here, each block with its `// SAFETY:` argument.

use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::CudaStream;
use serde::Serialize;

use crate::engine::ComputeStream;

pub mod check;
pub mod kernels;
pub mod memory;
pub mod reference;
pub mod resident;

/// Errors of the GPU path; each names the call or kernel that failed.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// No CUDA driver library (`libcuda.so`) could be loaded.
    #[error("no CUDA driver library (libcuda.so.1) on the loader's path: no NVIDIA GPU can be used")]
    NoDriver,
    /// No NVRTC library could be loaded.
    #[error("no NVRTC library (libnvrtc.so) on the loader's path: the CUDA kernels cannot be compiled")]
    NoNvrtc,
    /// A driver call failed.
    #[error("CUDA {call}: {source}")]
    Driver {
        /// What was being done.
        call: &'static str,
        /// The driver's error.
        #[source]
        source: cudarc::driver::DriverError,
    },
    /// A kernel source did not compile.
    #[error("NVRTC could not compile {kernel}: {message}")]
    Compile {
        /// The `.cu` file.
        kernel: &'static str,
        /// NVRTC's log.
        message: String,
    },
    /// Arguments that do not describe the buffers given.
    #[error("{kernel}: {message}")]
    Shape {
        /// The kernel.
        kernel: &'static str,
        /// What does not fit.
        message: String,
    },
}

/// `f`'s driver error as [`GpuError::Driver`] for `call`.
pub(crate) fn driver(call: &'static str) -> impl Fn(cudarc::driver::DriverError) -> GpuError {
    move |source| GpuError::Driver { call, source }
}

/// What the device reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeviceInfo {
    /// CUDA ordinal.
    pub ordinal: usize,
    /// Marketing name, e.g. `NVIDIA H200` or `Orin (nvgpu)`.
    pub name: String,
    /// Compute capability (major, minor).
    pub compute_capability: (i32, i32),
    /// Streaming multiprocessors.
    pub sm_count: i32,
    /// Device memory, bytes.
    pub total_bytes: u64,
    /// Free device memory now (`cuMemGetInfo`), bytes. On an integrated GPU (Jetson) this misses
    /// swap and reclaimable memory: the budget uses its Tegra estimate there instead.
    pub free_bytes: u64,
    /// The GPU shares the host's memory (Jetson).
    pub integrated: bool,
}

impl DeviceInfo {
    /// The device memory the budget may plan with: the free memory of a discrete GPU; `None` on
    /// an integrated one, whose memory the host-side budget already counts.
    pub fn budget_bytes(&self) -> Option<u64> {
        (!self.integrated).then_some(self.free_bytes)
    }
}

/// Whether the CUDA driver library can be loaded.
pub fn driver_present() -> bool {
    // SAFETY: `is_culib_present` only tries to open the library with libloading (no CUDA call is
    // made); a library that is not there gives `false`.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// Whether the NVRTC library can be loaded.
pub fn nvrtc_present() -> bool {
    // SAFETY: as in `driver_present`, only a dlopen attempt.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// The device at `ordinal`: `Ok(None)` when there is no driver library or no device.
pub fn probe(ordinal: usize) -> Result<Option<DeviceInfo>, GpuError> {
    if !driver_present() {
        return Ok(None);
    }
    let count = cudarc::driver::CudaContext::device_count().map_err(driver("cuDeviceGetCount"))?;
    if usize::try_from(count).map_or(true, |c| ordinal >= c) {
        return Ok(None);
    }
    let ctx = cudarc::driver::CudaContext::new(ordinal).map_err(driver("cuDevicePrimaryCtxRetain"))?;
    info(&ctx, ordinal).map(Some)
}

/// [`DeviceInfo`] of the context's device.
pub fn info(ctx: &cudarc::driver::CudaContext, ordinal: usize) -> Result<DeviceInfo, GpuError> {
    use cudarc::driver::sys::CUdevice_attribute as A;
    let (free, total) = ctx.mem_get_info().map_err(driver("cuMemGetInfo"))?;
    Ok(DeviceInfo {
        ordinal,
        name: ctx.name().map_err(driver("cuDeviceGetName"))?,
        compute_capability: ctx.compute_capability().map_err(driver("cuDeviceGetAttribute"))?,
        sm_count: ctx
            .attribute(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(driver("cuDeviceGetAttribute"))?,
        total_bytes: total as u64,
        free_bytes: free as u64,
        integrated: ctx
            .attribute(A::CU_DEVICE_ATTRIBUTE_INTEGRATED)
            .map_err(driver("cuDeviceGetAttribute"))?
            != 0,
    })
}

/// The stream the device path's kernels and its ONNX Runtime sessions share on device
/// `ordinal`: made on first use in the device's primary context and kept for the life of the
/// process, since a session holds its raw handle ([`ComputeStream`]).
pub fn session_stream(ordinal: usize) -> Result<Arc<CudaStream>, GpuError> {
    type ByDevice = Vec<(usize, Arc<CudaStream>)>;
    static STREAMS: OnceLock<Mutex<ByDevice>> = OnceLock::new();
    if !driver_present() {
        return Err(GpuError::NoDriver);
    }
    // A panic elsewhere while holding the list leaves it whole: every entry is pushed complete.
    let mut streams = STREAMS
        .get_or_init(|| Mutex::new(Vec::new()))
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some((_, s)) = streams.iter().find(|(o, _)| *o == ordinal) {
        return Ok(s.clone());
    }
    let ctx = cudarc::driver::CudaContext::new(ordinal).map_err(driver("cuDevicePrimaryCtxRetain"))?;
    let s = ctx.new_stream().map_err(driver("cuStreamCreate"))?;
    streams.push((ordinal, s.clone()));
    Ok(s)
}

/// [`session_stream`]'s handle, for the CUDA provider's `user_compute_stream`.
pub fn compute_stream(ordinal: usize) -> Result<ComputeStream, GpuError> {
    let s = session_stream(ordinal)?;
    Ok(ComputeStream::of(&s))
}

impl ComputeStream {
    /// The handle of `stream`.
    pub(crate) fn of(stream: &CudaStream) -> Self {
        Self(stream.cu_stream() as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_integrated_gpu_leaves_the_budget_to_the_host_estimate() {
        let mut d = DeviceInfo {
            ordinal: 0,
            name: "Orin (nvgpu)".into(),
            compute_capability: (8, 7),
            sm_count: 8,
            total_bytes: 8 << 30,
            free_bytes: 3 << 30,
            integrated: true,
        };
        assert_eq!(d.budget_bytes(), None);
        d.integrated = false;
        assert_eq!(d.budget_bytes(), Some(3 << 30));
    }

    #[test]
    fn probe_answers_without_a_gpu() {
        match probe(0) {
            Ok(None) => eprintln!("skipped: no CUDA driver or device here (probe gave None)"),
            Ok(Some(d)) => {
                assert!(d.sm_count > 0 && d.total_bytes >= d.free_bytes, "{d:?}");
                assert!(d.compute_capability.0 >= 5, "{d:?}");
            }
            Err(e) => panic!("probe failed: {e}"),
        }
    }
}
