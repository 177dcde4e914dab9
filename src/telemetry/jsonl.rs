//! JSON lines: one snapshot per line, each line flushed as it is written, so a reader following
//! the file (or a daemon's log collector) sees every snapshot as soon as it is emitted.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use super::{Sink, Snapshot, TelemetryError};

/// Writes snapshots as JSON lines.
pub struct JsonLines<W: Write + Send> {
    out: W,
    name: PathBuf,
    line: Vec<u8>,
}

impl JsonLines<BufWriter<File>> {
    /// Checks, without creating or changing anything, that `path` can be written: it exists and
    /// opens for writing, or its folder exists.
    pub fn check_writable(path: &Path) -> Result<(), TelemetryError> {
        let err = |source| TelemetryError::Io {
            what: "creating",
            path: path.to_path_buf(),
            source,
        };
        if path.exists() {
            return std::fs::OpenOptions::new()
                .append(true)
                .open(path)
                .map(drop)
                .map_err(err);
        }
        let folder = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        match std::fs::metadata(folder) {
            Ok(m) if m.is_dir() => Ok(()),
            Ok(_) => Err(err(std::io::ErrorKind::NotADirectory.into())),
            Err(e) => Err(err(e)),
        }
    }

    /// Creates (or truncates) `path`.
    pub fn create(path: &Path) -> Result<Self, TelemetryError> {
        let file = File::create(path).map_err(|source| TelemetryError::Io {
            what: "creating",
            path: path.to_path_buf(),
            source,
        })?;
        Ok(Self::new(BufWriter::new(file), path))
    }
}

impl<W: Write + Send> JsonLines<W> {
    /// Writes to `out`; `name` names it in errors.
    pub fn new(out: W, name: &Path) -> Self {
        Self {
            out,
            name: name.to_path_buf(),
            line: Vec::with_capacity(4096),
        }
    }

    /// The writer.
    pub fn into_inner(self) -> W {
        self.out
    }

    /// Writes one snapshot as one line and flushes it.
    pub fn write(&mut self, snapshot: &Snapshot) -> Result<(), TelemetryError> {
        self.line.clear();
        serde_json::to_writer(&mut self.line, snapshot)?;
        self.line.push(b'\n');
        let io = |source| TelemetryError::Io {
            what: "writing",
            path: self.name.clone(),
            source,
        };
        self.out.write_all(&self.line).map_err(io)?;
        self.out.flush().map_err(|source| TelemetryError::Io {
            what: "writing",
            path: self.name.clone(),
            source,
        })
    }
}

impl<W: Write + Send> Sink for JsonLines<W> {
    fn name(&self) -> String {
        format!("JSON lines {}", self.name.display())
    }

    fn emit(&mut self, snapshot: &Snapshot) -> Result<(), TelemetryError> {
        self.write(snapshot)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_object_per_line() {
        let mut w = JsonLines::new(Vec::new(), Path::new("mem"));
        for seq in 0..3 {
            let s = Snapshot {
                seq,
                pixels_done: seq * 10,
                notices: vec!["a \"quoted\"\nnotice".into()],
                ..Default::default()
            };
            assert!(w.write(&s).is_ok());
        }
        let text = String::from_utf8(w.into_inner()).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3);
        for (i, l) in lines.iter().enumerate() {
            let back: Result<Snapshot, _> = serde_json::from_str(l);
            assert_eq!(back.map(|s| s.pixels_done).ok(), Some(i as u64 * 10));
        }
    }

    #[test]
    fn a_failing_file_is_named() {
        let err = JsonLines::create(Path::new("/nonexistent-dir/t.jsonl")).err();
        let msg = err.map(|e| e.to_string()).unwrap_or_default();
        assert_eq!(msg, "telemetry creating /nonexistent-dir/t.jsonl");
    }
}
