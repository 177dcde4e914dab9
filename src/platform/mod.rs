//! What the board reports about itself: power rails, thermal zones, GPU load, the nvpmodel power
//! mode, memory, and on discrete GPUs NVML.
//!
//! Every reader takes `root` (`/` in production) and reads `root/sys/...`, `root/proc/...`,
//! `root/etc/...`, so recorded or constructed trees (`tests/fixtures/telemetry/`) test them. A
//! source that does not exist is `None` or an empty list (the caller decides how to report it);
//! a source that exists but cannot be read or parsed is a [`PlatformError`] naming the file.
//!
//! `doctor` and `telemetry` both read the board through this module: `doctor` once, to check a
//! deployment; `telemetry` every second, through discovery done once ([`power::find_rails`],
//! [`thermal::find_zones`], [`devfreq::find_gpu`]) and cheap re-reads of the value files.

use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

pub mod devfreq;
pub mod jetson;
pub mod memory;
pub mod nvml;
pub mod power;
pub mod thermal;

pub use devfreq::{GpuDevfreq, find_gpu};
pub use jetson::{Nvpmodel, PowerMode, parse_nvpmodel_conf, read_nvpmodel};
pub use memory::{MemoryReader, MemorySample, read_memory};
pub use nvml::{NvmlGpu, NvmlSample};
pub use power::{Rail, find_rails, module_total_milliwatts};
pub use thermal::{ThermalZone, find_zones};

/// Errors of the platform readers; each names the file and what was wrong with it.
#[derive(Debug, thiserror::Error)]
pub enum PlatformError {
    /// A file that exists could not be read.
    #[error("reading {path}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A file held something other than the number it should.
    #[error("{path}: `{value}` is not {expected}")]
    BadValue {
        /// The file.
        path: PathBuf,
        /// What it held (trimmed).
        value: String,
        /// What it should hold, e.g. "an integer in millivolts".
        expected: &'static str,
    },
    /// A memory source the budget reads failed.
    #[error(transparent)]
    Budget(#[from] crate::budget::BudgetError),
    /// NVML could not be loaded or answered with an error.
    #[error("NVML {call}: {message}")]
    Nvml {
        /// The call, e.g. `nvmlInit_v2` or `nvmlDeviceGetPowerUsage`.
        call: &'static str,
        /// NVML's message.
        message: String,
    },
}

/// `root` joined with an absolute path from inside the system.
pub(crate) fn under(root: &Path, abs: &str) -> PathBuf {
    root.join(abs.trim_start_matches('/'))
}

/// The entries of `dir`, sorted; empty when it does not exist or cannot be listed.
pub(crate) fn sorted_entries(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = fs::read_dir(dir)
        .map(|it| it.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    v.sort();
    v
}

/// A file's text without surrounding white space or the NUL a device-tree property ends with;
/// `None` when it cannot be read.
pub(crate) fn read_trimmed(path: &Path) -> Option<String> {
    fs::read_to_string(path)
        .ok()
        .map(|s| s.trim_matches(|c: char| c.is_whitespace() || c == '\0').to_string())
}

/// A sysfs number file: `Ok(None)` when it does not exist, an error when it cannot be read or
/// does not hold an integer.
pub(crate) fn read_number(path: &Path, expected: &'static str) -> Result<Option<i64>, PlatformError> {
    let text = match fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(PlatformError::Io {
                path: path.to_path_buf(),
                source: e,
            });
        }
    };
    let value = text.trim();
    value.parse::<i64>().map(Some).map_err(|_| PlatformError::BadValue {
        path: path.to_path_buf(),
        value: value.to_string(),
        expected,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_absent_bad_and_good() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("n");
        assert!(matches!(read_number(&p, "an integer"), Ok(None)));
        std::fs::write(&p, "42\n").unwrap();
        assert!(matches!(read_number(&p, "an integer"), Ok(Some(42))));
        std::fs::write(&p, "4x\n").unwrap();
        let err = read_number(&p, "an integer in millivolts").map(|_| ()).err();
        let msg = err.map(|e| e.to_string()).unwrap_or_default();
        assert!(msg.contains("`4x` is not an integer in millivolts"), "{msg}");
    }
}
