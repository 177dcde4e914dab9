//! A stream's accepted lines kept durable beside its journal, and scenes finished from them.
//!
//! A spooled cube is durable input by itself; a stream's lines exist only on the sensor's
//! connection. So a worker records every line it reads from a stream ([`Recorded`]) into
//! `STATE/journal/<folder>.part`; once the scene's last line is in, the file is synced and
//! renamed `<folder>.img`, its ENVI header (`.hdr`) written and synced, and
//! `input_end` journalled. A daemon killed after that
//! finishes the scene by itself at its next start ([`submit_recorded`]): the recorded cube is
//! queued as the same scene (same id, model, announced length), which resumes after its last
//! journalled segment like any other; the sensor need not send it again. The files go with the
//! journal once the scene is over.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::Mutex;

use super::intake::{IntakeScene, Refusal};
use super::journal::{self, Journal, Replay};
use super::{Shared, log};
use crate::engine::error_chain;
use crate::source::{FileSource, LineSource, LineStatus, SceneInfo, SourceError, SourceStats};

/// A source whose lines are also written, in order, to the journal's input file.
pub struct Recorded<'a> {
    inner: &'a mut dyn LineSource,
    journal: &'a Mutex<Journal>,
    file: Option<(std::fs::File, PathBuf)>,
    lines: usize,
    ended: bool,
    /// A line read was not recorded (a write failed, or a gap the recording cannot represent):
    /// the recording no longer holds the scene's lines in order and must not be read back.
    broken: bool,
}

impl<'a> Recorded<'a> {
    /// Records what `inner` hands out into `journal`'s input files (synced once whole: a
    /// recording is used only once the scene's last line is in it, or by this process). A file that cannot be written is logged and recording stops: the scene runs on,
    /// only without this safeguard.
    pub fn new(inner: &'a mut dyn LineSource, journal: &'a Mutex<Journal>) -> Self {
        // Written under a name of its own and renamed in once whole: a recording another run
        // reads (a replay, mapped) is replaced, never truncated under it.
        let part = lock(journal).input().0.with_extension("part");
        let file = match std::fs::File::create(&part) {
            Ok(f) => Some((f, part)),
            Err(e) => {
                warn(&inner.info().id, &part, &e);
                None
            }
        };
        let broken = file.is_none();
        Self {
            inner,
            journal,
            file,
            lines: 0,
            ended: false,
            broken,
        }
    }

    /// Goes on recording after the `n` lines already in the journal's recording (a run paused
    /// for space, read again); returns the recording's path with it. When the input had been
    /// recorded whole already, nothing more is recorded: `Err` gives the recording's path and
    /// `inner` back.
    #[allow(clippy::type_complexity)]
    pub fn resume(
        inner: &'a mut dyn LineSource,
        journal: &'a Mutex<Journal>,
        n: usize,
    ) -> Result<(PathBuf, Self), (PathBuf, &'a mut dyn LineSource)> {
        let img = lock(journal).input().0;
        let part = img.with_extension("part");
        if img.exists() && !part.exists() {
            return Err((img, inner));
        }
        // A line cut short by the failure is cut off.
        let bytes = (n * inner.info().line_bytes()) as u64;
        let file = match std::fs::OpenOptions::new()
            .append(true)
            .open(&part)
            .and_then(|f| f.set_len(bytes).map(|()| f))
        {
            Ok(f) => Some((f, part.clone())),
            Err(e) => {
                warn(&inner.info().id, &part, &e);
                None
            }
        };
        let broken = file.is_none();
        let rec = Self {
            inner,
            journal,
            file,
            lines: n,
            ended: false,
            broken,
        };
        Ok((part, rec))
    }

    /// Lines recorded so far, all of them in order from the first; `None` once a line read was
    /// not recorded, so the recording cannot stand in for the lines read.
    pub fn recorded(&self) -> Option<usize> {
        (!self.broken).then_some(self.lines)
    }

    fn record(&mut self, line: &[u8]) {
        let Some((f, path)) = &mut self.file else { return };
        match f.write_all(line) {
            Ok(()) => self.lines += 1,
            Err(e) => {
                warn(&self.inner.info().id, path, &e);
                self.stop();
            }
        }
    }

    /// Recording stops for good: what was written is never read back as the scene.
    fn stop(&mut self) {
        self.broken = true;
        if let Some((_, part)) = self.file.take() {
            let _ = std::fs::remove_file(part);
        }
    }

    /// The scene's input is all in: synced, its header written, `input_end` journalled.
    fn end(&mut self) {
        if std::mem::replace(&mut self.ended, true) {
            return;
        }
        let Some((f, part)) = self.file.take() else { return };
        let (img, hdr) = lock(self.journal).input();
        let info = self.inner.info();
        let mut header = info.header.clone();
        header.samples = info.samples;
        header.lines = self.lines;
        header.bands = info.bands;
        header.header_offset = 0;
        header.data_type = info.data_type;
        header.interleave = info.interleave;
        header.byte_order = info.byte_order;
        let dir = img.parent().unwrap_or(std::path::Path::new("."));
        let written = f
            .sync_all()
            .and_then(|()| std::fs::rename(&part, &img))
            .and_then(|()| std::fs::write(&hdr, header.to_text()))
            .and_then(|()| std::fs::File::open(&hdr)?.sync_all())
            .and_then(|()| std::fs::File::open(dir)?.sync_all());
        let result = match written {
            Ok(()) => lock(self.journal).input_end(self.lines),
            Err(e) => {
                warn(&info.id, &hdr, &e);
                return;
            }
        };
        if let Err(e) = result {
            log::event("warning", &error_chain(&e), serde_json::json!({"scene_id": info.id}));
        }
    }
}

/// The journal, whoever held it last (a panic in a worker is caught and the scene failed).
pub fn lock(journal: &Mutex<Journal>) -> std::sync::MutexGuard<'_, Journal> {
    journal.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn warn(id: &str, path: &std::path::Path, e: &std::io::Error) {
    log::event(
        "warning",
        &format!(
            "scene `{id}`: its input cannot be recorded in {} ({e}); a kill now needs the sensor to send it again",
            path.display()
        ),
        serde_json::json!({"scene_id": id, "path": path}),
    );
}

impl LineSource for Recorded<'_> {
    fn info(&self) -> &SceneInfo {
        self.inner.info()
    }

    fn next_line(&mut self, line: &mut [u8]) -> Result<Option<LineStatus>, SourceError> {
        let got = self.inner.next_line(line)?;
        match got {
            Some(LineStatus::Missing) if !self.broken => {
                // A recorded line reads back as received: a gap would be classified from
                // whatever the buffer held, not left unclassified as the live run leaves it.
                log::event(
                    "warning",
                    &format!(
                        "scene `{}`: line {} never arrived; the scene's input is no longer recorded (a recording cannot \
                         hold a gap), so a kill now needs the sensor to send it again",
                        self.inner.info().id,
                        self.lines
                    ),
                    serde_json::json!({"scene_id": self.inner.info().id, "line": self.lines}),
                );
                self.stop();
            }
            Some(_) => {
                self.record(line);
                if self.inner.info().lines == Some(self.lines) {
                    self.end();
                }
            }
            None => self.end(),
        }
        Ok(got)
    }

    fn stats(&self) -> SourceStats {
        self.inner.stats()
    }

    fn tile_rows(&self) -> Option<usize> {
        self.inner.tile_rows()
    }
}

/// A recorded stream, read back as the scene it was.
struct RecordedScene {
    source: FileSource,
    info: SceneInfo,
    header: PathBuf,
}

impl LineSource for RecordedScene {
    fn info(&self) -> &SceneInfo {
        &self.info
    }

    fn next_line(&mut self, line: &mut [u8]) -> Result<Option<LineStatus>, SourceError> {
        self.source.next_line(line)
    }

    fn stats(&self) -> SourceStats {
        self.source.stats()
    }
}

impl IntakeScene for RecordedScene {
    fn source(&mut self) -> &mut dyn LineSource {
        self
    }

    fn durable_input(&self) -> bool {
        true
    }

    fn reopen(&mut self) -> bool {
        match FileSource::open(&self.header, Some(&self.info.id)) {
            Ok(s) => {
                self.source = s;
                true
            }
            Err(_) => false,
        }
    }

    fn release(self: Box<Self>, _ok: bool) {}
}

fn open(r: &Replay) -> Result<RecordedScene, String> {
    let source = FileSource::open(&r.header, Some(&r.key.scene_id)).map_err(|e| error_chain(&e))?;
    // The scene as first announced: same model, same (possibly unknown) length, so its journal
    // matches and its tile rows are the first run's.
    let info = SceneInfo {
        lines: r.key.lines,
        model: Some(r.key.model.clone()),
        ..source.info().clone()
    };
    Ok(RecordedScene {
        source,
        info,
        header: r.header.clone(),
    })
}

/// Queues every scene whose input a killed daemon had recorded whole, from a thread of its own
/// (a full model queue makes it wait, as any intake does).
pub fn submit_recorded(state: &std::path::Path, shared: Arc<Shared>) {
    let found = journal::replayable(state);
    if found.is_empty() {
        return;
    }
    let spawned = std::thread::Builder::new()
        .name("hsiedge-replay".into())
        .spawn(move || {
            for r in found {
                let scene = match open(&r) {
                    Ok(s) => s,
                    Err(e) => {
                        log::event(
                            "warning",
                            &format!(
                                "scene `{}`: its recorded input {}: {e}",
                                r.key.scene_id,
                                r.header.display()
                            ),
                            serde_json::json!({"scene_id": r.key.scene_id}),
                        );
                        continue;
                    }
                };
                log::event(
                    "replayed",
                    &format!(
                        "scene `{}`: finished from its recorded input {} (the sensor need not send it again)",
                        r.key.scene_id,
                        r.header.display()
                    ),
                    serde_json::json!({"scene_id": r.key.scene_id, "folder": r.folder, "input": r.header}),
                );
                if let Err((refusal, _)) = shared.routes().submit(Box::new(scene)) {
                    let stopped = matches!(refusal, Refusal::Stopped { .. });
                    log::event(
                        "warning",
                        &format!(
                            "{}{}",
                            error_chain(&refusal),
                            if stopped { "; kept for the next start" } else { "" }
                        ),
                        serde_json::json!({"scene_id": r.key.scene_id}),
                    );
                }
            }
        });
    if let Err(e) = spawned {
        log::event(
            "warning",
            &format!("starting the replay of recorded scenes: {e}"),
            serde_json::Value::Null,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::daemon::journal::SceneKey;

    /// A source whose second line never arrived.
    struct Gap {
        inner: FileSource,
        at: usize,
    }

    impl LineSource for Gap {
        fn info(&self) -> &SceneInfo {
            self.inner.info()
        }

        fn next_line(&mut self, line: &mut [u8]) -> Result<Option<LineStatus>, SourceError> {
            let got = self.inner.next_line(line)?;
            let got = got.map(|s| if self.at == 1 { LineStatus::Missing } else { s });
            self.at += usize::from(got.is_some());
            Ok(got)
        }

        fn stats(&self) -> SourceStats {
            self.inner.stats()
        }
    }

    #[test]
    fn a_gap_stops_the_recording_so_it_is_never_read_back_as_the_scene() {
        let t = tempfile::tempdir().unwrap();
        let hdr = t.path().join("s.hdr");
        std::fs::write(
            &hdr,
            "ENVI\nsamples = 4\nlines = 3\nbands = 2\nheader offset = 0\ndata type = 4\ninterleave = bil\nbyte order = 0\n",
        )
        .unwrap();
        std::fs::write(t.path().join("s.img"), vec![0u8; 4 * 3 * 2 * 4]).unwrap();
        let mut gap = Gap {
            inner: FileSource::open(&hdr, Some("s")).unwrap(),
            at: 0,
        };
        let folder = t.path().join("outbox/s");
        std::fs::create_dir_all(&folder).unwrap();
        let key = SceneKey::of(gap.info(), "m", 0);
        let journal = Mutex::new(Journal::create(&t.path().join("state"), &key, &folder).unwrap());
        let mut line = vec![0u8; gap.info().line_bytes()];
        let mut rec = Recorded::new(&mut gap, &journal);
        assert_eq!(rec.next_line(&mut line).unwrap(), Some(LineStatus::Received));
        assert_eq!(rec.recorded(), Some(1));
        assert_eq!(rec.next_line(&mut line).unwrap(), Some(LineStatus::Missing));
        assert_eq!(rec.recorded(), None);
        while rec.next_line(&mut line).unwrap().is_some() {}
        assert_eq!(rec.recorded(), None);
        let (img, _) = lock(&journal).input();
        assert!(!img.exists() && !img.with_extension("part").exists());
    }
}
