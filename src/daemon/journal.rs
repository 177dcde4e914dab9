//! The row journal: one small append-only file per scene in flight, `STATE/journal/<folder>.log`,
//! one JSON record per line, each synced (`fdatasync`) before the daemon goes on. It records the
//! scene a worker took (id, model, geometry, segment length) and then every segment once it is
//! committed in the outbox and queued for delivery, so the journal's last segment is the last
//! completed row: everything above it is on disk and queued.
//!
//! The file is removed once the scene is over (written, or failed and moved aside). One left by a
//! killed daemon keeps the scene's folder in the outbox (`outbox::recover`), and when the same
//! scene comes again — a spooled cube taken back from `work/`, a stream re-sent by its sensor —
//! its worker finds the journal ([`find`]) and resumes after the last journalled segment
//! (`job::ModelSession::run_stream_resumed`): committed rows are not computed again, and the
//! maps are those of an uninterrupted run. A scene is taken for the same when its id, model,
//! geometry and segment length match.

use std::collections::BTreeSet;
use std::io::{Seek, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::DaemonError;
use crate::job::Resume;
use crate::map::SegmentRecord;
use crate::source::SceneInfo;

/// The folder of journals, inside the state folder.
pub const JOURNAL: &str = "journal";

/// Journals a worker holds open now: a scene sent twice at once resumes at most once.
static OPEN: Mutex<BTreeSet<PathBuf>> = Mutex::new(BTreeSet::new());

fn open_set() -> std::sync::MutexGuard<'static, BTreeSet<PathBuf>> {
    OPEN.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> DaemonError + '_ {
    move |source| DaemonError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// What a scene was run as: a scene that comes again resumes only when all of it matches.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SceneKey {
    /// The scene id.
    pub scene_id: String,
    /// The model's name in the configuration.
    pub model: String,
    /// Pixels per line.
    pub samples: usize,
    /// Bands.
    pub bands: usize,
    /// Bytes of one raw line (sample type included).
    pub line_bytes: usize,
    /// Lines, when announced.
    pub lines: Option<usize>,
    /// Lines per segment.
    pub segment_lines: usize,
}

impl SceneKey {
    /// The key of scene `info` run by `model` in segments of `segment_lines`.
    pub fn of(info: &SceneInfo, model: &str, segment_lines: usize) -> Self {
        Self {
            scene_id: info.id.clone(),
            model: model.to_string(),
            samples: info.samples,
            bands: info.bands,
            line_bytes: info.line_bytes(),
            lines: info.lines,
            segment_lines,
        }
    }
}

/// One line of a journal.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "record", rename_all = "snake_case")]
enum Record {
    /// The scene taken, and its outbox folder.
    Start {
        /// What it was run as.
        key: SceneKey,
        /// Its folder in the outbox.
        folder: PathBuf,
    },
    /// The scene's input is complete in `<folder>.img` / `.hdr` beside the journal (a stream's
    /// lines as the worker read them, synced): the daemon can finish the scene by itself.
    InputEnd {
        /// Lines recorded.
        lines: usize,
    },
    /// A segment committed and queued.
    Segment {
        /// What was committed.
        segment: SegmentRecord,
        /// Whether it was the scene's last.
        last: bool,
    },
}

/// What a journal file holds.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Read {
    key: SceneKey,
    folder: PathBuf,
    segments: Vec<SegmentRecord>,
    complete: bool,
    input_lines: Option<usize>,
}

impl Read {
    /// Whether a run can go on from it: not complete, something to go on from (committed
    /// segments, or the whole input), and every committed segment still in place.
    fn resumable(&self) -> bool {
        !self.complete
            && (!self.segments.is_empty() || self.input_lines.is_some())
            && self.segments.iter().all(committed)
    }
}

/// Reads the journal at `path`; a torn last line (the process killed mid-write) is ignored, as
/// is anything after it.
fn read(path: &Path) -> Result<Option<Read>, DaemonError> {
    let text = std::fs::read(path).map_err(io(path))?;
    let mut got: Option<Read> = None;
    for line in text.split(|b| *b == b'\n') {
        let Ok(record) = serde_json::from_slice::<Record>(line) else {
            break;
        };
        match (record, &mut got) {
            (Record::Start { key, folder }, None) => {
                got = Some(Read {
                    key,
                    folder,
                    segments: Vec::new(),
                    complete: false,
                    input_lines: None,
                });
            }
            (Record::Segment { segment, last }, Some(r)) if segment.index == r.segments.len() => {
                r.complete |= last;
                r.segments.push(segment);
            }
            (Record::InputEnd { lines }, Some(r)) => r.input_lines = Some(lines),
            _ => break,
        }
    }
    Ok(got)
}

/// The journal of the scene in `folder`.
fn path_of(state: &Path, folder: &Path) -> PathBuf {
    let name = folder.file_name().unwrap_or(folder.as_os_str()).to_string_lossy();
    state.join(JOURNAL).join(format!("{name}.log"))
}

/// Whether a committed segment's set is still where the journal says.
fn committed(s: &SegmentRecord) -> bool {
    s.folder.join("current").exists()
}

/// Whether the scene in `folder` can be resumed: its journal names committed segments (not the
/// scene's last) that the folder still holds, or its whole recorded input.
pub fn resumable(state: &Path, folder: &Path) -> bool {
    let path = path_of(state, folder);
    matches!(read(&path), Ok(Some(r)) if r.folder == folder && r.resumable())
}

/// The recorded input beside a journal: the raw lines and their ENVI header.
pub fn input_files(journal: &Path) -> (PathBuf, PathBuf) {
    (journal.with_extension("img"), journal.with_extension("hdr"))
}

fn remove_input(journal: &Path) {
    let (img, hdr) = input_files(journal);
    // Absent unless a stream's input was recorded.
    let _ = std::fs::remove_file(hdr);
    let _ = std::fs::remove_file(journal.with_extension("part"));
    let _ = std::fs::remove_file(img);
}

/// A scene whose whole input is recorded beside its journal: the daemon runs it again by itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replay {
    /// What it was run as.
    pub key: SceneKey,
    /// Its outbox folder.
    pub folder: PathBuf,
    /// The recorded input's ENVI header.
    pub header: PathBuf,
}

/// The scenes whose journal holds their whole input and that no worker holds (at start: every
/// stream a killed daemon had read to its end but not finished).
pub fn replayable(state: &Path) -> Vec<Replay> {
    let Ok(entries) = std::fs::read_dir(state.join(JOURNAL)) else {
        return Vec::new();
    };
    let open = open_set();
    let mut found = Vec::new();
    for path in entries.flatten().map(|e| e.path()) {
        if path.extension().is_some_and(|e| e == "log")
            && !open.contains(&path)
            && let Ok(Some(r)) = read(&path)
            && r.resumable()
            && r.input_lines.is_some()
        {
            found.push(Replay {
                key: r.key,
                folder: r.folder,
                header: input_files(&path).1,
            });
        }
    }
    found.sort_by(|a, b| a.folder.cmp(&b.folder));
    found
}

/// Removes `path`; one already gone (removed with its journal) is no error.
fn remove_if_there(path: &Path) -> Result<(), DaemonError> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io(path)(e)),
        _ => Ok(()),
    }
}

/// Removes the journals no scene can resume from (their folder moved aside or gone, nothing
/// committed, or the scene complete); returns how many were removed.
pub fn prune(state: &Path) -> Result<usize, DaemonError> {
    let dir = state.join(JOURNAL);
    std::fs::create_dir_all(&dir).map_err(io(&dir))?;
    let mut removed = 0;
    for entry in std::fs::read_dir(&dir).map_err(io(&dir))? {
        let path = entry.map_err(io(&dir))?.path();
        if path.extension().is_none_or(|e| e != "log") {
            // Recorded input goes with its journal; a recording cut off (`.part`) or a
            // temporary file of a rewrite, always.
            let partial = path.extension().is_some_and(|e| e == "part" || e == "tmp");
            if partial || !path.with_extension("log").exists() {
                remove_if_there(&path)?;
            }
            continue;
        }
        // A journal that cannot be read now (an I/O error) is kept with its input: only one
        // read whole and found finished or orphaned is removed.
        let keep = match read(&path) {
            Ok(Some(r)) => resumable(state, &r.folder),
            Ok(None) => false,
            Err(_) => true,
        };
        if !keep {
            remove_input(&path);
            remove_if_there(&path)?;
            removed += 1;
        }
    }
    Ok(removed)
}

/// A scene's open journal; dropping it leaves the file (the scene is taken up again later),
/// [`Journal::finish`] removes it.
#[derive(Debug)]
pub struct Journal {
    path: PathBuf,
    file: std::fs::File,
    /// Bytes of whole records.
    len: u64,
    /// A failed append may have left part of a record after `len`.
    torn: bool,
}

impl Drop for Journal {
    fn drop(&mut self) {
        open_set().remove(&self.path);
    }
}

impl Journal {
    /// Starts the journal of scene `key` in `folder` (synced, and its folder entry too).
    pub fn create(state: &Path, key: &SceneKey, folder: &Path) -> Result<Self, DaemonError> {
        let dir = state.join(JOURNAL);
        std::fs::create_dir_all(&dir).map_err(io(&dir))?;
        let path = path_of(state, folder);
        let file = std::fs::File::create(&path).map_err(io(&path))?;
        open_set().insert(path.clone());
        let mut journal = Self {
            path,
            file,
            len: 0,
            torn: false,
        };
        journal.append(&Record::Start {
            key: key.clone(),
            folder: folder.to_path_buf(),
        })?;
        std::fs::File::open(&dir).and_then(|d| d.sync_all()).map_err(io(&dir))?;
        Ok(journal)
    }

    fn append(&mut self, record: &Record) -> Result<(), DaemonError> {
        let mut line = serde_json::to_vec(record).map_err(|e| DaemonError::Io {
            path: self.path.clone(),
            source: std::io::Error::other(e),
        })?;
        line.push(b'\n');
        if self.torn {
            self.cut_back().map_err(io(&self.path))?;
        }
        if let Err(e) = self.file.write_all(&line).and_then(|()| self.file.sync_data()) {
            // A full disk writes part of a line: cut back to the last whole one (now, or before
            // the next append), so a record never follows torn bytes.
            self.torn = self.cut_back().is_err();
            return Err(io(&self.path)(e));
        }
        self.len += line.len() as u64;
        Ok(())
    }

    fn cut_back(&mut self) -> std::io::Result<()> {
        self.file.set_len(self.len)?;
        self.file.seek(std::io::SeekFrom::Start(self.len))?;
        self.torn = false;
        Ok(())
    }

    /// Records segment `s` as committed and queued (synced before it returns).
    pub fn segment(&mut self, s: &SegmentRecord, last: bool) -> Result<(), DaemonError> {
        self.append(&Record::Segment {
            segment: s.clone(),
            last,
        })
    }

    /// Records that the scene's whole input, `lines` lines, is in [`Journal::input`]'s files.
    pub fn input_end(&mut self, lines: usize) -> Result<(), DaemonError> {
        self.append(&Record::InputEnd { lines })
    }

    /// Where the scene's input is recorded: raw lines, ENVI header.
    pub fn input(&self) -> (PathBuf, PathBuf) {
        input_files(&self.path)
    }

    /// The scene is over: the journal and any recorded input go.
    pub fn finish(mut self) -> Result<(), DaemonError> {
        self.abandon()
    }

    /// Removes the journal now (its scene failed: nothing of it is resumed); [`Journal::finish`]
    /// after it has nothing left to do.
    pub fn abandon(&mut self) -> Result<(), DaemonError> {
        remove_input(&self.path);
        match std::fs::remove_file(&self.path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io(&self.path)(e)),
            _ => Ok(()),
        }
    }
}

/// A journal left by an earlier run of scene `key` that no worker holds, with the scene's folder
/// in `outbox` and what it committed: the journal is reopened for appending and the run goes on
/// from [`Resume`]. `None` when there is none to resume.
pub fn find(state: &Path, outbox: &Path, key: &SceneKey) -> Option<(Journal, PathBuf, Resume)> {
    let dir = state.join(JOURNAL);
    let entries = std::fs::read_dir(&dir).ok()?;
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_none_or(|e| e != "log") {
            continue;
        }
        let Ok(Some(r)) = read(&path) else { continue };
        if r.key != *key || !r.resumable() || r.folder.parent() != Some(outbox) {
            continue;
        }
        let mut open = open_set();
        if open.contains(&path) {
            continue;
        }
        // Read again under the lock: a worker may have finished the scene (and removed its
        // journal) since the read above, and a journal is rewritten only from what it holds now.
        let Ok(Some(r)) = read(&path) else { continue };
        if r.key != *key || !r.resumable() || r.folder.parent() != Some(outbox) {
            continue;
        }
        // A torn last line is cut off before records are appended after it.
        let (file, len) = match rewrite(&path, &r) {
            Ok(f) => f,
            Err(e) => {
                super::log::event(
                    "warning",
                    &format!(
                        "scene `{}`: its journal {} cannot be rewritten ({e}); the scene runs from its first line",
                        key.scene_id,
                        path.display()
                    ),
                    serde_json::json!({"scene_id": key.scene_id, "path": path}),
                );
                continue;
            }
        };
        open.insert(path.clone());
        drop(open);
        let resume = Resume {
            segments: r.segments.clone(),
        };
        let journal = Journal {
            path,
            file,
            len,
            torn: false,
        };
        return Some((journal, r.folder, resume));
    }
    None
}

/// Writes `r` back to `path` whole (through a temporary file renamed over it), returning the
/// file open for appending.
fn rewrite(path: &Path, r: &Read) -> std::io::Result<(std::fs::File, u64)> {
    let mut text = Vec::new();
    let mut push = |record: &Record| -> std::io::Result<()> {
        text.extend(serde_json::to_vec(record).map_err(std::io::Error::other)?);
        text.push(b'\n');
        Ok(())
    };
    push(&Record::Start {
        key: r.key.clone(),
        folder: r.folder.clone(),
    })?;
    if let Some(lines) = r.input_lines {
        push(&Record::InputEnd { lines })?;
    }
    for s in &r.segments {
        push(&Record::Segment {
            segment: s.clone(),
            last: false,
        })?;
    }
    let tmp = path.with_extension("log.tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(&text)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    let file = std::fs::OpenOptions::new().append(true).open(path)?;
    Ok((file, text.len() as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(id: &str) -> SceneKey {
        SceneKey {
            scene_id: id.into(),
            model: "tiny".into(),
            samples: 16,
            bands: 8,
            line_bytes: 256,
            lines: Some(64),
            segment_lines: 16,
        }
    }

    fn seg(folder: &Path, index: usize) -> SegmentRecord {
        let f = folder.join(format!("seg-{index:06}"));
        std::fs::create_dir_all(f.join("current")).unwrap();
        SegmentRecord {
            index,
            first_line: index * 16,
            lines: 16,
            folder: f,
            run_id: format!("r{index}"),
        }
    }

    #[test]
    fn a_journal_left_mid_scene_resumes_after_its_last_segment_once_and_only_for_that_scene() {
        let t = tempfile::tempdir().unwrap();
        let (state, outbox) = (t.path().join("state"), t.path().join("out"));
        let folder = outbox.join("s");
        std::fs::create_dir_all(&folder).unwrap();
        let mut j = Journal::create(&state, &key("s"), &folder).unwrap();
        let (a, b) = (seg(&folder, 0), seg(&folder, 1));
        j.segment(&a, false).unwrap();
        j.segment(&b, false).unwrap();
        // A torn record, as kill -9 mid-write leaves it.
        j.file.write_all(b"{\"record\":\"segm").unwrap();
        drop(j);
        assert!(resumable(&state, &folder));
        // Another scene, or the same id run otherwise, does not take it.
        assert!(find(&state, &outbox, &key("t")).is_none());
        let other = SceneKey {
            segment_lines: 8,
            ..key("s")
        };
        assert!(find(&state, &outbox, &other).is_none());
        let (mut j, f, resume) = find(&state, &outbox, &key("s")).unwrap();
        assert_eq!(f, folder);
        assert_eq!(resume.segments, vec![a.clone(), b.clone()]);
        assert_eq!(resume.line(), 32);
        // Held by a worker: a second copy of the scene starts afresh.
        assert!(find(&state, &outbox, &key("s")).is_none());
        // Appending after the cut-off torn line keeps the journal readable.
        let c = seg(&folder, 2);
        j.segment(&c, false).unwrap();
        drop(j);
        let (j, _, resume) = find(&state, &outbox, &key("s")).unwrap();
        assert_eq!(resume.line(), 48);
        j.finish().unwrap();
        assert!(find(&state, &outbox, &key("s")).is_none());
        assert!(!resumable(&state, &folder));
    }

    #[test]
    fn a_record_after_a_failed_append_follows_the_last_whole_one() {
        let t = tempfile::tempdir().unwrap();
        let (state, outbox) = (t.path().join("state"), t.path().join("out"));
        let folder = outbox.join("s");
        std::fs::create_dir_all(&folder).unwrap();
        let mut j = Journal::create(&state, &key("s"), &folder).unwrap();
        let (a, b) = (seg(&folder, 0), seg(&folder, 1));
        j.segment(&a, false).unwrap();
        // What a full disk leaves: part of a record, and a cut that has not happened yet.
        j.file.write_all(b"{\"record\":\"segm").unwrap();
        j.torn = true;
        j.segment(&b, false).unwrap();
        drop(j);
        let (_, _, resume) = find(&state, &outbox, &key("s")).unwrap();
        assert_eq!(resume.segments, vec![a, b]);
    }

    #[test]
    fn journals_of_complete_or_moved_scenes_are_pruned_and_a_missing_set_is_not_resumed() {
        let t = tempfile::tempdir().unwrap();
        let (state, outbox) = (t.path().join("state"), t.path().join("out"));
        let (f1, f2, f3) = (outbox.join("a"), outbox.join("b"), outbox.join("c"));
        let mut done = Journal::create(&state, &key("a"), &f1).unwrap();
        done.segment(&seg(&f1, 0), true).unwrap();
        let mut moved = Journal::create(&state, &key("b"), &f2).unwrap();
        let s = seg(&f2, 0);
        moved.segment(&s, false).unwrap();
        std::fs::remove_dir_all(&f2).unwrap();
        let mut live = Journal::create(&state, &key("c"), &f3).unwrap();
        live.segment(&seg(&f3, 0), false).unwrap();
        // Recorded input goes with its journal, whichever the directory lists first.
        for ext in ["part", "img", "hdr"] {
            std::fs::write(done.input().0.with_extension(ext), b"x").unwrap();
        }
        drop((done, moved, live));
        assert!(!resumable(&state, &f1) && !resumable(&state, &f2) && resumable(&state, &f3));
        assert!(find(&state, &outbox, &key("b")).is_none());
        assert_eq!(prune(&state).unwrap(), 2);
        assert_eq!(std::fs::read_dir(state.join(JOURNAL)).unwrap().count(), 1);
    }
}
