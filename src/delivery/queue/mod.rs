//! The durable delivery queue: an append-only log of our own in `STATE/delivery/queue.log`.
//!
//! Why a log and not an embedded store (`redb`, `sled`): the queue holds a few small records per
//! committed segment (the maps themselves stay in the outbox, written once by the set-atomic
//! commit), is read whole at start and is only ever appended to, so a log of length-prefixed
//! CBOR records with one `fdatasync` per append gives the durability an embedded B-tree would,
//! without a second storage engine, its file format and its compaction threads on the device.
//! `sled` has had no stable release for years; `redb` would do, but buys nothing here.
//!
//! Records, each `u32` big-endian length + one CBOR item: `next` (the next sequence number, first
//! in a compacted log), `entry` (a segment to deliver, with its sequence number), `ack` (one sink
//! acknowledged one sequence number). An entry leaves the queue when every sink configured now
//! has acknowledged it. A record cut short by a crash (only the last one can be) is dropped at
//! open and the log truncated to the records before it: its append had not returned, so nothing
//! was told it was queued. When no entry is left, or the log passes [`COMPACT_BYTES`], it is
//! rewritten (temporary file, sync, rename, folder sync) with what is still queued.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::DeliveryError;
use log::{frame, parse_log};

/// The log's file name inside the queue folder.
pub const LOG: &str = "queue.log";

/// A log longer than this is rewritten with only what is still queued.
pub const COMPACT_BYTES: u64 = 4 << 20;

/// The longest record accepted when reading the log back.
const MAX_RECORD: usize = 1 << 20;

/// One committed segment waiting for its sinks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Its sequence number: unique on this node, increasing in queue order, kept across restarts.
    pub seq: u64,
    /// The scene id.
    pub scene_id: String,
    /// The scene's outbox folder.
    pub scene_folder: PathBuf,
    /// The segment's number in its scene, from 0.
    pub segment: u64,
    /// The folder whose `current` link names the segment's set.
    pub folder: PathBuf,
    /// The segment's first scene line.
    pub first_line: u64,
    /// Its lines.
    pub lines: u64,
    /// Pixels per line.
    pub samples: u64,
    /// Whether it is the scene's last segment.
    pub last: bool,
    /// The model's name.
    pub model: String,
    /// Class names, in class-id order.
    pub classes: Vec<String>,
    /// Class colours (RGB), in class-id order.
    pub colours: Vec<[u8; 3]>,
    /// The scene's ENVI `map info`, when it had one.
    pub map_info: Option<String>,
    /// The scene's ENVI `coordinate system string`, when it had one.
    pub coordinate_system: Option<String>,
    /// [`super::message::digest`] of the segment's maps: the same scene id, segment and digest
    /// queued again (a scene run twice) keeps its first sequence number.
    #[serde(default)]
    pub digest: u64,
}

/// How many delivered segments are remembered for [`Queue::push`]'s duplicate check.
pub const RECENT: usize = 1024;

/// What identifies a segment across runs of its scene: scene id, segment number, digest.
type SegmentKey = (String, u64, u64);

/// What [`Queue::push`] did with one entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pushed {
    /// Its sequence number.
    pub seq: u64,
    /// False when the same segment (scene id, number, maps) was queued before: it keeps that
    /// sequence number and is not queued again.
    pub new: bool,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "r", rename_all = "lowercase")]
enum Record {
    Next {
        seq: u64,
    },
    Entry(Box<Entry>),
    Ack {
        seq: u64,
        sink: String,
    },
    Seen {
        scene_id: String,
        segment: u64,
        digest: u64,
        seq: u64,
    },
    Moved {
        from: PathBuf,
        to: PathBuf,
    },
}

/// Points the entries of scene folder `from` at `to`.
fn relocate(entries: &mut BTreeMap<u64, Queued>, from: &Path, to: &Path) {
    for q in entries.values_mut() {
        if q.entry.scene_folder == from {
            if let Ok(rest) = q.entry.folder.strip_prefix(from) {
                q.entry.folder = to.join(rest);
            }
            q.entry.scene_folder = to.to_path_buf();
        }
    }
}

#[derive(Debug)]
struct Queued {
    entry: Entry,
    acked: BTreeSet<String>,
}

#[derive(Debug)]
struct Inner {
    file: File,
    bytes: u64,
    next: u64,
    entries: BTreeMap<u64, Queued>,
    /// Segments queued lately (delivered or not), oldest first, for the duplicate check.
    recent: std::collections::VecDeque<(SegmentKey, u64)>,
    /// Intake waits while the queue is full; a drain lifts the wait.
    unbounded: bool,
    /// Records were appended since the log was last compacted.
    dirty: bool,
    /// A failed append may have left part of a record after `bytes`.
    torn: bool,
}

impl Inner {
    fn remember(&mut self, key: SegmentKey, seq: u64) {
        self.recent.push_back((key, seq));
        while self.recent.len() > RECENT {
            self.recent.pop_front();
        }
    }

    fn known(&self, key: &SegmentKey) -> Option<u64> {
        self.recent.iter().rev().find(|(k, _)| k == key).map(|(_, s)| *s)
    }
}

fn key_of(e: &Entry) -> SegmentKey {
    (e.scene_id.clone(), e.segment, e.digest)
}

/// What the queue holds now, for `status`.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct QueueStatus {
    /// Entries queued.
    pub queued: usize,
    /// The bound (`delivery.queue_max`).
    pub max: usize,
    /// Whether intake is paused for room.
    pub full: bool,
    /// The next sequence number.
    pub next_seq: u64,
    /// Per sink: entries it has not acknowledged.
    pub pending: BTreeMap<String, usize>,
}

/// The queue: the log, the entries still queued in memory (metadata only) and the sinks.
#[derive(Debug)]
pub struct Queue {
    dir: PathBuf,
    sinks: Vec<String>,
    max: usize,
    inner: Mutex<Inner>,
    changed: Condvar,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> DeliveryError + '_ {
    move |source| DeliveryError::Io {
        path: path.to_path_buf(),
        source,
    }
}

impl Queue {
    /// Opens (or creates) the queue in `dir` for `sinks`, holding at most `max` entries before
    /// intake waits; replays the log.
    pub fn open(dir: &Path, sinks: Vec<String>, max: usize) -> Result<Self, DeliveryError> {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let path = dir.join(LOG);
        let mut file = OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .open(&path)
            .map_err(io(&path))?;
        let mut data = Vec::new();
        file.read_to_end(&mut data).map_err(io(&path))?;
        let (records, good) = parse_log(&data, &path)?;
        if good < data.len() as u64 {
            // The tail of an append a crash cut short: nothing was told it was queued.
            file.set_len(good).map_err(io(&path))?;
            file.sync_data().map_err(io(&path))?;
        }
        let mut next = 0;
        let mut entries: BTreeMap<u64, Queued> = BTreeMap::new();
        let mut recent = Vec::new();
        for r in records {
            match r {
                Record::Next { seq } => next = next.max(seq),
                Record::Seen {
                    scene_id,
                    segment,
                    digest,
                    seq,
                } => recent.push(((scene_id, segment, digest), seq)),
                Record::Entry(e) => {
                    next = next.max(e.seq + 1);
                    recent.push((key_of(&e), e.seq));
                    entries.insert(
                        e.seq,
                        Queued {
                            entry: *e,
                            acked: BTreeSet::new(),
                        },
                    );
                }
                Record::Ack { seq, sink } => {
                    if let Some(q) = entries.get_mut(&seq) {
                        q.acked.insert(sink);
                    }
                }
                Record::Moved { from, to } => relocate(&mut entries, &from, &to),
            }
        }
        entries.retain(|_, q| !sinks.iter().all(|s| q.acked.contains(s)));
        let mut inner = Inner {
            file,
            bytes: good,
            next,
            entries,
            recent: Default::default(),
            unbounded: false,
            dirty: true,
            torn: false,
        };
        for (k, s) in recent {
            inner.remember(k, s);
        }
        let queue = Self {
            dir: dir.to_path_buf(),
            sinks,
            max,
            inner: Mutex::new(inner),
            changed: Condvar::new(),
        };
        queue.compact(&mut queue.lock())?;
        Ok(queue)
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn log_path(&self) -> PathBuf {
        self.dir.join(LOG)
    }

    fn append(&self, inner: &mut Inner, records: &[Record]) -> Result<(), DeliveryError> {
        let path = self.log_path();
        let bytes: Vec<u8> = records.iter().flat_map(frame).collect();
        if inner.torn {
            inner.file.set_len(inner.bytes).map_err(io(&path))?;
            inner.torn = false;
        }
        if let Err(e) = inner.file.write_all(&bytes).and_then(|()| inner.file.sync_data()) {
            // A full disk writes part of a record: cut back to the last whole one (now, or
            // before the next append), so a record never follows torn bytes and the log
            // still opens.
            inner.torn = inner.file.set_len(inner.bytes).is_err();
            return Err(io(&path)(e));
        }
        inner.bytes += bytes.len() as u64;
        inner.dirty = true;
        Ok(())
    }

    /// Rewrites the log with only what is queued when it is empty of entries or too long.
    fn compact(&self, inner: &mut Inner) -> Result<(), DeliveryError> {
        if !(inner.entries.is_empty() && inner.dirty) && inner.bytes <= COMPACT_BYTES {
            return Ok(());
        }
        let tmp = self.dir.join(format!("{LOG}.tmp"));
        let mut out = frame(&Record::Next { seq: inner.next });
        for ((scene_id, segment, digest), seq) in &inner.recent {
            if !inner.entries.contains_key(seq) {
                out.extend(frame(&Record::Seen {
                    scene_id: scene_id.clone(),
                    segment: *segment,
                    digest: *digest,
                    seq: *seq,
                }));
            }
        }
        for q in inner.entries.values() {
            out.extend(frame(&Record::Entry(Box::new(q.entry.clone()))));
            for sink in &q.acked {
                out.extend(frame(&Record::Ack {
                    seq: q.entry.seq,
                    sink: sink.clone(),
                }));
            }
        }
        {
            let mut f = File::create(&tmp).map_err(io(&tmp))?;
            f.write_all(&out).map_err(io(&tmp))?;
            f.sync_all().map_err(io(&tmp))?;
        }
        let path = self.log_path();
        // Opened before the rename, so that once the log is replaced every later record goes
        // to the new one, whatever fails after.
        let file = OpenOptions::new()
            .read(true)
            .append(true)
            .open(&tmp)
            .map_err(io(&tmp))?;
        std::fs::rename(&tmp, &path).map_err(io(&path))?;
        inner.file = file;
        inner.bytes = out.len() as u64;
        inner.torn = false;
        inner.dirty = false;
        File::open(&self.dir).and_then(|d| d.sync_all()).map_err(io(&self.dir))
    }

    /// The sinks every entry waits for.
    pub fn sinks(&self) -> &[String] {
        &self.sinks
    }

    /// Queues `entries` (their `seq` is assigned here, in order) durably, once the log is synced.
    /// An entry whose segment (scene id, number, digest) was queued before — its scene run again
    /// after a crash or a resend — is not queued again and keeps its first sequence number. Never
    /// refuses for room: the segments are already committed, and intake is what waits
    /// ([`Queue::wait_for_room`]).
    pub fn push(&self, entries: Vec<Entry>) -> Result<Vec<Pushed>, DeliveryError> {
        let mut inner = self.lock();
        self.push_locked(&mut inner, entries)
    }

    /// [`Queue::push`] within `queue_max`: waits up to `timeout` until the entries not queued
    /// before fit under the bound (or an empty queue takes them, or a drain lifted it), checked
    /// and taken under one lock so that pushers never pass it together. `None`: no room came.
    pub fn push_within_bound(
        &self,
        entries: Vec<Entry>,
        timeout: Duration,
    ) -> Result<Option<Vec<Pushed>>, DeliveryError> {
        let deadline = Instant::now() + timeout;
        let mut inner = self.lock();
        loop {
            let new = entries.iter().filter(|e| inner.known(&key_of(e)).is_none()).count();
            if inner.unbounded || new == 0 || inner.entries.is_empty() || inner.entries.len() + new <= self.max {
                return self.push_locked(&mut inner, entries).map(Some);
            }
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                return Ok(None);
            };
            inner = self
                .changed
                .wait_timeout(inner, left)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
    }

    fn push_locked(&self, inner: &mut Inner, entries: Vec<Entry>) -> Result<Vec<Pushed>, DeliveryError> {
        let mut pushed = Vec::with_capacity(entries.len());
        let mut records = Vec::with_capacity(entries.len());
        let mut next = inner.next;
        for mut e in entries {
            let key = key_of(&e);
            let earlier = inner.known(&key).or_else(|| {
                records.iter().find_map(|r| match r {
                    Record::Entry(q) if key_of(q) == key => Some(q.seq),
                    _ => None,
                })
            });
            if let Some(seq) = earlier {
                pushed.push(Pushed { seq, new: false });
                continue;
            }
            e.seq = next;
            pushed.push(Pushed { seq: next, new: true });
            next += 1;
            records.push(Record::Entry(Box::new(e)));
        }
        if records.is_empty() {
            return Ok(pushed);
        }
        self.append(inner, &records)?;
        inner.next = next;
        for r in records {
            if let Record::Entry(e) = r {
                inner.remember(key_of(&e), e.seq);
                inner.entries.insert(
                    e.seq,
                    Queued {
                        entry: *e,
                        acked: BTreeSet::new(),
                    },
                );
            }
        }
        self.changed.notify_all();
        Ok(pushed)
    }

    /// The oldest entry `sink` has not acknowledged, waiting up to `timeout` for one.
    pub fn next_for(&self, sink: &str, timeout: Duration) -> Option<Entry> {
        let deadline = Instant::now() + timeout;
        let mut inner = self.lock();
        loop {
            if let Some(q) = inner.entries.values().find(|q| !q.acked.contains(sink)) {
                return Some(q.entry.clone());
            }
            let left = deadline.checked_duration_since(Instant::now())?;
            inner = self
                .changed
                .wait_timeout(inner, left)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
    }

    /// Records that `sink` has `seq` (durably); the entry leaves the queue once every sink has it.
    /// An ack of a sequence number no longer queued is ignored.
    pub fn ack(&self, seq: u64, sink: &str) -> Result<(), DeliveryError> {
        let mut inner = self.lock();
        let Some(q) = inner.entries.get(&seq) else {
            return Ok(());
        };
        if q.acked.contains(sink) {
            return Ok(());
        }
        self.append(
            &mut inner,
            &[Record::Ack {
                seq,
                sink: sink.to_string(),
            }],
        )?;
        let done = match inner.entries.get_mut(&seq) {
            Some(q) => {
                q.acked.insert(sink.to_string());
                self.sinks.iter().all(|s| q.acked.contains(s))
            }
            None => false,
        };
        if done {
            inner.entries.remove(&seq);
            self.compact(&mut inner)?;
        }
        self.changed.notify_all();
        Ok(())
    }

    /// Entries queued now.
    pub fn len(&self) -> usize {
        self.lock().entries.len()
    }

    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the queue holds `delivery.queue_max` entries or more.
    pub fn full(&self) -> bool {
        let inner = self.lock();
        !inner.unbounded && inner.entries.len() >= self.max
    }

    /// Waits while the queue is full (up to `timeout`); true when there is room.
    pub fn wait_for_room(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut inner = self.lock();
        loop {
            if inner.unbounded || inner.entries.len() < self.max {
                return true;
            }
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                return false;
            };
            inner = self
                .changed
                .wait_timeout(inner, left)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
    }

    /// Lifts the bound for good (a drain: the scenes already accepted run and are queued).
    pub fn lift_bound(&self) {
        self.lock().unbounded = true;
        self.changed.notify_all();
    }

    /// Whether the last segment of the scene in `folder` is queued (the scene finished before a
    /// crash, and what it committed waits for a sink).
    pub fn holds_scene(&self, folder: &Path) -> bool {
        self.lock()
            .entries
            .values()
            .any(|q| q.entry.scene_folder == folder && q.entry.last)
    }

    /// Records (durably) that the scene folder `from` was moved to `to` (a failed or interrupted
    /// scene set aside): its queued segments are read from there.
    pub fn relocate(&self, from: &Path, to: &Path) -> Result<(), DeliveryError> {
        let mut inner = self.lock();
        if !inner.entries.values().any(|q| q.entry.scene_folder == from) {
            return Ok(());
        }
        self.append(
            &mut inner,
            &[Record::Moved {
                from: from.to_path_buf(),
                to: to.to_path_buf(),
            }],
        )?;
        relocate(&mut inner.entries, from, to);
        Ok(())
    }

    /// What the queue holds now.
    pub fn status(&self) -> QueueStatus {
        let inner = self.lock();
        QueueStatus {
            queued: inner.entries.len(),
            max: self.max,
            full: !inner.unbounded && inner.entries.len() >= self.max,
            next_seq: inner.next,
            pending: self
                .sinks
                .iter()
                .map(|s| {
                    let n = inner.entries.values().filter(|q| !q.acked.contains(s)).count();
                    (s.clone(), n)
                })
                .collect(),
        }
    }
}

mod log;
#[cfg(test)]
mod tests;
