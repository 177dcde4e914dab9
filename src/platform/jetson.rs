//! Jetson identity and the nvpmodel power mode.
//!
//! Mode ids differ by module and by Super/non-Super, so names come from `/etc/nvpmodel.conf`
//! (`< POWER_MODEL ID=n NAME=... >`), never from a table here. The current mode is the `pmode:`
//! word of `/var/lib/nvpmodel/status` (e.g. `pmode:0002 fmode:quiet`).

use std::fs;
use std::path::{Path, PathBuf};

use serde::Serialize;

pub use crate::budget::system::{JetsonInfo, detect_jetson};

use super::{read_trimmed, under};

/// Where nvpmodel's configuration lives on the inspected system.
pub const NVPMODEL_CONF: &str = "/etc/nvpmodel.conf";
/// Where nvpmodel records the mode in force.
pub const NVPMODEL_STATUS: &str = "/var/lib/nvpmodel/status";
/// Where the `nvpmodel` binary may be installed.
const NVPMODEL_BINARIES: &[&str] = &["/usr/sbin/nvpmodel", "/usr/bin/nvpmodel", "/sbin/nvpmodel"];

/// One `POWER_MODEL` of `/etc/nvpmodel.conf`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PowerMode {
    /// `ID=`.
    pub id: u32,
    /// `NAME=`.
    pub name: String,
}

/// nvpmodel state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Default)]
pub struct Nvpmodel {
    /// `/etc/nvpmodel.conf`, when present.
    pub conf: Option<PathBuf>,
    /// The `nvpmodel` binary, when present.
    pub binary: Option<PathBuf>,
    /// Modes in the conf file.
    pub modes: Vec<PowerMode>,
    /// The current mode id from `/var/lib/nvpmodel/status`.
    pub current: Option<u32>,
}

impl Nvpmodel {
    /// The name of the current mode, when both the mode and its conf entry are known.
    pub fn current_name(&self) -> Option<&str> {
        let id = self.current?;
        self.modes.iter().find(|m| m.id == id).map(|m| m.name.as_str())
    }

    /// True when nothing of nvpmodel exists (not a Jetson, or one without the tool).
    pub fn is_absent(&self) -> bool {
        self.conf.is_none() && self.binary.is_none() && self.current.is_none()
    }
}

/// `< POWER_MODEL ID=2 NAME=15W >` lines of nvpmodel.conf.
pub fn parse_nvpmodel_conf(text: &str) -> Vec<PowerMode> {
    let mut modes = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        let Some(body) = line.strip_prefix('<').and_then(|l| l.strip_suffix('>')).map(str::trim) else {
            continue;
        };
        let Some(fields) = body.strip_prefix("POWER_MODEL") else {
            continue;
        };
        let mut id = None;
        let mut name = None;
        for kv in fields.split_whitespace() {
            if let Some(v) = kv.strip_prefix("ID=") {
                id = v.parse::<u32>().ok();
            } else if let Some(v) = kv.strip_prefix("NAME=") {
                name = Some(v.to_string());
            }
        }
        if let (Some(id), Some(name)) = (id, name) {
            modes.push(PowerMode { id, name });
        }
    }
    modes
}

/// The whole status line under `root` (e.g. `pmode:0002 fmode:quiet`); `None` when unrecorded
/// or empty.
pub fn nvpmodel_status(root: &Path) -> Option<String> {
    read_trimmed(&under(root, NVPMODEL_STATUS)).filter(|s| !s.is_empty())
}

/// The current mode id under `root` (`pmode:0002` -> 2); `None` when unrecorded.
pub fn current_mode(root: &Path) -> Option<u32> {
    nvpmodel_status(root).and_then(|s| {
        s.split_whitespace()
            .find_map(|w| w.strip_prefix("pmode:"))
            .and_then(|n| n.parse::<u32>().ok())
    })
}

/// nvpmodel's conf, binary and current mode under `root`. Paths in the result are paths on the
/// inspected system.
pub fn read_nvpmodel(root: &Path) -> Nvpmodel {
    let conf_text = fs::read_to_string(under(root, NVPMODEL_CONF)).ok();
    let binary = NVPMODEL_BINARIES
        .iter()
        .find(|p| under(root, p).is_file())
        .map(PathBuf::from);
    Nvpmodel {
        modes: conf_text.as_deref().map(parse_nvpmodel_conf).unwrap_or_default(),
        conf: conf_text.map(|_| PathBuf::from(NVPMODEL_CONF)),
        binary,
        current: current_mode(root),
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
    fn nvpmodel_conf() {
        let modes = parse_nvpmodel_conf(
            "< POWER_MODEL ID=0 NAME=15W >\nCPU_ONLINE CORE_0 1\n< POWER_MODEL ID=1 NAME=7W >\n<PM_CONFIG DEFAULT=0>\n< POWER_MODEL NAME=broken >",
        );
        assert_eq!(
            modes,
            vec![
                PowerMode {
                    id: 0,
                    name: "15W".into()
                },
                PowerMode {
                    id: 1,
                    name: "7W".into()
                }
            ]
        );
    }

    #[test]
    fn orin_nano_mode() {
        let n = read_nvpmodel(&fixture("orin_nano"));
        assert_eq!(n.current, Some(0));
        assert_eq!(n.current_name(), Some("15W"));
        assert_eq!(n.modes.len(), 3);
        assert_eq!(n.conf.as_deref(), Some(Path::new(NVPMODEL_CONF)));
        assert!(detect_jetson(&fixture("orin_nano")).is_some_and(|j| j.soc.as_deref() == Some("tegra234")));
    }

    #[test]
    fn agx_orin_mode_is_named_from_its_own_conf() {
        let n = read_nvpmodel(&fixture("agx_orin"));
        assert_eq!(n.current, Some(3));
        assert_eq!(n.current_name(), Some("50W"));
    }

    #[test]
    fn x86_host_has_no_nvpmodel() {
        let n = read_nvpmodel(&fixture("x86_host"));
        assert!(n.is_absent());
        assert_eq!(n.current_name(), None);
        assert!(detect_jetson(&fixture("x86_host")).is_none());
    }
}
