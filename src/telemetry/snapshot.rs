//! What the aggregator emits every period: one [`Snapshot`], the record every exporter writes.

use serde::{Deserialize, Serialize};

use crate::platform::{MemorySample, NvmlSample};

/// Batch latency quantiles over a window, seconds (nearest rank).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Quantiles {
    /// Batches in the window.
    pub count: u64,
    /// Median.
    pub p50: f64,
    /// 95th percentile.
    pub p95: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Largest.
    pub max: f64,
}

/// One rail's reading.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RailPower {
    /// The rail's label, e.g. `VDD_IN`.
    pub label: String,
    /// Volts.
    pub volts: f64,
    /// Amperes.
    pub amps: f64,
    /// Watts.
    pub watts: f64,
}

/// One thermal zone's reading.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Temperature {
    /// The zone's type, e.g. `gpu-thermal`.
    pub zone: String,
    /// Degrees Celsius.
    pub celsius: f64,
}

/// The nvpmodel power mode in force.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PowerModeNow {
    /// The mode id.
    pub id: u32,
    /// Its name in `/etc/nvpmodel.conf`, when listed there.
    pub name: Option<String>,
}

/// The aggregated state of a run at one instant, with rates and quantiles over the window since
/// the previous snapshot.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    /// 0, 1, 2, ... in emission order.
    pub seq: u64,
    /// Seconds since telemetry started.
    pub t_s: f64,
    /// Wall-clock time, milliseconds since the Unix epoch.
    pub unix_ms: u64,
    /// Seconds this snapshot's window covers (since the previous snapshot).
    pub window_s: f64,
    /// True for the snapshot emitted when the run ended.
    #[serde(rename = "final")]
    pub is_final: bool,
    /// Pixels stitched so far.
    pub pixels_done: u64,
    /// Pixels in the scene, when known.
    pub pixels_total: Option<u64>,
    /// Batches run so far.
    pub batches: u64,
    /// Pixels per second over the window.
    pub pixels_per_s: f64,
    /// Seconds a batch spent in the engine, over the batches that finished in the window;
    /// `None` when none did.
    pub batch_latency_s: Option<Quantiles>,
    /// Sum of every batch's engine seconds since the start (with `batches`, the Prometheus
    /// summary's `_sum` and `_count`).
    pub batch_latency_sum_s: f64,
    /// Batches whose latency is in `batch_latency_sum_s` (all but dropped records).
    pub batch_latency_count: u64,
    /// Seconds the engine waited for input over the window.
    pub wait_s: f64,
    /// Ready batches queued behind the engine at the last batch.
    pub queue_depth: u64,
    /// The batch in force (patches or tiles).
    pub batch: u64,
    /// Why that batch: the budget's limit (`memory`, `benchmark knee`, `configured maximum`),
    /// `fixed` for a batch given on the command line, or the governor's change.
    pub batch_reason: String,
    /// The execution provider the session runs on (ONNX Runtime's name; empty when not told).
    #[serde(default)]
    pub provider: String,
    /// Each preferred provider that did not register, and why (never silent).
    #[serde(default)]
    pub provider_fallbacks: Vec<String>,
    /// Memory, when `/proc/meminfo` was readable.
    pub memory: Option<MemorySample>,
    /// The module's total power in watts: the `VDD_IN` rail (Orin NX/Nano), the sum of the rails
    /// (AGX Orin), else the NVML board power of discrete GPUs.
    pub power_w: Option<f64>,
    /// Every power rail read.
    pub rails: Vec<RailPower>,
    /// Energy since telemetry started, joules (trapezoids between power samples).
    pub energy_j: Option<f64>,
    /// Energy per megapixel over the window: joules in the window / (pixels in the window / 1e6).
    pub energy_per_megapixel_j: Option<f64>,
    /// Every thermal zone read.
    pub temperatures: Vec<Temperature>,
    /// Integrated GPU load (devfreq), 0..=1.
    pub gpu_load: Option<f64>,
    /// Integrated GPU clock, hertz.
    pub gpu_freq_hz: Option<u64>,
    /// The nvpmodel mode in force.
    pub nvpmodel: Option<PowerModeNow>,
    /// Discrete GPUs through NVML.
    pub nvml: Vec<NvmlSample>,
    /// Batch records the engine thread could not queue because the ring was full (their pixels
    /// still count; only their latencies are missing from the quantiles).
    pub dropped_records: u64,
    /// Sources absent or failing, each reported in one snapshot only.
    pub notices: Vec<String>,
}

impl Snapshot {
    /// The snapshot as one CBOR item (the delivery sinks' record).
    pub fn to_cbor(&self) -> Result<Vec<u8>, super::TelemetryError> {
        let mut out = Vec::new();
        ciborium::into_writer(self, &mut out).map_err(|e| super::TelemetryError::Cbor(e.to_string()))?;
        Ok(out)
    }

    /// Decodes a snapshot written by [`Snapshot::to_cbor`].
    pub fn from_cbor(bytes: &[u8]) -> Result<Self, super::TelemetryError> {
        ciborium::from_reader(bytes).map_err(|e| super::TelemetryError::Cbor(e.to_string()))
    }
}
