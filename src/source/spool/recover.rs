//! Scenes in this spool's owner folders that no live claim holds: left by a process that died
//! (in an adopted folder) or by a dropped [`Claimed`]. They are handed out again, or failed.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::claimed::{self, Claimed, Parts};
use super::owner::{OwnerDir, only_lock};
use super::{Notice, Spool, SpoolError, io_err, sync_dir};
use crate::cube::data_path_for;

/// Prefix of a hidden folder gathering a refused scene's files on their way to `failed/`.
pub(super) const REJECT_PREFIX: &str = ".reject-";

/// What an owner folder holds besides its lock.
enum Entry {
    /// A scene folder.
    Scene(PathBuf, String),
    /// A refused scene on its way to `failed/`.
    Reject(PathBuf),
}

impl Spool {
    /// The entries of this spool's owner folders that no live claim holds, with their folder.
    fn unheld(&mut self) -> Vec<(Arc<OwnerDir>, Entry)> {
        let held = self.held.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let mut out = Vec::new();
        let owners: Vec<_> = std::iter::once(&self.own).chain(&self.adopted).cloned().collect();
        for owner in &owners {
            let entries = match std::fs::read_dir(owner.path()) {
                Ok(entries) => entries,
                Err(e) => {
                    self.notice(Notice::Skipped(io_err("list", owner.path())(e)));
                    continue;
                }
            };
            let mut found: Vec<_> = entries
                .flatten()
                .filter_map(|e| {
                    let name = e.file_name().into_string().ok()?;
                    let path = e.path();
                    if name.starts_with(REJECT_PREFIX) {
                        return Some(Entry::Reject(path));
                    }
                    if name.starts_with('.') || held.contains(&path) || !e.file_type().ok()?.is_dir() {
                        return None;
                    }
                    Some(Entry::Scene(path, name))
                })
                .map(|e| (Arc::clone(owner), e))
                .collect();
            found.sort_by(|a, b| entry_path(&a.1).cmp(entry_path(&b.1)));
            out.extend(found);
        }
        out
    }

    /// Whether a scan would hand out or fail a scene of the owner folders.
    pub(super) fn recoverable(&mut self) -> Result<bool, SpoolError> {
        Ok(!self.unheld().is_empty())
    }

    /// Hands out the first scene of the owner folders that no claim holds, flagged recovered;
    /// moves refused scenes left midway on to `failed/`, and fails scenes that cannot be whole or
    /// were handed out too often. Owner folders adopted and emptied are let go.
    pub(super) fn next_recovered(&mut self) -> Result<Option<Claimed>, SpoolError> {
        for (owner, entry) in self.unheld() {
            let result = match entry {
                Entry::Reject(path) => self.finish_reject(&path).map(|()| None),
                Entry::Scene(path, id) => self.recover(owner, &path, &id),
            };
            match result {
                Ok(Some(c)) => return Ok(Some(c)),
                Ok(None) => {}
                Err(e) => self.notice(Notice::Skipped(e)),
            }
        }
        // The spool's own reference is the last one: nothing of the folder is claimed.
        self.adopted
            .retain(|d| Arc::strong_count(d) > 1 || !only_lock(d.path()));
        Ok(None)
    }

    /// Moves a refused scene's hidden folder (its reason written first) to `failed/`.
    fn finish_reject(&mut self, path: &Path) -> Result<(), SpoolError> {
        let reason = std::fs::read_dir(path)
            .map_err(io_err("list", path))?
            .flatten()
            .find_map(|e| e.file_name().to_str()?.strip_suffix(".reason").map(str::to_string));
        let Some(name) = reason else {
            // Cut before its reason was written: nothing was moved into it yet.
            return std::fs::remove_dir(path).map_err(io_err("remove", path));
        };
        let to = claimed::move_unique(path, &self.failed, &name)?;
        sync_dir(&self.failed)?;
        self.notice(Notice::Rejected {
            name: name.clone(),
            to,
            reason: "refused earlier; its move to failed/ was cut short".into(),
        });
        Ok(())
    }

    /// Hands out the scene folder `dir` (of `owner`) again, finishing a claim a crash cut between
    /// its two renames; or fails it when it cannot be whole or ran out of attempts.
    fn recover(&mut self, owner: Arc<OwnerDir>, dir: &Path, id: &str) -> Result<Option<Claimed>, SpoolError> {
        let header = find_header(dir, id);
        let probe = header.clone().unwrap_or_else(|| dir.join(format!("{id}.hdr")));
        let data = data_path_for(&probe).ok();
        let header = match (header, &data) {
            (Some(h), Some(_)) => h,
            (None, None) => {
                // Cut between the folder's creation and the first rename.
                let _ = std::fs::remove_file(dir.join(claimed::ATTEMPTS));
                if std::fs::remove_dir(dir).is_ok() {
                    sync_dir(owner.path())?;
                    return Ok(None);
                }
                return self.fail(dir, id, "a scene folder in work/ without a header or data file");
            }
            (None, Some(_)) => match find_header(&self.incoming, id) {
                // Cut between the two renames of the claim: finish it.
                Some(from) => {
                    let to = dir.join(from.file_name().unwrap_or_default());
                    std::fs::rename(&from, &to).map_err(io_err("claim (rename into work/)", &from))?;
                    sync_dir(dir)?;
                    sync_dir(&self.incoming)?;
                    to
                }
                None => {
                    return self.fail(
                        dir,
                        id,
                        "its claim was cut short after the data file was moved, and the header is no \
                         longer in incoming/",
                    );
                }
            },
            (Some(_), None) => return self.fail(dir, id, "the data file is missing from the claimed scene"),
        };
        let attempts = claimed::read_attempts(dir);
        if attempts >= self.options.max_attempts {
            let reason =
                format!("started {attempts} times without finishing (each time its process died or dropped it)");
            return self.fail(dir, id, &reason);
        }
        let parts = Parts {
            id: id.to_string(),
            dir: dir.to_path_buf(),
            header,
            data: data.unwrap_or_default(),
            recovered: true,
            attempts,
        };
        Ok(Some(Claimed::new(parts, owner, &self.held, &self.done, &self.failed)))
    }

    /// Moves the scene folder `dir` to `failed/` with the reason; a notice says so.
    fn fail(&mut self, dir: &Path, id: &str, reason: &str) -> Result<Option<Claimed>, SpoolError> {
        let text = claimed::reason_text(reason, id, claimed::read_attempts(dir));
        let to = claimed::finish(dir, id, "reason", &text, &self.failed)?;
        self.notice(Notice::Rejected {
            name: id.to_string(),
            to,
            reason: reason.to_string(),
        });
        Ok(None)
    }
}

fn entry_path(e: &Entry) -> &Path {
    match e {
        Entry::Scene(p, _) | Entry::Reject(p) => p,
    }
}

/// The header of scene `id` in `dir`: `id.hdr`, its extension in any case.
fn find_header(dir: &Path, id: &str) -> Option<PathBuf> {
    let exact = dir.join(format!("{id}.hdr"));
    if exact.symlink_metadata().is_ok() {
        return Some(exact);
    }
    std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|e| e.file_name())
        .find_map(|name| {
            let b = name.as_encoded_bytes();
            let hit =
                b.len() == id.len() + 4 && b.starts_with(id.as_bytes()) && b[id.len()..].eq_ignore_ascii_case(b".hdr");
            hit.then(|| dir.join(name))
        })
}
