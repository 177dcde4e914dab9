//! The outbox and the state folder: one folder per scene, a failed scene moved aside, and a
//! marker for each scene in flight so that a restart finds what a killed daemon left.
//!
//! A scene's folder is `OUTBOX/<scene id>`. An id that already has a folder is not refused and
//! never overwritten: the scene gets `<id>+2`, `<id>+3`, ... (`+` is outside the scene-id
//! alphabet, so such a name never collides with another scene's own). A failed scene's folder
//! (committed segments and all) moves to `OUTBOX/.failed/<folder>` with an `error.json` naming
//! the error; ids cannot start with `.`, so `.failed` is never a scene's.

use std::path::{Path, PathBuf};

use super::DaemonError;

/// The folder failed scenes are moved into, inside the outbox.
pub const FAILED: &str = ".failed";

/// The folder of in-flight markers, inside the state folder.
pub const IN_FLIGHT: &str = "in-flight";

/// How many numbered folders one scene id may take before new scenes of that id are refused.
const MAX_COPIES: u32 = 10_000;

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> DaemonError + '_ {
    move |source| DaemonError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Creates the outbox, its `.failed` folder and the state folder's marker folder.
pub fn prepare(outbox: &Path, state: &Path) -> Result<(), DaemonError> {
    for dir in [outbox.join(FAILED), state.join(IN_FLIGHT)] {
        std::fs::create_dir_all(&dir).map_err(io(&dir))?;
    }
    Ok(())
}

/// Creates the folder of scene `id` (checked by the source) and returns it: `<id>`, else the
/// first free `<id>+N`. Creating is the claim, so two scenes of one id never share a folder.
pub fn claim(outbox: &Path, id: &str) -> Result<PathBuf, DaemonError> {
    for n in 1..=MAX_COPIES {
        let name = if n == 1 { id.to_string() } else { format!("{id}+{n}") };
        let dir = outbox.join(&name);
        match std::fs::create_dir(&dir) {
            Ok(()) => {
                // Journal and queue records name the folder: its entry is on disk first.
                sync_dir(outbox).map_err(io(outbox))?;
                return Ok(dir);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(io(&dir)(e)),
        }
    }
    Err(DaemonError::Io {
        path: outbox.join(id),
        source: std::io::Error::other(format!("{MAX_COPIES} folders of this scene id exist already")),
    })
}

/// Where a folder moved aside is recorded (the delivery queue, whose entries name it), before
/// it moves: `(from, to)`.
pub type RecordMove<'a> = &'a dyn Fn(&Path, &Path) -> Result<(), DaemonError>;

/// Moves a failed scene's folder aside, with `error.json` holding `error`; returns where it went.
///
/// `record` hears the move before the rename, so what names the folder never names a place it
/// is not (a crash between the two leaves the folder in place, recorded as moved, and the next
/// start's [`recover`] moves it to the same name). A rename that fails is recorded back.
pub fn move_aside(
    outbox: &Path,
    folder: &Path,
    error: &serde_json::Value,
    record: RecordMove<'_>,
) -> Result<PathBuf, DaemonError> {
    let name = folder.file_name().unwrap_or(folder.as_os_str());
    let failed = outbox.join(FAILED);
    let mut to = failed.join(name);
    let mut n = 2;
    while to.exists() {
        to = failed.join(format!("{}+{n}", name.to_string_lossy()));
        n += 1;
    }
    // Written inside the folder, so it moves with it; a full disk leaves the move without it
    // (the daemon's log has the error) and no empty file.
    let file = folder.join("error.json");
    let text = serde_json::to_vec_pretty(error).unwrap_or_default();
    if write_synced(&file, &text).is_err() {
        let _ = std::fs::remove_file(&file);
    }
    record(folder, &to)?;
    if let Err(e) = std::fs::rename(folder, &to) {
        let _ = record(&to, folder);
        return Err(io(folder)(e));
    }
    // The move is done: a folder sync that fails (the disk, not the move) does not undo it.
    for d in [&failed, &outbox.to_path_buf()] {
        let _ = sync_dir(d);
    }
    Ok(to)
}

/// Records a move of a scene's folder in the delivery queue, when there is one (a
/// [`RecordMove`]).
pub fn relocate(queue: Option<&crate::delivery::Queue>, from: &Path, to: &Path) -> Result<(), DaemonError> {
    let Some(q) = queue else { return Ok(()) };
    q.relocate(from, to).map_err(|e| DaemonError::Runtime {
        what: "recording a scene's move in the delivery queue",
        source: std::io::Error::other(crate::engine::error_chain(&e)),
    })
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

fn write_synced(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut f = std::fs::File::create(path)?;
    std::io::Write::write_all(&mut f, bytes)?;
    f.sync_all()
}

/// Marks the scene in `folder` as in flight (removed by [`InFlight::finish`]; a marker left
/// behind means the process ended mid-scene).
pub struct InFlight {
    marker: PathBuf,
}

impl InFlight {
    /// Writes the marker of `folder` (the scene `info` describes, run by `model`).
    pub fn start(state: &Path, folder: &Path, scene_id: &str, model: &str) -> Result<Self, DaemonError> {
        let name = folder.file_name().unwrap_or(folder.as_os_str());
        let marker = state.join(IN_FLIGHT).join(name);
        let text = serde_json::json!({
            "scene_id": scene_id,
            "folder": folder,
            "model": model,
            "pid": std::process::id(),
        });
        std::fs::write(&marker, text.to_string()).map_err(io(&marker))?;
        Ok(Self { marker })
    }

    /// The scene is over (written or moved aside).
    pub fn finish(self) -> Result<(), DaemonError> {
        std::fs::remove_file(&self.marker).map_err(io(&self.marker))
    }
}

/// What a marker found at start says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interrupted {
    /// The scene's folder.
    pub folder: PathBuf,
    /// Where it was moved (`None` when the folder was gone or the scene had completed).
    pub moved_to: Option<PathBuf>,
    /// The scene had completed (its segments were queued for delivery) before the process ended.
    pub completed: bool,
    /// Why it could not be moved aside (it stays, with its marker, for the next start).
    pub not_moved: Option<String>,
}

/// Moves aside the scenes a previous process left in flight (killed, or cut off by a drain that
/// ran out of time before it could move them), `record`ing each move before it, and then removes
/// their markers; a scene whose folder
/// `completed` says finished (queued for delivery just before the end) is kept where it is.
pub fn recover(
    outbox: &Path,
    state: &Path,
    completed: &dyn Fn(&Path) -> bool,
    record: RecordMove<'_>,
) -> Result<Vec<Interrupted>, DaemonError> {
    let dir = state.join(IN_FLIGHT);
    let mut found = Vec::new();
    let entries = std::fs::read_dir(&dir).map_err(io(&dir))?;
    for entry in entries {
        let entry = entry.map_err(io(&dir))?;
        let name = entry.file_name();
        let folder = outbox.join(&name);
        // Only a plain name that could be a scene's folder is followed; a stray file is removed.
        let plausible = name.to_str().is_some_and(|n| !n.starts_with('.') && !n.contains('/'));
        let done = plausible && completed(&folder);
        let mut not_moved = None;
        let moved_to = if plausible && !done && folder.is_dir() {
            let error = serde_json::json!({
                "error": "interrupted: the daemon stopped while this scene was in flight (killed, or \
                          its drain timed out); its committed segments are kept here",
            });
            match move_aside(outbox, &folder, &error, record) {
                Ok(to) => Some(to),
                Err(e) => {
                    not_moved = Some(crate::engine::error_chain(&e));
                    None
                }
            }
        } else {
            None
        };
        // A scene that could not be moved keeps its marker: the next start tries again.
        if not_moved.is_none() {
            std::fs::remove_file(entry.path()).map_err(io(&entry.path()))?;
        }
        found.push(Interrupted {
            folder,
            moved_to,
            completed: done,
            not_moved,
        });
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_seen_before_gets_a_numbered_folder_and_nothing_is_overwritten() {
        let t = tempfile::tempdir().unwrap();
        let a = claim(t.path(), "pass-1").unwrap();
        let b = claim(t.path(), "pass-1").unwrap();
        let c = claim(t.path(), "pass-1").unwrap();
        assert_eq!(a, t.path().join("pass-1"));
        assert_eq!(b, t.path().join("pass-1+2"));
        assert_eq!(c, t.path().join("pass-1+3"));
    }

    #[test]
    fn failed_and_interrupted_scenes_are_moved_aside_with_their_error() {
        let t = tempfile::tempdir().unwrap();
        let (outbox, state) = (t.path().join("out"), t.path().join("state"));
        prepare(&outbox, &state).unwrap();
        let f = claim(&outbox, "s").unwrap();
        std::fs::write(f.join("part"), b"x").unwrap();
        let moves = std::cell::RefCell::new(Vec::new());
        let record = |from: &Path, to: &Path| {
            // The folder is still where it was when the move is recorded.
            assert!(from.is_dir() && !to.exists());
            moves.borrow_mut().push((from.to_path_buf(), to.to_path_buf()));
            Ok(())
        };
        let to = move_aside(&outbox, &f, &serde_json::json!({"error": "boom"}), &record).unwrap();
        assert_eq!(*moves.borrow(), [(f.clone(), to.clone())]);
        // A move that cannot be recorded does not happen.
        let k = claim(&outbox, "k").unwrap();
        let refuse = |_: &Path, to: &Path| Err(io(to)(std::io::Error::other("state disk full")));
        assert!(move_aside(&outbox, &k, &serde_json::json!({}), &refuse).is_err());
        assert!(k.is_dir() && !outbox.join(FAILED).join("k").exists());
        assert_eq!(to, outbox.join(FAILED).join("s"));
        assert!(to.join("part").is_file() && !f.exists());
        assert!(std::fs::read_to_string(to.join("error.json")).unwrap().contains("boom"));

        // A marker left by a killed process: the folder moves aside, the marker goes.
        let g = claim(&outbox, "s").unwrap();
        let marker = InFlight::start(&state, &g, "s", "m").unwrap();
        std::mem::forget(marker);
        let found = recover(&outbox, &state, &|_| false, &record).unwrap();
        assert_eq!(found.len(), 1);
        assert_eq!(
            found[0].moved_to.as_deref(),
            Some(outbox.join(FAILED).join("s+2").as_path())
        );
        assert_eq!(std::fs::read_dir(state.join(IN_FLIGHT)).unwrap().count(), 0);
        // A finished scene leaves no marker.
        let h = claim(&outbox, "t").unwrap();
        InFlight::start(&state, &h, "t", "m").unwrap().finish().unwrap();
        assert!(recover(&outbox, &state, &|_| false, &record).unwrap().is_empty());
        // A marker of a scene that had completed (queued for delivery): the folder stays.
        std::mem::forget(InFlight::start(&state, &h, "t", "m").unwrap());
        let found = recover(&outbox, &state, &|f| f == h.as_path(), &record).unwrap();
        assert!(found[0].completed && found[0].moved_to.is_none() && h.is_dir());
    }
}
