//! Run telemetry: per-batch timings from the engine thread and board readings, aggregated every
//! second into a [`Snapshot`] and exported as JSON lines, a Prometheus text endpoint and CBOR
//! records.
//!
//! The parts:
//!
//! * [`recorder`]: the hot path. `Job::infer`'s `progress` callback calls [`Recorder::record`],
//!   which pushes the `BatchDone` into a fixed single-producer single-consumer ring (no
//!   allocation, lock or system call) and updates four atomic totals.
//! * [`aggregate`]: on its own thread (started by [`run`]), drains the ring four times a second,
//!   samples power as often (energy is the trapezoid rule over those samples), and every
//!   [`TelemetryConfig::period`] samples the board and emits a snapshot: pixels/s, batch latency
//!   p50/p95/p99, queue depth, memory, power, temperatures, energy per megapixel, the batch and
//!   why.
//! * [`sampler`]: the board's sources through [`crate::platform`], absent ones reported once.
//! * Exporters: [`jsonl`] (one object per line, flushed per line: `classify --telemetry`),
//!   [`prometheus`] (text exposition of the latest snapshot) served by [`http`] on a localhost
//!   listener, and [`Snapshot::to_cbor`] / [`cbor`] for the delivery sinks.
//! * [`bench`](mod@bench): `hsiedge bench telemetry`, classify with and without telemetry.

use std::sync::mpsc;
use std::time::{Duration, Instant};

pub mod aggregate;
pub mod bench;
pub mod cbor;
pub mod http;
pub mod jsonl;
pub mod prometheus;
pub mod recorder;
pub mod sampler;
pub mod snapshot;
pub mod stats;

pub use aggregate::{Aggregator, RunInfo};
pub use http::MetricsServer;
pub use jsonl::JsonLines;
pub use prometheus::LatestSnapshot;
pub use recorder::{Recorder, Ring};
pub use sampler::Sampler;
pub use snapshot::Snapshot;

/// Errors of telemetry; each names the sink, file or address concerned.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// A sink's file could not be created or written.
    #[error("telemetry {what} {path}")]
    Io {
        /// `creating` or `writing`.
        what: &'static str,
        /// The file.
        path: std::path::PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A snapshot could not be encoded.
    #[error("telemetry JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// A snapshot could not be encoded or decoded as CBOR.
    #[error("telemetry CBOR: {0}")]
    Cbor(String),
    /// The metrics endpoint could not be set up.
    #[error("metrics endpoint {addr}: {why}")]
    Endpoint {
        /// The address asked for.
        addr: String,
        /// What went wrong.
        why: String,
    },
    /// The aggregator thread panicked.
    #[error("the telemetry aggregator thread panicked")]
    Panicked,
}

/// How often telemetry samples and emits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TelemetryConfig {
    /// Between snapshots.
    pub period: Duration,
    /// Between ring drains and power samples.
    pub tick: Duration,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        Self {
            period: Duration::from_secs(1),
            tick: Duration::from_millis(250),
        }
    }
}

/// Where snapshots go.
pub trait Sink: Send {
    /// A name for messages, e.g. the file written.
    fn name(&self) -> String;
    /// Takes one snapshot.
    fn emit(&mut self, snapshot: &Snapshot) -> Result<(), TelemetryError>;
}

/// What a telemetry run leaves.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Outcome {
    /// The final snapshot.
    pub last: Snapshot,
    /// Snapshots emitted, the final one included.
    pub snapshots: u64,
    /// Every notice emitted (absent or failing sources), in order.
    pub notices: Vec<String>,
    /// Sinks that failed (each then stopped receiving snapshots).
    pub sink_errors: Vec<String>,
    /// CPU seconds the aggregator thread used, where the thread CPU clock is available.
    pub aggregator_cpu_s: Option<f64>,
}

/// Runs `body` with a [`Recorder`] while an aggregator thread samples `sampler` and emits a
/// snapshot to every sink each period, and a final one when `body` returns.
///
/// The ring is allocated here, before `body` starts; the recorder never allocates.
pub fn run<R>(
    cfg: &TelemetryConfig,
    sampler: &mut Sampler,
    info: RunInfo,
    sinks: &mut [&mut dyn Sink],
    body: impl FnOnce(&mut Recorder<'_>) -> R,
) -> (R, Result<Outcome, TelemetryError>) {
    let mut ring = Ring::new();
    ring.set_batch(info.batch);
    let (mut recorder, mut drain) = ring.split();
    let (stop_tx, stop_rx) = mpsc::channel::<()>();
    let cfg = *cfg;
    std::thread::scope(|scope| {
        let aggregator = scope.spawn(move || {
            let mut agg = Aggregator::new(sampler, info);
            let start = Instant::now();
            agg.sample_power(0.0);
            let mut out = Outcome::default();
            let mut live: Vec<bool> = vec![true; sinks.len()];
            let mut emit = |snapshot: &Snapshot, out: &mut Outcome| {
                out.notices.extend(snapshot.notices.iter().cloned());
                for (sink, live) in sinks.iter_mut().zip(live.iter_mut()) {
                    if !*live {
                        continue;
                    }
                    if let Err(e) = sink.emit(snapshot) {
                        out.sink_errors.push(format!("{}: {e}", sink.name()));
                        *live = false;
                    }
                }
                out.snapshots += 1;
            };
            let mut next_tick = start + cfg.tick;
            let mut next_emit = start + cfg.period;
            loop {
                let next = next_tick.min(next_emit);
                match stop_rx.recv_timeout(next.saturating_duration_since(Instant::now())) {
                    Err(mpsc::RecvTimeoutError::Timeout) => {}
                    Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => break,
                }
                let now = Instant::now();
                let t_s = now.duration_since(start).as_secs_f64();
                agg.drain(&mut drain);
                if now >= next_tick {
                    if agg.has_power() {
                        agg.sample_power(t_s);
                    }
                    while next_tick <= now {
                        next_tick += cfg.tick;
                    }
                }
                if now >= next_emit {
                    let s = agg.snapshot(&drain, t_s, false);
                    emit(&s, &mut out);
                    while next_emit <= now {
                        next_emit += cfg.period;
                    }
                }
            }
            let t_s = start.elapsed().as_secs_f64();
            agg.drain(&mut drain);
            agg.sample_power(t_s);
            let last = agg.snapshot(&drain, t_s, true);
            emit(&last, &mut out);
            out.last = last;
            out.aggregator_cpu_s = crate::ffi::thread_cpu_time().map(|d| d.as_secs_f64());
            out
        });
        let result = body(&mut recorder);
        // The aggregator stops at once: it is waiting on this channel.
        let _ = stop_tx.send(());
        let outcome = aggregator.join().map_err(|_| TelemetryError::Panicked);
        (result, outcome)
    })
}
