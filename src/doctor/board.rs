//! The board: Jetson model and JetPack release, the memory budget's sources, power rails, nvpmodel.

use std::fs;
use std::path::Path;

use super::*;

/// L4T release prefixes and the JetPack they ship with, newest first. [Reported: NVIDIA's JetPack
/// archive and L4T release notes; not verified on hardware here.]
pub(super) const L4T_TO_JETPACK: &[(&str, &str)] = &[
    ("R36.4.3", "6.2"),
    ("R36.4", "6.1"),
    ("R36.3", "6.0"),
    ("R36.2", "6.0 DP"),
    ("R35.6", "5.1.4"),
    ("R35.5", "5.1.3"),
    ("R35.4", "5.1.2"),
    ("R35.3", "5.1.1"),
    ("R35.2", "5.1"),
    ("R35.1", "5.0.2"),
    ("R34.1", "5.0 DP"),
    ("R32.7", "4.6.x"),
];

/// JetPack from L4T, e.g. `R36.3.0` -> `6.0`.
pub fn jetpack_for_l4t(l4t: &str) -> Option<&'static str> {
    L4T_TO_JETPACK
        .iter()
        .find(|(prefix, _)| l4t == *prefix || l4t.strip_prefix(prefix).is_some_and(|rest| rest.starts_with('.')))
        .map(|(_, jp)| *jp)
}

pub(super) fn jetpack_release(opts: &DoctorOptions, jetson: Option<&JetsonInfo>) -> Option<String> {
    if let Ok(status) = fs::read_to_string(opts.at(Path::new("/var/lib/dpkg/status"))) {
        for para in status.split("\n\n") {
            let mut lines = para.lines();
            if lines.clone().any(|l| l.trim() == "Package: nvidia-jetpack")
                && let Some(v) = lines.find_map(|l| l.strip_prefix("Version:"))
            {
                return Some(v.trim().to_string());
            }
        }
    }
    jetson
        .and_then(|j| j.l4t_release.as_deref())
        .and_then(jetpack_for_l4t)
        .map(str::to_string)
}

pub(super) fn jetson_check(jetson: Option<&JetsonInfo>, jetpack: Option<&str>) -> Check {
    match jetson {
        None => Check {
            name: "jetson",
            status: Status::Info,
            summary: "not a Jetson (no nvidia,tegra* device-tree entry, no /etc/nv_tegra_release)".into(),
            details: Vec::new(),
        },
        Some(j) => {
            let mut details = Vec::new();
            if let Some(soc) = &j.soc {
                details.push(format!("SoC: {soc}"));
            }
            let status = if j.l4t_release.is_some() {
                Status::Ok
            } else {
                details.push("/etc/nv_tegra_release missing or unreadable: JetPack unknown".into());
                Status::Warn
            };
            Check {
                name: "jetson",
                status,
                summary: format!(
                    "{}, L4T {}, JetPack {}",
                    j.model.as_deref().unwrap_or("unknown model"),
                    j.l4t_release.as_deref().unwrap_or("unknown"),
                    jetpack.unwrap_or("unknown")
                ),
                details,
            }
        }
    }
}

// Memory

pub(super) fn check_memory(opts: &DoctorOptions, checks: &mut Vec<Check>) -> Option<Memory> {
    let mi = match system::read_meminfo(&opts.root) {
        Ok(m) => m,
        Err(e) => {
            checks.push(Check {
                name: "memory",
                status: Status::Fail,
                summary: format!("the memory budget cannot be read: {e}"),
                details: vec!["--batch auto sizes batches from /proc/meminfo".into()],
            });
            return None;
        }
    };
    let mut details = Vec::new();
    let mut status = Status::Ok;
    let cgroup_limit = match system::find_cgroup(&opts.root) {
        Ok(Some(cg)) => {
            details.push(format!(
                "cgroup {:?} {}: limit {}",
                cg.version,
                cg.cgroup_path,
                cg.limit_bytes.map_or("none".to_string(), mib)
            ));
            cg.limit_bytes
        }
        Ok(None) => {
            details.push("no memory cgroup found".into());
            None
        }
        Err(e) => {
            status = Status::Warn;
            details.push(format!("cgroup unreadable: {e}"));
            None
        }
    };
    if let Some(n) = mi.nvmap_used_bytes {
        details.push(format!("NvMapMemUsed {}", mib(n)));
    }
    checks.push(Check {
        name: "memory",
        status,
        summary: format!(
            "MemTotal {}, MemAvailable {}{}",
            mib(mi.total_bytes),
            mib(mi.available_bytes),
            cgroup_limit.map_or(String::new(), |l| format!(", cgroup limit {}", mib(l)))
        ),
        details,
    });
    Some(Memory {
        total_bytes: mi.total_bytes,
        available_bytes: mi.available_bytes,
        nvmap_used_bytes: mi.nvmap_used_bytes,
        cgroup_limit_bytes: cgroup_limit,
    })
}

pub(super) fn mib(bytes: u64) -> String {
    format!("{} MiB", bytes / (1024 * 1024))
}

// Power rails

pub(super) fn rails_check(rails: &[Rail], on_jetson: bool) -> Check {
    if rails.is_empty() {
        return Check {
            name: "power",
            status: if on_jetson { Status::Warn } else { Status::Info },
            summary: "no INA3221 rails under /sys/bus/i2c/devices/*/hwmon/hwmon*/in*_label".into(),
            details: if on_jetson {
                vec!["power per frame will not be reported".into()]
            } else {
                Vec::new()
            },
        };
    }
    let readable = rails.iter().filter(|r| r.millivolts.is_some()).count();
    let details = rails
        .iter()
        .map(|r| {
            let mw = match (r.millivolts, r.milliamps) {
                (Some(v), Some(i)) => format!("{} mW", v.saturating_mul(i) / 1000),
                (Some(v), None) => format!("{v} mV"),
                _ => "unreadable".into(),
            };
            format!("{} (in{}): {mw}", r.label, r.channel)
        })
        .collect();
    Check {
        name: "power",
        status: if readable == rails.len() {
            Status::Ok
        } else {
            Status::Warn
        },
        summary: format!(
            "{} rails ({}), {readable} readable",
            rails.len(),
            rails.iter().map(|r| r.label.as_str()).collect::<Vec<_>>().join(", ")
        ),
        details,
    }
}

// nvpmodel

pub(super) fn nvpmodel_check(n: &Nvpmodel, on_jetson: bool) -> Check {
    let missing = if on_jetson { Status::Warn } else { Status::Info };
    match (&n.conf, &n.binary) {
        (None, None) => Check {
            name: "nvpmodel",
            status: missing,
            summary: "no /etc/nvpmodel.conf, no nvpmodel binary".into(),
            details: Vec::new(),
        },
        _ => {
            let current = n
                .current
                .map(|id| {
                    let name = n.modes.iter().find(|m| m.id == id).map_or("?", |m| m.name.as_str());
                    format!(", current mode {id} ({name})")
                })
                .unwrap_or_default();
            let mut details = Vec::new();
            if !n.modes.is_empty() {
                details.push(format!(
                    "modes: {}",
                    n.modes
                        .iter()
                        .map(|m| format!("{}={}", m.id, m.name))
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
            let status = if n.conf.is_some() && n.binary.is_some() {
                Status::Ok
            } else {
                details.push(if n.binary.is_none() {
                    "nvpmodel binary missing: modes cannot be switched".into()
                } else {
                    "/etc/nvpmodel.conf missing: modes unknown".into()
                });
                missing
            };
            Check {
                name: "nvpmodel",
                status,
                summary: format!(
                    "{} modes in /etc/nvpmodel.conf{current}{}",
                    n.modes.len(),
                    n.binary
                        .as_ref()
                        .map_or(String::new(), |b| format!(", {}", b.display()))
                ),
                details,
            }
        }
    }
}
