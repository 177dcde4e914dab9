//! `[telemetry] metrics`: each scene a worker runs feeds the telemetry aggregator
//! ([`crate::telemetry::run`]), whose latest snapshot the Prometheus endpoint serves. With several
//! scenes in flight the endpoint shows whichever emitted last; between scenes, the last one's.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use super::log;
use crate::pipeline::BatchDone;
use crate::telemetry::{self, LatestSnapshot, RunInfo, Sampler, Sink, TelemetryConfig};

/// What the workers share to report to the endpoint.
#[derive(Debug, Default)]
pub struct Metrics {
    latest: LatestSnapshot,
    /// Absent board sources are logged for the first scene only.
    noticed: AtomicBool,
}

impl Metrics {
    /// Feeds `latest` (the endpoint's).
    pub fn new(latest: LatestSnapshot) -> Self {
        Self {
            latest,
            noticed: AtomicBool::new(false),
        }
    }
}

/// Runs `body` (one scene, described by `info`), handing it a function to call with each batch
/// done; with `metrics`, telemetry records those batches and samples the board while it runs.
pub fn observe<R>(metrics: Option<&Metrics>, info: RunInfo, body: impl FnOnce(&mut dyn FnMut(&BatchDone)) -> R) -> R {
    let Some(m) = metrics else {
        return body(&mut |_| {});
    };
    // Discovered per scene: concurrent scenes each need a sampler of their own.
    let mut sampler = Sampler::discover(Path::new("/"), true);
    let mut sink = m.latest.clone();
    let mut sinks: [&mut dyn Sink; 1] = [&mut sink];
    let (r, outcome) = telemetry::run(&TelemetryConfig::default(), &mut sampler, info, &mut sinks, |rec| {
        body(&mut |done| rec.record(done))
    });
    match outcome {
        Ok(o) => {
            if !m.noticed.swap(true, Ordering::Relaxed) {
                for n in &o.notices {
                    log::event("telemetry", n, serde_json::json!({}));
                }
            }
        }
        Err(e) => log::event(
            "telemetry_failed",
            &format!("telemetry of a scene: {e}"),
            serde_json::json!({"error": e.to_string()}),
        ),
    }
    r
}

#[cfg(test)]
mod tests {
    fn info() -> RunInfo {
        RunInfo {
            batch: 16,
            batch_reason: "test".into(),
            pixels_total: None,
            provider: "CPUExecutionProvider".into(),
            provider_fallbacks: Vec::new(),
        }
    }

    use super::*;

    fn done(i: usize) -> BatchDone {
        BatchDone {
            batches: i + 1,
            pixels_done: (i + 1) * 16,
            units: 16,
            pixels: 16,
            infer_s: 1e-3,
            wait_s: 0.0,
            queued: 0,
            batch: 16,
        }
    }

    #[test]
    fn without_metrics_the_body_runs_alone() {
        let mut seen = 0;
        let r = observe(None, info(), |record| {
            record(&done(0));
            seen += 1;
            7
        });
        assert_eq!((r, seen), (7, 1));
    }

    #[test]
    fn a_scene_s_batches_reach_the_endpoint_s_snapshot() {
        let latest = LatestSnapshot::new();
        let m = Metrics::new(latest.clone());
        assert!(latest.get().is_none());
        let r = observe(Some(&m), info(), |record| {
            for i in 0..5 {
                record(&done(i));
            }
            "ok"
        });
        assert_eq!(r, "ok");
        // The final snapshot is taken when the body returns: every batch is in it.
        let s = latest.get().unwrap_or_default();
        assert_eq!((s.batches, s.pixels_done, s.batch), (5, 80, 16));
        assert_eq!(
            (s.batch_reason.as_str(), s.provider.as_str()),
            ("test", "CPUExecutionProvider")
        );
        let text = latest.render();
        assert!(text.contains("hsiedge_pixels_total 80"), "{text}");
    }
}
