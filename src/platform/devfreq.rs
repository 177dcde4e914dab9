//! GPU load of an integrated GPU through devfreq: the `/sys/class/devfreq/*` device whose
//! `device/of_node/name` is `ga10b` (Orin) or `gpu` (older Tegra), its `device/load` in tenths
//! of a percent and its `cur_freq` in hertz.

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::{PlatformError, read_number, read_trimmed, sorted_entries, under};

/// Device-tree node names of Tegra GPUs.
const GPU_NODES: &[&str] = &["ga10b", "gpu", "gv11b", "gp10b"];

/// The GPU's devfreq device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuDevfreq {
    /// The device-tree node name, e.g. `ga10b`.
    pub node: String,
    /// The devfreq folder, as seen from here.
    pub dir: PathBuf,
}

/// One reading of the GPU's devfreq device.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct GpuLoad {
    /// Busy share of the last devfreq window, 0..=1.
    pub load: f64,
    /// Current clock in hertz, when the kernel reports it.
    pub freq_hz: Option<u64>,
}

impl GpuDevfreq {
    /// Reads the load (`device/load`, tenths of a percent) and the clock (`cur_freq`).
    pub fn read(&self) -> Result<GpuLoad, PlatformError> {
        let path = self.dir.join("device/load");
        let tenths = read_number(&path, "an integer in tenths of a percent")?.ok_or_else(|| PlatformError::Io {
            path: path.clone(),
            source: std::io::Error::from(std::io::ErrorKind::NotFound),
        })?;
        let freq_hz =
            read_number(&self.dir.join("cur_freq"), "an integer in hertz")?.and_then(|f| u64::try_from(f).ok());
        Ok(GpuLoad {
            load: (tenths as f64 / 1000.0).clamp(0.0, 1.0),
            freq_hz,
        })
    }
}

/// The integrated GPU's devfreq device under `root`, `None` when there is none (an x86 host, a
/// discrete GPU).
pub fn find_gpu(root: &Path) -> Option<GpuDevfreq> {
    sorted_entries(&under(root, "/sys/class/devfreq"))
        .into_iter()
        .find_map(|dir| {
            let node = read_trimmed(&dir.join("device/of_node/name"))?;
            GPU_NODES.contains(&node.as_str()).then_some(GpuDevfreq { node, dir })
        })
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
    fn orin_gpu_is_found_among_devfreq_devices() {
        for board in ["orin_nano", "agx_orin"] {
            let gpu = find_gpu(&fixture(board));
            assert_eq!(gpu.as_ref().map(|g| g.node.as_str()), Some("ga10b"), "{board}");
            let read = gpu.map(|g| g.read());
            assert!(matches!(read, Some(Ok(_))), "{board}: {read:?}");
        }
        let load = find_gpu(&fixture("orin_nano")).and_then(|g| g.read().ok());
        // device/load 627 = 62.7 %, cur_freq 624750000 Hz.
        assert_eq!(
            load,
            Some(GpuLoad {
                load: 0.627,
                freq_hz: Some(624_750_000)
            })
        );
    }

    #[test]
    fn x86_host_has_no_gpu_devfreq() {
        assert_eq!(find_gpu(&fixture("x86_host")), None);
    }
}
