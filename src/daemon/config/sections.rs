//! The `[intake]` and `[engine]` sections' checks: ranges and names, without I/O.

use super::*;

type Bad<'a> = &'a dyn Fn(&str, String) -> ConfigError;

impl RawIntake {
    pub(super) fn validate(self, bad: Bad) -> Result<Intake, ConfigError> {
        let positive = |key: &str, v: Option<usize>, default: usize| match v {
            Some(0) => Err(bad(key, "must be at least 1".into())),
            v => Ok(v.unwrap_or(default)),
        };
        let seconds = |key: &str, v: Option<f64>, default: f64| -> Result<f64, ConfigError> {
            let s = v.unwrap_or(default);
            if !s.is_finite() || !(0.0..=1e9).contains(&s) {
                return Err(bad(key, format!("{s} is not a number of seconds >= 0")));
            }
            Ok(s)
        };
        let optional = |s: f64| (s > 0.0).then(|| Duration::from_secs_f64(s));
        let defaults = Limits::default();
        let max_header_bytes = self.max_header_bytes.unwrap_or(defaults.max_header_bytes);
        if !(1024..=16 << 20).contains(&max_header_bytes) {
            return Err(bad(
                "intake.max_header_bytes",
                format!("{max_header_bytes} is outside 1024 ..= 16777216"),
            ));
        }
        let max_line_bytes = self.max_line_bytes.unwrap_or(MAX_LINE_BYTES);
        if !(1..=MAX_LINE_BYTES).contains(&max_line_bytes) {
            return Err(bad(
                "intake.max_line_bytes",
                format!("{max_line_bytes} is outside 1 ..= {MAX_LINE_BYTES}"),
            ));
        }
        if let Some(d) = &self.default_model {
            check_scene_id(d).map_err(|e| bad("intake.default_model", e.to_string()))?;
        }
        let drain = seconds(
            "intake.drain_timeout_s",
            self.drain_timeout_s,
            defaults::DRAIN_TIMEOUT_S,
        )?;
        Ok(Intake {
            default_model: self.default_model,
            segment_lines: self.segment_lines.unwrap_or(defaults::SEGMENT_LINES),
            max_connections: positive(
                "intake.max_connections",
                self.max_connections,
                defaults::MAX_CONNECTIONS,
            )?,
            queue: positive("intake.queue", self.queue, defaults::QUEUE)?,
            limits: Limits {
                max_header_bytes,
                max_gap: self.max_gap.unwrap_or(defaults.max_gap),
                ..defaults
            },
            max_line_bytes,
            idle_timeout: optional(seconds(
                "intake.idle_timeout_s",
                self.idle_timeout_s,
                defaults::IDLE_TIMEOUT_S,
            )?),
            line_timeout: optional(seconds(
                "intake.line_timeout_s",
                self.line_timeout_s,
                defaults::LINE_TIMEOUT_S,
            )?),
            drain_timeout: Duration::from_secs_f64(drain),
        })
    }
}

impl RawEngine {
    pub(super) fn validate(self, bad: Bad) -> Result<EngineOptions, ConfigError> {
        let arena = match self.arena.as_deref() {
            None => Arena::default(),
            Some(a) => a.parse::<Arena>().map_err(|e| bad("engine.arena", e))?,
        };
        let producer_nice = self.producer_nice.unwrap_or(crate::job::STREAM_PRODUCER_NICE);
        if !(0..=19).contains(&producer_nice) {
            return Err(bad(
                "engine.producer_nice",
                format!("{producer_nice} is outside 0 ..= 19"),
            ));
        }
        let providers = match self.ep.as_deref() {
            None => Preference::default(),
            Some(p) => p.parse::<Preference>().map_err(|e| bad("engine.ep", e))?,
        };
        let conv_search = match self.cudnn_conv_algo_search.as_deref() {
            None => ConvSearch::default(),
            Some(c) => c
                .parse::<ConvSearch>()
                .map_err(|e| bad("engine.cudnn_conv_algo_search", e))?,
        };
        let precision = match self.precision.as_deref() {
            None => Precision::default(),
            Some(p) => p.parse::<Precision>().map_err(|e| bad("engine.precision", e))?,
        };
        Ok(EngineOptions {
            ort_lib: self.ort_lib,
            threads: 0,
            providers,
            gpu: GpuOptions {
                device_id: self.device_id.unwrap_or(0),
                conv_search,
                ..GpuOptions::default()
            },
            precision,
            spin: self.spin.unwrap_or(false),
            arena,
            memory_pattern: self.memory_pattern.unwrap_or(false),
            producer_nice,
        })
    }
}
