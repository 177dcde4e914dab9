//! A claimed scene and how it leaves `work/`: one rename of its folder into `done/` or `failed/`,
//! under a name nothing there has yet.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::owner::OwnerDir;
use super::{Held, SpoolError, io_err, sync_dir};
use crate::source::FileSource;
use crate::source::file::OpenError;

/// The file in a scene folder counting how often a run of the scene started.
pub(super) const ATTEMPTS: &str = ".attempts";

/// A scene handed out by [`super::Spool::claim_next`]: its header and data file sit in a folder
/// of `work/` that only this claim uses until [`Self::done`] or [`Self::failed`] moves it out.
///
/// Dropped without either (a worker that panicked), the scene stays in `work/` and is handed out
/// again, as [`Self::recovered`], by the next scan of its spool (or by the next spool to start,
/// if this process ends first).
#[derive(Debug)]
pub struct Claimed {
    id: String,
    dir: PathBuf,
    header: PathBuf,
    data: PathBuf,
    recovered: bool,
    attempts: u32,
    done_root: PathBuf,
    failed_root: PathBuf,
    held: Held,
    /// Keeps the owner folder locked while the claim lives.
    _owner: Arc<OwnerDir>,
}

/// Where a claimed scene is and what the spool knows of it.
pub(super) struct Parts {
    pub id: String,
    pub dir: PathBuf,
    pub header: PathBuf,
    pub data: PathBuf,
    pub recovered: bool,
    pub attempts: u32,
}

impl Claimed {
    /// Registers `parts` as held by a claim (until it is dropped).
    pub(super) fn new(parts: Parts, owner: Arc<OwnerDir>, held: &Held, done_root: &Path, failed_root: &Path) -> Self {
        held.lock().unwrap_or_else(|e| e.into_inner()).insert(parts.dir.clone());
        Self {
            id: parts.id,
            dir: parts.dir,
            header: parts.header,
            data: parts.data,
            recovered: parts.recovered,
            attempts: parts.attempts,
            done_root: done_root.to_path_buf(),
            failed_root: failed_root.to_path_buf(),
            held: held.clone(),
            _owner: owner,
        }
    }

    /// The scene id (the header's file name without `.hdr`).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The header, inside the claim's folder of `work/`.
    pub fn header_path(&self) -> &Path {
        &self.header
    }

    /// The data file, beside the header.
    pub fn data_path(&self) -> &Path {
        &self.data
    }

    /// The claim's folder in `work/`.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Whether the scene was handed out before without finishing (its process died, or its
    /// claim was dropped): outputs of that attempt may exist and are to be replaced.
    pub fn recovered(&self) -> bool {
        self.recovered
    }

    /// How many times a run of the scene started, [`Self::start`] of this claim included (0
    /// for a first claim not yet started).
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// Records (synced) that a run of the scene starts now. A claim handed out again counts
    /// only runs that started, so a scene that waited in a queue through a crash is not
    /// charged for it. Returns the attempts, this one included.
    pub fn start(&mut self) -> Result<u32, SpoolError> {
        // Counted here even when the record cannot be written, so what this run writes later
        // is not one short.
        self.attempts += 1;
        write_attempts(&self.dir, self.attempts)?;
        Ok(self.attempts)
    }

    /// The attempts record of this claim, for its run to say when it waits.
    pub fn attempt_mark(&self) -> AttemptMark {
        AttemptMark {
            dir: self.dir.clone(),
            started: self.attempts.into(),
            reached: read_record(&self.dir).1.into(),
        }
    }

    /// The scene's lines.
    pub fn open_source(&self) -> Result<FileSource, OpenError> {
        FileSource::open(&self.header, Some(&self.id))
    }

    /// Moves the scene to `done/` with `NAME.json` holding `record` (what processing produced)
    /// under `"record"`, beside the scene id, the time, the attempts and the recovered flag.
    /// Returns the scene's folder in `done/`.
    ///
    /// On an error the scene is left in `work/` and handed out again as recovered.
    pub fn done(self, record: &serde_json::Value) -> Result<PathBuf, SpoolError> {
        let json = serde_json::json!({
            "scene": self.id,
            "finished": utc_now(),
            "attempts": self.attempts,
            "recovered": self.recovered,
            "record": record,
        });
        let mut text = serde_json::to_string_pretty(&json).unwrap_or_default();
        text.push('\n');
        finish(&self.dir, &self.id, "json", &text, &self.done_root)
    }

    /// Moves the scene to `failed/` with `NAME.reason`: `reason` on its first line, then the
    /// time and the attempts. Returns the scene's folder in `failed/`.
    ///
    /// On an error the scene is left in `work/` and handed out again as recovered.
    pub fn failed(self, reason: &str) -> Result<PathBuf, SpoolError> {
        let text = reason_text(reason, &self.id, self.attempts);
        finish(&self.dir, &self.id, "reason", &text, &self.failed_root)
    }
}

/// The attempts record of a started run. A run that waits for room downstream (a delivery
/// outage) is not processing its cube, so the process dying then is not charged to the cube;
/// and a run that commits a segment no run before it reached has shown the cube gets further
/// (a resume starts after it), so the runs before it are forgiven.
#[derive(Debug)]
pub struct AttemptMark {
    dir: PathBuf,
    started: std::sync::atomic::AtomicU32,
    /// The most segments any run of the cube committed.
    reached: std::sync::atomic::AtomicU32,
}

impl AttemptMark {
    /// Records (synced) that the run waits (`true`: not charged while it does) or goes on.
    pub fn waiting(&self, waiting: bool) -> Result<(), SpoolError> {
        let started = self.started.load(Ordering::Relaxed);
        let n = if waiting { started.saturating_sub(1) } else { started };
        write_record(&self.dir, n, self.reached.load(Ordering::Relaxed))
    }

    /// Records (synced) that the run committed its first `segments` segments: past what any run
    /// reached before, only this run counts from now on.
    pub fn progressed(&self, segments: u32) -> Result<(), SpoolError> {
        if segments <= self.reached.load(Ordering::Relaxed) {
            return Ok(());
        }
        self.reached.store(segments, Ordering::Relaxed);
        self.started.store(1, Ordering::Relaxed);
        write_record(&self.dir, 1, segments)
    }
}

impl Drop for Claimed {
    fn drop(&mut self) {
        self.held.lock().unwrap_or_else(|e| e.into_inner()).remove(&self.dir);
    }
}

/// The text of a `NAME.reason` file.
pub(super) fn reason_text(reason: &str, name: &str, attempts: u32) -> String {
    format!(
        "{}\nscene: {name}\ntime: {}\nattempts: {attempts}\n",
        reason.replace('\n', " "),
        utc_now()
    )
}

/// Writes `NAME.ext` into the scene folder `dir` and moves the folder into `root` under a free
/// name; returns where it went.
pub(super) fn finish(dir: &Path, name: &str, ext: &str, text: &str, root: &Path) -> Result<PathBuf, SpoolError> {
    write_synced(&dir.join(format!("{name}.{ext}")), text.as_bytes())?;
    // The count is in the record or reason now.
    let _ = std::fs::remove_file(dir.join(ATTEMPTS));
    sync_dir(dir)?;
    let to = move_unique(dir, root, name)?;
    sync_dir(root)?;
    if let Some(parent) = dir.parent() {
        sync_dir(parent)?;
    }
    Ok(to)
}

/// Renames the folder `from` to `root/NAME`, or `root/NAME~2`, `~3`, ... when taken; never over
/// anything that exists (a rename fails onto a folder that is not empty, and both a scene folder
/// and a refused one always hold files).
pub(super) fn move_unique(from: &Path, root: &Path, name: &str) -> Result<PathBuf, SpoolError> {
    use std::io::ErrorKind::{AlreadyExists, DirectoryNotEmpty, NotADirectory};
    for k in 1u64.. {
        let to = root.join(if k == 1 {
            name.to_string()
        } else {
            format!("{name}~{k}")
        });
        if to.symlink_metadata().is_ok() {
            continue;
        }
        match std::fs::rename(from, &to) {
            Ok(()) => return Ok(to),
            // Another spool took the name between the look and the rename.
            Err(e) if matches!(e.kind(), AlreadyExists | DirectoryNotEmpty | NotADirectory) => {}
            Err(e) => {
                return Err(SpoolError::Io {
                    what: format!("{}: rename to {}", from.display(), to.display()),
                    source: e,
                });
            }
        }
    }
    unreachable!("more than 2^64 scenes of one name")
}

/// Writes `path` and fsyncs it.
pub(super) fn write_synced(path: &Path, bytes: &[u8]) -> Result<(), SpoolError> {
    use std::io::Write as _;
    let mut f = std::fs::File::create(path).map_err(io_err("create", path))?;
    f.write_all(bytes).map_err(io_err("write", path))?;
    f.sync_all().map_err(io_err("sync", path))
}

/// How many times a run of the scene in `dir` started (0 when never recorded).
pub(super) fn read_attempts(dir: &Path) -> u32 {
    read_record(dir).0
}

/// Records that a run of the scene in `dir` started `n` times (keeping what runs reached).
pub(super) fn write_attempts(dir: &Path, n: u32) -> Result<(), SpoolError> {
    write_record(dir, n, read_record(dir).1)
}

/// The attempts record: runs started, and the most segments a run committed (`N SEGMENTS`).
fn read_record(dir: &Path) -> (u32, u32) {
    let text = std::fs::read_to_string(dir.join(ATTEMPTS)).unwrap_or_default();
    let mut words = text.split_whitespace().map(|w| w.parse().unwrap_or(0));
    (words.next().unwrap_or(0), words.next().unwrap_or(0))
}

fn write_record(dir: &Path, started: u32, reached: u32) -> Result<(), SpoolError> {
    write_synced(&dir.join(ATTEMPTS), format!("{started} {reached}\n").as_bytes())
}

/// Now in UTC, as `YYYY-MM-DDTHH:MM:SSZ`.
pub(super) fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    utc(secs)
}

/// `secs` since the epoch in UTC, as `YYYY-MM-DDTHH:MM:SSZ` (civil calendar from day numbers,
/// after Howard Hinnant's `civil_from_days`).
fn utc(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_times_match_known_dates() {
        assert_eq!(utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(utc(1_709_210_096), "2024-02-29T12:34:56Z");
        assert_eq!(utc(4_102_444_799), "2099-12-31T23:59:59Z");
    }

    #[test]
    fn a_taken_name_gets_the_next_free_suffix_and_nothing_is_overwritten() {
        let root = tempfile::tempdir().unwrap();
        let dest = root.path().join("done");
        std::fs::create_dir(&dest).unwrap();
        let mut got = Vec::new();
        for i in 0..3 {
            let dir = root.path().join(format!("scene{i}"));
            std::fs::create_dir(&dir).unwrap();
            std::fs::write(dir.join("s.hdr"), format!("{i}")).unwrap();
            got.push(move_unique(&dir, &dest, "s").unwrap());
        }
        assert_eq!(got, [dest.join("s"), dest.join("s~2"), dest.join("s~3")]);
        for (i, d) in got.iter().enumerate() {
            assert_eq!(std::fs::read_to_string(d.join("s.hdr")).unwrap(), i.to_string());
        }
        // A file of the name is skipped over too.
        std::fs::write(dest.join("t"), "x").unwrap();
        let dir = root.path().join("t-scene");
        std::fs::create_dir(&dir).unwrap();
        assert_eq!(move_unique(&dir, &dest, "t").unwrap(), dest.join("t~2"));
        assert_eq!(std::fs::read_to_string(dest.join("t")).unwrap(), "x");
    }
}
