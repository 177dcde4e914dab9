//! `hsiedge serve`: one long-running process serving many scenes.
//!
//! Threads: tokio (one thread, the `service` loop) only at the I/O edges — accepting on the listeners,
//! the control socket, signals, systemd notifications. Each sensor connection is read on OS
//! threads through blocking `Read`: its own thread reads scene headers ([`listen`]), and a scene's
//! lines are read by the model worker that runs it ([`worker`]), each worker owning one
//! `ModelSession` built once. Every hand-over is a bounded channel: a model's queue holds at most
//! `intake.queue` scenes, and a connection whose scene waits there is not read, so a slow model or
//! sink slows the sensor (TCP backpressure) instead of buffering.
//!
//! Robustness: a scene that fails is logged with its error chain (one JSON line) and its folder
//! moved aside; the connection closes and the others go on. Each run is wrapped in
//! `catch_unwind`, which only helps where panics unwind (test and dev builds): the release
//! profile has `panic = "abort"`, so there the daemon's robustness comes from not panicking
//! (typed errors on every input path) and from systemd restarting it (`Restart=on-failure`), with
//! [`outbox::recover`] moving aside what the killed process left in flight.

pub mod check;
pub mod config;
pub mod conn;
pub mod control;
mod failed;
pub mod intake;
pub mod journal;
pub mod listen;
pub mod log;
pub mod metrics;
pub mod nospace;
pub mod notify;
pub mod outbox;
mod pause;
pub mod replay;
mod service;
mod spool;
pub mod status;
pub mod worker;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Instant;

pub use config::{Config, ConfigError};
pub use service::serve;

use conn::Connections;
use intake::Routes;
use status::Status;

/// Errors that stop the daemon from starting or a reload from applying, each naming what failed.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// The configuration.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A model could not be loaded.
    #[error("model `{name}`")]
    Model {
        /// The model's name in the configuration.
        name: String,
        /// Why.
        source: crate::job::JobError,
    },
    /// The `/metrics` endpoint (`telemetry.metrics`) could not be set up.
    #[error("telemetry.metrics")]
    Metrics(#[source] crate::telemetry::TelemetryError),
    /// A socket could not be bound.
    #[error("binding {what}")]
    Bind {
        /// The listener (`tcp ADDR`, `unix PATH`).
        what: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// A file or folder of the daemon's.
    #[error("{path}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A thread could not be started.
    #[error("starting {what}")]
    Thread {
        /// Which thread.
        what: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The I/O runtime, signal handlers or the notification socket.
    #[error("{what}")]
    Runtime {
        /// What was being set up.
        what: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
}

/// What the intake threads, the workers and the control socket share.
#[derive(Debug)]
pub struct Shared {
    routes: RwLock<Arc<Routes>>,
    /// Scenes in flight and totals.
    pub status: Arc<Status>,
    /// Open sensor connections.
    pub conns: Connections,
    draining: AtomicBool,
    started: Instant,
    listening: Vec<String>,
    config_path: PathBuf,
    delivery: Option<Arc<crate::delivery::Queue>>,
}

impl Shared {
    fn new(
        routes: Routes,
        status: Arc<Status>,
        listening: Vec<String>,
        config_path: PathBuf,
        delivery: Option<Arc<crate::delivery::Queue>>,
    ) -> Self {
        Self {
            routes: RwLock::new(Arc::new(routes)),
            status,
            conns: Connections::default(),
            draining: AtomicBool::new(false),
            started: Instant::now(),
            listening,
            config_path,
            delivery,
        }
    }

    /// The routes in force now (a scene keeps the ones it was accepted under).
    pub fn routes(&self) -> Arc<Routes> {
        self.routes
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn set_routes(&self, routes: Routes) {
        *self.routes.write().unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(routes);
    }

    /// Whether a drain has begun.
    pub fn draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    fn state(&self) -> &'static str {
        if self.draining() { "draining" } else { "serving" }
    }

    /// The control socket's `status` response.
    pub fn status_report(&self) -> serde_json::Value {
        let routes = self.routes();
        let models: serde_json::Map<String, serde_json::Value> = routes
            .models
            .iter()
            .map(|(name, r)| {
                (
                    name.clone(),
                    serde_json::json!({
                        "model": r.manifest.name,
                        "manifest": r.manifest.path,
                        "mode": worker::mode_name(r.run.mode),
                        "batch": r.run.batch,
                        "batch_reason": r.batch_reason,
                        "tile": r.run.tile,
                        "workers": r.workers,
                        "queued": r.tx.len(),
                    }),
                )
            })
            .collect();
        let root = std::path::Path::new("/");
        let own = crate::job::anon_bytes(root);
        let budget = crate::budget::read_system_budget(
            root,
            &crate::budget::BudgetConfig {
                own_bytes: own,
                ..Default::default()
            },
        );
        let budget = match budget {
            Ok(b) => serde_json::json!({
                "binding": b.binding.name(),
                "budget_bytes": b.budget_bytes,
                "detail": b.sources.iter().find(|s| s.kind == b.binding).map(|s| s.detail.clone()),
            }),
            Err(e) => serde_json::json!({"error": crate::engine::error_chain(&e)}),
        };
        serde_json::json!({
            "ok": true,
            "state": self.state(),
            "pid": std::process::id(),
            "uptime_s": self.started.elapsed().as_secs_f64(),
            "config": self.config_path,
            "listening": self.listening,
            "connections": self.conns.len(),
            "in_flight": self.status.in_flight(),
            "totals": self.status.totals(),
            "default_model": routes.default_model,
            "segment_lines": routes.segment_lines,
            "models": models,
            "rss_anon_bytes": own,
            "memory_budget": budget,
            "delivery": self.delivery.as_ref().map(|q| q.status()),
            "paused": self.status.paused(),
        })
    }
}
