//! The aggregator: drains the recorder's ring, samples the board, and every period turns both
//! into a [`Snapshot`] for the sinks. It runs on a thread of its own (see [`super::run`]).

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use super::recorder::Drain;
use super::sampler::{PowerSample, Sampler};
use super::snapshot::Snapshot;
use super::stats::{EnergyMeter, LatencyWindow, joules_per_megapixel};

/// What the run tells telemetry before its first batch.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RunInfo {
    /// The batch the run starts with.
    pub batch: u64,
    /// Why that batch (e.g. `auto: memory`, `fixed`).
    pub batch_reason: String,
    /// Pixels in the scene, when known.
    pub pixels_total: Option<u64>,
    /// The execution provider the session runs on (ONNX Runtime's name).
    pub provider: String,
    /// Each preferred provider that did not register, and why.
    pub provider_fallbacks: Vec<String>,
}

/// Builds snapshots from records and samples.
pub struct Aggregator<'s> {
    sampler: &'s mut Sampler,
    start: Instant,
    pixels_total: Option<u64>,
    batch: u64,
    reason: String,
    provider: String,
    provider_fallbacks: Vec<String>,
    seq: u64,
    window: LatencyWindow,
    latency_sum_s: f64,
    latency_count: u64,
    wait_s: f64,
    energy: EnergyMeter,
    power: PowerSample,
    last_t: f64,
    last_pixels: u64,
    last_joules: f64,
    pub(super) notices: Vec<String>,
}

impl<'s> Aggregator<'s> {
    /// An aggregator whose clock starts now.
    pub fn new(sampler: &'s mut Sampler, info: RunInfo) -> Self {
        Self {
            sampler,
            start: Instant::now(),
            pixels_total: info.pixels_total,
            batch: info.batch,
            reason: info.batch_reason,
            provider: info.provider,
            provider_fallbacks: info.provider_fallbacks,
            seq: 0,
            window: LatencyWindow::new(),
            latency_sum_s: 0.0,
            latency_count: 0,
            wait_s: 0.0,
            energy: EnergyMeter::default(),
            power: PowerSample::default(),
            last_t: 0.0,
            last_pixels: 0,
            last_joules: 0.0,
            notices: Vec::new(),
        }
    }

    /// Seconds since the aggregator started.
    pub fn elapsed_s(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    /// True when there is power to sample between snapshots.
    pub fn has_power(&self) -> bool {
        self.sampler.has_power()
    }

    /// Moves the queued records into the latency window.
    pub fn drain(&mut self, drain: &mut Drain<'_>) {
        let (window, sum, wait) = (&mut self.window, &mut self.latency_sum_s, &mut self.wait_s);
        self.latency_count += drain.drain(|d| {
            window.push(d.infer_s);
            *sum += d.infer_s;
            *wait += d.wait_s;
        }) as u64;
    }

    /// Samples power at `t_s` and adds it to the energy.
    pub fn sample_power(&mut self, t_s: f64) {
        self.power = self.sampler.power();
        if let Some(w) = self.power.total_w {
            self.energy.add(t_s, w);
        }
    }

    /// The snapshot of the window that ends at `t_s` (records drained beforehand).
    pub fn snapshot(&mut self, drain: &Drain<'_>, t_s: f64, is_final: bool) -> Snapshot {
        let totals = drain.totals();
        if totals.batch != self.batch && totals.batch != 0 {
            self.reason = if totals.batch < self.batch {
                "governor: budget fell".into()
            } else {
                "governor: budget recovered".into()
            };
            self.batch = totals.batch;
        }
        let board = self.sampler.board();
        self.notices.extend(self.sampler.take_notices());
        let window_s = (t_s - self.last_t).max(0.0);
        let pixels = totals.pixels_done.saturating_sub(self.last_pixels);
        let joules = self.energy.started().then(|| self.energy.joules());
        let snapshot = Snapshot {
            seq: self.seq,
            t_s,
            unix_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            window_s,
            is_final,
            pixels_done: totals.pixels_done,
            pixels_total: self.pixels_total,
            batches: totals.batches,
            pixels_per_s: if window_s > 0.0 { pixels as f64 / window_s } else { 0.0 },
            batch_latency_s: self.window.take_quantiles(),
            batch_latency_sum_s: self.latency_sum_s,
            batch_latency_count: self.latency_count,
            wait_s: std::mem::take(&mut self.wait_s),
            queue_depth: totals.queued,
            batch: self.batch,
            batch_reason: self.reason.clone(),
            provider: self.provider.clone(),
            provider_fallbacks: self.provider_fallbacks.clone(),
            memory: board.memory,
            power_w: self.power.total_w,
            rails: self.power.rails.clone(),
            energy_j: joules,
            energy_per_megapixel_j: joules.and_then(|j| joules_per_megapixel(j - self.last_joules, pixels)),
            temperatures: board.temperatures,
            gpu_load: board.gpu_load,
            gpu_freq_hz: board.gpu_freq_hz,
            nvpmodel: board.nvpmodel,
            nvml: self.power.nvml.clone(),
            dropped_records: totals.dropped,
            notices: std::mem::take(&mut self.notices),
        };
        self.seq += 1;
        self.last_t = t_s;
        self.last_pixels = totals.pixels_done;
        self.last_joules = joules.unwrap_or(0.0);
        snapshot
    }
}

#[cfg(test)]
mod tests {
    use super::super::recorder::Ring;
    use super::*;
    use crate::pipeline::BatchDone;
    use std::path::PathBuf;

    fn fixture(name: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/telemetry")
            .join(name)
    }

    #[test]
    fn windows_rates_energy_and_reason() {
        let mut sampler = Sampler::discover(&fixture("orin_nano"), false);
        let info = RunInfo {
            batch: 64,
            batch_reason: "auto: memory".into(),
            pixels_total: Some(10_000),
            ..RunInfo::default()
        };
        let mut agg = Aggregator::new(&mut sampler, info);
        let mut ring = Ring::new();
        ring.set_batch(64);
        let (mut rec, mut drain) = ring.split();
        // The fixture's power is constant: VDD_IN 6.623 W.
        agg.sample_power(0.0);
        for i in 0..10 {
            rec.record(&BatchDone {
                batches: i + 1,
                pixels_done: (i + 1) * 100,
                units: 64,
                pixels: 100,
                infer_s: 0.01 * (i + 1) as f64,
                wait_s: 0.001,
                queued: 2,
                batch: 64,
            });
        }
        agg.drain(&mut drain);
        agg.sample_power(2.0);
        let s0 = agg.snapshot(&drain, 2.0, false);
        assert_eq!((s0.seq, s0.pixels_done, s0.batches, s0.queue_depth), (0, 1000, 10, 2));
        assert!((s0.pixels_per_s - 500.0).abs() < 1e-9);
        let q = s0.batch_latency_s.unwrap_or_default();
        assert_eq!((q.count, q.p50, q.max), (10, 0.05, 0.1));
        assert!((s0.wait_s - 0.01).abs() < 1e-12);
        assert_eq!(s0.energy_j.map(|j| (j * 1000.0).round()), Some(13_246.0));
        // 13.246 J over 1000 pixels = 13246 J per megapixel.
        assert_eq!(s0.energy_per_megapixel_j.map(|e| e.round()), Some(13_246.0));
        assert_eq!(s0.batch_reason, "auto: memory");
        assert_eq!(s0.pixels_total, Some(10_000));
        // The governor halves the batch; nothing else finishes in the next window.
        rec.record(&BatchDone {
            batches: 11,
            pixels_done: 1000,
            batch: 32,
            ..Default::default()
        });
        agg.drain(&mut drain);
        agg.sample_power(3.0);
        let s1 = agg.snapshot(&drain, 3.0, true);
        assert_eq!(
            (s1.seq, s1.batch, s1.batch_reason.as_str()),
            (1, 32, "governor: budget fell")
        );
        assert_eq!(s1.pixels_per_s, 0.0);
        assert_eq!(s1.energy_per_megapixel_j, None);
        assert!(s1.is_final);
        assert!((s1.batch_latency_sum_s - 0.55).abs() < 1e-12);
    }
}
