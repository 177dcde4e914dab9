//! Memory as telemetry reports it: the system (`/proc/meminfo`), this process's cgroup and this
//! process's resident set, through the budget's own readers so both see the same numbers.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::PlatformError;
use crate::budget::{self, BudgetError};

/// One reading of the memory sources.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemorySample {
    /// `MemTotal`.
    pub total_bytes: u64,
    /// `MemAvailable`.
    pub available_bytes: u64,
    /// `NvMapMemUsed` (Jetson kernels).
    pub nvmap_used_bytes: Option<u64>,
    /// The cgroup's usage at the level whose limit binds, when the cgroup is found.
    pub cgroup_usage_bytes: Option<u64>,
    /// The cgroup's effective limit, when one is set.
    pub cgroup_limit_bytes: Option<u64>,
    /// This process's resident set (`VmRSS`), when `/proc/self/status` is there.
    pub process_rss_bytes: Option<u64>,
}

/// Reads the memory sources under `root`. `/proc/meminfo` must be there; the cgroup and the
/// process status are `None` when absent.
pub fn read_memory(root: &Path) -> Result<MemorySample, PlatformError> {
    let info = budget::read_meminfo(root)?;
    let cgroup = budget::find_cgroup(root)?;
    let rss = match budget::read_process_rss(root) {
        Ok(v) => Some(v),
        Err(BudgetError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(e.into()),
    };
    Ok(MemorySample {
        total_bytes: info.total_bytes,
        available_bytes: info.available_bytes,
        nvmap_used_bytes: info.nvmap_used_bytes,
        cgroup_usage_bytes: cgroup.as_ref().map(|c| c.usage_bytes),
        cgroup_limit_bytes: cgroup.and_then(|c| c.limit_bytes),
        process_rss_bytes: rss,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn fixture(name: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/telemetry")
            .join(name)
    }

    #[test]
    fn orin_nano_memory() {
        let m = read_memory(&fixture("orin_nano"));
        let m = m.map_err(|e| e.to_string());
        assert_eq!(
            m,
            Ok(MemorySample {
                total_bytes: 7_620_272 * 1024,
                available_bytes: 4_863_512 * 1024,
                nvmap_used_bytes: Some(412_160 * 1024),
                cgroup_usage_bytes: Some(1_073_741_824),
                cgroup_limit_bytes: Some(4_294_967_296),
                process_rss_bytes: Some(812_344 * 1024),
            })
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
    fn this_process() {
        let m = read_memory(Path::new("/")).map_err(|e| e.to_string());
        assert!(
            m.as_ref().is_ok_and(|m| m.process_rss_bytes.is_some_and(|r| r > 0)),
            "{m:?}"
        );
    }
}
