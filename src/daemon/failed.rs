//! How a scene that failed is reported: before its run started (nothing written), or after it
//! (its folder moved aside with what it committed, which is delivered from there).

use std::path::Path;
use std::sync::{Mutex, PoisonError};

use super::journal::Journal;
use super::worker::WorkerContext;
use super::{DaemonError, log, outbox};
use crate::engine::error_chain;
use crate::source::SceneInfo;

pub(super) fn fail_before_start(ctx: &WorkerContext, info: &SceneInfo, model: &str, origin: &str, e: &DaemonError) {
    ctx.status.count(|t| t.scenes_failed += 1);
    log::event(
        "scene_failed",
        &format!("scene `{}` from {origin}: {}", info.id, error_chain(e)),
        serde_json::json!({"scene_id": info.id, "model": model, "origin": origin, "error": error_chain(e)}),
    );
}

#[allow(clippy::too_many_arguments)]
pub(super) fn fail_after_start(
    ctx: &WorkerContext,
    journal: &Mutex<Journal>,
    info: &SceneInfo,
    model: &str,
    origin: &str,
    folder: &Path,
    error: &str,
    memory: &serde_json::Value,
) {
    ctx.status.count(|t| t.scenes_failed += 1);
    let record = serde_json::json!({
        "scene_id": info.id,
        "model": model,
        "origin": origin,
        "error": error,
    });
    // Nothing of a failed scene is resumed: its journal goes before the move is recorded, so a
    // crash before the rename leaves a folder the next start moves aside to the recorded name
    // (a journal left would have it kept in place, and the queue name a folder not there).
    if let Err(e) = journal.lock().unwrap_or_else(PoisonError::into_inner).abandon() {
        log::event("warning", &error_chain(&e), serde_json::json!({"folder": folder}));
    }
    let relocate = |from: &Path, to: &Path| outbox::relocate(ctx.delivery.as_deref(), from, to);
    let moved = outbox::move_aside(&ctx.outbox, folder, &record, &relocate);
    let (moved_to, note) = match &moved {
        Ok(to) => (serde_json::json!(to), format!("moved to {}", to.display())),
        Err(e) => (
            serde_json::Value::Null,
            format!("could not be moved aside: {}", error_chain(e)),
        ),
    };
    log::event(
        "scene_failed",
        &format!(
            "scene `{}` from {origin}: {error}; its folder {} {note}",
            info.id,
            folder.display()
        ),
        serde_json::json!({
            "scene_id": info.id,
            "model": model,
            "origin": origin,
            "folder": folder,
            "moved_to": moved_to,
            "error": error,
            "memory": memory,
        }),
    );
}
