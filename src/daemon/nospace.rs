//! A scene whose outbox runs out of space mid-run (ENOSPC while a segment is written or
//! committed) pauses instead of failing: the worker says which folder needs how many bytes, waits
//! until the outbox's file system has them, and runs the scene on from its last journalled
//! segment. Its input is read again from where it is durable: a spooled cube from its file, a
//! stream from the lines recorded so far (`daemon::replay`) and then from its connection, which
//! waited meanwhile (the sensor sees backpressure).

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::log;
use super::status::Status;
use crate::source::{LineSource, LineStatus, SceneInfo, SourceError, SourceStats};

/// Whether `e`, or an error under it, is the file system out of space.
pub fn storage_full(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut at = Some(e);
    while let Some(err) = at {
        if let Some(io) = err.downcast_ref::<std::io::Error>()
            && io.kind() == std::io::ErrorKind::StorageFull
        {
            return true;
        }
        at = err.source();
    }
    false
}

/// Bytes a segment of `lines` lines `samples` wide takes in the outbox, with room for its
/// headers, quick-look and summary: what the file system must have free before the scene goes on.
pub fn segment_bytes(lines: usize, samples: usize, channels: usize, scores: bool) -> u64 {
    // Saturating: `lines` may be a sensor's announced count, and an absurd one must ask for
    // more space than there is, not wrap to a little.
    let per_pixel = 5u64.saturating_add(if scores {
        4u64.saturating_mul(channels as u64)
    } else {
        0
    });
    (lines as u64)
        .saturating_mul(samples as u64)
        .saturating_mul(per_pixel)
        .saturating_add(1 << 20)
}

/// Waits until the file system of `folder` has `needed` bytes free (or `give_up` says stop),
/// with `model` shown paused in `status` meanwhile; logs `outbox_full` when it begins and
/// `outbox_space_returned` when it ends. Returns whether space came.
pub fn wait_for_space(
    status: &Status,
    model: &str,
    scene_id: &str,
    folder: &Path,
    needed: u64,
    give_up: &dyn Fn() -> bool,
) -> bool {
    let mib = |b: u64| b as f64 / f64::from(1 << 20);
    // A file system that cannot say what it has free counts as full, and says why once.
    let warned = std::cell::Cell::new(false);
    let free = || match crate::ffi::available_bytes(folder) {
        Ok(b) => b,
        Err(e) => {
            if !warned.replace(true) {
                log::event(
                    "warning",
                    &format!(
                        "scene `{scene_id}`: the free space of {} cannot be read ({e})",
                        folder.display()
                    ),
                    serde_json::json!({"scene_id": scene_id, "path": folder}),
                );
            }
            0
        }
    };
    let why = |free: u64| {
        format!(
            "scene `{scene_id}`: no space left in {} ({:.2} MiB free, {:.2} MiB needed for its next segment); \
             it waits and goes on from its last committed segment when space returns",
            folder.display(),
            mib(free),
            mib(needed)
        )
    };
    let f = free();
    log::event(
        "outbox_full",
        &why(f),
        serde_json::json!({
            "scene_id": scene_id, "model": model, "path": folder, "free_bytes": f, "needed_bytes": needed,
        }),
    );
    status.set_paused(model, Some(why(f)));
    let t0 = Instant::now();
    let came = loop {
        let f = free();
        if f >= needed {
            break true;
        }
        if give_up() {
            break false;
        }
        status.set_paused(model, Some(why(f)));
        std::thread::sleep(Duration::from_millis(250));
    };
    status.set_paused(model, None);
    log::event(
        "outbox_space_returned",
        &format!(
            "scene `{scene_id}`: {} after {:.1} s",
            if came {
                "space returned, going on"
            } else {
                "gave up waiting for space (drain)"
            },
            t0.elapsed().as_secs_f64()
        ),
        serde_json::json!({"scene_id": scene_id, "model": model, "waited_s": t0.elapsed().as_secs_f64(), "resumed": came}),
    );
    came
}

/// A stream read again: its first `first` lines from the recording, the rest from `rest` (the
/// connection, recorded on as it goes).
pub struct Rewound<'a> {
    file: std::fs::File,
    path: PathBuf,
    first: usize,
    read: usize,
    rest: &'a mut dyn LineSource,
}

impl<'a> Rewound<'a> {
    /// Lines `0..first` from the raw recording at `path`, then `rest`.
    pub fn new(path: &Path, first: usize, rest: &'a mut dyn LineSource) -> Result<Self, SourceError> {
        let file = std::fs::File::open(path).map_err(|source| SourceError::Io {
            what: path.display().to_string(),
            source,
        })?;
        Ok(Self {
            file,
            path: path.to_path_buf(),
            first,
            read: 0,
            rest,
        })
    }
}

impl LineSource for Rewound<'_> {
    fn info(&self) -> &SceneInfo {
        self.rest.info()
    }

    fn next_line(&mut self, line: &mut [u8]) -> Result<Option<LineStatus>, SourceError> {
        if self.read < self.first {
            let at = (self.read * line.len()) as u64;
            self.file
                .seek(SeekFrom::Start(at))
                .and_then(|_| self.file.read_exact(line))
                .map_err(|source| SourceError::Io {
                    what: self.path.display().to_string(),
                    source,
                })?;
            self.read += 1;
            return Ok(Some(LineStatus::Received));
        }
        self.rest.next_line(line)
    }

    fn stats(&self) -> SourceStats {
        self.rest.stats()
    }

    fn tile_rows(&self) -> Option<usize> {
        self.rest.tile_rows()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn storage_full_is_found_under_the_errors_that_wrap_it() {
        let full = std::io::Error::from(std::io::ErrorKind::StorageFull);
        let map = crate::map::MapError::Io {
            path: "/o/x".into(),
            source: full,
        };
        let job = crate::job::JobError::from(crate::pipeline::PipelineError::Sink(Box::new(map)));
        assert!(storage_full(&job));
        let other = crate::map::MapError::Io {
            path: "/o/x".into(),
            source: std::io::Error::from(std::io::ErrorKind::PermissionDenied),
        };
        assert!(!storage_full(&crate::job::JobError::from(other)));
    }
}
