//! The bare onnxruntime Python loop `bench classify` times beside hsiedge: a child process kept
//! alive across repetitions, spoken to over stdin and stdout.

use std::path::Path;

use super::BenchError;
use crate::job::Job;

/// The top-level package named by Python's `No module named 'a.b'` in `stderr`, if any.
fn missing_module(stderr: &str) -> Option<&str> {
    const NEEDLE: &str = "No module named '";
    let rest = &stderr[stderr.find(NEEDLE)? + NEEDLE.len()..];
    let name = &rest[..rest.find('\'')?];
    name.split('.').next().filter(|m| !m.is_empty())
}

/// A Python baseline process kept alive across repetitions, so each of its repetitions runs
/// between two of hsiedge's under the same machine conditions.
pub(super) struct PythonLoop {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    stdout: std::io::BufReader<std::process::ChildStdout>,
    /// The child's stderr: a file, not a pipe, so a chatty child never blocks on a full pipe.
    stderr: std::fs::File,
    python: String,
    command: String,
    pub(super) onnxruntime: String,
}

#[derive(serde::Deserialize)]
pub(super) struct PythonRep {
    pub(super) run_loop_s: f64,
    pub(super) with_gather_s: f64,
}

#[derive(serde::Deserialize)]
struct PythonReady {
    pub(super) onnxruntime: String,
}

impl PythonLoop {
    pub(super) fn start(python: &str, script: &Path, job: &Job, batch: usize) -> Result<Self, BenchError> {
        use std::process::Stdio;
        let args: Vec<String> = vec![
            script.display().to_string(),
            "--manifest".into(),
            job.manifest.path.display().to_string(),
            "--scene".into(),
            job.cube.header_path().display().to_string(),
            "--batch".into(),
            batch.to_string(),
            "--threads".into(),
            job.spec.engine.threads.to_string(),
            "--spin".into(),
            u8::from(job.spec.engine.spin).to_string(),
            "--serve".into(),
        ];
        let command = format!("{python} {}", args.join(" "));
        let err = |message: String| BenchError::Baseline {
            command: command.clone(),
            message,
        };
        let stderr = tempfile::tempfile().map_err(|e| err(e.to_string()))?;
        let child_stderr = stderr.try_clone().map_err(|e| err(e.to_string()))?;
        let mut child = std::process::Command::new(python)
            .args(&args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(child_stderr)
            .spawn()
            .map_err(|e| err(e.to_string()))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            let _ = child.kill();
            return Err(err("no pipe to the child".into()));
        };
        let mut me = Self {
            child,
            stdin,
            stdout: std::io::BufReader::new(stdout),
            stderr,
            python: python.to_string(),
            command,
            onnxruntime: String::new(),
        };
        let ready: PythonReady = me.read()?;
        me.onnxruntime = ready.onnxruntime;
        Ok(me)
    }

    /// One line of JSON from the child; how it ended and its stderr when it has exited instead.
    fn read<T: serde::de::DeserializeOwned>(&mut self) -> Result<T, BenchError> {
        use std::io::BufRead;
        let mut line = String::new();
        let n = self.stdout.read_line(&mut line).map_err(|e| self.err(e.to_string()))?;
        if n == 0 {
            return Err(self.exited());
        }
        serde_json::from_str(&line).map_err(|e| self.err(format!("{e}: {}", line.trim())))
    }

    /// The error for a child that has gone: the package it could not import, else its exit
    /// status and what it wrote to stderr.
    fn exited(&mut self) -> BenchError {
        use std::io::{Read, Seek};
        let status = match self.child.wait() {
            Ok(s) => s.to_string(),
            Err(e) => format!("status unknown ({e})"),
        };
        let mut stderr = String::new();
        if self.stderr.seek(std::io::SeekFrom::Start(0)).is_ok() {
            let _ = self.stderr.read_to_string(&mut stderr);
        }
        if let Some(module) = missing_module(&stderr) {
            return BenchError::BaselineMissing {
                python: self.python.clone(),
                module: module.to_string(),
            };
        }
        self.err(format!("exited early ({status}): {}", stderr.trim()))
    }

    /// One repetition: the bare run loop and the loop with the window copy.
    pub(super) fn rep(&mut self) -> Result<PythonRep, BenchError> {
        use std::io::Write;
        if writeln!(self.stdin, "run").and_then(|()| self.stdin.flush()).is_err() {
            // A closed pipe: the child has gone, and why is in its status and stderr.
            return Err(self.exited());
        }
        self.read()
    }

    fn err(&self, message: String) -> BenchError {
        BenchError::Baseline {
            command: self.command.clone(),
            message,
        }
    }
}

impl Drop for PythonLoop {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_python_package_is_named_from_the_import_error() {
        let stderr = "ort_patch_loop.py: No module named 'onnxruntime' (/usr/bin/python3)\n";
        assert_eq!(missing_module(stderr), Some("onnxruntime"));
        let traceback = "Traceback (most recent call last):\n  File \"x.py\", line 1\n\
                         ModuleNotFoundError: No module named 'numpy.linalg'\n";
        assert_eq!(missing_module(traceback), Some("numpy"));
        assert_eq!(missing_module("Segmentation fault"), None);
        assert_eq!(missing_module("No module named ''"), None);
    }
}
