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

/// cgroup hierarchy version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CgroupVersion {
    /// The v1 `memory` controller.
    V1,
    /// The v2 unified hierarchy.
    V2,
}

/// The memory accounting of this process's cgroup.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CgroupMemory {
    /// v1 or v2.
    pub version: CgroupVersion,
    /// The cgroup path from `/proc/self/cgroup`.
    pub cgroup_path: String,
    /// The cgroup's directory under the root.
    pub dir: PathBuf,
    /// The effective limit: the tightest over the hierarchy; `None` when unlimited.
    pub limit_bytes: Option<u64>,
    /// Usage (`memory.usage_in_bytes` / `memory.current`) at the level whose limit binds.
    pub usage_bytes: u64,
    /// High-water mark (`memory.max_usage_in_bytes` / `memory.peak`), when the kernel has one.
    pub peak_bytes: Option<u64>,
    /// Reclaimable inactive file cache counted in usage (`memory.stat`).
    pub inactive_file_bytes: u64,
}

impl CgroupMemory {
    /// Bytes that can still be charged before the limit: `limit - (usage - inactive_file)`;
    /// `None` when there is no limit.
    pub fn headroom_bytes(&self) -> Option<u64> {
        self.limit_bytes
            .map(|l| l.saturating_sub(self.usage_bytes.saturating_sub(self.inactive_file_bytes)))
    }

    /// The file holding the high-water mark.
    pub fn peak_file(&self) -> PathBuf {
        match self.version {
            CgroupVersion::V1 => self.dir.join("memory.max_usage_in_bytes"),
            CgroupVersion::V2 => self.dir.join("memory.peak"),
        }
    }
}

/// One line of `/proc/self/mountinfo` that matters here.
struct Mount {
    root: String,
    mount_point: String,
    fstype: String,
    super_options: String,
}

/// Undoes mountinfo's octal escapes (`\040` for a space).
fn unescape_mount(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && let Some(v) = b
                .get(i + 1..i + 4)
                .and_then(|o| std::str::from_utf8(o).ok())
                .and_then(|o| u8::from_str_radix(o, 8).ok())
        {
            out.push(v);
            i += 4;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn parse_mountinfo(text: &str) -> Vec<Mount> {
    let mut mounts = Vec::new();
    for line in text.lines() {
        let Some((pre, post)) = line.split_once(" - ") else {
            continue;
        };
        let pre: Vec<&str> = pre.split_whitespace().collect();
        let post: Vec<&str> = post.split_whitespace().collect();
        if pre.len() < 5 || post.is_empty() {
            continue;
        }
        mounts.push(Mount {
            root: unescape_mount(pre[3]),
            mount_point: unescape_mount(pre[4]),
            fstype: post[0].to_string(),
            super_options: post.get(2).copied().unwrap_or("").to_string(),
        });
    }
    mounts
}

/// The directory of cgroup `path` inside `mount`, under `root`.
fn cgroup_dir(root: &Path, mount: &Mount, path: &str) -> PathBuf {
    let mp = under(root, &mount.mount_point);
    // Inside a cgroup namespace or a container the mount's root is a sub-path of the
    // hierarchy; strip it so the process's path lands under the mount point.
    let rel = if mount.root == "/" {
        path
    } else {
        path.strip_prefix(mount.root.as_str()).unwrap_or("/")
    };
    let dir = mp.join(rel.trim_start_matches('/'));
    if dir.is_dir() { dir } else { mp }
}

/// `key value` lines of a cgroup `memory.stat`.
fn stat_field(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        if k == key { v.trim().parse().ok() } else { None }
    })
}

fn read_u64_file(path: &Path, field: &str) -> Result<Option<u64>, BudgetError> {
    match read_optional(path)? {
        Some(t) => parse_u64(path, field, &t).map(Some),
        None => Ok(None),
    }
}

/// Finds this process's memory cgroup under `root` and reads its limit, usage and peak.
///
/// Prefers the v1 `memory` controller when it is mounted, else the v2 unified hierarchy.
/// `Ok(None)` when no memory accounting is visible (no matching mount, or no usage file, as in
/// the v2 root cgroup).
pub fn find_cgroup(root: &Path) -> Result<Option<CgroupMemory>, BudgetError> {
    let cg_path = under(root, "/proc/self/cgroup");
    let Some(cg_text) = read_optional(&cg_path)? else {
        return Ok(None);
    };
    let mi_path = under(root, "/proc/self/mountinfo");
    let mounts = parse_mountinfo(&read_optional(&mi_path)?.unwrap_or_default());

    let mut v1_path = None;
    let mut v2_path = None;
    for line in cg_text.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(ctrls), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        if id == "0" && ctrls.is_empty() {
            v2_path = Some(path.to_string());
        } else if ctrls.split(',').any(|c| c == "memory") {
            v1_path = Some(path.to_string());
        }
    }

    if let Some(path) = v1_path
        && let Some(m) = mounts
            .iter()
            .find(|m| m.fstype == "cgroup" && m.super_options.split(',').any(|o| o == "memory"))
    {
        let dir = cgroup_dir(root, m, &path);
        return read_v1(dir, path);
    }
    if let Some(path) = v2_path
        && let Some(m) = mounts.iter().find(|m| m.fstype == "cgroup2")
    {
        let mount_dir = under(root, &m.mount_point);
        let dir = cgroup_dir(root, m, &path);
        return read_v2(dir, &mount_dir, path);
    }
    Ok(None)
}

fn read_v1(dir: PathBuf, cgroup_path: String) -> Result<Option<CgroupMemory>, BudgetError> {
    let Some(usage) = read_u64_file(&dir.join("memory.usage_in_bytes"), "memory.usage_in_bytes")? else {
        return Ok(None);
    };
    let own = read_u64_file(&dir.join("memory.limit_in_bytes"), "memory.limit_in_bytes")?;
    let stat = read_optional(&dir.join("memory.stat"))?.unwrap_or_default();
    // An ancestor's tighter limit binds too; v1 reports it as hierarchical_memory_limit.
    let hier = stat_field(&stat, "hierarchical_memory_limit");
    let limit = [own, hier]
        .into_iter()
        .flatten()
        .filter(|&l| l < CGROUP_V1_UNLIMITED)
        .min();
    let inactive = stat_field(&stat, "total_inactive_file")
        .or_else(|| stat_field(&stat, "inactive_file"))
        .unwrap_or(0);
    let peak = read_u64_file(&dir.join("memory.max_usage_in_bytes"), "memory.max_usage_in_bytes")?;
    Ok(Some(CgroupMemory {
        version: CgroupVersion::V1,
        cgroup_path,
        dir,
        limit_bytes: limit,
        usage_bytes: usage,
        peak_bytes: peak,
        inactive_file_bytes: inactive,
    }))
}

/// `memory.max` is a number or `max`.
fn read_v2_max(path: &Path) -> Result<Option<u64>, BudgetError> {
    match read_optional(path)? {
        Some(t) if t.trim() == "max" => Ok(None),
        Some(t) => parse_u64(path, "memory.max", &t).map(Some),
        None => Ok(None),
    }
}

fn read_v2(dir: PathBuf, mount_dir: &Path, cgroup_path: String) -> Result<Option<CgroupMemory>, BudgetError> {
    let Some(usage) = read_u64_file(&dir.join("memory.current"), "memory.current")? else {
        return Ok(None);
    };
    let stat = read_optional(&dir.join("memory.stat"))?.unwrap_or_default();
    let inactive = stat_field(&stat, "inactive_file").unwrap_or(0);
    let peak = read_u64_file(&dir.join("memory.peak"), "memory.peak")?;

    // v2 limits are hierarchical but not summarised in one file: walk up to the mount point and
    // keep the level with the least headroom.
    let mut best: Option<(u64, u64, u64)> = None; // (headroom, limit, usage)
    let mut level = Some(dir.as_path());
    while let Some(d) = level {
        if let Some(limit) = read_v2_max(&d.join("memory.max"))? {
            let used = if d == dir {
                usage
            } else {
                read_u64_file(&d.join("memory.current"), "memory.current")?.unwrap_or(usage)
            };
            let head = limit.saturating_sub(used.saturating_sub(inactive));
            if best.is_none_or(|(h, _, _)| head < h) {
                best = Some((head, limit, used));
            }
        }
        if d == mount_dir {
            break;
        }
        level = d.parent().filter(|p| p.starts_with(mount_dir));
    }
    let (limit, usage_at) = match best {
        Some((_, l, u)) => (Some(l), u),
        None => (None, usage),
    };
    Ok(Some(CgroupMemory {
        version: CgroupVersion::V2,
        cgroup_path,
        dir,
        limit_bytes: limit,
        usage_bytes: usage_at,
        peak_bytes: peak,
        inactive_file_bytes: inactive,
    }))
}

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
fn parse_l4t(text: &str) -> Option<String> {
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

/// `/proc/pressure/memory` (PSI). Averages are percentages of wall time some (or all) tasks
/// were stalled on memory.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Psi {
    /// `some avg10`.
    pub some_avg10: f64,
    /// `some avg60`.
    pub some_avg60: f64,
    /// `some avg300`.
    pub some_avg300: f64,
    /// `some total` (microseconds).
    pub some_total_us: u64,
    /// `full avg10`, when the file has a `full` line.
    pub full_avg10: Option<f64>,
}

/// Reads `root/proc/pressure/memory`; `Ok(None)` when the kernel has no PSI.
pub fn read_psi(root: &Path) -> Result<Option<Psi>, BudgetError> {
    let path = under(root, "/proc/pressure/memory");
    let Some(text) = read_optional(&path)? else {
        return Ok(None);
    };
    let line_fields = |kind: &str| -> Option<Vec<(String, String)>> {
        let line = text.lines().find(|l| l.starts_with(kind))?;
        Some(
            line.split_whitespace()
                .skip(1)
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    };
    let some = line_fields("some ").ok_or_else(|| BudgetError::MissingField {
        path: path.clone(),
        field: "some".into(),
    })?;
    let get = |fields: &[(String, String)], k: &str| -> Result<String, BudgetError> {
        fields
            .iter()
            .find(|(fk, _)| fk == k)
            .map(|(_, v)| v.clone())
            .ok_or_else(|| BudgetError::MissingField {
                path: path.clone(),
                field: format!("some {k}"),
            })
    };
    let float = |field: &str, v: String| -> Result<f64, BudgetError> {
        v.parse::<f64>().map_err(|_| BudgetError::BadValue {
            path: path.clone(),
            field: field.to_string(),
            value: v,
        })
    };
    let full_avg10 = line_fields("full ")
        .and_then(|f| f.into_iter().find(|(k, _)| k == "avg10"))
        .and_then(|(_, v)| v.parse::<f64>().ok());
    Ok(Some(Psi {
        some_avg10: float("some avg10", get(&some, "avg10")?)?,
        some_avg60: float("some avg60", get(&some, "avg60")?)?,
        some_avg300: float("some avg300", get(&some, "avg300")?)?,
        some_total_us: parse_u64(&path, "some total", &get(&some, "total")?)?,
        full_avg10,
    }))
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
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn fixture(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/sysroots")
            .join(name)
    }

    fn write(root: &Path, rel: &str, text: &str) {
        let p = root.join(rel);
        if let Some(parent) = p.parent() {
            fs::create_dir_all(parent).unwrap();
        }
        fs::write(p, text).unwrap();
    }

    const MEMINFO: &str = "MemTotal:        8000000 kB\nMemFree:          100000 kB\nMemAvailable:    4000000 kB\nSwapTotal:       1000000 kB\nSwapFree:         500000 kB\nHugePages_Total:       0\n";

    #[test]
    fn tegra_estimate_both_branches() {
        // host 2000 < swap 3000: total - device.
        assert_eq!(tegra_allocatable(8000, 3000, 1000, 3000), 7000);
        // host 5000 >= swap 1000: total - (host - swap).
        assert_eq!(tegra_allocatable(8000, 6000, 1000, 1000), 4000);
        assert_eq!(tegra_allocatable(8000, 100, 1000, 50), 7000);
    }

    #[test]
    fn meminfo_parses_and_requires_fields() {
        let d = tempfile::tempdir().unwrap();
        write(d.path(), "proc/meminfo", MEMINFO);
        let m = read_meminfo(d.path()).unwrap();
        assert_eq!(m.total_bytes, 8_000_000 * 1024);
        assert_eq!(m.swap_free_bytes, 500_000 * 1024);
        assert_eq!(m.nvmap_used_bytes, None);
        write(d.path(), "proc/meminfo", "MemTotal: 1 kB\nMemFree: 1 kB\n");
        assert!(matches!(
            read_meminfo(d.path()),
            Err(BudgetError::MissingField { ref field, .. }) if field == "MemAvailable"
        ));
        write(d.path(), "proc/meminfo", "MemTotal: x kB\n");
        assert!(matches!(
            read_meminfo(d.path()),
            Err(BudgetError::BadValue { ref field, .. }) if field == "MemTotal"
        ));
    }

    #[test]
    fn cgroup_v1_nested_in_container_mount() {
        let d = tempfile::tempdir().unwrap();
        let r = d.path();
        write(r, "proc/meminfo", MEMINFO);
        write(
            r,
            "proc/self/cgroup",
            "12:cpu,cpuacct:/docker/abc\n9:memory:/docker/abc\n0::/\n",
        );
        write(
            r,
            "proc/self/mountinfo",
            "30 25 0:26 /docker/abc /sys/fs/cgroup/memory ro,nosuid - cgroup cgroup rw,memory\n",
        );
        write(r, "sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");
        write(
            r,
            "sys/fs/cgroup/memory/memory.usage_in_bytes",
            &format!("{}\n", 300 * MIB),
        );
        write(
            r,
            "sys/fs/cgroup/memory/memory.max_usage_in_bytes",
            &format!("{}\n", 400 * MIB),
        );
        write(
            r,
            "sys/fs/cgroup/memory/memory.stat",
            &format!(
                "cache 1\nhierarchical_memory_limit {}\ntotal_inactive_file {}\n",
                1024 * MIB,
                100 * MIB
            ),
        );
        let cg = find_cgroup(r).unwrap().unwrap();
        assert_eq!(cg.version, CgroupVersion::V1);
        assert_eq!(cg.limit_bytes, Some(1024 * MIB)); // the ancestor's limit binds
        assert_eq!(cg.peak_bytes, Some(400 * MIB));
        assert_eq!(cg.headroom_bytes(), Some(1024 * MIB - 200 * MIB));
        let b = read_system_budget(
            r,
            &BudgetConfig {
                reserve_bytes: 100 * MIB,
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(b.binding, SourceKind::Cgroup);
        // The reserve is for the rest of the system: it does not come off the cgroup's own share.
        assert_eq!(b.budget_bytes, 824 * MIB);
        assert_eq!(b.gpu, GpuKind::None);
    }

    #[test]
    fn cgroup_v2_parent_limit_binds() {
        let d = tempfile::tempdir().unwrap();
        let r = d.path();
        write(r, "proc/self/cgroup", "0::/app.slice/run.service\n");
        write(
            r,
            "proc/self/mountinfo",
            "35 24 0:30 / /sys/fs/cgroup rw,nosuid shared:9 - cgroup2 cgroup2 rw,nsdelegate\n",
        );
        let leaf = "sys/fs/cgroup/app.slice/run.service";
        write(r, &format!("{leaf}/memory.max"), "max\n");
        write(r, &format!("{leaf}/memory.current"), &format!("{}\n", 100 * MIB));
        write(r, &format!("{leaf}/memory.stat"), "anon 1\ninactive_file 0\n");
        write(r, "sys/fs/cgroup/app.slice/memory.max", &format!("{}\n", 2048 * MIB));
        write(
            r,
            "sys/fs/cgroup/app.slice/memory.current",
            &format!("{}\n", 1548 * MIB),
        );
        let cg = find_cgroup(r).unwrap().unwrap();
        assert_eq!(cg.version, CgroupVersion::V2);
        assert_eq!(cg.limit_bytes, Some(2048 * MIB));
        assert_eq!(cg.headroom_bytes(), Some(500 * MIB));
        assert_eq!(cg.peak_bytes, None);
    }

    #[test]
    fn no_cgroup_files_is_none() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(find_cgroup(d.path()).unwrap(), None);
        write(d.path(), "proc/self/cgroup", "0::/\n");
        assert_eq!(find_cgroup(d.path()).unwrap(), None);
    }

    #[test]
    fn psi_and_l4t_parse() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(read_psi(d.path()).unwrap(), None);
        write(
            d.path(),
            "proc/pressure/memory",
            "some avg10=12.50 avg60=3.00 avg300=0.50 total=123456\nfull avg10=1.25 avg60=0.00 avg300=0.00 total=100\n",
        );
        let p = read_psi(d.path()).unwrap().unwrap();
        assert_eq!(p.some_avg10, 12.5);
        assert_eq!(p.some_total_us, 123456);
        assert_eq!(p.full_avg10, Some(1.25));
        assert_eq!(
            parse_l4t("# R35 (release), REVISION: 4.1, GCID: 33958178, BOARD: t186ref\n").as_deref(),
            Some("R35.4.1")
        );
        assert_eq!(unescape_mount("/a\\040b"), "/a b");
    }

    #[test]
    fn orin_nano_fixture() {
        let root = fixture("orin_nano_8gb");
        let j = detect_jetson(&root).unwrap();
        assert_eq!(j.soc.as_deref(), Some("tegra234"));
        assert!(j.model.unwrap_or_default().contains("Orin Nano"));
        assert_eq!(j.l4t_release.as_deref(), Some("R35.4.1"));
        let b = read_system_budget(&root, &BudgetConfig::default()).unwrap();
        assert_eq!(b.gpu, GpuKind::Integrated);
        assert!(b.meminfo.nvmap_used_bytes.is_some());
        let kinds: Vec<_> = b.sources.iter().map(|s| s.kind).collect();
        assert!(kinds.contains(&SourceKind::TegraEstimate));
        let min = b.sources.iter().map(|s| s.bytes).min().unwrap();
        assert_eq!(b.available_bytes, min);
        assert_eq!(b.budget_bytes, min - DEFAULT_RESERVE_BYTES);
        assert!(b.cgroup.is_some());
        assert!(b.psi.is_some());
    }

    #[test]
    fn agx_orin_fixture() {
        let root = fixture("agx_orin_64gb");
        let j = detect_jetson(&root).unwrap();
        assert!(j.model.unwrap_or_default().contains("AGX Orin"));
        let b = read_system_budget(&root, &BudgetConfig::default()).unwrap();
        assert_eq!(b.gpu, GpuKind::Integrated);
        assert!(b.meminfo.total_bytes > 60 * 1024 * MIB);
        // The service runs in a cgroup with a 16 GiB limit: that binds.
        assert_eq!(b.binding, SourceKind::Cgroup);
    }

    #[test]
    fn discrete_gpu_fixture() {
        let root = fixture("discrete_gpu_host");
        assert_eq!(detect_jetson(&root), None);
        let dev = DeviceMemory {
            free_bytes: 2 * 1024 * MIB,
            total_bytes: 24 * 1024 * MIB,
        };
        let b = read_system_budget(
            &root,
            &BudgetConfig {
                device: Some(dev),
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(b.gpu, GpuKind::Discrete);
        assert_eq!(b.binding, SourceKind::DeviceFree);
        assert_eq!(b.budget_bytes, 2 * 1024 * MIB);
        let cpu = read_system_budget(&root, &BudgetConfig::default()).unwrap();
        assert_eq!(cpu.gpu, GpuKind::None);
        assert_eq!(cpu.cgroup.as_ref().map(|c| c.version), Some(CgroupVersion::V1));
    }

    #[test]
    fn cgroup_v2_fixture() {
        let root = fixture("orin_nx_16gb_cgroup_v2");
        let b = read_system_budget(&root, &BudgetConfig::default()).unwrap();
        let cg = b.cgroup.clone().unwrap();
        assert_eq!(cg.version, CgroupVersion::V2);
        assert!(cg.limit_bytes.is_some());
        assert!(cg.peak_bytes.is_some());
        assert_eq!(b.binding, SourceKind::Cgroup);
    }

    #[test]
    fn own_bytes_are_added_back() {
        let root = fixture("discrete_gpu_host");
        let a = read_system_budget(&root, &BudgetConfig::default()).unwrap();
        let b = read_system_budget(
            &root,
            &BudgetConfig {
                own_bytes: 10 * MIB,
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(b.available_bytes, a.available_bytes + 10 * MIB);
    }
}
