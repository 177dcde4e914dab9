//! Spool intake: complete cubes taken from a spool folder (`source::spool`), each claimed, run
//! like a streamed scene, and moved to `done/` or `failed/` once its run is over.

use std::path::Path;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use super::intake::{IntakeScene, Refusal};
use super::{DaemonError, Shared, log};
use crate::engine::error_chain;
use crate::source::spool::{AttemptMark, Claimed, Notice, Spool, SpoolOptions, StopHandle, Wait};
use crate::source::{FileSource, LineSource};

/// How long one wait for the spool lasts before the drain flag is looked at again.
const WAIT: Duration = Duration::from_millis(500);

/// A claimed cube on its way through a model's worker.
struct SpoolScene {
    claimed: Claimed,
    source: FileSource,
}

impl IntakeScene for SpoolScene {
    fn source(&mut self) -> &mut dyn LineSource {
        &mut self.source
    }

    fn durable_input(&self) -> bool {
        true
    }

    fn reopen(&mut self) -> bool {
        match self.claimed.open_source() {
            Ok(s) => {
                self.source = s;
                true
            }
            Err(e) => {
                log::event(
                    "warning",
                    &format!("scene `{}`: reading it again: {}", self.claimed.id(), error_chain(&e)),
                    serde_json::json!({"scene": self.claimed.id()}),
                );
                false
            }
        }
    }

    fn refused(self: Box<Self>, reason: &str) {
        let id = self.claimed.id().to_string();
        if let Err(e) = self.claimed.failed(reason) {
            log::event(
                "warning",
                &format!("scene `{id}`: {}", error_chain(&e)),
                serde_json::json!({"scene": id}),
            );
        }
    }

    fn started(&mut self) {
        if let Err(e) = self.claimed.start() {
            // Uncounted, a cube that kills the daemon is retried past its limit.
            log::event(
                "warning",
                &format!("scene `{}`: {}", self.claimed.id(), error_chain(&e)),
                serde_json::json!({"scene": self.claimed.id()}),
            );
        }
    }

    fn attempt_mark(&self) -> Option<AttemptMark> {
        Some(self.claimed.attempt_mark())
    }

    fn release(self: Box<Self>, ok: bool) {
        let Self { claimed, source } = *self;
        let id = claimed.id().to_string();
        let moved = if ok {
            claimed.done(&serde_json::json!({"lines": source.stats().lines}))
        } else {
            claimed.failed("the run failed: the daemon's log and OUTBOX/.failed hold the error")
        };
        match moved {
            Ok(to) => log::event(
                "spool",
                &format!("scene `{id}` moved to {}", to.display()),
                serde_json::json!({"scene": id, "ok": ok, "to": to}),
            ),
            Err(e) => log::event(
                "warning",
                &format!("scene `{id}`: {}", error_chain(&e)),
                serde_json::json!({"scene": id}),
            ),
        }
    }
}

/// The running spool intake: a thread that claims scenes and submits them.
pub struct SpoolIntake {
    stop: StopHandle,
    thread: JoinHandle<()>,
}

impl SpoolIntake {
    /// Opens the spool at `root` and starts taking scenes in, until [`SpoolIntake::stop`] or a
    /// drain.
    pub fn start(root: &Path, shared: Arc<Shared>) -> Result<Self, DaemonError> {
        let mut spool = Spool::open(root, SpoolOptions::default()).map_err(|e| DaemonError::Runtime {
            what: "opening the spool folder",
            source: std::io::Error::other(error_chain(&e)),
        })?;
        let stop = spool.stop_handle();
        let thread = std::thread::Builder::new()
            .name("hsiedge-spool".into())
            .spawn(move || take_in(&mut spool, &shared))
            .map_err(|source| DaemonError::Runtime {
                what: "starting the spool thread",
                source,
            })?;
        log::event(
            "listening",
            &format!("taking scenes from the spool {}", root.display()),
            serde_json::json!({"spool": root}),
        );
        Ok(Self { stop, thread })
    }

    /// Stops taking scenes in; scenes already submitted run on. Waits for the thread.
    pub fn stop(self) {
        self.stop.stop();
        let _ = self.thread.join();
    }
}

fn take_in(spool: &mut Spool, shared: &Shared) {
    while !shared.draining() {
        match spool.wait_ready(WAIT) {
            Ok(Wait::Stopped) => break,
            Ok(Wait::TimedOut) => {}
            Ok(Wait::Ready) => loop {
                if shared.draining() {
                    break;
                }
                match spool.claim_next() {
                    Ok(Some(claimed)) => submit(claimed, shared),
                    Ok(None) => break,
                    Err(e) => {
                        log::event("warning", &error_chain(&e), serde_json::Value::Null);
                        break;
                    }
                }
            },
            Err(e) => log::event("warning", &error_chain(&e), serde_json::Value::Null),
        }
        for n in spool.take_notices() {
            match n {
                Notice::Rejected { name, to, reason } => log::event(
                    "refused",
                    &format!("spool: `{name}` moved to {}: {reason}", to.display()),
                    serde_json::json!({"scene": name, "to": to, "reason": reason}),
                ),
                Notice::Skipped(e) => log::event("warning", &error_chain(&e), serde_json::Value::Null),
            }
        }
    }
}

/// Routes a claimed cube to its model's queue (waiting while it is full), or fails it with the
/// reason it cannot run.
fn submit(claimed: Claimed, shared: &Shared) {
    let source = match claimed.open_source() {
        Ok(s) => s,
        Err(e) => {
            let reason = error_chain(&e);
            log::event(
                "refused",
                &format!("spool: scene `{}`: {reason}", claimed.id()),
                serde_json::json!({"scene": claimed.id()}),
            );
            if let Err(e) = claimed.failed(&reason) {
                log::event("warning", &error_chain(&e), serde_json::Value::Null);
            }
            return;
        }
    };
    let scene = Box::new(SpoolScene { claimed, source });
    match shared.routes().submit(scene) {
        Ok(()) => {}
        // The workers are gone (a drain, or a model that stopped): the claim stays in work/ and the
        // next start takes the scene up again.
        Err((refusal @ Refusal::Stopped { .. }, scene)) => {
            log::event(
                "warning",
                &format!("{refusal}; left in the spool"),
                serde_json::Value::Null,
            );
            drop(scene);
        }
        Err((refusal, scene)) => {
            let reason = error_chain(&refusal);
            log::event("refused", &reason, serde_json::Value::Null);
            scene.refused(&reason);
        }
    }
}
