//! A session over one graph: runs a batch (padded to its bucket on a GPU provider) and hands back
//! the output rows.

use std::path::{Path, PathBuf};

use ort::session::Session;
use ort::value::TensorRef;

use super::{Arena, Buckets, ComputeStream, EngineError, Provider};
use crate::model::{self, Manifest, TensorSig};

/// A session over one graph with one float32 input and one float32 output.
pub struct Graph {
    pub(super) session: Session,
    pub(super) path: PathBuf,
    pub(super) input: TensorSig,
    pub(super) output: TensorSig,
    pub(super) shrink_next: bool,
    pub(super) shrink_options: ort::session::RunOptions,
    /// Options of a plain run when the session captures CUDA graphs: such a run (the halo
    /// check, calibration probes, the host path) has its buffers placed anew each time, so it
    /// must neither capture the graph the bound runs replay nor replay it (`gpu_graph_id` -1).
    pub(super) uncaptured: Option<ort::session::RunOptions>,
    /// Options of a bound run that returns once its work is queued: only on a session given
    /// a compute stream, whose caller orders its own work on that stream.
    pub(super) unsynced: Option<ort::session::RunOptions>,
    pub(super) compute_stream: Option<ComputeStream>,
    pub(super) arena: Arena,
    pub(super) buckets: Option<Buckets>,
    pub(super) provider: Provider,
    /// The CUDA device and the arena bound the session was built with (a GPU provider's).
    pub(super) device: Option<(u32, Option<u64>)>,
}

impl std::fmt::Debug for Graph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Graph")
            .field("path", &self.path)
            .field("input", &self.input)
            .field("output", &self.output)
            .field("shrink_next", &self.shrink_next)
            .finish_non_exhaustive()
    }
}

impl Graph {
    /// The ONNX file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The input tensor's signature.
    pub fn input(&self) -> &TensorSig {
        &self.input
    }

    /// The output tensor's signature.
    pub fn output(&self) -> &TensorSig {
        &self.output
    }

    /// The CUDA device ordinal and the provider's arena bound (`gpu_mem_limit`), on a GPU provider.
    pub fn device(&self) -> Option<(u32, Option<u64>)> {
        self.device
    }

    /// The ONNX Runtime session, for binding device buffers to it (`gpu::resident`).
    pub(crate) fn session_mut(&mut self) -> &mut Session {
        &mut self.session
    }

    /// The provider the session runs on.
    pub fn provider(&self) -> Provider {
        self.provider
    }

    /// Runs every later batch at one of `buckets`' sizes, padding a smaller batch with zeros (its
    /// extra outputs dropped), so the provider never meets a new batch shape mid-run. A batch
    /// above the largest bucket runs as it is.
    pub fn use_buckets(&mut self, buckets: Buckets) {
        self.buckets = Some(buckets);
    }

    /// Has the arenas (the CPU one, and a GPU provider's) give their unused regions back at the
    /// end of the next run.
    ///
    /// An arena keeps what the largest run needed; when the batch shrinks because memory got
    /// scarce, that surplus has to leave the process, not just sit free inside it.
    /// Without an arena there is nothing to give back and this does nothing.
    pub fn shrink_arena_after_next_run(&mut self) {
        self.shrink_next = self.arena != Arena::Off || self.provider.on_gpu();
    }

    /// The stream the CUDA provider runs on, when the session was given one.
    pub fn compute_stream(&self) -> Option<ComputeStream> {
        self.compute_stream
    }

    /// Runs the session on `binding`'s device buffers (the device-resident path), giving the
    /// arena's unused regions back at its end when [`Graph::shrink_arena_after_next_run`] asked.
    ///
    /// With `wait` false, on a session given a [compute stream](Graph::compute_stream), the run
    /// returns once its work is queued on that stream: what reads its output must be queued on
    /// the same stream. A run that gives arena regions back always waits, so they are idle.
    pub fn run_binding(&mut self, binding: &ort::session::IoBinding, wait: bool) -> Result<(), ort::Error> {
        let outputs = if std::mem::take(&mut self.shrink_next) {
            self.session.run_binding_with_options(binding, &self.shrink_options)
        } else if let (false, Some(options)) = (wait, &self.unsynced) {
            self.session.run_binding_with_options(binding, options)
        } else {
            self.session.run_binding(binding)
        }?;
        drop(outputs);
        Ok(())
    }

    /// Runs a dense twin once over a window of `2 * halo + 2` pixels a side, which must give the
    /// 2 x 2 centre: a twin that trims another halo than the manifest's would otherwise fail (or
    /// shift every tile) only once a run is under way.
    pub(super) fn check_halo(&mut self, manifest: &Manifest) -> Result<(), EngineError> {
        let side = 2 * manifest.halo + 2;
        let shape = manifest.input.layout.shape(1, manifest.input.bands, side, side);
        let zeros = vec![0f32; shape.iter().product()];
        let (got, _) = self.run(&zeros, &shape)?;
        let want = [1, manifest.classes(), 2, 2];
        if got != want {
            return Err(model::ModelError::Mismatch {
                onnx: self.path.clone(),
                tensor: self.output.name.clone(),
                detail: format!(
                    "is {} for a {side} x {side} window",
                    got.iter().map(ToString::to_string).collect::<Vec<_>>().join(" x ")
                ),
                manifest: manifest.path.clone(),
                field: "halo".into(),
                expected: format!(
                    "says {}, so the twin must give 1 x {} x 2 x 2 ({side} - 2 x {})",
                    manifest.halo,
                    manifest.classes(),
                    manifest.halo
                ),
            }
            .into());
        }
        Ok(())
    }

    /// Runs the graph on `data` of `shape`, returning the output's shape and values. With
    /// buckets ([`Graph::use_buckets`]) a batch is padded to its bucket and the output cut back to
    /// `shape[0]` rows.
    pub fn run(&mut self, data: &[f32], shape: &[usize]) -> Result<(Vec<usize>, Vec<f32>), EngineError> {
        let n = shape.first().copied().unwrap_or(0);
        let bucket = self
            .buckets
            .as_ref()
            .and_then(|b| b.bucket_for(n))
            .filter(|&b| b > n && n > 0);
        let Some(bucket) = bucket else {
            return self.run_exact(data, shape);
        };
        let mut padded_shape = shape.to_vec();
        padded_shape[0] = bucket;
        let mut padded = Vec::with_capacity(data.len() / n * bucket);
        padded.extend_from_slice(data);
        padded.resize(data.len() / n * bucket, 0.0);
        let (mut dims, mut values) = self.run_exact(&padded, &padded_shape)?;
        if let Some(rows) = dims.first_mut() {
            let per_row = values.len() / bucket;
            values.truncate(per_row * n);
            *rows = n;
        }
        Ok((dims, values))
    }

    fn run_exact(&mut self, data: &[f32], shape: &[usize]) -> Result<(Vec<usize>, Vec<f32>), EngineError> {
        let fail = |message: String| EngineError::Run {
            path: self.path.clone(),
            shape: shape.to_vec(),
            message,
        };
        let tensor = TensorRef::from_array_view((shape.to_vec(), data)).map_err(|e| fail(e.to_string()))?;
        let inputs = ort::inputs![self.input.name.as_str() => tensor];
        let outputs = if std::mem::take(&mut self.shrink_next) {
            self.session.run_with_options(inputs, &self.shrink_options)
        } else if let Some(options) = &self.uncaptured {
            self.session.run_with_options(inputs, options)
        } else {
            self.session.run(inputs)
        }
        .map_err(|e| fail(e.to_string()))?;
        let (out_shape, values) = outputs[0]
            .try_extract_tensor::<f32>()
            .map_err(|e| fail(e.to_string()))?;
        let dims = out_shape.iter().map(|d| usize::try_from(*d).unwrap_or(0)).collect();
        Ok((dims, values.to_vec()))
    }
}
