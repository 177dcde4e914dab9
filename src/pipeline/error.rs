//! What can fail in a pipeline run.

use crate::engine::EngineError;

/// Errors from a pipeline run.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    /// The cube's bands do not match the model.
    #[error("{cube}: {bands} bands, but {manifest} field `input.bands` says {expected}")]
    Bands {
        /// The cube's header.
        cube: std::path::PathBuf,
        /// Bands in the cube.
        bands: usize,
        /// The manifest.
        manifest: std::path::PathBuf,
        /// Bands the model expects.
        expected: usize,
    },
    /// Dense mode was asked for a model without a dense twin.
    #[error("{manifest}: dense mode needs `files.dense`, which this manifest does not have (use --mode patch)")]
    NoDense {
        /// The manifest.
        manifest: std::path::PathBuf,
    },
    /// A setting is out of range.
    #[error("invalid setting `{name}`: {message}")]
    Setting {
        /// The setting.
        name: &'static str,
        /// Why.
        message: String,
    },
    /// The engine failed on a batch.
    #[error("batch {batch} (from tile row, col {first_tile:?})")]
    Engine {
        /// Batch index.
        batch: usize,
        /// The first tile in it.
        first_tile: (usize, usize),
        /// The engine error.
        source: EngineError,
    },
    /// The graph returned a shape the pipeline cannot stitch.
    #[error("{graph}: output shape {got:?} for input {input:?}, expected {expected}")]
    OutputShape {
        /// The ONNX file.
        graph: std::path::PathBuf,
        /// What came back.
        got: Vec<usize>,
        /// The input shape sent.
        input: Vec<usize>,
        /// What was expected.
        expected: String,
    },
    /// The line source failed.
    #[error(transparent)]
    Source(#[from] crate::source::SourceError),
    /// A stream ended after another line count than its scene header announced.
    #[error("scene `{scene}`: the header announced {announced} lines, the stream ended after {got}")]
    LineCount {
        /// The scene id.
        scene: String,
        /// Lines announced.
        announced: usize,
        /// Lines received.
        got: usize,
    },
    /// The output sink failed.
    #[error("writing the maps")]
    Sink(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// A pixel was written twice or never: an internal error, reported with its place.
    #[error("pixel (line {line}, sample {sample}) written {count} times (tile row {row}, col {col})")]
    Coverage {
        /// Scene line.
        line: usize,
        /// Scene sample.
        sample: usize,
        /// Times written.
        count: u8,
        /// Tile row holding it.
        row: usize,
        /// Tile column holding it.
        col: usize,
    },
}
