//! Which path a CUDA job's batches take (`--io`): the device-resident one of
//! [`crate::gpu::resident`] where the run allows it, else the host pipeline.

use super::JobError;
use crate::budget::{Adjustment, Cause};
use crate::cube::Cube;
use crate::engine::{Buckets, ComputeStream, EngineOptions, GpuOptions, Graph, IoPath, Provider, Runtime};
use crate::gpu::resident::{DeviceIo, Resident, ResidentError, StripSender, unsupported};
use crate::model::Manifest;
use crate::pipeline::{Adapt, BatchDone, Maps, RunOptions, RunStats};

/// The device path's buffers for this job, or `None` for the host path with why the device path
/// was not taken (`None` too where nothing was asked of it: `--io host`, or a CPU session under
/// `--io auto`). `--io device` where the run does not allow it is an error; under `--io auto`
/// the reason is printed and the host path runs.
pub(super) fn choose(
    cube: &Cube,
    manifest: &Manifest,
    graph: &mut Graph,
    run: &RunOptions,
    runtime: &Runtime,
) -> Result<(Option<Resident>, Option<String>), JobError> {
    let gpu = &runtime.options().gpu;
    let io = gpu.io;
    if io == IoPath::Host || (io == IoPath::Auto && runtime.provider() != Provider::Cuda) {
        return Ok((None, None));
    }
    let refused = |what: String| -> Result<(Option<Resident>, Option<String>), JobError> {
        if io == IoPath::Device {
            return Err(ResidentError::Unsupported { what }.into());
        }
        eprintln!("hsiedge: note: host I/O path: the device-resident path {what}");
        Ok((None, Some(what)))
    };
    if let Some(what) = unsupported(cube, manifest, runtime.provider(), run.keep_scores) {
        return refused(what);
    }
    match Resident::new(cube, manifest, graph, run, gpu.device_id, gpu.cuda_graph) {
        Ok(r) => Ok((Some(r), None)),
        Err(e) if io == IoPath::Auto => refused(format!("could not start: {e}")),
        Err(e) => Err(e.into()),
    }
}

/// The stream a CUDA session that may take the device path runs on: the device path's kernels'
/// stream, so its runs are queued between their preprocessing and argmax without the host
/// waiting. `None` where the device path is not asked for, with CUDA graphs (captured on the
/// provider's own stream), or where no stream can be made (then the session keeps its own, and
/// the device path, if it starts at all, waits for each run).
pub(super) fn provider_stream(engine: &EngineOptions) -> Option<ComputeStream> {
    let gpu = &engine.gpu;
    if engine.providers.first() != Provider::Cuda || gpu.io == IoPath::Host || gpu.cuda_graph {
        return None;
    }
    crate::gpu::compute_stream(gpu.device_id as usize).ok()
}

/// Runs the scene on the device path, each finished tile row to `strips`. A first batch the
/// provider's arena cannot hold (the plan's device line counted less than the provider asked
/// for, such as a convolution's workspace) does not end the run: the buffers and the session (`fresh` opens another, with an empty arena) are
/// released, the scene starts again at the next smaller bucket, and the cut is recorded in
/// `changes`, with a warning. Once a batch's labels have come back (and with them, perhaps, a
/// strip in `strips`), an error ends the run (the governor cuts batches between them).
#[allow(clippy::too_many_arguments)]
pub(super) fn run(
    slot: &mut Option<Resident>,
    cube: &Cube,
    manifest: &Manifest,
    graph: &mut Graph,
    fresh: &dyn Fn() -> Result<Graph, JobError>,
    run: &mut RunOptions,
    gpu: &GpuOptions,
    progress: &mut dyn FnMut(&BatchDone),
    mut adapt: Option<&mut dyn Adapt>,
    changes: &mut Vec<Adjustment>,
    strips: Option<StripSender>,
) -> Result<(Maps, RunStats, DeviceIo), JobError> {
    loop {
        let resident = slot.as_mut().ok_or(ResidentError::Unbound)?;
        let mut completed = 0usize;
        let mut counting = |d: &BatchDone| {
            completed += 1;
            progress(d);
        };
        let adapt_now = adapt.as_mut().map(|a| &mut **a as &mut dyn Adapt);
        let old = resident.bucket();
        match resident.run(cube, graph, &mut counting, adapt_now, strips.clone()) {
            Err(e) if completed == 0 && old > 1 && is_out_of_device_memory(&e) => {
                let new = Buckets::up_to(old).at_most(old - 1);
                eprintln!(
                    "hsiedge: warning: device path: a batch of {old} did not fit the CUDA arena ({e}); the scene starts again at {new}"
                );
                changes.push(Adjustment {
                    old: old as u64,
                    new: new as u64,
                    cause: Cause::DeviceOutOfMemory,
                    budget_bytes: gpu.mem_limit.unwrap_or(0),
                    needed_bytes: 0,
                    psi_some_avg10: None,
                });
                // A new session, not a shrunk arena: the failed batch's regions, partly reused
                // by a smaller one, would leave no room for its largest allocation (the 8 GiB
                // patch run failed again so at the next bucket, H100).
                *slot = None;
                *graph = fresh()?;
                graph.use_buckets(Buckets::up_to(new));
                run.batch = new;
                *slot = Some(Resident::new(
                    cube,
                    manifest,
                    graph,
                    run,
                    gpu.device_id,
                    gpu.cuda_graph,
                )?);
            }
            other => return other.map_err(JobError::from),
        }
    }
}

/// Whether `e` is a device allocation that failed for want of memory: ONNX Runtime reports its
/// arena's refusal and CUDA's out-of-memory only as text under a generic status code.
fn is_out_of_device_memory(e: &ResidentError) -> bool {
    let text = match e {
        ResidentError::Ort { message, .. } => message.as_str(),
        _ => return false,
    };
    [
        "Available memory of",
        "Failed to allocate memory",
        "out of memory",
        "CUDA_ERROR_OUT_OF_MEMORY",
    ]
    .iter()
    .any(|needle| text.contains(needle))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ort(message: &str) -> ResidentError {
        ResidentError::Ort {
            graph: "patch.onnx".into(),
            call: "RunWithBinding",
            message: message.into(),
        }
    }

    #[test]
    fn an_arena_or_cuda_out_of_memory_is_recognised_and_nothing_else() {
        // What ONNX Runtime 1.31.1 said when an 8 GiB arena could not hold a patch batch (H100).
        let arena = "Non-zero status code returned while running Conv node. Name:'/core/c2/Conv' Status Message: \
                     /onnxruntime_src/onnxruntime/core/framework/bfc_arena.cc:360 void* onnxruntime::BFCArena::AllocateRawInternal(size_t, bool, \
                     onnxruntime::Stream*) Available memory of 738012672 is smaller than requested bytes of 1881617152";
        assert!(is_out_of_device_memory(&ort(arena)));
        assert!(is_out_of_device_memory(&ort("CUDA failure 2: out of memory ; GPU=0")));
        assert!(!is_out_of_device_memory(&ort("Got invalid dimensions for input")));
        assert!(!is_out_of_device_memory(&ResidentError::Prefetch));
    }
}
