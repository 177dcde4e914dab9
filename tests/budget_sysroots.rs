//! The budget API end to end on the constructed system roots in `tests/fixtures/sysroots`
//! (see the README there: constructed from the documented formats, not recorded on hardware).

mod common;

use std::fs;
use std::path::{Path, PathBuf};

use hsiedge::budget::{
    self, BudgetConfig, Cause, ChooseConfig, CostModel, DeviceMemory, Governor, GovernorConfig, Plan, SourceKind, Unit,
};

const MIB: u64 = 1 << 20;

fn sysroot(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/sysroots")
        .join(name)
}

/// HybridSN-like patch cost: 84 MiB fixed (weights + runtime), 6 MiB per sample (the baselines' peak per sample).
fn hybridsn() -> CostModel {
    CostModel::new(Unit::Sample, 84 * MIB, 6 * MIB)
}

#[test]
fn plans_on_every_root() {
    let cases = [
        ("orin_nano_8gb", SourceKind::MemAvailable, None),
        ("agx_orin_64gb", SourceKind::Cgroup, None),
        ("orin_nx_16gb_cgroup_v2", SourceKind::Cgroup, None),
        (
            "discrete_gpu_host",
            SourceKind::DeviceFree,
            Some(DeviceMemory {
                free_bytes: 20 << 30,
                total_bytes: 24 << 30,
            }),
        ),
    ];
    for (name, binding, device) in cases {
        let cfg = BudgetConfig {
            device,
            ..BudgetConfig::default()
        };
        let system = budget::read_system_budget(&sysroot(name), &cfg).unwrap();
        assert_eq!(system.binding, binding, "{name}: {:#?}", system.sources);
        let choose = ChooseConfig {
            max_units: 1 << 20,
            ..ChooseConfig::default()
        };
        let plan = Plan::build(&system, &hybridsn(), None, &choose).unwrap();
        let expect = ((system.budget_bytes as f64 * 0.9) as u64 - 84 * MIB) / (6 * MIB);
        assert!(
            plan.batch_safe.abs_diff(expect) <= 1,
            "{name}: {} vs {expect}",
            plan.batch_safe
        );
        assert!(plan.predicted_peak_bytes <= system.budget_bytes);
        let json = serde_json::to_value(&plan).unwrap();
        assert_eq!(json["binding_source"], binding.name());
        assert_eq!(json["budget_bytes"], system.budget_bytes);
        eprintln!("{name}:\n{plan}\n");
    }
}

#[test]
fn knee_caps_the_batch() {
    let system = budget::read_system_budget(&sysroot("agx_orin_64gb"), &BudgetConfig::default()).unwrap();
    let choose = ChooseConfig {
        knee: Some(1024),
        max_units: 8192,
        ..ChooseConfig::default()
    };
    let plan = Plan::build(&system, &hybridsn(), None, &choose).unwrap();
    assert_eq!(plan.batch_safe, 1024);
    assert_eq!(plan.limited_by, budget::Limit::Knee);
}

fn copy_tree(from: &Path, to: &Path) {
    for e in fs::read_dir(from).unwrap().flatten() {
        let dst = to.join(e.file_name());
        if e.path().is_dir() {
            fs::create_dir_all(&dst).unwrap();
            copy_tree(&e.path(), &dst);
        } else {
            fs::copy(e.path(), dst).unwrap();
        }
    }
}

fn set_available(root: &Path, kb: u64) {
    let p = root.join("proc/meminfo");
    let text = fs::read_to_string(&p).unwrap();
    let out: String = text
        .lines()
        .map(|l| {
            if l.starts_with("MemAvailable:") {
                format!("MemAvailable:   {kb:>8} kB\n")
            } else {
                format!("{l}\n")
            }
        })
        .collect();
    fs::write(p, out).unwrap();
}

#[test]
fn governor_follows_a_neighbour_taking_memory() {
    let dir = tempfile::tempdir().unwrap();
    copy_tree(&sysroot("orin_nano_8gb"), dir.path());
    let root = dir.path();
    let cfg = BudgetConfig::default();
    let system = budget::read_system_budget(root, &cfg).unwrap();
    let choose = ChooseConfig {
        max_units: 1 << 20,
        ..ChooseConfig::default()
    };
    let plan = Plan::build(&system, &hybridsn(), None, &choose).unwrap();
    let mut gov = Governor::new(hybridsn(), plan.batch_safe, GovernorConfig::from(&choose)).unwrap();
    let start = gov.current();

    // A neighbour takes ~2 GiB: MemAvailable 4.64 GiB -> 2.6 GiB; the batch shrinks before the next run.
    set_available(root, 2_700_000);
    let a = gov.check(root, &cfg).unwrap().unwrap();
    assert_eq!(a.cause, Cause::BudgetFell);
    assert!(a.new < start);
    let b = budget::read_system_budget(root, &cfg).unwrap();
    assert!(hybridsn().predict(a.new) <= b.budget_bytes);

    // It leaves: the batch grows back by at most 25 % per check, never above the start.
    set_available(root, 4_870_044);
    let mut last = gov.current();
    while let Some(adj) = gov.check(root, &cfg).unwrap() {
        assert_eq!(adj.cause, Cause::Recovered);
        assert!(adj.new <= (last as f64 * 1.25).ceil() as u64);
        last = adj.new;
    }
    assert_eq!(gov.current(), start);

    // Almost nothing left: exhausted.
    set_available(root, 300_000);
    assert_eq!(gov.check(root, &cfg).unwrap().map(|a| a.cause), Some(Cause::Exhausted));
}

#[test]
fn live_system_reads_without_error() {
    let root = Path::new("/");
    if !root.join("proc/meminfo").exists() {
        common::skip("no /proc");
        return;
    }
    let b = budget::read_system_budget(root, &BudgetConfig::default()).unwrap();
    assert!(b.available_bytes <= b.meminfo.available_bytes); // the minimum over sources
    assert!(b.budget_bytes <= b.available_bytes);
    eprintln!("live: binding {} {:?}", b.binding, b.sources);
}
