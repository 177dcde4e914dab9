//! What the daemon is doing, for the control socket's `status` and systemd's `STATUS=` line:
//! scenes in flight (lines done, lines/s, batch, model) and running totals.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde::Serialize;

/// One scene being run.
#[derive(Debug)]
pub struct SceneEntry {
    /// The scene id.
    pub scene_id: String,
    /// Its outbox folder.
    pub folder: PathBuf,
    /// The model running it.
    pub model: String,
    /// `dense` or `patch`.
    pub mode: &'static str,
    /// Units per batch now (the pipeline reports it after each batch).
    pub batch: AtomicU64,
    /// Pixels per line.
    pub samples: usize,
    /// Lines read from the source so far.
    pub lines: AtomicU64,
    /// Pixels whose maps are done.
    pub pixels: AtomicU64,
    /// When its first line was asked for.
    pub started: Instant,
}

/// A scene in flight as `status` reports it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct SceneReport {
    /// The scene id.
    pub scene_id: String,
    /// Its outbox folder.
    pub folder: PathBuf,
    /// The model.
    pub model: String,
    /// `dense` or `patch`.
    pub mode: &'static str,
    /// Units per batch now.
    pub batch: u64,
    /// Lines received.
    pub lines: u64,
    /// Lines whose maps are done.
    pub lines_done: u64,
    /// Lines received per second since the scene began.
    pub lines_per_s: f64,
    /// Seconds since the scene began.
    pub elapsed_s: f64,
}

/// Counts since the daemon started.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct Totals {
    /// Scenes written whole.
    pub scenes_done: u64,
    /// Scenes that failed (moved aside).
    pub scenes_failed: u64,
    /// Scenes or connections refused before anything was written.
    pub refused: u64,
    /// Connections accepted.
    pub connections: u64,
    /// Lines of the scenes done.
    pub lines: u64,
}

/// The scenes in flight and the totals.
#[derive(Debug, Default)]
pub struct Status {
    next: AtomicU64,
    scenes: Mutex<BTreeMap<u64, Arc<SceneEntry>>>,
    totals: Mutex<Totals>,
    paused: Mutex<BTreeMap<String, String>>,
}

impl Status {
    fn scenes(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Arc<SceneEntry>>> {
        self.scenes.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Records `entry` as running; the key [`Status::end`] takes.
    pub fn begin(&self, entry: SceneEntry) -> (u64, Arc<SceneEntry>) {
        let key = self.next.fetch_add(1, Ordering::Relaxed);
        let entry = Arc::new(entry);
        self.scenes().insert(key, entry.clone());
        (key, entry)
    }

    /// The scene `key` is over.
    pub fn end(&self, key: u64) {
        self.scenes().remove(&key);
    }

    /// Changes the totals.
    pub fn count(&self, f: impl FnOnce(&mut Totals)) {
        f(&mut self.totals.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
    }

    /// The totals now.
    pub fn totals(&self) -> Totals {
        *self.totals.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Records why intake is paused for `who` (`None`: no longer paused).
    pub fn set_paused(&self, who: &str, why: Option<String>) {
        let mut p = self.paused.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        match why {
            Some(w) => p.insert(who.to_string(), w),
            None => p.remove(who),
        };
    }

    /// Why intake is paused, by model; empty when it is not.
    pub fn paused(&self) -> BTreeMap<String, String> {
        self.paused
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// The scenes in flight now.
    pub fn in_flight(&self) -> Vec<SceneReport> {
        self.scenes()
            .values()
            .map(|e| {
                let elapsed_s = e.started.elapsed().as_secs_f64();
                let lines = e.lines.load(Ordering::Relaxed);
                SceneReport {
                    scene_id: e.scene_id.clone(),
                    folder: e.folder.clone(),
                    model: e.model.clone(),
                    mode: e.mode,
                    batch: e.batch.load(Ordering::Relaxed),
                    lines,
                    lines_done: e.pixels.load(Ordering::Relaxed) / e.samples.max(1) as u64,
                    lines_per_s: if elapsed_s > 0.0 { lines as f64 / elapsed_s } else { 0.0 },
                    elapsed_s,
                }
            })
            .collect()
    }

    /// One line for systemd's `STATUS=`.
    pub fn summary(&self, state: &str) -> String {
        let flying = self.in_flight();
        let t = self.totals();
        let rate: f64 = flying.iter().map(|s| s.lines_per_s).sum();
        let paused = self.paused();
        let pause = match paused.values().next() {
            Some(why) => format!("; intake paused: {why}"),
            None => String::new(),
        };
        format!(
            "{state}: {} scene(s) in flight ({rate:.0} lines/s); {} done, {} failed, {} refused{pause}",
            flying.len(),
            t.scenes_done,
            t.scenes_failed,
            t.refused
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scenes_in_flight_report_their_progress_until_they_end() {
        let s = Status::default();
        let (key, e) = s.begin(SceneEntry {
            scene_id: "a".into(),
            folder: "/o/a".into(),
            model: "m".into(),
            mode: "dense",
            batch: AtomicU64::new(2),
            samples: 10,
            lines: AtomicU64::new(0),
            pixels: AtomicU64::new(0),
            started: Instant::now(),
        });
        e.lines.store(7, Ordering::Relaxed);
        e.pixels.store(45, Ordering::Relaxed);
        let r = &s.in_flight()[0];
        assert_eq!((r.lines, r.lines_done, r.batch), (7, 4, 2));
        assert!(r.lines_per_s > 0.0);
        s.count(|t| t.scenes_done += 1);
        assert!(s.summary("serving").starts_with("serving: 1 scene(s) in flight"));
        s.end(key);
        assert!(s.in_flight().is_empty());
        s.set_paused("m", Some("the outbox is full".into()));
        assert!(s.summary("serving").ends_with("intake paused: the outbox is full"));
        s.set_paused("m", None);
        assert!(s.paused().is_empty());
        assert_eq!(s.totals().scenes_done, 1);
    }
}
