//! A memory cap for probing the wall: a child cgroup whose limit is the planned budget, so a probe
//! that crosses it is the one killed (exit 137), never the planner or anything else on the machine.
//!
//! Only `hsiedge plan --probe-wall` uses it, and only on request: on shared memory (a Jetson) the
//! plan never probes to failure by itself.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::BudgetError;

/// A child cgroup with a memory limit, removed on drop.
#[derive(Debug)]
pub struct MemoryCap {
    path: PathBuf,
    v2: bool,
}

impl MemoryCap {
    /// Creates `hsiedge-wall-<pid>` under the cgroup v1 memory controller
    /// (`<root>/sys/fs/cgroup/memory`) or the cgroup v2 root (`<root>/sys/fs/cgroup`), limited to
    /// `bytes` with swap off. Needs root (or a delegated cgroup).
    pub fn new(root: &Path, bytes: u64) -> Result<Self, BudgetError> {
        let v1 = root.join("sys/fs/cgroup/memory");
        let unified = root.join("sys/fs/cgroup");
        let (base, v2) = if v1.join("memory.limit_in_bytes").is_file() {
            (v1, false)
        } else {
            // A v2 hierarchy that offers the memory controller; anything else (a hybrid layout's
            // tmpfs) would take a folder and a plain file and cap nothing.
            let controllers = unified.join("cgroup.controllers");
            let found = match std::fs::read_to_string(&controllers) {
                Ok(t) if t.split_whitespace().any(|c| c == "memory") => Ok(()),
                Ok(_) => Err(std::io::Error::other("the memory controller is not listed")),
                Err(e) => Err(e),
            };
            if let Err(source) = found {
                return Err(BudgetError::Io {
                    op: "finding a memory cgroup controller (v1 memory/ or v2 with `memory` in)",
                    path: controllers,
                    source,
                });
            }
            (unified, true)
        };
        let path = base.join(format!("hsiedge-wall-{}", std::process::id()));
        std::fs::create_dir(&path).map_err(|source| BudgetError::Io {
            op: "creating (needs root and a writable cgroup memory controller)",
            path: path.clone(),
            source,
        })?;
        let cap = Self { path, v2 };
        if v2 {
            cap.write("memory.max", &bytes.to_string())?;
            // Absent when swap accounting is off: then there is no swap to escape to either.
            let _ = cap.write("memory.swap.max", "0");
        } else {
            cap.write("memory.limit_in_bytes", &bytes.to_string())?;
            let _ = cap.write("memory.swappiness", "0");
        }
        Ok(cap)
    }

    fn write(&self, file: &str, value: &str) -> Result<(), BudgetError> {
        let path = self.path.join(file);
        std::fs::write(&path, value).map_err(|source| BudgetError::Io {
            op: "writing",
            path,
            source,
        })
    }

    /// The cgroup folder.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `program` as a command that enters the cgroup before it starts.
    pub fn command(&self, program: &Path) -> Command {
        let mut c = Command::new("sh");
        c.arg("-c")
            .arg(r#"echo $$ > "$0/cgroup.procs" && shift && exec "$@""#)
            .arg(&self.path)
            .arg("--")
            .arg(program);
        c
    }

    /// OOM kills inside the cgroup so far.
    pub fn oom_kills(&self) -> u64 {
        let file = if self.v2 { "memory.events" } else { "memory.oom_control" };
        std::fs::read_to_string(self.path.join(file))
            .ok()
            .and_then(|t| {
                t.lines()
                    .find_map(|l| l.strip_prefix("oom_kill ").and_then(|v| v.trim().parse().ok()))
            })
            .unwrap_or(0)
    }
}

impl Drop for MemoryCap {
    fn drop(&mut self) {
        // The probes have exited by now; their cgroup empties once the kernel has reaped them.
        for _ in 0..50 {
            if std::fs::remove_dir(&self.path).is_ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_root_without_cgroups_is_an_error_naming_the_folder() {
        let dir = tempfile::tempdir().unwrap();
        let e = MemoryCap::new(dir.path(), 1 << 20).unwrap_err().to_string();
        assert!(
            e.contains("sys/fs/cgroup/cgroup.controllers") && e.contains("memory cgroup controller"),
            "{e}"
        );
        // A v2 hierarchy without the memory controller (or a hybrid layout's tmpfs) is refused
        // the same way; with it, the cap is a child cgroup whose creation needs root.
        let unified = dir.path().join("sys/fs/cgroup");
        std::fs::create_dir_all(&unified).unwrap();
        std::fs::write(unified.join("cgroup.controllers"), "cpu io pids\n").unwrap();
        assert!(MemoryCap::new(dir.path(), 1 << 20).is_err());
        assert!(std::fs::read_dir(&unified).unwrap().count() == 1, "no folder made");
        std::fs::write(unified.join("cgroup.controllers"), "cpu io memory pids\n").unwrap();
        let cap = MemoryCap::new(dir.path(), 1 << 20).unwrap();
        assert_eq!(
            std::fs::read_to_string(cap.path().join("memory.max")).unwrap(),
            (1u64 << 20).to_string()
        );
        // A real cgroup's files go with its folder; these are plain files.
        for f in ["memory.max", "memory.swap.max"] {
            let _ = std::fs::remove_file(cap.path().join(f));
        }
    }

    #[test]
    fn limits_and_oom_kills_on_recorded_trees() {
        let dir = tempfile::tempdir().unwrap();
        let v1 = dir.path().join("sys/fs/cgroup/memory");
        std::fs::create_dir_all(&v1).unwrap();
        std::fs::write(v1.join("memory.limit_in_bytes"), "9223372036854771712\n").unwrap();
        let cap = MemoryCap::new(dir.path(), 123 << 20).unwrap();
        assert_eq!(
            std::fs::read_to_string(cap.path().join("memory.limit_in_bytes")).unwrap(),
            (123u64 << 20).to_string()
        );
        std::fs::write(
            cap.path().join("memory.oom_control"),
            "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n",
        )
        .unwrap();
        assert_eq!(cap.oom_kills(), 2);
        let path = cap.path().to_path_buf();
        for f in ["memory.limit_in_bytes", "memory.swappiness", "memory.oom_control"] {
            let _ = std::fs::remove_file(path.join(f));
        }
        drop(cap);
        assert!(!path.exists(), "removed on drop");
    }
}
