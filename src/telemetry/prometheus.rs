//! Prometheus text exposition (format 0.0.4) of the latest snapshot.
//!
//! Units are in the metric names in base units (`_seconds`, `_bytes`, `_watts`, `_joules`,
//! `_celsius`, `_hertz`, `_ratio` for shares), counters end in `_total`, and every family has its
//! `# HELP` and `# TYPE` lines. A quantity the board does not report has no series.

use std::fmt::Write as _;
use std::sync::{Arc, Mutex, PoisonError};

use super::{Sink, Snapshot, TelemetryError};

/// The content type of the exposition.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The latest snapshot, shared between the aggregator (a [`Sink`]) and the metrics endpoint.
/// The lock is held only to store or clone a snapshot.
#[derive(Debug, Clone, Default)]
pub struct LatestSnapshot(Arc<Mutex<Option<Snapshot>>>);

impl LatestSnapshot {
    /// An empty holder.
    pub fn new() -> Self {
        Self::default()
    }

    /// A copy of the latest snapshot, if any.
    pub fn get(&self) -> Option<Snapshot> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Replaces the latest snapshot.
    pub fn set(&self, s: &Snapshot) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(s.clone());
    }

    /// The exposition of the latest snapshot.
    pub fn render(&self) -> String {
        render(self.get().as_ref())
    }
}

impl Sink for LatestSnapshot {
    fn name(&self) -> String {
        "metrics endpoint".into()
    }

    fn emit(&mut self, snapshot: &Snapshot) -> Result<(), TelemetryError> {
        self.set(snapshot);
        Ok(())
    }
}

/// Prometheus' spelling of a sample value.
fn value(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v == f64::INFINITY {
        "+Inf".into()
    } else if v == f64::NEG_INFINITY {
        "-Inf".into()
    } else {
        format!("{v}")
    }
}

/// A label value with `\`, `"` and newlines escaped.
fn escape(v: &str) -> String {
    v.replace('\\', r"\\").replace('"', "\\\"").replace('\n', r"\n")
}

struct Text(String);

impl Text {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.0, "# HELP {name} {help}");
        let _ = writeln!(self.0, "# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], v: f64) {
        self.0.push_str(name);
        if !labels.is_empty() {
            self.0.push('{');
            for (i, (k, val)) in labels.iter().enumerate() {
                if i > 0 {
                    self.0.push(',');
                }
                let _ = write!(self.0, "{k}=\"{}\"", escape(val));
            }
            self.0.push('}');
        }
        let _ = writeln!(self.0, " {}", value(v));
    }

    /// One family with one unlabelled sample, when there is a value.
    fn single(&mut self, name: &str, kind: &str, help: &str, v: Option<f64>) {
        if let Some(v) = v {
            self.family(name, kind, help);
            self.sample(name, &[], v);
        }
    }

    /// One family with a sample per labelled value; nothing when there are none.
    fn labelled<'a>(
        &mut self,
        name: &str,
        kind: &str,
        help: &str,
        label: &str,
        vs: impl Iterator<Item = (&'a str, f64)>,
    ) {
        let mut first = true;
        for (l, v) in vs {
            if first {
                self.family(name, kind, help);
                first = false;
            }
            self.sample(name, &[(label, l)], v);
        }
    }
}

/// The exposition of `s`; with no snapshot yet, only the snapshot counter (0).
pub fn render(s: Option<&Snapshot>) -> String {
    let mut t = Text(String::with_capacity(4096));
    let f = |v: u64| v as f64;
    t.single(
        "hsiedge_telemetry_snapshots_total",
        "counter",
        "Telemetry snapshots emitted.",
        Some(s.map_or(0.0, |s| f(s.seq + 1))),
    );
    let Some(s) = s else { return t.0 };
    t.single(
        "hsiedge_pixels_total",
        "counter",
        "Pixels stitched.",
        Some(f(s.pixels_done)),
    );
    t.single(
        "hsiedge_scene_pixels",
        "gauge",
        "Pixels in the scene being classified.",
        s.pixels_total.map(f),
    );
    t.single("hsiedge_batches_total", "counter", "Batches run.", Some(f(s.batches)));
    t.single(
        "hsiedge_throughput_pixels_per_second",
        "gauge",
        "Pixels stitched per second over the last window.",
        Some(s.pixels_per_s),
    );
    let name = "hsiedge_batch_latency_seconds";
    t.family(
        name,
        "summary",
        "Seconds a batch spent in the engine; quantiles over the last window.",
    );
    let q = s.batch_latency_s;
    for (label, v) in [
        ("0.5", q.map(|q| q.p50)),
        ("0.95", q.map(|q| q.p95)),
        ("0.99", q.map(|q| q.p99)),
    ] {
        t.sample(name, &[("quantile", label)], v.unwrap_or(f64::NAN));
    }
    t.sample("hsiedge_batch_latency_seconds_sum", &[], s.batch_latency_sum_s);
    t.sample("hsiedge_batch_latency_seconds_count", &[], f(s.batch_latency_count));
    t.single(
        "hsiedge_engine_wait_seconds",
        "gauge",
        "Seconds the engine waited for input over the last window.",
        Some(s.wait_s),
    );
    t.single(
        "hsiedge_queue_depth",
        "gauge",
        "Ready batches queued behind the engine.",
        Some(f(s.queue_depth)),
    );
    t.labelled(
        "hsiedge_batch_units",
        "gauge",
        "The batch in force (patches or tiles), labelled with why.",
        "reason",
        std::iter::once((s.batch_reason.as_str(), f(s.batch))),
    );
    if let Some(m) = &s.memory {
        t.single(
            "hsiedge_memory_total_bytes",
            "gauge",
            "MemTotal.",
            Some(f(m.total_bytes)),
        );
        t.single(
            "hsiedge_memory_available_bytes",
            "gauge",
            "MemAvailable.",
            Some(f(m.available_bytes)),
        );
        t.single(
            "hsiedge_nvmap_used_bytes",
            "gauge",
            "NvMapMemUsed (Jetson).",
            m.nvmap_used_bytes.map(f),
        );
        t.single(
            "hsiedge_cgroup_memory_usage_bytes",
            "gauge",
            "This process's cgroup usage.",
            m.cgroup_usage_bytes.map(f),
        );
        t.single(
            "hsiedge_cgroup_memory_limit_bytes",
            "gauge",
            "This process's cgroup limit.",
            m.cgroup_limit_bytes.map(f),
        );
        t.single(
            "hsiedge_process_resident_memory_bytes",
            "gauge",
            "This process's resident set.",
            m.process_rss_bytes.map(f),
        );
    }
    t.single(
        "hsiedge_power_watts",
        "gauge",
        "Module power: VDD_IN, else the sum of the rails, else NVML board power.",
        s.power_w,
    );
    let rails = |g: fn(&super::snapshot::RailPower) -> f64| s.rails.iter().map(move |r| (r.label.as_str(), g(r)));
    t.labelled(
        "hsiedge_rail_power_watts",
        "gauge",
        "Power of one rail.",
        "rail",
        rails(|r| r.watts),
    );
    t.labelled(
        "hsiedge_rail_voltage_volts",
        "gauge",
        "Voltage of one rail.",
        "rail",
        rails(|r| r.volts),
    );
    t.labelled(
        "hsiedge_rail_current_amperes",
        "gauge",
        "Current of one rail.",
        "rail",
        rails(|r| r.amps),
    );
    t.single(
        "hsiedge_energy_joules_total",
        "counter",
        "Energy since telemetry started (trapezoids between power samples).",
        s.energy_j,
    );
    t.single(
        "hsiedge_energy_per_megapixel_joules",
        "gauge",
        "Joules per megapixel over the last window.",
        s.energy_per_megapixel_j,
    );
    t.labelled(
        "hsiedge_temperature_celsius",
        "gauge",
        "Temperature of one thermal zone.",
        "zone",
        s.temperatures.iter().map(|z| (z.zone.as_str(), z.celsius)),
    );
    t.single(
        "hsiedge_gpu_load_ratio",
        "gauge",
        "Integrated GPU busy share (devfreq).",
        s.gpu_load,
    );
    t.single(
        "hsiedge_gpu_frequency_hertz",
        "gauge",
        "Integrated GPU clock.",
        s.gpu_freq_hz.map(f),
    );
    if let Some(m) = &s.nvpmodel {
        let name = "hsiedge_nvpmodel_info";
        t.family(name, "gauge", "The nvpmodel power mode in force (always 1).");
        let id = m.id.to_string();
        t.sample(name, &[("id", &id), ("name", m.name.as_deref().unwrap_or(""))], 1.0);
    }
    let gpus: Vec<String> = s.nvml.iter().map(|g| g.index.to_string()).collect();
    type Field = fn(&crate::platform::NvmlSample) -> Option<f64>;
    let nvml: [(&str, &str, Field); 5] = [
        ("hsiedge_nvml_power_watts", "Discrete GPU board power.", |g| g.power_w),
        ("hsiedge_nvml_utilization_ratio", "Discrete GPU busy share.", |g| {
            g.utilization
        }),
        (
            "hsiedge_nvml_memory_used_bytes",
            "Discrete GPU memory allocated.",
            |g| g.memory_used_bytes.map(|b| b as f64),
        ),
        (
            "hsiedge_nvml_memory_total_bytes",
            "Discrete GPU memory installed.",
            |g| g.memory_total_bytes.map(|b| b as f64),
        ),
        (
            "hsiedge_nvml_temperature_celsius",
            "Discrete GPU die temperature.",
            |g| g.temperature_c,
        ),
    ];
    for (name, help, get) in nvml {
        t.labelled(
            name,
            "gauge",
            help,
            "gpu",
            s.nvml
                .iter()
                .zip(&gpus)
                .filter_map(|(g, i)| Some((i.as_str(), get(g)?))),
        );
    }
    t.single(
        "hsiedge_telemetry_dropped_records_total",
        "counter",
        "Batch records lost to a full ring (their latencies only).",
        Some(f(s.dropped_records)),
    );
    t.0
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::platform::{MemorySample, NvmlSample};
    use crate::telemetry::snapshot::{PowerModeNow, Quantiles, RailPower, Temperature};
    use std::collections::BTreeMap;

    /// Parses an exposition back: every sample's family must have had its HELP and TYPE lines
    /// first, names and labels must be well formed. Returns `name{labels}` -> value.
    pub(crate) fn parse(text: &str) -> Result<BTreeMap<String, f64>, String> {
        let mut helped = std::collections::BTreeSet::new();
        let mut typed = BTreeMap::new();
        let mut out = BTreeMap::new();
        let valid = |n: &str| {
            !n.is_empty()
                && n.chars()
                    .enumerate()
                    .all(|(i, c)| c == '_' || c == ':' || c.is_ascii_alphabetic() || (i > 0 && c.is_ascii_digit()))
        };
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let name = rest.split(' ').next().unwrap_or("");
                if !helped.insert(name.to_string()) {
                    return Err(format!("HELP twice for {name}"));
                }
                continue;
            }
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let mut p = rest.split(' ');
                let (name, kind) = (p.next().unwrap_or(""), p.next().unwrap_or(""));
                if !["counter", "gauge", "summary", "histogram", "untyped"].contains(&kind) {
                    return Err(format!("bad type {kind}"));
                }
                typed.insert(name.to_string(), kind.to_string());
                continue;
            }
            let (series, v) = line.rsplit_once(' ').ok_or(format!("no value: {line}"))?;
            let name = series.split('{').next().unwrap_or("");
            if !valid(name) {
                return Err(format!("bad name {name}"));
            }
            let family = ["_sum", "_count"]
                .iter()
                .find_map(|s| {
                    name.strip_suffix(s)
                        .filter(|f| typed.get(*f).is_some_and(|k| k == "summary"))
                })
                .unwrap_or(name);
            if !helped.contains(family) || !typed.contains_key(family) {
                return Err(format!("{name} has no HELP/TYPE before it"));
            }
            if typed.get(family).is_some_and(|k| k == "counter") && !family.ends_with("_total") {
                return Err(format!("counter {family} without _total"));
            }
            let labels = series.strip_prefix(name).unwrap_or("");
            if !(labels.is_empty() || labels.starts_with('{') && labels.ends_with('}')) {
                return Err(format!("bad labels {labels}"));
            }
            let v = match v {
                "NaN" => f64::NAN,
                "+Inf" => f64::INFINITY,
                "-Inf" => f64::NEG_INFINITY,
                v => v.parse::<f64>().map_err(|_| format!("bad value {v}"))?,
            };
            out.insert(series.to_string(), v);
        }
        Ok(out)
    }

    fn full() -> Snapshot {
        Snapshot {
            seq: 4,
            pixels_done: 7138,
            pixels_total: Some(7138),
            batches: 112,
            pixels_per_s: 1500.5,
            batch_latency_s: Some(Quantiles {
                count: 20,
                p50: 0.04,
                p95: 0.05,
                p99: 0.06,
                max: 0.06,
            }),
            batch_latency_sum_s: 4.5,
            batch_latency_count: 112,
            queue_depth: 2,
            batch: 64,
            batch_reason: "auto: benchmark knee".into(),
            memory: Some(MemorySample {
                total_bytes: 8 << 30,
                available_bytes: 4 << 30,
                nvmap_used_bytes: Some(1 << 28),
                cgroup_usage_bytes: Some(1 << 30),
                cgroup_limit_bytes: None,
                process_rss_bytes: Some(1 << 29),
            }),
            power_w: Some(6.6),
            rails: vec![RailPower {
                label: "VDD_IN".into(),
                volts: 5.056,
                amps: 1.31,
                watts: 6.623,
            }],
            energy_j: Some(33.0),
            energy_per_megapixel_j: Some(4.6),
            temperatures: vec![Temperature {
                zone: "cpu-thermal".into(),
                celsius: 48.5,
            }],
            gpu_load: Some(0.627),
            gpu_freq_hz: Some(624_750_000),
            nvpmodel: Some(PowerModeNow {
                id: 0,
                name: Some("15W \"max\"".into()),
            }),
            nvml: vec![NvmlSample {
                index: 0,
                name: "NVIDIA H100".into(),
                power_w: Some(120.0),
                utilization: Some(0.5),
                memory_used_bytes: Some(1 << 30),
                memory_total_bytes: None,
                temperature_c: Some(40.0),
            }],
            ..Default::default()
        }
    }

    #[test]
    fn exposition_parses_back_with_every_value() {
        let text = render(Some(&full()));
        let m = parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        let get = |k: &str| m.get(k).copied();
        assert_eq!(get("hsiedge_telemetry_snapshots_total"), Some(5.0));
        assert_eq!(get("hsiedge_pixels_total"), Some(7138.0));
        assert_eq!(get("hsiedge_batch_latency_seconds{quantile=\"0.95\"}"), Some(0.05));
        assert_eq!(get("hsiedge_batch_latency_seconds_count"), Some(112.0));
        assert_eq!(get("hsiedge_batch_units{reason=\"auto: benchmark knee\"}"), Some(64.0));
        assert_eq!(get("hsiedge_rail_power_watts{rail=\"VDD_IN\"}"), Some(6.623));
        assert_eq!(get("hsiedge_temperature_celsius{zone=\"cpu-thermal\"}"), Some(48.5));
        assert_eq!(
            get("hsiedge_nvpmodel_info{id=\"0\",name=\"15W \\\"max\\\"\"}"),
            Some(1.0)
        );
        assert_eq!(get("hsiedge_nvml_power_watts{gpu=\"0\"}"), Some(120.0));
        assert_eq!(get("hsiedge_gpu_frequency_hertz"), Some(624_750_000.0));
        // Absent quantities have no series at all.
        assert_eq!(get("hsiedge_cgroup_memory_limit_bytes"), None);
        assert!(!text.contains("hsiedge_nvml_memory_total_bytes"));
    }

    #[test]
    fn before_any_snapshot_and_without_batches() {
        assert_eq!(
            parse(&render(None))
                .ok()
                .and_then(|m| m.get("hsiedge_telemetry_snapshots_total").copied()),
            Some(0.0)
        );
        let bare = Snapshot::default();
        let m = parse(&render(Some(&bare))).unwrap_or_default();
        assert!(
            m.get("hsiedge_batch_latency_seconds{quantile=\"0.5\"}")
                .is_some_and(|v| v.is_nan())
        );
        assert_eq!(m.get("hsiedge_power_watts"), None);
    }
}
