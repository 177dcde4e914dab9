//! Owner folders under `work/`: one per live [`super::Spool`], each locked for as long as its
//! process lives, so the scenes of a process that died can be told from those of a live one.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::{SpoolError, io_err, sync_dir};

/// The lock file inside an owner folder.
pub(super) const LOCK: &str = ".lock";

/// Prefix of an owner folder being set up (hidden, so nobody adopts it half made).
const NEW_PREFIX: &str = ".new-";

/// Age past which a `.new-` folder is taken for a leftover (setting one up takes microseconds).
const STAGING_MAX_AGE: std::time::Duration = std::time::Duration::from_secs(60);

/// A folder of `work/` this process holds: an exclusive `flock` on its [`LOCK`] file, released
/// by the kernel when the process dies, however it dies.
///
/// Dropped (by the spool and every claim in it), it removes itself when nothing but its lock is
/// left in it; otherwise it stays, unlocked, for the next spool to adopt.
#[derive(Debug)]
pub(super) struct OwnerDir {
    path: PathBuf,
    /// Locked while this lives (the lock goes with the open file description).
    _lock: File,
}

impl OwnerDir {
    /// Makes a new owner folder in `work`, locked before anyone can see it: it is set up under a
    /// hidden name and renamed into place.
    pub(super) fn create(work: &Path) -> Result<Self, SpoolError> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let id = format!(
            "{}-{}.{:09}-{}",
            std::process::id(),
            now.as_secs(),
            now.subsec_nanos(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let staging = work.join(format!("{NEW_PREFIX}{id}"));
        let path = work.join(format!("owner-{id}"));
        std::fs::create_dir(&staging).map_err(io_err("create folder", &staging))?;
        let lock_path = staging.join(LOCK);
        let lock = File::create(&lock_path).map_err(io_err("create", &lock_path))?;
        lock.try_lock().map_err(|e| SpoolError::Io {
            what: format!("{}: lock", lock_path.display()),
            source: e.into(),
        })?;
        std::fs::rename(&staging, &path).map_err(io_err("rename into place", &staging))?;
        sync_dir(work)?;
        Ok(Self { path, _lock: lock })
    }

    /// Takes over the owner folder `path` when no live process holds it; `None` when one does (or
    /// when the folder went away meanwhile).
    ///
    /// A folder without a lock file (its owner died while removing it) gets one.
    pub(super) fn try_adopt(path: &Path) -> Result<Option<Self>, SpoolError> {
        let lock_path = path.join(LOCK);
        let lock = match OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(&lock_path)
        {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_err("open", &lock_path)(e)),
        };
        match lock.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => return Ok(None),
            Err(std::fs::TryLockError::Error(e)) => return Err(io_err("lock", &lock_path)(e)),
        }
        // The lock is good only if the file is still the folder's lock file: its last owner may
        // have removed it (and the folder) between our open and our lock.
        if !same_file(&lock, &lock_path) {
            return Ok(None);
        }
        Ok(Some(Self {
            path: path.to_path_buf(),
            _lock: lock,
        }))
    }

    /// Removes a half-made owner folder (a `.new-` one) left by a process that died setting it up.
    ///
    /// Only one a minute old: a young one may be between its creation and the lock of its lock
    /// file, which a lock taken here would break. Such a folder never holds a scene.
    pub(super) fn remove_stale_staging(path: &Path) {
        let age = std::fs::symlink_metadata(path)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok());
        if age.is_some_and(|a| a > STAGING_MAX_AGE)
            && let Ok(Some(dir)) = Self::try_adopt(path)
        {
            drop(dir);
        }
    }

    /// Whether `name` (an entry of `work/`) is an owner folder being set up.
    pub(super) fn is_staging(name: &str) -> bool {
        name.starts_with(NEW_PREFIX)
    }

    /// The folder.
    pub(super) fn path(&self) -> &Path {
        &self.path
    }
}

/// Whether only the lock file is left in the owner folder `dir`.
pub(super) fn only_lock(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|entries| entries.flatten().all(|e| e.file_name() == LOCK))
}

impl Drop for OwnerDir {
    fn drop(&mut self) {
        // Nothing else adds to a held folder, so an empty one stays empty until it is removed.
        if only_lock(&self.path) {
            let _ = std::fs::remove_file(self.path.join(LOCK));
            if std::fs::remove_dir(&self.path).is_ok()
                && let Some(parent) = self.path.parent()
            {
                let _ = sync_dir(parent);
            }
        }
    }
}

/// Whether the open `file` is the file at `path` now.
fn same_file(file: &File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    match (file.metadata(), std::fs::metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_folder_is_not_adopted_and_a_released_one_is() {
        let work = tempfile::tempdir().unwrap();
        let a = OwnerDir::create(work.path()).unwrap();
        assert!(a.path().join(LOCK).is_file());
        assert!(OwnerDir::try_adopt(a.path()).unwrap().is_none(), "held by a live owner");
        // Something left in it keeps the folder after its owner goes.
        std::fs::create_dir(a.path().join("scene")).unwrap();
        let path = a.path().to_path_buf();
        drop(a);
        assert!(path.is_dir());
        let b = OwnerDir::try_adopt(&path).unwrap().expect("released");
        assert!(OwnerDir::try_adopt(&path).unwrap().is_none(), "held by its adopter");
        std::fs::remove_dir(path.join("scene")).unwrap();
        drop(b);
        assert!(!path.exists(), "an emptied folder is removed");
        assert_eq!(std::fs::read_dir(work.path()).unwrap().count(), 0);
    }

    #[test]
    fn a_folder_that_lost_its_lock_file_is_adopted() {
        let work = tempfile::tempdir().unwrap();
        let dir = work.path().join("owner-x");
        std::fs::create_dir_all(dir.join("scene")).unwrap();
        let held = OwnerDir::try_adopt(&dir)
            .unwrap()
            .expect("no lock file: nobody holds it");
        assert!(dir.join(LOCK).is_file());
        drop(held);
        assert!(dir.join("scene").is_dir());
    }
}
