//! Putting a committed segment of the daemon's into the queue: the entry (with the model's class
//! names and colours and the digest of its maps), retried while the queue cannot be written.

use std::path::Path;

use super::{Entry, Queue};
use crate::daemon::log;
use crate::engine::error_chain;
use crate::source::SceneInfo;

/// Class names and colours of a model, as every message of its scenes carries them.
pub struct Labels {
    classes: Vec<String>,
    colours: Vec<[u8; 3]>,
}

impl Labels {
    /// The labels of model `m`.
    pub fn of(m: &crate::model::Manifest) -> Self {
        Self {
            classes: m.outputs.iter().map(|o| o.name.clone()).collect(),
            colours: (0..m.classes()).map(|c| m.color(c)).collect(),
        }
    }
}

/// Queues one committed segment for delivery, waiting for room under `delivery.queue_max`. It is
/// on disk already, so a queue that cannot be written (state disk full) is retried until it can:
/// the scene, and with it intake, waits. `waiting` hears `true` when the wait starts and `false`
/// when it is over.
#[allow(clippy::too_many_arguments)]
pub fn enqueue(
    q: &Queue,
    labels: &Labels,
    model: &str,
    info: &SceneInfo,
    folder: &Path,
    s: &crate::map::SegmentRecord,
    last: bool,
    waiting: &dyn Fn(bool),
) {
    let entries = vec![Entry {
        seq: 0,
        scene_id: info.id.clone(),
        scene_folder: folder.to_path_buf(),
        segment: s.index as u64,
        folder: s.folder.clone(),
        first_line: s.first_line as u64,
        lines: s.lines as u64,
        samples: info.samples as u64,
        last,
        model: model.to_string(),
        classes: labels.classes.clone(),
        colours: labels.colours.clone(),
        map_info: info.header.map_info.clone(),
        coordinate_system: info.header.coordinate_system.clone(),
        // Unreadable maps get no digest (0): such a segment is never taken for an earlier one
        // unless that one was unreadable too, and the sink reports the read error.
        digest: crate::delivery::message::digest(&s.folder).unwrap_or(0),
    }];
    let mut failures = 0u64;
    let mut waited = 0u64;
    loop {
        let pushed = q.push_within_bound(entries.clone(), std::time::Duration::from_secs(1));
        let held = !matches!(pushed, Ok(Some(_)));
        if held && failures + waited == 0 {
            waiting(true);
        } else if !held && failures + waited > 0 {
            waiting(false);
        }
        match pushed {
            Ok(None) => {
                // No room: the scene (and with it its source) waits, so the queue never holds
                // more than `delivery.queue_max`.
                if waited.is_multiple_of(60) {
                    let st = q.status();
                    log::event(
                        "delivery_full",
                        &format!(
                            "scene `{}` segment {}: committed, waiting for room in the delivery queue \
                             ({} of {} segments not yet acknowledged by every sink)",
                            info.id, s.index, st.queued, st.max
                        ),
                        serde_json::json!({"scene_id": info.id, "segment": s.index, "delivery": st}),
                    );
                }
                waited += 1;
            }
            Ok(Some(pushed)) => {
                let seqs: Vec<u64> = pushed.iter().map(|p| p.seq).collect();
                let again: Vec<u64> = pushed.iter().filter(|p| !p.new).map(|p| p.seq).collect();
                if failures > 0 {
                    log::event(
                        "delivery_resumed",
                        &format!(
                            "scene `{}` queued for delivery after {failures} failed attempt(s)",
                            info.id
                        ),
                        serde_json::json!({"scene_id": info.id}),
                    );
                }
                log::event(
                    "queued",
                    &format!(
                        "scene `{}` segment {}{}: queued for delivery as {:?}{}",
                        info.id,
                        s.index,
                        if last { " (its last)" } else { "" },
                        seqs,
                        if again.is_empty() {
                            ""
                        } else {
                            "; identical to an earlier run's, queued once"
                        }
                    ),
                    serde_json::json!({
                        "scene_id": info.id,
                        "segment": s.index,
                        "last": last,
                        "sequences": seqs,
                        "queued_before": again,
                    }),
                );
                return;
            }
            Err(e) => {
                failures += 1;
                if failures == 1 || failures.is_multiple_of(60) {
                    log::event(
                        "delivery_blocked",
                        &format!(
                            "scene `{}`: its segments cannot be queued ({}); intake waits, retrying every second",
                            info.id,
                            error_chain(&e)
                        ),
                        serde_json::json!({"scene_id": info.id, "error": error_chain(&e)}),
                    );
                }
                std::thread::sleep(std::time::Duration::from_secs(1));
            }
        }
    }
}
