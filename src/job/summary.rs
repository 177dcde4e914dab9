//! What a job reports: `summary.json` and `--json`.

use std::path::PathBuf;

use super::{Accuracy, AutoBatch};
use crate::budget::Adjustment;
use crate::model::Task;
use crate::pipeline::Mode;

/// What a job did, as written to `summary.json` and printed by `--json`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Summary {
    /// The output set's run id, also in each map header (`hsiedge run id`) and the quick-look.
    pub run_id: String,
    /// Scene header.
    pub scene: PathBuf,
    /// Model name.
    pub model: String,
    /// Task.
    pub task: Task,
    /// Mode used.
    pub mode: Mode,
    /// Batch used (patches or tiles).
    pub batch: usize,
    /// Tile shape (lines, samples).
    pub tile: (usize, usize),
    /// Tiles in the grid.
    pub tiles: usize,
    /// Batches run.
    pub batches: usize,
    /// Pixels written.
    pub pixels: usize,
    /// Pipeline wall time (read, tile, infer, stitch).
    pub elapsed_s: f64,
    /// `pixels / elapsed_s`.
    pub pixels_per_s: f64,
    /// Time inside the engine.
    pub inference_s: f64,
    /// Time the engine waited for input.
    pub wait_s: f64,
    /// Time to the first batch's result.
    pub first_batch_s: f64,
    /// Time to open scene and model and build the session.
    pub load_s: f64,
    /// Time to write the maps.
    pub write_s: f64,
    /// Execution provider.
    pub provider: String,
    /// Providers preferred over `provider` that did not register, with why (empty: the first
    /// choice ran).
    pub provider_fallbacks: Vec<crate::engine::Fallback>,
    /// The model files' precision.
    pub precision: crate::engine::Precision,
    /// The ONNX Runtime library used.
    pub ort_library: PathBuf,
    /// Intra-op threads (0 = ONNX Runtime default).
    pub threads: usize,
    /// Peak resident set of the process (includes the mapped scene's file pages).
    pub peak_rss_bytes: u64,
    /// Peak anonymous memory during inference, sampled every 2 ms: what the memory plan predicts.
    pub peak_anon_bytes: u64,
    /// Class map path.
    pub class_map: Option<PathBuf>,
    /// Confidence map path.
    pub confidence_map: Option<PathBuf>,
    /// Abundance/score map path.
    pub scores_map: Option<PathBuf>,
    /// Quick-look path.
    pub quicklook: PathBuf,
    /// Pixels whose model output was not finite (see [`crate::pipeline::Maps::nonfinite_pixels`]).
    pub nonfinite_pixels: usize,
    /// Accuracy against `--labels`.
    pub accuracy: Option<Accuracy>,
    /// How `--batch auto` chose the batch.
    pub batch_plan: Option<AutoBatch>,
    /// Batch changes made while running, with their causes.
    pub batch_changes: Vec<Adjustment>,
    /// Where batches were prepared and reduced: `host` or `device` (`--io`).
    pub io: &'static str,
    /// Why a CUDA run under `--io auto` took the host path.
    pub io_fallback: Option<String>,
    /// What the device-resident path moved and where its time went.
    pub device_io: Option<crate::gpu::resident::DeviceIo>,
    /// Device memory in use at the run's peak, sampled every millisecond (`cuMemGetInfo`: the
    /// whole device), on a GPU provider: what `batch_plan.device.predicted_peak_bytes` predicts.
    pub device_peak_bytes: Option<u64>,
}
