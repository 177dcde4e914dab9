//! The spool intake: complete ENVI cubes dropped into a spool folder (`source::spool`, docs/spool.md)
//! are claimed one at a time on an OS thread and handed to [`Routes::submit`](super::intake::Routes::submit)
//! like a streamed scene. The thread waits for each scene to end before claiming the next, so
//! at most one spool scene is in flight and a busy model leaves the rest in `incoming/`. A written
//! scene's claim moves to `done/` with the scene's record, a failed or refused one to `failed/`
//! with its error; a claim the daemon died holding is handed out again by the spool (recovered).

use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::Sender;

use super::intake::IntakeScene;
use super::{Shared, log};
use crate::engine::error_chain;
use crate::source::spool::{Claimed, Notice, Spool, StopHandle, Wait};
use crate::source::{FileSource, LineSource};

/// How long one wait for a scene lasts before the drain flag is looked at again.
const WAIT: Duration = Duration::from_secs(1);

/// A claimed cube as a scene.
struct SpoolScene {
    source: FileSource,
    claimed: Claimed,
    reply: Sender<()>,
}

impl IntakeScene for SpoolScene {
    fn source(&mut self) -> &mut dyn LineSource {
        &mut self.source
    }

    fn release(self: Box<Self>, outcome: Result<&serde_json::Value, &str>) {
        let Self { claimed, reply, .. } = *self;
        let id = claimed.id().to_string();
        let moved = match outcome {
            Ok(record) => claimed.done(record),
            Err(error) => claimed.failed(error),
        };
        match moved {
            Ok(to) => log::event(
                "spool_released",
                &format!("spool scene `{id}` moved to {}", to.display()),
                serde_json::json!({"scene_id": id, "to": to}),
            ),
            Err(e) => log::event(
                "spool_failed",
                &format!(
                    "spool scene `{id}`: {}; it stays claimed and is handed out again",
                    error_chain(&e)
                ),
                serde_json::json!({"scene_id": id}),
            ),
        }
        let _ = reply.send(());
    }
}

/// Claims and submits scenes from `spool` until `stop` is used (a drain).
pub fn run(mut spool: Spool, shared: Arc<Shared>, stop: StopHandle) {
    let root = spool.root().to_path_buf();
    loop {
        for n in spool.take_notices() {
            let msg = match n {
                Notice::Rejected { name, to, reason } => {
                    format!("spool: `{name}` refused and moved to {}: {reason}", to.display())
                }
                Notice::Skipped(e) => format!("spool: {}", error_chain(&e)),
            };
            shared.status.count(|t| t.refused += 1);
            log::event("spool_notice", &msg, serde_json::json!({"spool": root}));
        }
        if stop.is_stopped() {
            return;
        }
        match spool.wait_ready(WAIT) {
            Ok(Wait::Ready) => {}
            Ok(Wait::TimedOut) => continue,
            Ok(Wait::Stopped) => return,
            Err(e) => {
                log::event(
                    "spool_failed",
                    &format!("spool: {}", error_chain(&e)),
                    serde_json::Value::Null,
                );
                std::thread::sleep(WAIT);
                continue;
            }
        }
        let claimed = match spool.claim_next() {
            Ok(Some(c)) => c,
            Ok(None) => continue,
            Err(e) => {
                log::event(
                    "spool_failed",
                    &format!("spool: {}", error_chain(&e)),
                    serde_json::Value::Null,
                );
                continue;
            }
        };
        let source = match claimed.open_source() {
            Ok(s) => s,
            Err(e) => {
                let error = error_chain(&e);
                log::event(
                    "refused",
                    &format!("spool scene `{}`: refused: {error}", claimed.id()),
                    serde_json::json!({"scene_id": claimed.id(), "error": error}),
                );
                shared.status.count(|t| t.refused += 1);
                let _ = claimed.failed(&error);
                continue;
            }
        };
        let (reply, done) = crossbeam_channel::bounded(1);
        let scene = Box::new(SpoolScene { source, claimed, reply });
        if let Err((refusal, scene)) = shared.routes().submit(scene) {
            let error = error_chain(&refusal);
            log::event(
                "refused",
                &format!("spool: refused: {error}"),
                serde_json::json!({"error": error}),
            );
            shared.status.count(|t| t.refused += 1);
            scene.release(Err(&error));
        }
        // One spool scene in flight at a time; a drain waits for it.
        let _ = done.recv();
    }
}
