//! The process's memory cgroup (v1 or v2), found through `/proc/self/cgroup` and
//! `/proc/self/mountinfo` under the root.

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::*;

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
    /// The effective limit: the level with the least headroom over the hierarchy (v2: the lower
    /// of `memory.max` and `memory.high` at each level); `None` when unlimited.
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
pub(super) fn unescape_mount(s: &str) -> String {
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
        let mount_dir = under(root, &m.mount_point);
        let dir = cgroup_dir(root, m, &path);
        return read_v1(dir, &mount_dir, path);
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

fn read_v1(dir: PathBuf, mount_dir: &Path, cgroup_path: String) -> Result<Option<CgroupMemory>, BudgetError> {
    let Some(usage) = read_u64_file(&dir.join("memory.usage_in_bytes"), "memory.usage_in_bytes")? else {
        return Ok(None);
    };
    let stat = read_optional(&dir.join("memory.stat"))?.unwrap_or_default();
    let inactive = stat_field(&stat, "total_inactive_file")
        .or_else(|| stat_field(&stat, "inactive_file"))
        .unwrap_or(0);
    let peak = read_u64_file(&dir.join("memory.max_usage_in_bytes"), "memory.max_usage_in_bytes")?;
    let limited = |l: Option<u64>| l.filter(|&l| l < CGROUP_V1_UNLIMITED);
    // Each visible level's limit against that level's own usage: siblings under a limited
    // parent are charged to it too.
    let mut tightest = Tightest::new(inactive);
    for d in levels(&dir, mount_dir) {
        if let Some(limit) = limited(read_u64_file(
            &d.join("memory.limit_in_bytes"),
            "memory.limit_in_bytes",
        )?) {
            let used = if d == dir {
                usage
            } else {
                read_u64_file(&d.join("memory.usage_in_bytes"), "memory.usage_in_bytes")?.unwrap_or(usage)
            };
            tightest.level(limit, used);
        }
    }
    // An ancestor above the mount (a container's view) shows only as hierarchical_memory_limit;
    // its usage is not visible, so this cgroup's own stands in for it.
    if let Some(hier) = limited(stat_field(&stat, "hierarchical_memory_limit"))
        && tightest.limit().is_none_or(|l| hier < l)
    {
        tightest.level(hier, usage);
    }
    let (limit, usage_at) = tightest.result(usage);
    Ok(Some(CgroupMemory {
        version: CgroupVersion::V1,
        cgroup_path,
        dir,
        limit_bytes: limit,
        usage_bytes: usage_at,
        peak_bytes: peak,
        inactive_file_bytes: inactive,
    }))
}

/// `dir` and its parents up to and including `mount_dir`.
fn levels<'a>(dir: &'a Path, mount_dir: &'a Path) -> impl Iterator<Item = &'a Path> {
    let mut next = Some(dir);
    std::iter::from_fn(move || {
        let d = next?;
        next = if d == mount_dir {
            None
        } else {
            d.parent().filter(|p| p.starts_with(mount_dir))
        };
        Some(d)
    })
}

/// The level of a cgroup hierarchy with the least headroom: its limit and usage.
struct Tightest {
    inactive: u64,
    best: Option<(u64, u64, u64)>,
}

impl Tightest {
    fn new(inactive: u64) -> Self {
        Self { inactive, best: None }
    }

    fn level(&mut self, limit: u64, used: u64) {
        let head = limit.saturating_sub(used.saturating_sub(self.inactive));
        if self.best.is_none_or(|(h, _, _)| head < h) {
            self.best = Some((head, limit, used));
        }
    }

    fn limit(&self) -> Option<u64> {
        self.best.map(|(_, l, _)| l)
    }

    /// The binding limit and the usage at its level, or no limit and `usage`.
    fn result(&self, usage: u64) -> (Option<u64>, u64) {
        match self.best {
            Some((_, l, u)) => (Some(l), u),
            None => (None, usage),
        }
    }
}

/// `memory.max` or `memory.high`: a number or `max`.
fn read_v2_max(path: &Path, field: &str) -> Result<Option<u64>, BudgetError> {
    match read_optional(path)? {
        Some(t) if t.trim() == "max" => Ok(None),
        Some(t) => parse_u64(path, field, &t).map(Some),
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
    // keep the level with the least headroom. Above `memory.high` the kernel throttles and
    // reclaims on every charge, so it is as much a wall for a batch as `memory.max`.
    let mut tightest = Tightest::new(inactive);
    for d in levels(&dir, mount_dir) {
        let max = read_v2_max(&d.join("memory.max"), "memory.max")?;
        let high = read_v2_max(&d.join("memory.high"), "memory.high")?;
        if let Some(limit) = [max, high].into_iter().flatten().min() {
            let used = if d == dir {
                usage
            } else {
                read_u64_file(&d.join("memory.current"), "memory.current")?.unwrap_or(usage)
            };
            tightest.level(limit, used);
        }
    }
    let (limit, usage_at) = tightest.result(usage);
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
