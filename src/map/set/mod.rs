//! An output set, switched into place as a whole.
//!
//! Layout of an output folder `OUT`:
//!
//! ```text
//! OUT/.hsiedge.lock             the writer's lock (lock.rs)
//! OUT/.set-<run id>/            one complete set: class_map.hdr, class_map.img, ..., summary.json
//! OUT/current -> .set-<run id>  the set in force: the one symbolic link a commit replaces
//! OUT/class_map.hdr -> current/class_map.hdr, ...   a stable link per file name of the set
//! ```
//!
//! A set is written into a hidden folder of its own, synced, and made current by renaming one
//! new symbolic link over `current`: every instant shows exactly one complete set, whatever kills
//! the writer. The stable per-name links let readers open `OUT/class_map.hdr` as before; a reader
//! that must see one set throughout resolves `OUT/current` once and reads inside it.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::MapError;
use super::lock::{LOCK_NAME, OutputDir};

/// The link naming the set in force.
pub const CURRENT: &str = "current";
/// Prefix of the folder holding each set.
pub const SET_PREFIX: &str = ".set-";

/// Files of one output set, staged into a hidden folder and made current together by
/// [`Staged::commit`]; dropping without committing removes them.
///
/// Each file's sync to disk starts on its own thread as soon as it is written, so the syncs
/// overlap each other and whatever is staged after them. A file can be [reserved](Staged::reserve)
/// before its bytes exist, so a job makes its files while the run is in flight and, after the last
/// batch, only writes them.
#[derive(Debug)]
pub struct Staged {
    out: OutputDir,
    id: String,
    set: PathBuf,
    files: Vec<Entry>,
    /// Stable links this set made that a failed commit must take back.
    links: Vec<PathBuf>,
    committed: bool,
}

#[derive(Debug)]
struct Entry {
    name: String,
    file: std::fs::File,
    /// `None` while reserved and not yet written.
    sync: Option<std::thread::JoinHandle<std::io::Result<()>>>,
    /// The sync of what was appended before the file was finished (one at a time).
    early: Option<std::thread::JoinHandle<std::io::Result<()>>>,
    /// The first error of an earlier such sync.
    early_error: Option<std::io::Error>,
}

impl Staged {
    /// Starts a set in the locked folder `out`, first removing what killed runs left there.
    pub fn new(out: &OutputDir) -> Result<Self, MapError> {
        remove_leftovers(out.path());
        let id = run_id();
        let set = out.path().join(format!("{SET_PREFIX}{id}"));
        step("make the set folder");
        std::fs::create_dir(&set).map_err(|source| MapError::Io {
            path: set.clone(),
            source,
        })?;
        Ok(Self {
            out: out.clone(),
            id,
            set,
            files: Vec::new(),
            links: Vec::new(),
            committed: false,
        })
    }

    /// The folder the set goes to.
    pub fn dir(&self) -> &Path {
        self.out.path()
    }

    /// This set's run id: unique per set, written into each file that can carry it.
    pub fn run_id(&self) -> &str {
        &self.id
    }

    /// Stages `bytes` as `name` (into its reserved file, when [`Staged::reserve`] made one),
    /// starts its sync, and returns the path it will have in the output folder.
    pub fn add(&mut self, name: &str, bytes: &[u8]) -> Result<PathBuf, MapError> {
        let at = match self.files.iter().position(|e| e.name == name && e.sync.is_none()) {
            Some(at) => at,
            None => {
                self.reserve(name)?;
                self.files.len() - 1
            }
        };
        step("write a file");
        let e = &mut self.files[at];
        let written = e.file.write_all(bytes).and_then(|()| spawn_sync(&e.file, false));
        match written {
            Ok(sync) => {
                e.sync = Some(sync);
                Ok(self.out.path().join(name))
            }
            Err(source) => {
                // Dropped, so nothing half written is ever committed or written into again.
                let e = self.files.remove(at);
                let _ = std::fs::remove_file(self.set.join(&e.name));
                Err(MapError::Io {
                    path: self.out.path().join(name),
                    source,
                })
            }
        }
    }

    /// Appends `bytes` to `name` (made if needed) without finishing it: a map written row by row
    /// as a stream finishes its rows. [`Staged::add`] (with the last bytes, or none) finishes it.
    pub fn append(&mut self, name: &str, bytes: &[u8]) -> Result<(), MapError> {
        let at = match self.files.iter().position(|e| e.name == name && e.sync.is_none()) {
            Some(at) => at,
            None => {
                self.reserve(name)?;
                self.files.len() - 1
            }
        };
        step("append to a file");
        self.files[at].file.write_all(bytes).map_err(|source| MapError::Io {
            path: self.out.path().join(name),
            source,
        })
    }

    /// Starts syncing what was appended to `name` so far, on its own thread, so the sync when
    /// the file is finished has only the rest to write; [`Staged::commit`] waits for it. While
    /// the last such sync still runs, none is started (the final sync covers the data).
    pub fn sync_appended(&mut self, name: &str) -> Result<(), MapError> {
        let path = self.out.path().join(name);
        let Some(e) = self.files.iter_mut().find(|e| e.name == name && e.sync.is_none()) else {
            return Err(MapError::Io {
                path,
                source: std::io::Error::other("not a file being appended to"),
            });
        };
        match e.early.take() {
            Some(h) if !h.is_finished() => {
                e.early = Some(h);
                return Ok(());
            }
            Some(h) => {
                if let Err(err) = joined(h) {
                    e.early_error.get_or_insert(err);
                }
            }
            None => {}
        }
        e.early = Some(spawn_sync(&e.file, true).map_err(|source| MapError::Io { path, source })?);
        Ok(())
    }

    /// Makes the file `name` (empty) and returns the path it will have in the output folder;
    /// [`Staged::add`] writes it later. [`Staged::commit`] fails while a reserved file has not
    /// been written.
    pub fn reserve(&mut self, name: &str) -> Result<PathBuf, MapError> {
        let path = self.out.path().join(name);
        if name.is_empty() || name.contains('/') || name.starts_with('.') || name == CURRENT {
            return Err(MapError::Io {
                path,
                source: std::io::Error::other("not a name an output set can hold"),
            });
        }
        step("make a file");
        // Created with 0666 less the umask, as other tools make files meant to be read.
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(self.set.join(name))
            .map_err(|source| MapError::Io {
                path: path.clone(),
                source,
            })?;
        self.files.push(Entry {
            name: name.to_string(),
            file,
            sync: None,
            early: None,
            early_error: None,
        });
        Ok(path)
    }

    /// Waits for every file's sync, syncs the set's folder, and makes the set current by renaming
    /// one link over `current`; then syncs the output folder. Until that rename the set in force
    /// stays whole, and a failure before it removes this set. The set replaced is removed when the
    /// returned [`Retired`] is dropped or handed to [`Retired::remove_in_background`].
    pub fn commit(mut self) -> Result<Retired, MapError> {
        let out = self.out.path().to_path_buf();
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| MapError::Io { path, source }
        };
        let mut failed = None;
        for e in &mut self.files {
            let early = e.early.take().map(joined);
            let synced = match e.sync.take() {
                Some(s) => joined(s),
                None => Err(std::io::Error::other("reserved but never written")),
            }
            .and_then(|()| early.unwrap_or(Ok(())))
            .and_then(|()| e.early_error.take().map_or(Ok(()), Err));
            if let Err(source) = synced {
                failed.get_or_insert(MapError::Io {
                    path: out.join(&e.name),
                    source,
                });
            }
        }
        if let Some(e) = failed {
            return Err(e);
        }
        sync_dir(&self.set).map_err(io(&self.set))?;
        let old = current_set(&out);
        // Stable links for names the folder lacks point into `current` first: they dangle, so
        // look absent, until the switch below brings their file.
        let mut legacy = Vec::new();
        for e in &self.files {
            let public = out.join(&e.name);
            let target = Path::new(CURRENT).join(&e.name);
            match std::fs::symlink_metadata(&public) {
                Ok(m) if m.file_type().is_symlink() && std::fs::read_link(&public).is_ok_and(|t| t == target) => {}
                Ok(_) => legacy.push(e.name.clone()),
                Err(_) => {
                    step("make a stable link");
                    std::os::unix::fs::symlink(&target, &public).map_err(io(&public))?;
                    self.links.push(public);
                }
            }
        }
        let switch = out.join(format!(".{CURRENT}.{}.tmp", self.id));
        let set_name = self.set.file_name().map(PathBuf::from).unwrap_or_default();
        step("make the new current link");
        std::os::unix::fs::symlink(&set_name, &switch).map_err(io(&switch))?;
        step("switch current");
        if let Err(source) = std::fs::rename(&switch, out.join(CURRENT)) {
            let _ = std::fs::remove_file(&switch);
            return Err(MapError::Io {
                path: out.join(CURRENT),
                source,
            });
        }
        self.committed = true;
        step("sync the output folder");
        let _ = sync_dir(&out);
        // A folder written before sets existed holds plain files under the set's names: each is
        // replaced by its link now, one rename each, so the names show the new set from here on.
        for name in &legacy {
            let public = out.join(name);
            let tmp = out.join(format!(".link.{name}.{}.tmp", self.id));
            step("make a link over an old file");
            let placed = std::os::unix::fs::symlink(Path::new(CURRENT).join(name), &tmp)
                .and_then(|()| std::fs::rename(&tmp, &public));
            if let Err(source) = placed {
                let _ = std::fs::remove_file(&tmp);
                return Err(MapError::Io { path: public, source });
            }
        }
        remove_stale_links(&out, &self.files.iter().map(|e| e.name.as_str()).collect::<Vec<_>>());
        if !legacy.is_empty() {
            step("sync the output folder");
            let _ = sync_dir(&out);
        }
        Ok(Retired {
            dirs: old.into_iter().filter(|o| *o != self.set).collect(),
        })
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if self.committed {
            return;
        }
        // Not committed: the set in force stays, and nothing of this one is left.
        for e in &mut self.files {
            for s in e.early.take().into_iter().chain(e.sync.take()) {
                let _ = s.join();
            }
        }
        for link in &self.links {
            let _ = std::fs::remove_file(link);
        }
        let _ = std::fs::remove_dir_all(&self.set);
    }
}

/// Syncs `file` (its data only, or all of it) on a thread of its own.
fn spawn_sync(file: &std::fs::File, data_only: bool) -> std::io::Result<std::thread::JoinHandle<std::io::Result<()>>> {
    let file = file.try_clone()?;
    std::thread::Builder::new()
        .name("hsiedge-sync".into())
        .spawn(move || if data_only { file.sync_data() } else { file.sync_all() })
}

/// A sync thread's result.
fn joined(h: std::thread::JoinHandle<std::io::Result<()>>) -> std::io::Result<()> {
    h.join()
        .unwrap_or_else(|_| Err(std::io::Error::other("a file sync thread panicked")))
}

/// The set a commit replaced; dropping removes it.
#[derive(Debug)]
#[must_use = "dropping removes the replaced set on this thread; see `remove_in_background`"]
pub struct Retired {
    dirs: Vec<PathBuf>,
}

impl Retired {
    /// Removes the replaced set on a thread of its own; join the handle before the process
    /// exits, or the hidden set may stay behind (the next run removes it). `None` when there is
    /// nothing to remove.
    pub fn remove_in_background(mut self) -> Option<std::thread::JoinHandle<()>> {
        if self.dirs.is_empty() {
            return None;
        }
        let retired = Retired {
            dirs: std::mem::take(&mut self.dirs),
        };
        // When the thread cannot start, the closure and `retired` with it are dropped here, which
        // removes on this thread.
        std::thread::Builder::new()
            .name("hsiedge-unlink".into())
            .spawn(move || {
                // Freeing the old files' blocks is kernel work that would otherwise take its
                // share of the cores from the next run's intra-op threads.
                let _ = crate::ffi::idle_thread_policy();
                drop(retired)
            })
            .ok()
    }
}

impl Drop for Retired {
    fn drop(&mut self) {
        for dir in self.dirs.drain(..) {
            remove_set(&dir);
        }
    }
}

/// Checks that writing a set into `out` replaces none of `inputs`: none is the lock, `current`, a
/// name the set may hold or a stable link, or lies inside a set folder (the set in force is retired
/// by the next commit, the others are leftovers). Each input is checked both as the path given
/// (its folder resolved) and as the file it finally names.
pub fn check_inputs_spared(out: &OutputDir, inputs: &[PathBuf]) -> Result<(), MapError> {
    let Ok(out_real) = out.path().canonicalize() else {
        return Ok(());
    };
    for input in inputs {
        let given = input
            .parent()
            .map(|p| if p.as_os_str().is_empty() { Path::new(".") } else { p })
            .and_then(|p| p.canonicalize().ok())
            .zip(input.file_name())
            .map(|(dir, name)| dir.join(name));
        for path in given.into_iter().chain(input.canonicalize().ok()) {
            let Ok(rest) = path.strip_prefix(&out_real) else {
                continue;
            };
            let mut parts = rest.components();
            let Some(first) = parts.next().and_then(|c| c.as_os_str().to_str()) else {
                continue;
            };
            let top = parts.next().is_none();
            let ours = first.starts_with(SET_PREFIX)
                || first == CURRENT
                || (top
                    && (first == LOCK_NAME
                        || super::SET_NAMES.contains(&first)
                        || is_stable_link(&out_real.join(first), first)));
            if ours {
                return Err(MapError::WouldReplaceInput {
                    input: input.clone(),
                    output: out
                        .path()
                        .join(if first.starts_with(SET_PREFIX) { CURRENT } else { first }),
                });
            }
        }
    }
    Ok(())
}

/// Refuses `path`, a file the run writes beside its maps under option `flag`, where it is one of
/// `inputs` (the same file, by device and inode) or one of the names in `out` that each output
/// set replaces. Checked before the file is created, which empties it.
pub fn check_side_file(out: &OutputDir, inputs: &[PathBuf], flag: &'static str, path: &Path) -> Result<(), MapError> {
    use std::os::unix::fs::MetadataExt;
    let clash = |clash: String| MapError::SideFileClash {
        flag,
        path: path.to_path_buf(),
        clash,
    };
    if let Ok(m) = std::fs::metadata(path) {
        for input in inputs {
            if std::fs::metadata(input).is_ok_and(|i| (i.dev(), i.ino()) == (m.dev(), m.ino())) {
                return Err(clash(format!("is the run's input {}", input.display())));
            }
        }
    }
    match check_inputs_spared(out, &[path.to_path_buf()]) {
        Err(MapError::WouldReplaceInput { output, .. }) => Err(clash(format!(
            "is {} of the output set, which the run replaces",
            output.display()
        ))),
        other => other,
    }
}

/// The set folder `current` names, if it names one.
fn current_set(out: &Path) -> Option<PathBuf> {
    let target = std::fs::read_link(out.join(CURRENT)).ok()?;
    let name = target.file_name()?.to_str()?;
    (target.components().count() == 1 && name.starts_with(SET_PREFIX)).then(|| out.join(name))
}

/// Removes a set folder: its files, then the folder, each a step.
fn remove_set(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            step("remove a file of an old set");
            let _ = std::fs::remove_file(e.path());
        }
    }
    step("remove an old set folder");
    let _ = std::fs::remove_dir_all(dir);
}

/// Removes stable links of names the set in force lacks (they dangle).
fn remove_stale_links(out: &Path, names: &[&str]) {
    let Ok(entries) = std::fs::read_dir(out) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        if names.contains(&name) || !is_stable_link(&e.path(), name) {
            continue;
        }
        if !e.path().exists() {
            step("remove a stale link");
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// Whether `path` is one of our stable links (`NAME -> current/NAME`).
fn is_stable_link(path: &Path, name: &str) -> bool {
    std::fs::read_link(path).is_ok_and(|t| t == Path::new(CURRENT).join(name))
}

/// Removes what runs killed before their commit ended left in `out`: set folders other than the
/// current one, half-made links, dangling stable links, and the hidden temporaries of the
/// file-by-file layout of earlier versions. The caller holds the folder's lock, so none of it is
/// another writer's work in progress. Never fails: what cannot be removed is never read either.
fn remove_leftovers(out: &Path) {
    let Ok(entries) = std::fs::read_dir(out) else {
        return;
    };
    let current = current_set(out);
    for e in entries.flatten() {
        let path = e.path();
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        if name == LOCK_NAME || name == CURRENT {
            continue;
        }
        let hidden_tmp = name.starts_with('.') && (name.ends_with(".tmp") || name.ends_with(".replaced"));
        if name.starts_with(SET_PREFIX) {
            if current.as_deref() != Some(path.as_path()) && e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_set(&path);
            }
        } else if hidden_tmp && e.file_type().is_ok_and(|t| t.is_file() || t.is_symlink()) {
            step("remove a leftover");
            let _ = std::fs::remove_file(&path);
        } else if is_stable_link(&path, name) && !path.exists() {
            step("remove a stale link");
            let _ = std::fs::remove_file(&path);
        }
    }
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

/// A run id unique on this host: seconds and nanoseconds since the epoch, the pid, and a counter.
fn run_id() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    format!(
        "{}.{:09}-{}-{}",
        now.as_secs(),
        now.subsec_nanos(),
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Counts a file-system step of writing a set and, when `HSIEDGE_FAILPOINT=set-step:K` names
/// this one, kills the process before it: the crash tests walk K over every step.
fn step(_what: &str) {
    static KILL_AT: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    static DONE: AtomicU64 = AtomicU64::new(0);
    let kill_at = KILL_AT.get_or_init(|| {
        crate::config::HSIEDGE_FAILPOINT
            .get()?
            .strip_prefix("set-step:")?
            .parse()
            .ok()
    });
    if let Some(k) = *kill_at
        && DONE.fetch_add(1, Ordering::SeqCst) + 1 == k
    {
        crate::ffi::kill_self();
    }
}

#[cfg(test)]
mod tests;
