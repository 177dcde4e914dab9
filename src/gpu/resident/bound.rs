//! The session's input and output bound on the device at one batch size, and the sizes a run may
//! take: the engine's [`Buckets`] up to the planned batch (powers of two and the batch itself, the
//! shapes the host path and the TensorRT profiles use), so a batch the governor cuts still runs at
//! one of a few fixed shapes (a partial batch is padded to its size).

use std::time::{Duration, Instant};

use cudarc::driver::CudaStream;
use ort::memory::Allocator;
use ort::session::IoBinding;
use ort::value::Tensor;

use super::{ResidentError, ort_error};
use crate::engine::{Buckets, Graph};
use crate::gpu::driver;

/// The size a run planned at `bucket` units a batch takes when the governor asks for `target`:
/// the largest of [`Buckets::up_to`]`(bucket)` at or below it (at least 1).
pub fn size_for(bucket: usize, target: usize) -> usize {
    Buckets::up_to(bucket).at_most(target)
}

/// Input and output tensors of `units` units allocated by the CUDA provider's allocator and bound
/// to the session.
pub struct Bound {
    /// Units (tiles or patches) of this shape.
    pub units: usize,
    // Declared before the tensors it binds, so it is released first.
    binding: IoBinding,
    input: Tensor<f32>,
    output: Tensor<f32>,
}

impl Bound {
    /// Allocates and binds `units` units: `in_unit` / `out_unit` are one unit's shape after the
    /// batch dimension. The input is zeroed on `stream` (the kernels' stream, which writes it
    /// next), so padded units of a partial batch are defined; the stream is synchronised.
    pub fn new(
        graph: &mut Graph,
        allocator: &Allocator,
        units: usize,
        in_unit: &[usize],
        out_unit: &[usize],
        stream: &CudaStream,
    ) -> Result<Self, ResidentError> {
        let path = graph.path().to_path_buf();
        let ort = |call| ort_error(&path, call);
        let shape = |unit: &[usize]| std::iter::once(units).chain(unit.iter().copied()).collect::<Vec<_>>();
        let mut input = Tensor::<f32>::new(allocator, shape(in_unit)).map_err(ort("allocating the input"))?;
        let mut output = Tensor::<f32>::new(allocator, shape(out_unit)).map_err(ort("allocating the output"))?;
        let in_floats: usize = shape(in_unit).iter().product();
        let in_ptr = input.data_ptr_mut() as u64;
        stream.context().bind_to_thread().map_err(driver("cuCtxSetCurrent"))?;
        // SAFETY: `in_ptr` is the input tensor's device allocation of `in_floats` float32 values
        // in this device's primary context (the CUDA provider's allocator), the context of
        // `stream`; the memset has finished before the tensor can be released (synchronised
        // below, also when it failed).
        let zeroed = unsafe { cudarc::driver::result::memset_d8_async(in_ptr, 0, in_floats * 4, stream.cu_stream()) }
            .map_err(driver("cuMemsetD8Async"));
        // Binding is rare (the start, a governor's cut): waiting here keeps every error return
        // below free of queued work on the tensor.
        let synced = stream.synchronize().map_err(driver("cuStreamSynchronize"));
        zeroed?;
        synced?;
        let (input_name, output_name) = (graph.input().name.clone(), graph.output().name.clone());
        let mut binding = graph.session_mut().create_binding().map_err(ort("CreateIoBinding"))?;
        binding.bind_input(input_name, &input).map_err(ort("BindInput"))?;
        binding
            .bind_output(output_name, &mut output)
            .map_err(ort("BindOutput"))?;
        Ok(Self {
            units,
            binding,
            input,
            output,
        })
    }

    /// The bound input's device address.
    pub fn input_ptr(&mut self) -> u64 {
        self.input.data_ptr_mut() as u64
    }

    /// The bound output's device address.
    pub fn output_ptr(&self) -> u64 {
        self.output.data_ptr() as u64
    }

    /// Runs the session on the bound buffers; returns the time the call took. ONNX Runtime
    /// synchronises its stream before a run returns, except when it replays a captured CUDA
    /// graph (`cuda_graph`): then the outputs are synchronised too, inside the time, which then
    /// also waits for whatever else the device is doing (the next batch's upload); or when
    /// `queued` and the session runs on the kernels' stream: then the call returns once the
    /// run is queued on it.
    pub fn run(&self, graph: &mut Graph, cuda_graph: bool, queued: bool) -> Result<Duration, ResidentError> {
        let path = graph.path().to_path_buf();
        let fail = |call| ort_error(&path, call);
        let t0 = Instant::now();
        graph
            .run_binding(&self.binding, !queued)
            .map_err(fail("RunWithBinding"))?;
        // A replayed CUDA graph may still be running on the provider's own stream when the run
        // returns: the output is read only once the provider has synchronised it. Otherwise
        // this would wait for the whole device (the copy stream's upload too).
        if cuda_graph {
            self.binding
                .synchronize_outputs()
                .map_err(fail("SynchronizeBoundOutputs"))?;
        }
        Ok(t0.elapsed())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cut_batch_runs_at_one_of_the_engine_buckets() {
        assert_eq!(size_for(16, 16), 16);
        assert_eq!(size_for(16, 100), 16);
        assert_eq!(size_for(16, 9), 8);
        assert_eq!(size_for(12, 12), 12);
        assert_eq!(size_for(12, 11), 8);
        assert_eq!(size_for(12, 5), 4);
        assert_eq!(size_for(12, 0), 1);
        assert_eq!(size_for(0, 3), 1);
    }
}
