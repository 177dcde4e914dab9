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
/// snapshot to every sink each period, and a final one when `body` calls [`Recorder::end`] or
/// returns. A body that has work left after its last batch (writing maps) calls `end` first, so
/// the final snapshot is taken while that work goes on.
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
    recorder.set_stop(stop_tx.clone());
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
        // The aggregator stops at once (it is waiting on this channel), unless `end` already
        // stopped it.
        let _ = stop_tx.send(());
        let outcome = aggregator.join().map_err(|_| TelemetryError::Panicked);
        (result, outcome)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::BatchDone;
    use std::path::PathBuf;
    use std::sync::{Arc, Mutex, PoisonError};

    /// Keeps every snapshot it is given, with when it got it.
    #[derive(Clone, Default)]
    struct Kept(Arc<Mutex<Vec<(Instant, Snapshot)>>>);

    impl Kept {
        fn all(&self) -> Vec<(Instant, Snapshot)> {
            self.0.lock().unwrap_or_else(PoisonError::into_inner).clone()
        }
    }

    impl Sink for Kept {
        fn name(&self) -> String {
            "kept".into()
        }

        fn emit(&mut self, s: &Snapshot) -> Result<(), TelemetryError> {
            self.0
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push((Instant::now(), s.clone()));
            Ok(())
        }
    }

    fn sampler() -> Sampler {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/telemetry/orin_nano");
        Sampler::discover(&root, false)
    }

    fn batch(i: usize) -> BatchDone {
        BatchDone {
            batches: i + 1,
            pixels_done: (i + 1) * 10,
            pixels: 10,
            infer_s: 0.001,
            batch: 8,
            ..Default::default()
        }
    }

    #[test]
    fn periodic_snapshots_then_a_final_one() {
        let cfg = TelemetryConfig {
            period: Duration::from_millis(40),
            tick: Duration::from_millis(10),
        };
        let mut kept = Kept::default();
        let mut sinks: [&mut dyn Sink; 1] = [&mut kept];
        let mut sampler = sampler();
        let info = RunInfo {
            batch: 8,
            batch_reason: "fixed".into(),
            pixels_total: Some(300),
            ..RunInfo::default()
        };
        let (n, outcome) = run(&cfg, &mut sampler, info, &mut sinks, |rec| {
            for i in 0..30 {
                rec.record(&batch(i));
                std::thread::sleep(Duration::from_millis(5));
            }
            30
        });
        assert_eq!(n, 30);
        let outcome = outcome.map_err(|e| e.to_string());
        let Ok(outcome) = outcome else { panic!("{outcome:?}") };
        let got: Vec<Snapshot> = kept.all().into_iter().map(|(_, s)| s).collect();
        // At least one periodic snapshot (three or four on an idle machine) and the final one.
        assert!(got.len() >= 2, "{} snapshots in 150 ms at 40 ms", got.len());
        assert_eq!(outcome.snapshots, got.len() as u64);
        assert!(got.iter().enumerate().all(|(i, s)| s.seq == i as u64));
        assert!(got.iter().rev().skip(1).all(|s| !s.is_final));
        assert!(got.windows(2).all(|w| w[0].pixels_done <= w[1].pixels_done));
        let last = &outcome.last;
        assert!(last.is_final);
        assert_eq!(
            (last.pixels_done, last.batches, last.batch_latency_count),
            (300, 30, 30)
        );
        // The fixture's constant 6.623 W integrated over the run.
        let energy = last.energy_j.unwrap_or_default();
        assert!(
            (energy - 6.623 * last.t_s).abs() < 1e-6,
            "{energy} J over {} s",
            last.t_s
        );
        // The board's notices came once (none on this fixture), the reason stayed.
        assert!(outcome.notices.is_empty(), "{:?}", outcome.notices);
        assert!(got.iter().all(|s| s.batch_reason == "fixed"));
    }

    #[test]
    fn end_takes_the_final_snapshot_while_the_body_goes_on() {
        let kept = Kept::default();
        let mut sink = kept.clone();
        let mut sinks: [&mut dyn Sink; 1] = [&mut sink];
        let mut sampler = sampler();
        let (returned, outcome) = run(
            &TelemetryConfig::default(),
            &mut sampler,
            RunInfo::default(),
            &mut sinks,
            |rec| {
                rec.record(&batch(0));
                rec.end();
                rec.end();
                // The body's remaining work: the final snapshot arrives meanwhile.
                let t = Instant::now();
                while kept.all().is_empty() && t.elapsed() < Duration::from_secs(10) {
                    std::thread::sleep(Duration::from_millis(1));
                }
                Instant::now()
            },
        );
        let all = kept.all();
        assert_eq!(all.len(), 1);
        assert!(all[0].1.is_final && all[0].1.pixels_done == 10);
        assert!(all[0].0 < returned, "the final snapshot waited for the body");
        assert!(outcome.is_ok_and(|o| o.snapshots == 1));
    }
}
