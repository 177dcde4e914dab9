use super::cgroup::unescape_mount;
use super::jetson::parse_l4t;
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
fn cgroup_v1_limited_parent_counts_its_siblings() {
    let d = tempfile::tempdir().unwrap();
    let r = d.path();
    write(r, "proc/self/cgroup", "9:memory:/hsiedge/run\n");
    write(
        r,
        "proc/self/mountinfo",
        "30 25 0:26 / /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory\n",
    );
    let leaf = "sys/fs/cgroup/memory/hsiedge/run";
    write(r, &format!("{leaf}/memory.limit_in_bytes"), "9223372036854771712\n");
    write(r, &format!("{leaf}/memory.usage_in_bytes"), &format!("{}\n", 100 * MIB));
    write(
        r,
        &format!("{leaf}/memory.stat"),
        &format!("hierarchical_memory_limit {}\ntotal_inactive_file 0\n", 1024 * MIB),
    );
    // The parent holds this cgroup and siblings that use 800 MiB more.
    write(
        r,
        "sys/fs/cgroup/memory/hsiedge/memory.limit_in_bytes",
        &format!("{}\n", 1024 * MIB),
    );
    write(
        r,
        "sys/fs/cgroup/memory/hsiedge/memory.usage_in_bytes",
        &format!("{}\n", 900 * MIB),
    );
    write(r, "sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");
    write(
        r,
        "sys/fs/cgroup/memory/memory.usage_in_bytes",
        &format!("{}\n", 4096 * MIB),
    );
    let cg = find_cgroup(r).unwrap().unwrap();
    assert_eq!(cg.limit_bytes, Some(1024 * MIB));
    assert_eq!(cg.usage_bytes, 900 * MIB);
    assert_eq!(cg.headroom_bytes(), Some(124 * MIB));
}

#[test]
fn cgroup_v2_memory_high_below_max_binds() {
    let d = tempfile::tempdir().unwrap();
    let r = d.path();
    write(r, "proc/self/cgroup", "0::/app.slice/run.service\n");
    write(
        r,
        "proc/self/mountinfo",
        "35 24 0:30 / /sys/fs/cgroup rw,nosuid shared:9 - cgroup2 cgroup2 rw,nsdelegate\n",
    );
    let leaf = "sys/fs/cgroup/app.slice/run.service";
    write(r, &format!("{leaf}/memory.max"), &format!("{}\n", 1024 * MIB));
    write(r, &format!("{leaf}/memory.high"), &format!("{}\n", 512 * MIB));
    write(r, &format!("{leaf}/memory.current"), &format!("{}\n", 100 * MIB));
    write(r, &format!("{leaf}/memory.stat"), "inactive_file 0\n");
    let cg = find_cgroup(r).unwrap().unwrap();
    assert_eq!(cg.limit_bytes, Some(512 * MIB));
    assert_eq!(cg.headroom_bytes(), Some(412 * MIB));
    // `max` in memory.high leaves memory.max.
    write(r, &format!("{leaf}/memory.high"), "max\n");
    assert_eq!(find_cgroup(r).unwrap().unwrap().limit_bytes, Some(1024 * MIB));
    write(r, &format!("{leaf}/memory.high"), "lots\n");
    assert!(matches!(
        find_cgroup(r),
        Err(BudgetError::BadValue { ref field, .. }) if field == "memory.high"
    ));
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
