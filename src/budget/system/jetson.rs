//! What identifies a Jetson (Tegra) board: device-tree model and L4T release.

use std::fs;
use std::path::Path;

use serde::Serialize;

use super::*;

/// What identifies a Jetson (Tegra) board.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct JetsonInfo {
    /// `/proc/device-tree/model`, e.g. "NVIDIA Jetson Orin Nano Developer Kit".
    pub model: Option<String>,
    /// `/proc/device-tree/compatible` entries (NUL-separated in the file).
    pub compatible: Vec<String>,
    /// The SoC from the `nvidia,tegraNNN` entry, e.g. "tegra234".
    pub soc: Option<String>,
    /// L4T release from `/etc/nv_tegra_release`, e.g. "R36.3.0".
    pub l4t_release: Option<String>,
}

fn nul_strings(bytes: &[u8]) -> Vec<String> {
    bytes
        .split(|&b| b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8_lossy(s).trim().to_string())
        .collect()
}

/// Parses the first line of `nv_tegra_release`: `# R36 (release), REVISION: 3.0, ...` -> `R36.3.0`.
pub(super) fn parse_l4t(text: &str) -> Option<String> {
    let line = text.lines().next()?;
    let major = line
        .trim_start_matches('#')
        .split_whitespace()
        .next()
        .filter(|w| w.starts_with('R'))?;
    let rev = line
        .split(',')
        .find_map(|p| p.trim().strip_prefix("REVISION:"))
        .map(str::trim);
    Some(match rev {
        Some(r) => format!("{major}.{r}"),
        None => major.to_string(),
    })
}

/// Detects a Jetson: `/proc/device-tree/compatible` has an `nvidia,tegra*` entry, or
/// `/etc/nv_tegra_release` exists. Unreadable files count as absent (detection is best effort;
/// the budget itself does not depend on it beyond adding the Tegra estimate).
pub fn detect_jetson(root: &Path) -> Option<JetsonInfo> {
    let compatible = fs::read(under(root, "/proc/device-tree/compatible"))
        .map(|b| nul_strings(&b))
        .unwrap_or_default();
    let soc = compatible
        .iter()
        .find_map(|c| c.strip_prefix("nvidia,").filter(|s| s.starts_with("tegra")))
        .map(str::to_string);
    let release = fs::read_to_string(under(root, "/etc/nv_tegra_release")).ok();
    if soc.is_none() && release.is_none() {
        return None;
    }
    let model = fs::read(under(root, "/proc/device-tree/model"))
        .ok()
        .and_then(|b| nul_strings(&b).into_iter().next());
    Some(JetsonInfo {
        model,
        compatible,
        soc,
        l4t_release: release.as_deref().and_then(parse_l4t),
    })
}
