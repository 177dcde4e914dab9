//! The daemon's configuration file (TOML), in two stages: [`parse`] reads the text into raw structs
//! that refuse unknown keys and wrong types (the `toml` crate's message names the key and its
//! line), and [`RawConfig::validate`] checks ranges and names without touching any file. Opening
//! models and binding sockets happens later, in the service. `systemd/hsiedge.toml` documents
//! every key.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::engine::{Arena, ConvSearch, EngineOptions, GpuOptions, Precision, Preference};
use crate::job::{BudgetSettings, ModeChoice, SessionBatch, SessionSpec};
use crate::source::stream::Limits;
use crate::source::{MAX_LINE_BYTES, check_scene_id};

/// Why a configuration cannot be used; every variant names the file, and the key when one is at fault.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("reading the configuration {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// Not TOML, an unknown key or a value of the wrong type (the message names the key and line).
    #[error("{path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message.
        message: String,
    },
    /// A value out of range or inconsistent with another.
    #[error("{path}: key `{key}`: {message}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// The key, as a dotted path (`models.tiny.batch`).
        key: String,
        /// What is wrong.
        message: String,
    },
}

/// The file as written: every table refuses keys it does not know.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    /// `[listen]`.
    #[serde(default)]
    pub listen: RawListen,
    /// `[paths]`.
    pub paths: RawPaths,
    /// `[intake]`.
    #[serde(default)]
    pub intake: RawIntake,
    /// `[engine]`.
    #[serde(default)]
    pub engine: RawEngine,
    /// `[models.NAME]`.
    #[serde(default)]
    pub models: BTreeMap<String, RawModel>,
    /// `[telemetry]`.
    #[serde(default)]
    pub telemetry: RawTelemetry,
    /// `[delivery]`: the queue and its sinks besides the outbox.
    #[serde(default)]
    pub delivery: crate::delivery::RawDelivery,
}

/// `[telemetry]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTelemetry {
    /// A loopback `IP:PORT` to serve Prometheus `/metrics` on; none by default.
    pub metrics: Option<String>,
}

/// `[listen]`: where sensors connect (at least one of the two).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawListen {
    /// `IP:PORT`.
    pub tcp: Option<String>,
    /// A Unix socket path.
    pub unix: Option<PathBuf>,
}

/// `[paths]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPaths {
    /// Where each scene's maps go, one folder per scene.
    pub outbox: PathBuf,
    /// The daemon's own state (scenes in flight, the scene log).
    pub state: PathBuf,
    /// The control socket.
    pub control: PathBuf,
    /// A spool folder of complete cubes to take in (docs/spool.md); none by default.
    pub spool: Option<PathBuf>,
}

/// `[intake]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawIntake {
    /// The model of scenes that name none.
    pub default_model: Option<String>,
    /// Lines per committed segment (0: one set per scene).
    pub segment_lines: Option<usize>,
    /// Connections served at once.
    pub max_connections: Option<usize>,
    /// Scenes waiting for a model's workers.
    pub queue: Option<usize>,
    /// The longest scene message.
    pub max_header_bytes: Option<usize>,
    /// The longest raw line.
    pub max_line_bytes: Option<usize>,
    /// The most lines one message may leave missing.
    pub max_gap: Option<u64>,
    /// Seconds a connection may wait between scenes (0: no limit).
    pub idle_timeout_s: Option<f64>,
    /// Seconds a scene may wait for its next message (0: no limit).
    pub line_timeout_s: Option<f64>,
    /// Seconds a drain waits for scenes in flight before cutting them off.
    pub drain_timeout_s: Option<f64>,
}

/// `[engine]`: ONNX Runtime settings every model shares.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawEngine {
    /// The ONNX Runtime library.
    pub ort_lib: Option<PathBuf>,
    /// `exact`, `pow2` or `off`.
    pub arena: Option<String>,
    /// Spin-waiting intra-op threads.
    pub spin: Option<bool>,
    /// ONNX Runtime's memory pattern.
    pub memory_pattern: Option<bool>,
    /// Nice increment of the tiling thread.
    pub producer_nice: Option<i32>,
    /// Execution providers in order of preference, e.g. `"cuda,cpu"` (a later one is a fallback).
    pub ep: Option<String>,
    /// cuDNN convolution search: `heuristic`, `exhaustive` or `default`.
    pub cudnn_conv_algo_search: Option<String>,
    /// CUDA device ordinal.
    pub device_id: Option<u32>,
    /// `fp32` or `fp16` model files.
    pub precision: Option<String>,
}

/// `[models.NAME]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawModel {
    /// The model manifest.
    pub manifest: PathBuf,
    /// `auto`, `dense` or `patch`.
    pub mode: Option<String>,
    /// Units per batch, or `"auto"`.
    pub batch: Option<RawBatch>,
    /// Tile side.
    pub tile: Option<usize>,
    /// Intra-op threads (0: one per core).
    pub threads: Option<usize>,
    /// Write every output channel.
    pub keep_scores: Option<bool>,
    /// Scenes this model runs at once, each on a session of its own.
    pub workers: Option<usize>,
}

/// `models.NAME.batch`: a whole number, or `"auto"`.
#[derive(Debug, Clone, PartialEq)]
pub enum RawBatch {
    /// Units per batch.
    Units(i64),
    /// `"auto"` (anything else is refused by validation).
    Word(String),
}

impl<'de> Deserialize<'de> for RawBatch {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = RawBatch;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a whole number or \"auto\"")
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<RawBatch, E> {
                Ok(RawBatch::Units(v))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<RawBatch, E> {
                Ok(RawBatch::Units(i64::try_from(v).unwrap_or(i64::MAX)))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<RawBatch, E> {
                Ok(RawBatch::Word(v.to_string()))
            }
        }
        d.deserialize_any(Visitor)
    }
}

/// Defaults of the keys left out.
/// The most workers a model may have for each CPU.
const WORKERS_PER_CPU: usize = 4;

pub mod defaults {
    /// `intake.segment_lines`.
    pub const SEGMENT_LINES: usize = 4096;
    /// `intake.max_connections`.
    pub const MAX_CONNECTIONS: usize = 16;
    /// `intake.queue`.
    pub const QUEUE: usize = 2;
    /// `intake.idle_timeout_s`.
    pub const IDLE_TIMEOUT_S: f64 = 300.0;
    /// `intake.line_timeout_s`.
    pub const LINE_TIMEOUT_S: f64 = 60.0;
    /// `intake.drain_timeout_s`: below systemd's default stop timeout (90 s), so a drain that has
    /// to cut scenes off still ends on its own terms.
    pub const DRAIN_TIMEOUT_S: f64 = 60.0;
    /// `models.NAME.workers`.
    pub const WORKERS: usize = 1;
}

/// A validated configuration: every value in range, every path absolute.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The file it came from.
    pub path: PathBuf,
    /// The TCP listener's address.
    pub tcp: Option<SocketAddr>,
    /// The Unix listener's path.
    pub unix: Option<PathBuf>,
    /// The outbox.
    pub outbox: PathBuf,
    /// The state folder.
    pub state: PathBuf,
    /// The control socket.
    pub control: PathBuf,
    /// The spool folder taken in, if any.
    pub spool: Option<PathBuf>,
    /// Settings of scene intake.
    pub intake: Intake,
    /// The models, by name.
    pub models: BTreeMap<String, ModelConfig>,
    /// Where `/metrics` is served (a loopback address), if anywhere.
    pub metrics: Option<SocketAddr>,
    /// Delivery downstream of the outbox.
    pub delivery: crate::delivery::DeliveryConfig,
}

/// `[intake]`, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct Intake {
    /// The model of scenes that name none.
    pub default_model: Option<String>,
    /// Lines per committed segment (0: one set per scene).
    pub segment_lines: usize,
    /// Connections served at once; more wait in the listen backlog.
    pub max_connections: usize,
    /// Scenes waiting per model for a free worker (their connections wait too).
    pub queue: usize,
    /// The stream's limits.
    pub limits: Limits,
    /// The longest raw line.
    pub max_line_bytes: usize,
    /// How long a connection may wait between scenes.
    pub idle_timeout: Option<Duration>,
    /// How long a scene may wait for its next message.
    pub line_timeout: Option<Duration>,
    /// How long a drain waits for scenes in flight.
    pub drain_timeout: Duration,
}

/// One model, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// What its sessions are built from.
    pub session: SessionSpec,
    /// Sessions (and worker threads) of this model.
    pub workers: usize,
}

/// Reads and validates the configuration at `path`.
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    parse(&text, path)?.validate(path)
}

/// Parses `text` (from `path`, for messages) into the raw structs.
pub fn parse(text: &str, path: &Path) -> Result<RawConfig, ConfigError> {
    toml::from_str(text).map_err(|e| ConfigError::Parse {
        path: path.to_path_buf(),
        message: e.to_string().trim_end().to_string(),
    })
}

impl RawConfig {
    /// Checks every value (no I/O); relative paths are taken from the configuration's folder.
    pub fn validate(self, path: &Path) -> Result<Config, ConfigError> {
        let bad = |key: &str, message: String| ConfigError::Invalid {
            path: path.to_path_buf(),
            key: key.to_string(),
            message,
        };
        let base = path.parent().unwrap_or(Path::new("/"));
        let abs = |p: &Path| if p.is_absolute() { p.to_path_buf() } else { base.join(p) };
        let tcp = self
            .listen
            .tcp
            .as_deref()
            .map(|a| {
                a.parse::<SocketAddr>()
                    .map_err(|_| bad("listen.tcp", format!("`{a}` is not IP:PORT (e.g. 0.0.0.0:5555)")))
            })
            .transpose()?;
        let unix = self.listen.unix.as_deref().map(abs);
        if self.paths.spool.as_ref().is_some_and(|p| p.as_os_str().is_empty()) {
            return Err(bad("paths.spool", "is empty".into()));
        }
        let spool = self.paths.spool.as_deref().map(abs);
        if tcp.is_none() && unix.is_none() && spool.is_none() {
            return Err(bad(
                "listen",
                "no intake: give listen.tcp, listen.unix or paths.spool (or several)".into(),
            ));
        }

        for (key, p) in [
            ("paths.outbox", &self.paths.outbox),
            ("paths.state", &self.paths.state),
            ("paths.control", &self.paths.control),
        ] {
            if p.as_os_str().is_empty() {
                return Err(bad(key, "is empty".into()));
            }
        }
        let (outbox, state, control) = (
            abs(&self.paths.outbox),
            abs(&self.paths.state),
            abs(&self.paths.control),
        );
        if outbox == state || outbox.starts_with(&state) || state.starts_with(&outbox) {
            return Err(bad(
                "paths.state",
                format!(
                    "{} and the outbox {} must not hold one another",
                    state.display(),
                    outbox.display()
                ),
            ));
        }
        if unix.as_ref() == Some(&control) {
            return Err(bad("paths.control", "is the same socket as listen.unix".into()));
        }

        let metrics = self
            .telemetry
            .metrics
            .as_deref()
            .map(|a| match a.parse::<SocketAddr>() {
                Ok(addr) if addr.ip().is_loopback() => Ok(addr),
                Ok(_) => Err(bad(
                    "telemetry.metrics",
                    format!("`{a}` is not a loopback address (the endpoint has no authentication: use 127.0.0.1:PORT)"),
                )),
                Err(_) => Err(bad(
                    "telemetry.metrics",
                    format!("`{a}` is not IP:PORT (e.g. 127.0.0.1:9464)"),
                )),
            })
            .transpose()?;
        let intake = self.intake.validate(&bad)?;
        let delivery = self
            .delivery
            .validate(base)
            .map_err(|(key, message)| bad(&key, message))?;
        if let Some(crate::delivery::config::SubscriberAddr::Unix(p)) = &delivery.subscriber
            && (Some(p) == unix.as_ref() || *p == control)
        {
            return Err(bad(
                "delivery.subscriber_unix",
                "is the same socket as listen.unix or paths.control".into(),
            ));
        }
        let engine = self.engine.validate(&bad)?;
        if self.models.is_empty() {
            return Err(bad("models", "no model: add a [models.NAME] table".into()));
        }
        let mut models = BTreeMap::new();
        for (name, m) in self.models {
            let key = |k: &str| format!("models.{name}.{k}");
            check_scene_id(&name).map_err(|e| bad(&format!("models.{name}"), format!("a model name is {e}")))?;
            if m.manifest.as_os_str().is_empty() {
                return Err(bad(&key("manifest"), "is empty".into()));
            }
            let mode = match m.mode.as_deref().unwrap_or("auto") {
                "auto" => ModeChoice::Auto,
                "dense" => ModeChoice::Fixed(crate::pipeline::Mode::Dense),
                "patch" => ModeChoice::Fixed(crate::pipeline::Mode::Patch),
                other => return Err(bad(&key("mode"), format!("`{other}` is not auto, dense or patch"))),
            };
            let at_least_one = |k: &str, v: Option<usize>, default: usize| match v {
                Some(0) => Err(bad(&key(k), "must be at least 1".into())),
                v => Ok(v.unwrap_or(default)),
            };
            let batch = match m.batch {
                None => SessionBatch::ModeDefault,
                Some(RawBatch::Units(n)) => match usize::try_from(n) {
                    Ok(n) if n >= 1 => SessionBatch::Fixed(n),
                    _ => return Err(bad(&key("batch"), format!("{n} must be at least 1"))),
                },
                Some(RawBatch::Word(w)) if w == "auto" => SessionBatch::Auto(BudgetSettings {
                    // Streams reuse a session: no cached sweep of another run caps it.
                    sweep_cache: None,
                    ..BudgetSettings::default()
                }),
                Some(RawBatch::Word(w)) => {
                    return Err(bad(&key("batch"), format!("`{w}` is not a whole number or \"auto\"")));
                }
            };
            let tile = at_least_one("tile", m.tile, crate::job::DEFAULT_TILE)?;
            let workers = at_least_one("workers", m.workers, defaults::WORKERS)?;
            let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
            if workers > WORKERS_PER_CPU * cpus {
                return Err(bad(
                    &key("workers"),
                    format!(
                        "{workers} workers on {cpus} CPUs: each holds a session of its own; at most {} (workers of a GPU model mostly wait on the device, so more than one a CPU can pay)",
                        WORKERS_PER_CPU * cpus
                    ),
                ));
            }
            let threads = m.threads.unwrap_or(0);
            if threads > cpus {
                return Err(bad(
                    &key("threads"),
                    format!(
                        "{threads} intra-op threads on {cpus} CPUs: oversubscribed threads only wait on each other"
                    ),
                ));
            }
            models.insert(
                name.clone(),
                ModelConfig {
                    session: SessionSpec {
                        manifest: abs(&m.manifest),
                        mode,
                        batch,
                        tile,
                        engine: EngineOptions {
                            threads,
                            ..engine.clone()
                        },
                        keep_scores: m.keep_scores.unwrap_or(false),
                    },
                    workers,
                },
            );
        }
        match &intake.default_model {
            Some(d) if !models.contains_key(d) => {
                return Err(bad(
                    "intake.default_model",
                    format!(
                        "`{d}` is not a configured model ({})",
                        models.keys().cloned().collect::<Vec<_>>().join(", ")
                    ),
                ));
            }
            _ => {}
        }
        Ok(Config {
            path: path.to_path_buf(),
            tcp,
            spool,
            unix,
            outbox,
            state,
            control,
            intake,
            models,
            metrics,
            delivery,
        })
    }
}

impl Config {
    /// The keys whose change a reload cannot apply (sockets and folders are bound at start):
    /// their dotted names, empty when `new` differs from `self` only in what a reload applies.
    pub fn restart_only_changes(&self, new: &Config) -> Vec<&'static str> {
        let mut keys = Vec::new();
        if self.spool != new.spool {
            keys.push("paths.spool");
        }
        if self.tcp != new.tcp {
            keys.push("listen.tcp");
        }
        if self.unix != new.unix {
            keys.push("listen.unix");
        }
        if self.outbox != new.outbox {
            keys.push("paths.outbox");
        }
        if self.state != new.state {
            keys.push("paths.state");
        }
        if self.control != new.control {
            keys.push("paths.control");
        }
        if self.delivery != new.delivery {
            keys.push("delivery");
        }
        if self.intake.max_connections != new.intake.max_connections {
            keys.push("intake.max_connections");
        }
        if self.metrics != new.metrics {
            keys.push("telemetry.metrics");
        }
        keys
    }
}

mod sections;
#[cfg(test)]
mod tests;
