//! What the system can give: memory sources read from a root directory.
//!
//! Every reader takes `root` (`/` in production) and reads `root/proc/...`, `root/sys/...`,
//! `root/etc/...`, so tests run on recorded or constructed trees. Paths found inside files
//! (cgroup paths, mount points) are resolved under `root` too.
//!
//! The budget is the minimum over the sources that apply, the system-wide ones (`MemAvailable`,
//! the Tegra estimate) less [`BudgetConfig::reserve_bytes`]:
//!
//! * `MemAvailable` from `/proc/meminfo` (the kernel's own estimate of what can be allocated
//!   without swapping; swap is deliberately not counted, since a swapping Jetson misses its
//!   frame deadline long before it fails);
//! * the cgroup headroom, `limit - (usage - inactive_file)`, v1 or v2, found through
//!   `/proc/self/cgroup` and `/proc/self/mountinfo` (inactive file cache is reclaimable);
//! * on an integrated GPU (Jetson), the CUDA-for-Tegra app-note estimate
//!   ([`tegra_allocatable`]) with `NvMapMemUsed` as the device allocation, because
//!   `cudaMemGetInfo` there excludes swap and reclaimable memory;
//! * on a discrete GPU, the device free memory the caller passes ([`DeviceMemory`]), because the
//!   GPU module owns CUDA.

use std::fmt;
use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::BudgetError;
mod cgroup;
mod jetson;
mod psi;

pub use cgroup::*;
pub use jetson::*;
pub use psi::*;

/// Values at or above this are "no limit" in cgroup v1 (the kernel prints `PAGE_COUNTER_MAX`
/// times the page size, e.g. 9223372036854771712).
const CGROUP_V1_UNLIMITED: u64 = 1 << 60;

/// The default reserve left to the rest of the system (desktop, camera, network stack).
pub const DEFAULT_RESERVE_BYTES: u64 = 512 << 20;

/// `root` joined with an absolute path from inside the system.
fn under(root: &Path, abs: &str) -> PathBuf {
    root.join(abs.trim_start_matches('/'))
}

/// Reads a file, mapping "not there" to `Ok(None)`.
fn read_optional(path: &Path) -> Result<Option<String>, BudgetError> {
    match fs::read_to_string(path) {
        Ok(s) => Ok(Some(s)),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(e) => Err(BudgetError::io("reading", path, e)),
    }
}

fn read_required(path: &Path) -> Result<String, BudgetError> {
    fs::read_to_string(path).map_err(|e| BudgetError::io("reading", path, e))
}

fn parse_u64(path: &Path, field: &str, text: &str) -> Result<u64, BudgetError> {
    text.trim().parse::<u64>().map_err(|_| BudgetError::BadValue {
        path: path.to_path_buf(),
        field: field.to_string(),
        value: text.trim().to_string(),
    })
}

/// `/proc/meminfo`, in bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MemInfo {
    /// `MemTotal`.
    pub total_bytes: u64,
    /// `MemFree`.
    pub free_bytes: u64,
    /// `MemAvailable`.
    pub available_bytes: u64,
    /// `SwapTotal` (0 when absent).
    pub swap_total_bytes: u64,
    /// `SwapFree` (0 when absent).
    pub swap_free_bytes: u64,
    /// `NvMapMemUsed`: memory the Tegra nvmap driver holds for the GPU and other engines
    /// (present on Jetson kernels only).
    pub nvmap_used_bytes: Option<u64>,
}

/// Reads `root/proc/meminfo`. `MemTotal`, `MemFree` and `MemAvailable` are required.
pub fn read_meminfo(root: &Path) -> Result<MemInfo, BudgetError> {
    let path = under(root, "/proc/meminfo");
    let text = read_required(&path)?;
    let mut fields = std::collections::HashMap::new();
    for line in text.lines() {
        let Some((key, rest)) = line.split_once(':') else {
            continue;
        };
        let rest = rest.trim();
        // Most lines are "N kB"; a few (HugePages_*) are plain counts.
        let (num, scale) = match rest.strip_suffix("kB") {
            Some(n) => (n.trim(), 1024u64),
            None => (rest, 1u64),
        };
        let v = parse_u64(&path, key.trim(), num)?;
        fields.insert(key.trim().to_string(), v.saturating_mul(scale));
    }
    let need = |k: &str| {
        fields.get(k).copied().ok_or_else(|| BudgetError::MissingField {
            path: path.clone(),
            field: k.to_string(),
        })
    };
    Ok(MemInfo {
        total_bytes: need("MemTotal")?,
        free_bytes: need("MemFree")?,
        available_bytes: need("MemAvailable")?,
        swap_total_bytes: fields.get("SwapTotal").copied().unwrap_or(0),
        swap_free_bytes: fields.get("SwapFree").copied().unwrap_or(0),
        nvmap_used_bytes: fields.get("NvMapMemUsed").copied(),
    })
}

/// Free and total memory of a discrete GPU, as `cudaMemGetInfo` reports it. The caller (the GPU
/// module) fills it; never use it for an integrated GPU, where it excludes swap and
/// reclaimable memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct DeviceMemory {
    /// Free bytes.
    pub free_bytes: u64,
    /// Total bytes.
    pub total_bytes: u64,
}

/// Which kind of GPU the budget was computed for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GpuKind {
    /// No GPU information: CPU only.
    None,
    /// Integrated GPU sharing DRAM (Jetson).
    Integrated,
    /// Discrete GPU with its own memory (the caller passed [`DeviceMemory`]).
    Discrete,
}

/// What the budget reads and keeps back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetConfig {
    /// Bytes left for the rest of the system, subtracted from the binding source.
    pub reserve_bytes: u64,
    /// Bytes this process already holds that the cost model also counts (e.g. a loaded
    /// session and its arena while the governor re-reads mid-run): added back to every source,
    /// since the sources report what is free *besides* them. 0 before the model is loaded.
    pub own_bytes: u64,
    /// Discrete-GPU free/total memory, when running on one.
    pub device: Option<DeviceMemory>,
}

impl Default for BudgetConfig {
    fn default() -> Self {
        Self {
            reserve_bytes: DEFAULT_RESERVE_BYTES,
            own_bytes: 0,
            device: None,
        }
    }
}

/// A memory source.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SourceKind {
    /// `/proc/meminfo` `MemAvailable`.
    MemAvailable,
    /// The cgroup headroom.
    Cgroup,
    /// The CUDA-for-Tegra allocatable estimate.
    TegraEstimate,
    /// A discrete GPU's free memory.
    DeviceFree,
}

impl SourceKind {
    /// The stable name used in reports (`mem_available`, `cgroup`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Self::MemAvailable => "mem_available",
            Self::Cgroup => "cgroup",
            Self::TegraEstimate => "tegra_estimate",
            Self::DeviceFree => "device_free",
        }
    }
}

impl fmt::Display for SourceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One source's value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BudgetSource {
    /// Which source.
    pub kind: SourceKind,
    /// Bytes this source allows for the process (own bytes added back).
    pub bytes: u64,
    /// How it was computed, for the report.
    pub detail: String,
}

/// What the system can give now.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SystemBudget {
    /// Every source that applied.
    pub sources: Vec<BudgetSource>,
    /// The source with the least bytes.
    pub binding: SourceKind,
    /// The binding source's bytes.
    pub available_bytes: u64,
    /// The reserve kept back.
    pub reserve_bytes: u64,
    /// What the plan may use: the binding source, less the reserve when that source is system-wide.
    pub budget_bytes: u64,
    /// The meminfo read.
    pub meminfo: MemInfo,
    /// The cgroup, when one accounts memory.
    pub cgroup: Option<CgroupMemory>,
    /// Jetson identification, when on one.
    pub jetson: Option<JetsonInfo>,
    /// The GPU kind the budget assumed.
    pub gpu: GpuKind,
    /// Memory pressure, when the kernel has PSI.
    pub psi: Option<Psi>,
}

/// The CUDA-for-Tegra app-note estimate of allocatable device memory on an integrated GPU:
/// `host = used - device_alloc`; if `host < free_swap` then `total - device_alloc`, else
/// `total - (host - free_swap)`. All in bytes; saturating.
pub fn tegra_allocatable(total: u64, used: u64, device_alloc: u64, free_swap: u64) -> u64 {
    let host = used.saturating_sub(device_alloc);
    if host < free_swap {
        total.saturating_sub(device_alloc)
    } else {
        total.saturating_sub(host - free_swap)
    }
}

/// Reads every source under `root` and returns the budget, naming the binding source.
///
/// On a Jetson the Tegra estimate uses `used = MemTotal - MemAvailable` and
/// `device_alloc = NvMapMemUsed` (0 when the kernel lacks the field, noted in the detail).
pub fn read_system_budget(root: &Path, cfg: &BudgetConfig) -> Result<SystemBudget, BudgetError> {
    let meminfo = read_meminfo(root)?;
    let cgroup = find_cgroup(root)?;
    let jetson = detect_jetson(root);
    let psi = read_psi(root)?;
    let own = cfg.own_bytes;
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;

    let mut sources = vec![BudgetSource {
        kind: SourceKind::MemAvailable,
        bytes: meminfo.available_bytes.saturating_add(own),
        detail: format!(
            "MemAvailable {:.0} MiB of MemTotal {:.0} MiB",
            mib(meminfo.available_bytes),
            mib(meminfo.total_bytes)
        ),
    }];
    if let Some(cg) = &cgroup
        && let (Some(head), Some(limit)) = (cg.headroom_bytes(), cg.limit_bytes)
    {
        sources.push(BudgetSource {
            kind: SourceKind::Cgroup,
            bytes: head.saturating_add(own),
            detail: format!(
                "cgroup {:?} {}: limit {:.0} MiB, usage {:.0} MiB, inactive_file {:.0} MiB",
                cg.version,
                cg.cgroup_path,
                mib(limit),
                mib(cg.usage_bytes),
                mib(cg.inactive_file_bytes)
            ),
        });
    }
    let gpu = if cfg.device.is_some() {
        GpuKind::Discrete
    } else if jetson.is_some() {
        GpuKind::Integrated
    } else {
        GpuKind::None
    };
    if gpu == GpuKind::Integrated {
        let used = meminfo.total_bytes.saturating_sub(meminfo.available_bytes);
        let dev = meminfo.nvmap_used_bytes.unwrap_or(0);
        let est = tegra_allocatable(meminfo.total_bytes, used, dev, meminfo.swap_free_bytes);
        sources.push(BudgetSource {
            kind: SourceKind::TegraEstimate,
            bytes: est.saturating_add(own),
            detail: format!(
                "total {:.0} MiB, used {:.0} MiB, device_alloc (NvMapMemUsed) {}, free_swap {:.0} MiB",
                mib(meminfo.total_bytes),
                mib(used),
                match meminfo.nvmap_used_bytes {
                    Some(d) => format!("{:.0} MiB", mib(d)),
                    None => "absent, taken as 0".to_string(),
                },
                mib(meminfo.swap_free_bytes)
            ),
        });
    }
    if let Some(d) = cfg.device {
        sources.push(BudgetSource {
            kind: SourceKind::DeviceFree,
            bytes: d.free_bytes.saturating_add(own),
            detail: format!(
                "device free {:.0} MiB of {:.0} MiB",
                mib(d.free_bytes),
                mib(d.total_bytes)
            ),
        });
    }
    // The reserve protects the rest of the system, so it comes off the system-wide sources only: a
    // cgroup limit or a device's free memory is already this workload's own share.
    let usable = |s: &BudgetSource| match s.kind {
        SourceKind::MemAvailable | SourceKind::TegraEstimate => s.bytes.saturating_sub(cfg.reserve_bytes),
        _ => s.bytes,
    };
    // The first source always exists, so the minimum does too; fall back to it regardless.
    let binding_src = sources
        .iter()
        .min_by_key(|s| usable(s))
        .cloned()
        .unwrap_or_else(|| sources[0].clone());
    Ok(SystemBudget {
        binding: binding_src.kind,
        available_bytes: binding_src.bytes,
        reserve_bytes: cfg.reserve_bytes,
        budget_bytes: usable(&binding_src),
        sources,
        meminfo,
        cgroup,
        jetson,
        gpu,
        psi,
    })
}

#[cfg(test)]
mod tests;
