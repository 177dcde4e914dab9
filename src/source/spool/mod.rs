//! A spool folder of complete ENVI cubes: scenes are picked up only once whole, each is handed
//! out once, and each ends in `done/` or `failed/`, whatever crashes in between.
//!
//! # Layout
//!
//! [`Spool::open`] makes (if missing) four folders under the spool root, which must all be on one
//! file system so that every move is a rename:
//!
//! - `incoming/`: producers deliver scenes here (the root itself is never read, so that nothing
//!   else kept beside the spool is ever taken for a scene);
//! - `work/`: scenes being processed, in one owner folder per running spool (`work/owner-*/NAME/`);
//! - `done/`: one folder per finished scene, `done/NAME/` with `NAME.hdr`, its data file and
//!   `NAME.json` (what processing produced, as the caller recorded it);
//! - `failed/`: one folder per refused or failed scene, `failed/NAME/` with whatever files the
//!   scene had and `NAME.reason` (first line the reason, then the time and the attempts).
//!
//! A name already in `done/` or `failed/` is never overwritten: the newcomer is `NAME~2`,
//! `NAME~3`, ... (`~` cannot be part of a scene id).
//!
//! # The producer's convention
//!
//! 1. Write the data file `incoming/NAME.img` (or `.dat`, `.raw`, `.bsq`, `.bil`, `.bip`, as
//!    [`crate::cube::data_path_for`] finds it) completely; fsync it.
//! 2. Write the header under a hidden name (e.g. `incoming/.NAME.hdr.tmp`; names starting with
//!    `.` are never read), fsync it, and rename it to `incoming/NAME.hdr`. That rename is the
//!    scene's arrival.
//!
//! `NAME` must be a valid scene id ([`crate::source::check_scene_id`]): ASCII letters, digits,
//! `.`, `_`, `-`, at most 128 characters. A header whose name is not is moved to `failed/` at once
//! with the reason (under a cleaned-up name). A header that does not make a readable cube yet (no
//! data file, a data file shorter than the header describes, a header that does not parse) is
//! re-checked on every scan; once it has stayed unchanged in that state for
//! [`SpoolOptions::grace`], it goes to `failed/` with the last reason. A data file without a
//! header waits indefinitely (it may still be arriving). Names must be unique per spool while a
//! scene is in `incoming/` or `work/`: a second `NAME` waits until the first has left `work/`.
//!
//! # Claims, crashes and recovery
//!
//! [`Spool::claim_next`] takes the oldest ready scene (by the header's modification time) by
//! renaming its data file, then its header, into a folder of its own owner folder in `work/`.
//! Two spools (two daemons, or two threads) on one root never claim one scene: a rename of a
//! file that another spool already moved fails, and the header's rename is the claim.
//!
//! Each owner folder is locked (`flock`) by its spool for as long as the spool or any of its
//! claims lives; the kernel drops the lock when the process dies, even by `kill -9`. Every spool
//! adopts the unlocked owner folders it finds, at [`Spool::open`] and on every scan, and hands
//! out their scenes first, flagged [`Claimed::recovered`], so the daemon processes them again
//! (the scene is whole; outputs the killed run had started are the daemon's to replace). A claim
//! the crash cut between its two renames is finished (the header is still in `incoming/`). A
//! [`Claimed`] dropped without [`Claimed::done`] or [`Claimed::failed`] is handed out again the
//! same way. A scene whose run started ([`Claimed::start`]) [`SpoolOptions::max_attempts`] times
//! without finishing goes to `failed/` instead, so a cube that kills the daemon cannot do so
//! forever; hand-outs that never reached a run (a queue a crash emptied) do not count, nor does a
//! run that died while it waited for room downstream ([`AttemptMark`]).
//!
//! Every move is followed by an fsync of the folders it touched (and a written record or reason
//! by an fsync of the file), so a power cut loses no scene and never shows one in two places.
//!
//! # Waiting
//!
//! [`Spool::wait_ready`] polls the folders every [`SpoolOptions::poll`] (500 ms by default)
//! rather than using inotify: cubes often arrive over NFS or SMB, whose remote writes inotify does
//! not see, one folder listing per poll costs next to nothing, and a few hundred milliseconds of
//! pick-up latency is small beside a scene's processing. A [`StopHandle`] ends a wait at once.

mod claimed;
mod inbox;
mod owner;
mod recover;

use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

pub use claimed::{AttemptMark, Claimed};

use owner::OwnerDir;

/// Tuning of a [`Spool`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpoolOptions {
    /// How long a header may stay unchanged while its cube is incomplete (no data file, a short
    /// one, a header that does not parse) before it is moved to `failed/`.
    pub grace: Duration,
    /// How often [`Spool::wait_ready`] looks at the folders.
    pub poll: Duration,
    /// How many runs of one scene may start without finishing before a further recovery fails
    /// it instead.
    pub max_attempts: u32,
}

impl Default for SpoolOptions {
    fn default() -> Self {
        Self {
            grace: Duration::from_secs(300),
            poll: Duration::from_millis(500),
            max_attempts: 3,
        }
    }
}

/// Errors of a spool, each naming the folder or file and what was being done to it.
#[derive(Debug, thiserror::Error)]
pub enum SpoolError {
    /// A file-system operation failed.
    #[error("{what}")]
    Io {
        /// The path and the operation.
        what: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// Two spool folders are on different file systems, so moves between them would not be
    /// renames (not atomic, and not a claim).
    #[error(
        "spool folders {} and {} are on different file systems: moves between them would be copies, \
         not renames; keep incoming/, work/, done/ and failed/ on one file system",
        first.display(), second.display()
    )]
    CrossDevice {
        /// One folder.
        first: PathBuf,
        /// A folder on another file system.
        second: PathBuf,
    },
}

/// `f` for `map_err`: an I/O error of `op` on `path`.
fn io_err(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> SpoolError {
    let what = format!("{}: {op}", path.display());
    move |source| SpoolError::Io { what, source }
}

/// Makes the entries of `dir` durable.
fn sync_dir(dir: &Path) -> Result<(), SpoolError> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err("sync folder", dir))
}

/// Something a scan did besides handing out a scene, for the daemon to log.
#[derive(Debug)]
pub enum Notice {
    /// A scene was moved to `failed/` without being handed out.
    Rejected {
        /// Its name as found (the header's file name, or the scene folder in `work/`).
        name: String,
        /// The folder it now is in.
        to: PathBuf,
        /// Why.
        reason: String,
    },
    /// One scene could not be looked at or moved; it was left where it is and is tried again on
    /// the next scan.
    Skipped(SpoolError),
}

/// How a [`Spool::wait_ready`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// Something may be claimed (or refused): call [`Spool::claim_next`].
    Ready,
    /// The timeout passed with nothing to do.
    TimedOut,
    /// [`StopHandle::stop`] was called.
    Stopped,
}

/// Ends [`Spool::wait_ready`] from another thread (a daemon's shutdown). Clones share one flag.
#[derive(Debug, Clone, Default)]
pub struct StopHandle {
    inner: Arc<(Mutex<bool>, Condvar)>,
}

impl StopHandle {
    /// Stops every wait now and from now on.
    pub fn stop(&self) {
        let (flag, cv) = &*self.inner;
        *flag.lock().unwrap_or_else(|e| e.into_inner()) = true;
        cv.notify_all();
    }

    /// Whether [`Self::stop`] was called.
    pub fn is_stopped(&self) -> bool {
        *self.inner.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sleeps for `d` or until stopped; true when stopped.
    fn sleep(&self, d: Duration) -> bool {
        let (flag, cv) = &*self.inner;
        let guard = flag.lock().unwrap_or_else(|e| e.into_inner());
        let (guard, _) = cv
            .wait_timeout_while(guard, d, |stopped| !*stopped)
            .unwrap_or_else(|e| e.into_inner());
        *guard
    }
}

/// The most notices a [`Spool`] keeps between two [`Spool::take_notices`].
pub const MAX_NOTICES: usize = 1000;

/// Scene folders of this process that a live [`Claimed`] holds.
type Held = Arc<Mutex<HashSet<PathBuf>>>;

/// A spool folder opened for claiming (see the [module documentation](self)).
#[derive(Debug)]
pub struct Spool {
    root: PathBuf,
    incoming: PathBuf,
    work: PathBuf,
    done: PathBuf,
    failed: PathBuf,
    options: SpoolOptions,
    /// This spool's own owner folder, where its claims go.
    own: Arc<OwnerDir>,
    /// Owner folders of dead processes taken over, until emptied.
    adopted: Vec<Arc<OwnerDir>>,
    held: Held,
    /// Incomplete headers in `incoming/`: the state last seen and since when.
    waiting: HashMap<OsString, (String, Instant)>,
    notices: Vec<Notice>,
    stop: StopHandle,
    /// The last [`Spool::claim_next`] handed out nothing: the next wait looks after one poll,
    /// so a scene that fails on every scan is retried at the poll's pace, not in a busy loop.
    idle: bool,
}

impl Spool {
    /// Opens the spool at `root`, making it and its folders if missing, and adopts the scenes
    /// processes that died left in `work/` (handed out first by [`Self::claim_next`]).
    pub fn open(root: &Path, options: SpoolOptions) -> Result<Self, SpoolError> {
        let [incoming, work, done, failed] = ["incoming", "work", "done", "failed"].map(|d| root.join(d));
        for dir in [&incoming, &work, &done, &failed] {
            std::fs::create_dir_all(dir).map_err(io_err("create folder", dir))?;
        }
        sync_dir(root)?;
        check_one_device(&[&incoming, &work, &done, &failed])?;
        let own = Arc::new(OwnerDir::create(&work)?);
        let mut spool = Self {
            root: root.to_path_buf(),
            incoming,
            work,
            done,
            failed,
            options,
            own,
            adopted: Vec::new(),
            held: Held::default(),
            waiting: HashMap::new(),
            notices: Vec::new(),
            stop: StopHandle::default(),
            idle: false,
        };
        spool.adopt_orphans()?;
        Ok(spool)
    }

    /// The spool root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The folder producers deliver into.
    pub fn incoming(&self) -> &Path {
        &self.incoming
    }

    /// The folder of finished scenes.
    pub fn done_dir(&self) -> &Path {
        &self.done
    }

    /// The folder of refused and failed scenes.
    pub fn failed_dir(&self) -> &Path {
        &self.failed
    }

    /// A handle that ends [`Self::wait_ready`] from another thread.
    pub fn stop_handle(&self) -> StopHandle {
        self.stop.clone()
    }

    /// What scans did besides handing out scenes since the last call (scenes refused, scenes
    /// skipped on an error), oldest first; the latest [`MAX_NOTICES`] at most.
    pub fn take_notices(&mut self) -> Vec<Notice> {
        std::mem::take(&mut self.notices)
    }

    /// Keeps `n` for [`Self::take_notices`], dropping the oldest past [`MAX_NOTICES`] (a scene
    /// that fails the same way on every scan must not grow memory in a daemon that never asks).
    fn notice(&mut self, n: Notice) {
        if self.notices.len() >= MAX_NOTICES {
            self.notices.remove(0);
        }
        self.notices.push(n);
    }

    /// Hands out the next scene: first one recovered from a process that died (or from a dropped
    /// claim), else the oldest complete one in `incoming/`, claimed by renames; `None` when there
    /// is none. Scenes refused on the way go to `failed/` ([`Self::take_notices`] lists them).
    ///
    /// An error is one of the spool's own folders failing; trouble with one scene is a
    /// [`Notice::Skipped`] and the scan goes on.
    pub fn claim_next(&mut self) -> Result<Option<Claimed>, SpoolError> {
        let next = self.scan();
        self.idle = !matches!(next, Ok(Some(_)));
        next
    }

    /// [`Self::claim_next`]'s scan.
    fn scan(&mut self) -> Result<Option<Claimed>, SpoolError> {
        self.adopt_orphans()?;
        if let Some(c) = self.next_recovered()? {
            return Ok(Some(c));
        }
        for candidate in self.candidates()? {
            match self.check(&candidate) {
                inbox::Check::Wait => {}
                inbox::Check::Reject(reason) => self.reject(&candidate, &reason),
                inbox::Check::Ready => match self.claim(&candidate) {
                    Ok(Some(c)) => return Ok(Some(c)),
                    Ok(None) => {}
                    Err(e) => self.notice(Notice::Skipped(e)),
                },
            }
        }
        // A claim cut short (its header gone meanwhile) is failed now rather than on the next call.
        self.next_recovered()
    }

    /// Blocks until [`Self::claim_next`] has something to do (a scene to hand out or to refuse),
    /// `timeout` passes, or the [`StopHandle`] is used; looks every [`SpoolOptions::poll`], the
    /// first time at once unless the last [`Self::claim_next`] handed out nothing.
    pub fn wait_ready(&mut self, timeout: Duration) -> Result<Wait, SpoolError> {
        let start = Instant::now();
        if self.idle && self.stop.sleep(timeout.min(self.options.poll)) {
            return Ok(Wait::Stopped);
        }
        loop {
            if self.stop.is_stopped() {
                return Ok(Wait::Stopped);
            }
            if self.has_work()? {
                return Ok(Wait::Ready);
            }
            let left = timeout.saturating_sub(start.elapsed());
            if left.is_zero() {
                return Ok(Wait::TimedOut);
            }
            if self.stop.sleep(left.min(self.options.poll)) {
                return Ok(Wait::Stopped);
            }
        }
    }

    /// Whether a scan would hand out or refuse something now.
    fn has_work(&mut self) -> Result<bool, SpoolError> {
        self.adopt_orphans()?;
        if self.recoverable()? {
            return Ok(true);
        }
        for candidate in self.candidates()? {
            match self.check(&candidate) {
                inbox::Check::Wait => {}
                // Not claimable while a scene of its id is held here.
                inbox::Check::Ready if candidate.id.as_ref().is_ok_and(|id| self.holds(id)) => {}
                _ => return Ok(true),
            }
        }
        Ok(false)
    }

    /// Takes over the owner folders in `work/` that no live process holds.
    fn adopt_orphans(&mut self) -> Result<(), SpoolError> {
        let entries = std::fs::read_dir(&self.work).map_err(io_err("list", &self.work))?;
        for entry in entries {
            let entry = entry.map_err(io_err("list", &self.work))?;
            let path = entry.path();
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            if !entry.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            if OwnerDir::is_staging(name) {
                OwnerDir::remove_stale_staging(&path);
                continue;
            }
            if name.starts_with('.') || path == self.own.path() || self.adopted.iter().any(|d| d.path() == path) {
                continue;
            }
            match OwnerDir::try_adopt(&path) {
                Ok(Some(dir)) => self.adopted.push(Arc::new(dir)),
                Ok(None) => {}
                Err(e) => self.notice(Notice::Skipped(e)),
            }
        }
        Ok(())
    }
}

/// Fails unless every folder is on the file system of the first.
fn check_one_device(dirs: &[&PathBuf]) -> Result<(), SpoolError> {
    use std::os::unix::fs::MetadataExt as _;
    let dev = |d: &Path| std::fs::metadata(d).map(|m| m.dev()).map_err(io_err("stat", d));
    let first = dev(dirs[0])?;
    for d in &dirs[1..] {
        if dev(d)? != first {
            return Err(SpoolError::CrossDevice {
                first: dirs[0].clone(),
                second: (*d).clone(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
