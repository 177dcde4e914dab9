//! Which path a CUDA job's batches take (`--io`): the device-resident one of
//! [`crate::gpu::resident`] where the run allows it, else the host pipeline.

use super::JobError;
use crate::cube::Cube;
use crate::engine::{Graph, IoPath, Provider, Runtime};
use crate::gpu::resident::{Resident, ResidentError, unsupported};
use crate::model::Manifest;
use crate::pipeline::RunOptions;

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
    if let Some(what) = unsupported(cube, manifest, runtime.provider()) {
        return refused(what);
    }
    match Resident::new(cube, manifest, graph, run, gpu.device_id, gpu.cuda_graph) {
        Ok(r) => Ok((Some(r), None)),
        Err(e) if io == IoPath::Auto => refused(format!("could not start: {e}")),
        Err(e) => Err(e.into()),
    }
}
