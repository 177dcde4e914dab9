//! One writer per output folder: an exclusive lock held for a whole run.

use std::fs::{File, OpenOptions};
use std::io::{Read as _, Seek as _, Write as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::MapError;

/// The lock file beside an output set; it holds the pid of the process writing the folder.
pub const LOCK_NAME: &str = ".hsiedge.lock";

/// What a writer does when another process holds the folder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Contention {
    /// Fail at once, naming the folder and the holder's pid.
    #[default]
    Fail,
    /// Wait until the holder is done.
    Wait,
}

/// An output folder held for writing: an exclusive `flock` on its lock file, released when the
/// last clone is dropped.
///
/// Every output set is staged and committed through one (see [`super::Staged::new`]), so two
/// processes never write one folder at once. A folder the lock had to create is removed again
/// when the last clone drops while nothing but the lock file is in it: a run that fails leaves
/// no empty folder of its own making.
#[derive(Debug, Clone)]
pub struct OutputDir {
    held: Arc<Held>,
}

#[derive(Debug)]
struct Held {
    path: PathBuf,
    /// Locked while this lives (the lock goes with the open file description).
    file: File,
    /// Folders this lock created, outermost first.
    created: Vec<PathBuf>,
}

impl OutputDir {
    /// Creates `path` (and its missing parents) if needed and locks it for this process.
    ///
    /// When another process holds it, fails with [`MapError::Busy`] naming its pid, or with
    /// [`Contention::Wait`] says so on stderr and waits.
    pub fn lock(path: &Path, contention: Contention) -> Result<Self, MapError> {
        let io = |p: &Path| {
            let p = p.to_path_buf();
            move |source| MapError::Io { path: p, source }
        };
        let lock_path = path.join(LOCK_NAME);
        let mut created = Vec::new();
        loop {
            created.extend(create_dirs(path)?);
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&lock_path)
                .map_err(io(&lock_path))?;
            match file.try_lock() {
                Ok(()) => {}
                Err(std::fs::TryLockError::WouldBlock) => {
                    let pid = holder(&file);
                    if contention == Contention::Fail {
                        return Err(MapError::Busy {
                            dir: path.to_path_buf(),
                            pid,
                        });
                    }
                    eprintln!(
                        "hsiedge: waiting for {} ({}), which is writing {}",
                        pid.map_or("another process".to_string(), |p| format!("pid {p}")),
                        lock_path.display(),
                        path.display()
                    );
                    file.lock().map_err(io(&lock_path))?;
                }
                Err(std::fs::TryLockError::Error(e)) => return Err(io(&lock_path)(e)),
            }
            // A holder that made the folder removes it when its run fails: a lock on the file it
            // unlinked guards nothing, so lock whatever is at the path now.
            if same_file(&file, &lock_path) {
                let mut file = file;
                let pid = format!("{}\n", std::process::id());
                file.set_len(0)
                    .and_then(|()| file.rewind())
                    .and_then(|()| file.write_all(pid.as_bytes()))
                    .map_err(io(&lock_path))?;
                return Ok(Self {
                    held: Arc::new(Held {
                        path: path.to_path_buf(),
                        file,
                        created,
                    }),
                });
            }
        }
    }

    /// The folder.
    pub fn path(&self) -> &Path {
        &self.held.path
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let Some(outer) = self.created.first() else {
            return;
        };
        let only_lock = std::fs::read_dir(&self.path)
            .is_ok_and(|mut entries| entries.all(|e| e.is_ok_and(|e| e.file_name() == LOCK_NAME)));
        if !only_lock {
            return;
        }
        // Still locked while the file goes, so no other writer is between the two.
        let _ = std::fs::remove_file(self.path.join(LOCK_NAME));
        for dir in self.created.iter().rev() {
            if std::fs::remove_dir(dir).is_err() {
                break;
            }
        }
        let _ = self.file.sync_all();
        if let Some(parent) = outer.parent().and_then(|p| File::open(p).ok()) {
            let _ = parent.sync_all();
        }
    }
}

/// Creates `path` and its missing parents; returns those it created, outermost first.
fn create_dirs(path: &Path) -> Result<Vec<PathBuf>, MapError> {
    let mut missing = Vec::new();
    let mut at = Some(path);
    while let Some(p) = at {
        if p.as_os_str().is_empty() || p.exists() {
            break;
        }
        missing.push(p.to_path_buf());
        at = p.parent();
    }
    missing.reverse();
    let mut created = Vec::new();
    for dir in missing {
        match std::fs::create_dir(&dir) {
            Ok(()) => created.push(dir),
            // Made by someone else meanwhile: theirs, not ours to remove.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && dir.is_dir() => {}
            Err(source) => return Err(MapError::Io { path: dir, source }),
        }
    }
    if !path.is_dir() {
        return Err(MapError::NotAFolder {
            path: path.to_path_buf(),
        });
    }
    Ok(created)
}

/// The pid the holder wrote into the lock file, if it has.
fn holder(file: &File) -> Option<u32> {
    let mut text = String::new();
    let mut file = file;
    file.rewind().ok()?;
    file.read_to_string(&mut text).ok()?;
    text.trim().parse().ok()
}

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
    fn a_second_writer_fails_naming_the_holder_then_gets_the_folder_once_it_is_free() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("a/b");
        let first = OutputDir::lock(&out, Contention::Fail).unwrap();
        // flock is per open file description: a second open in this process contends as another
        // process would.
        let err = OutputDir::lock(&out, Contention::Fail).unwrap_err();
        let text = err.to_string();
        assert!(text.contains(&out.display().to_string()), "{text}");
        assert!(text.contains(&format!("pid {}", std::process::id())), "{text}");
        let waiter = {
            let out = out.clone();
            std::thread::spawn(move || OutputDir::lock(&out, Contention::Wait).map(|_| ()))
        };
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(!waiter.is_finished(), "the waiter waits while the folder is held");
        std::fs::write(out.join("kept"), b"x").unwrap();
        drop(first);
        waiter.join().unwrap().unwrap();
        assert!(out.join("kept").exists());
    }

    #[test]
    fn a_folder_the_lock_made_goes_when_nothing_was_written_into_it() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("new/deeper");
        drop(OutputDir::lock(&out, Contention::Fail).unwrap());
        assert!(!dir.path().join("new").exists(), "both made folders removed");

        // A folder that existed stays, lock file and all.
        std::fs::create_dir(dir.path().join("there")).unwrap();
        drop(OutputDir::lock(&dir.path().join("there"), Contention::Fail).unwrap());
        assert!(dir.path().join("there").join(LOCK_NAME).exists());
    }

    #[test]
    fn a_waiter_whose_holder_removed_the_folder_makes_it_again() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("made");
        let first = OutputDir::lock(&out, Contention::Fail).unwrap();
        let waiter = {
            let out = out.clone();
            std::thread::spawn(move || OutputDir::lock(&out, Contention::Wait))
        };
        std::thread::sleep(std::time::Duration::from_millis(100));
        drop(first);
        let second = waiter.join().unwrap().unwrap();
        assert!(out.join(LOCK_NAME).exists());
        assert!(OutputDir::lock(&out, Contention::Fail).is_err(), "the waiter holds it");
        drop(second);
        assert!(!out.exists());
    }

    #[test]
    fn a_file_in_the_way_is_named() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), b"").unwrap();
        let err = OutputDir::lock(&dir.path().join("f"), Contention::Fail).unwrap_err();
        assert!(err.to_string().contains("not a folder"), "{err}");
    }
}
