//! Memory as telemetry reports it: the system (`/proc/meminfo`), this process's cgroup and this
//! process's resident set, through the budget's own readers so both see the same numbers.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::{PlatformError, read_number};
use crate::budget::{self, BudgetError, CgroupMemory, CgroupVersion};

/// How long a [`MemoryReader`] keeps the cgroup it found before looking it up again (a limit
/// changed at run time, e.g. by `systemctl set-property`, shows within this).
pub const CGROUP_REFRESH: Duration = Duration::from_secs(30);

/// One reading of the memory sources.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemorySample {
    /// `MemTotal`.
    pub total_bytes: u64,
    /// `MemAvailable`.
    pub available_bytes: u64,
    /// `NvMapMemUsed` (Jetson kernels).
    pub nvmap_used_bytes: Option<u64>,
    /// This process's cgroup's usage (`memory.usage_in_bytes` / `memory.current` of its own
    /// level), when the cgroup is found.
    pub cgroup_usage_bytes: Option<u64>,
    /// The cgroup's effective limit (the tightest over the hierarchy), when one is set.
    pub cgroup_limit_bytes: Option<u64>,
    /// This process's resident set (`VmRSS`), when `/proc/self/status` is there.
    pub process_rss_bytes: Option<u64>,
}

fn rss(root: &Path) -> Result<Option<u64>, PlatformError> {
    match budget::read_process_rss(root) {
        Ok(v) => Ok(Some(v)),
        Err(BudgetError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Reads the memory sources under `root` once. `/proc/meminfo` must be there; the cgroup and
/// the process status are `None` when absent.
pub fn read_memory(root: &Path) -> Result<MemorySample, PlatformError> {
    let info = budget::read_meminfo(root)?;
    let cgroup = budget::find_cgroup(root)?;
    Ok(MemorySample {
        total_bytes: info.total_bytes,
        available_bytes: info.available_bytes,
        nvmap_used_bytes: info.nvmap_used_bytes,
        cgroup_usage_bytes: cgroup.as_ref().map(|c| c.usage_bytes),
        cgroup_limit_bytes: cgroup.and_then(|c| c.limit_bytes),
        process_rss_bytes: rss(root)?,
    })
}

/// Reads the memory sources again and again: the cgroup is looked up (through
/// `/proc/self/cgroup`, the mount table and the hierarchy's limits) once per
/// [`CGROUP_REFRESH`], and between lookups only its usage file is re-read.
#[derive(Debug)]
pub struct MemoryReader {
    root: PathBuf,
    cgroup: Option<CgroupMemory>,
    found_at: Instant,
}

impl MemoryReader {
    /// Looks up the cgroup under `root`.
    pub fn new(root: &Path) -> Result<Self, PlatformError> {
        Ok(Self {
            root: root.to_path_buf(),
            cgroup: budget::find_cgroup(root)?,
            found_at: Instant::now(),
        })
    }

    /// One reading.
    pub fn read(&mut self) -> Result<MemorySample, PlatformError> {
        let info = budget::read_meminfo(&self.root)?;
        if self.found_at.elapsed() >= CGROUP_REFRESH {
            self.cgroup = budget::find_cgroup(&self.root)?;
            self.found_at = Instant::now();
        }
        let usage = match &self.cgroup {
            Some(cg) => {
                let file = match cg.version {
                    CgroupVersion::V1 => "memory.usage_in_bytes",
                    CgroupVersion::V2 => "memory.current",
                };
                read_number(&cg.dir.join(file), "an integer in bytes")?.and_then(|v| u64::try_from(v).ok())
            }
            None => None,
        };
        Ok(MemorySample {
            total_bytes: info.total_bytes,
            available_bytes: info.available_bytes,
            nvmap_used_bytes: info.nvmap_used_bytes,
            cgroup_usage_bytes: usage,
            cgroup_limit_bytes: self.cgroup.as_ref().and_then(|c| c.limit_bytes),
            process_rss_bytes: rss(&self.root)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/telemetry")
            .join(name)
    }

    #[test]
    fn orin_nano_memory() {
        let m = read_memory(&fixture("orin_nano"));
        let m = m.map_err(|e| e.to_string());
        let expected = MemorySample {
            total_bytes: 7_620_272 * 1024,
            available_bytes: 4_863_512 * 1024,
            nvmap_used_bytes: Some(412_160 * 1024),
            cgroup_usage_bytes: Some(1_073_741_824),
            cgroup_limit_bytes: Some(4_294_967_296),
            process_rss_bytes: Some(812_344 * 1024),
        };
        assert_eq!(m, Ok(expected));
        // The repeated reader sees the same.
        let again = MemoryReader::new(&fixture("orin_nano")).and_then(|mut r| r.read());
        assert_eq!(again.map_err(|e| e.to_string()), Ok(expected));
    }

    #[test]
    fn agx_orin_cgroup_v1_without_a_limit() {
        let m = MemoryReader::new(&fixture("agx_orin")).and_then(|mut r| r.read());
        let m = m.map_err(|e| e.to_string());
        assert!(
            matches!(
                m,
                Ok(MemorySample {
                    cgroup_usage_bytes: Some(1_513_095_168),
                    cgroup_limit_bytes: None,
                    ..
                })
            ),
            "{m:?}"
        );
    }

    #[test]
    fn x86_host_without_cgroup_or_status() {
        let m = read_memory(&fixture("x86_host")).map_err(|e| e.to_string());
        assert!(
            matches!(
                m,
                Ok(MemorySample {
                    nvmap_used_bytes: None,
                    cgroup_usage_bytes: None,
                    process_rss_bytes: None,
                    ..
                })
            ),
            "{m:?}"
        );
    }

    #[test]
    fn the_reader_follows_usage_between_lookups() {
        let dir = tempfile::tempdir().map_err(|e| e.to_string());
        let Ok(dir) = dir else { return };
        let root = dir.path();
        let write = |p: &str, t: &str| {
            let p = root.join(p);
            std::fs::create_dir_all(p.parent().unwrap_or(root)).ok();
            std::fs::write(p, t).ok();
        };
        write(
            "proc/meminfo",
            "MemTotal: 1000 kB\nMemFree: 400 kB\nMemAvailable: 500 kB\n",
        );
        write("proc/self/cgroup", "0::/svc\n");
        write(
            "proc/self/mountinfo",
            "31 22 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n",
        );
        write("sys/fs/cgroup/svc/memory.current", "100\n");
        write("sys/fs/cgroup/svc/memory.max", "1000\n");
        let reader = MemoryReader::new(root).map_err(|e| e.to_string());
        let Ok(mut reader) = reader else { panic!("{reader:?}") };
        let first = reader.read().map_err(|e| e.to_string());
        assert_eq!(first.map(|m| m.cgroup_usage_bytes), Ok(Some(100)));
        write("sys/fs/cgroup/svc/memory.current", "250\n");
        let m = reader.read().ok();
        assert_eq!(m.and_then(|m| m.cgroup_usage_bytes), Some(250));
        assert_eq!(m.and_then(|m| m.cgroup_limit_bytes), Some(1000));
    }

    #[test]
    fn this_process() {
        let m = read_memory(Path::new("/")).map_err(|e| e.to_string());
        assert!(
            m.as_ref().is_ok_and(|m| m.process_rss_bytes.is_some_and(|r| r > 0)),
            "{m:?}"
        );
    }
}
