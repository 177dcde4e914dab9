//! `incoming/`: which headers are scenes, whether each is complete, claiming one by two renames,
//! and refusing one into `failed/`.

use std::ffi::{OsStr, OsString};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Instant, SystemTime};

use super::claimed::{self, Claimed, Parts};
use super::{Notice, Spool, SpoolError, io_err, sync_dir};
use crate::cube::data_path_for;
use crate::engine::error_chain;
use crate::source::check_scene_id;
use crate::source::file::{FileSource, OpenError};

/// A header in `incoming/`.
#[derive(Debug)]
pub(super) struct Candidate {
    /// The header's file name.
    pub name: OsString,
    /// The scene id it names, or why it names none.
    pub id: Result<String, String>,
    /// When it arrived (the header's modification time).
    mtime: SystemTime,
}

/// What to do with a candidate now.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Check {
    /// A complete, readable cube: claim it.
    Ready,
    /// Not complete yet: look again later.
    Wait,
    /// Move it to `failed/` for this reason.
    Reject(String),
}

/// Whether `name` is an `incoming/` header: not hidden, ending in `.hdr` (any case).
fn is_header(name: &OsStr) -> bool {
    let b = name.as_encoded_bytes();
    !b.starts_with(b".") && b.len() > 4 && b[b.len() - 4..].eq_ignore_ascii_case(b".hdr")
}

/// The scene id of header `name`, or why it is none.
fn scene_id(name: &OsStr) -> Result<String, String> {
    let b = name.as_encoded_bytes();
    let stem = &b[..b.len() - 4];
    let stem = std::str::from_utf8(stem).map_err(|_| "scene id: the name is not UTF-8".to_string())?;
    check_scene_id(stem).map_err(|e| e.to_string())?;
    Ok(stem.to_string())
}

/// `name` made into a folder name of `failed/`: the characters a scene id may hold, others as `_`.
fn clean_name(name: &OsStr) -> String {
    let b = name.as_encoded_bytes();
    let stem = if is_header(name) { &b[..b.len() - 4] } else { b };
    let s: String = String::from_utf8_lossy(stem)
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .skip_while(|&c| c == '.')
        .take(100)
        .collect();
    if s.is_empty() { "unnamed".into() } else { s }
}

impl Spool {
    /// The headers in `incoming/`, oldest first; forgets waiting state of headers gone.
    pub(super) fn candidates(&mut self) -> Result<Vec<Candidate>, SpoolError> {
        let entries = std::fs::read_dir(&self.incoming).map_err(io_err("list", &self.incoming))?;
        let mut found = Vec::new();
        for entry in entries {
            let entry = entry.map_err(io_err("list", &self.incoming))?;
            let name = entry.file_name();
            if !is_header(&name) {
                continue;
            }
            // Gone since the listing: someone else claimed it.
            let Ok(meta) = entry.metadata() else { continue };
            found.push(Candidate {
                id: scene_id(&name),
                mtime: meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                name,
            });
        }
        found.sort_by(|a, b| (a.mtime, &a.name).cmp(&(b.mtime, &b.name)));
        self.waiting.retain(|name, _| found.iter().any(|c| &c.name == name));
        Ok(found)
    }

    /// Whether `c` is ready, still incomplete, or to be refused.
    pub(super) fn check(&mut self, c: &Candidate) -> Check {
        let id = match &c.id {
            Ok(id) => id,
            Err(reason) => return Check::Reject(reason.clone()),
        };
        let reason = match FileSource::open(&self.incoming.join(&c.name), Some(id)) {
            Ok(_) => {
                self.waiting.remove(&c.name);
                return Check::Ready;
            }
            // The cube is whole but cannot be streamed: waiting will not mend it.
            Err(OpenError::Source(e)) => return Check::Reject(error_chain(&e)),
            Err(OpenError::Cube(e)) => error_chain(&e),
        };
        let now = Instant::now();
        let (seen, since) = self
            .waiting
            .entry(c.name.clone())
            .or_insert_with(|| (reason.clone(), now));
        if *seen != reason {
            // Progress (a growing data file, a header being rewritten) restarts the grace.
            *seen = reason.clone();
            *since = now;
        }
        if since.elapsed() < self.options.grace || self.being_claimed(id) {
            return Check::Wait;
        }
        Check::Reject(format!(
            "incomplete and unchanged for {} s: {reason}",
            self.options.grace.as_secs_f64()
        ))
    }

    /// Whether some spool's `work/` holds a scene folder `id` (its data file is moved before its
    /// header, so a header without data may be one being claimed).
    fn being_claimed(&self, id: &str) -> bool {
        std::fs::read_dir(&self.work).is_ok_and(|entries| {
            entries
                .flatten()
                .any(|e| !e.file_name().as_encoded_bytes().starts_with(b".") && e.path().join(id).exists())
        })
    }

    /// Whether one of this spool's owner folders holds a scene `id`.
    pub(super) fn holds(&self, id: &str) -> bool {
        std::iter::once(&self.own)
            .chain(&self.adopted)
            .any(|d| d.path().join(id).symlink_metadata().is_ok())
    }

    /// Claims `c` (checked ready): its data file, then its header, renamed into a new scene
    /// folder of this spool's owner folder. `None` when another spool got it first, or when a
    /// scene of the same id is still held here.
    pub(super) fn claim(&mut self, c: &Candidate) -> Result<Option<Claimed>, SpoolError> {
        let Ok(id) = &c.id else { return Ok(None) };
        if self.holds(id) {
            return Ok(None);
        }
        let dir = self.own.path().join(id);
        match std::fs::create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(None),
            Err(e) => return Err(io_err("create folder", &dir)(e)),
        }
        sync_dir(self.own.path())?;
        let header_from = self.incoming.join(&c.name);
        let gone = |dir: &Path| {
            let _ = std::fs::remove_dir(dir);
            Ok(None)
        };
        let Ok(data_from) = data_path_for(&header_from) else {
            return gone(&dir);
        };
        let data = dir.join(data_from.file_name().unwrap_or_default());
        if let Err(e) = std::fs::rename(&data_from, &data) {
            if e.kind() == std::io::ErrorKind::NotFound {
                return gone(&dir);
            }
            let _ = std::fs::remove_dir(&dir);
            return Err(io_err("claim (rename into work/)", &data_from)(e));
        }
        // From here on a crash leaves the data in work/ and the header in incoming/: the scan of
        // recovery finishes the claim. So does the next scan of this spool if the rename fails.
        let header = dir.join(&c.name);
        std::fs::rename(&header_from, &header).map_err(io_err("claim (rename into work/)", &header_from))?;
        sync_dir(&dir)?;
        sync_dir(&self.incoming)?;
        let parts = Parts {
            id: id.clone(),
            dir,
            header,
            data,
            recovered: false,
            attempts: 0,
        };
        Ok(Some(Claimed::new(
            parts,
            Arc::clone(&self.own),
            &self.held,
            &self.done,
            &self.failed,
        )))
    }

    /// Moves `c` (and its data file, if any) to `failed/` with the reason; a [`Notice`] says so.
    pub(super) fn reject(&mut self, c: &Candidate, reason: &str) {
        self.waiting.remove(&c.name);
        match self.try_reject(c, reason) {
            Ok(Some(to)) => self.notice(Notice::Rejected {
                name: c.name.to_string_lossy().into_owned(),
                to,
                reason: reason.to_string(),
            }),
            Ok(None) => {}
            Err(e) => self.notice(Notice::Skipped(e)),
        }
    }

    /// The files are gathered in a hidden folder of this spool's owner folder, the reason first,
    /// and the folder is renamed into `failed/`: a crash midway leaves a folder that recovery
    /// moves on, and whatever is still in `incoming/` is refused again.
    fn try_reject(&mut self, c: &Candidate, reason: &str) -> Result<Option<std::path::PathBuf>, SpoolError> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let name = clean_name(&c.name);
        let staging = self.own.path().join(format!(
            "{}{}",
            super::recover::REJECT_PREFIX,
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir(&staging).map_err(io_err("create folder", &staging))?;
        let reason_file = staging.join(format!("{name}.reason"));
        claimed::write_synced(&reason_file, claimed::reason_text(reason, &name, 0).as_bytes())?;
        let header_from = self.incoming.join(&c.name);
        if let Err(e) = std::fs::rename(&header_from, staging.join(&c.name)) {
            let _ = std::fs::remove_file(&reason_file);
            let _ = std::fs::remove_dir(&staging);
            if e.kind() == std::io::ErrorKind::NotFound {
                return Ok(None);
            }
            return Err(io_err("rename into failed/", &header_from)(e));
        }
        if let Ok(data) = data_path_for(&header_from) {
            let to = staging.join(data.file_name().unwrap_or_default());
            match std::fs::rename(&data, &to) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_err("rename into failed/", &data)(e)),
            }
        }
        sync_dir(&staging)?;
        sync_dir(&self.incoming)?;
        let to = claimed::move_unique(&staging, &self.failed, &name)?;
        sync_dir(&self.failed)?;
        sync_dir(self.own.path())?;
        Ok(Some(to))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_and_their_scene_ids() {
        assert!(is_header(OsStr::new("a.hdr")) && is_header(OsStr::new("a.HDR")));
        for not in [".a.hdr", ".a.hdr.tmp", "a.img", "hdr", ".hdr", "a.hdr.tmp"] {
            assert!(!is_header(OsStr::new(not)), "{not}");
        }
        assert_eq!(scene_id(OsStr::new("pass-7.v2.hdr")), Ok("pass-7.v2".into()));
        assert!(scene_id(OsStr::new("a b.hdr")).unwrap_err().contains("character"));
        #[cfg(unix)]
        {
            use std::os::unix::ffi::OsStrExt as _;
            let latin1 = OsStr::from_bytes(b"sc\xe8ne.hdr");
            assert!(scene_id(latin1).unwrap_err().contains("not UTF-8"));
            assert_eq!(clean_name(latin1), "sc_ne");
        }
        assert_eq!(clean_name(OsStr::new("a b$.hdr")), "a_b_");
        assert_eq!(clean_name(OsStr::new("x y.HDR")), "x_y");
    }
}
