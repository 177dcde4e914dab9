//! `hsiedge bench sweep`, the knee cap it hands to `--batch auto`, the in-run sweep that finds the
//! knee without it, and the limits `hsiedge plan` names, through the binary. No test bounds a
//! timing: the machine is shared, so the tests check what the timings are turned into.

mod common;

use std::path::{Path, PathBuf};

use common::*;

fn hybridsn() -> Option<PathBuf> {
    model("hybridsn_salinas_a")
}

fn sweep(cache: &Path, model: &Path, extra: &[&str]) -> serde_json::Value {
    let mut args = vec![
        "bench",
        "sweep",
        "--model",
        model.to_str().unwrap(),
        "--repeat",
        "2",
        "--threads",
        "2",
        "--cache",
        cache.to_str().unwrap(),
        "--json",
    ];
    args.extend_from_slice(extra);
    serde_json::from_str(&ok(&args)).expect("sweep --json prints JSON")
}

/// The knee by the documented rule, from a sweep's reported points: the smallest batch whose
/// median per-unit time is within 5 % of the best, confirmed by three larger sizes reaching eight
/// times it.
fn knee_by_rule(points: &[serde_json::Value]) -> Option<u64> {
    let per: Vec<(u64, f64)> = points
        .iter()
        .map(|p| (p["batch"].as_u64().unwrap(), p["per_unit_s"].as_f64().unwrap()))
        .collect();
    let best = per.iter().map(|p| p.1).fold(f64::INFINITY, f64::min);
    let pick = per.iter().find(|p| p.1 <= best * 1.05)?.0;
    let above: Vec<u64> = per.iter().map(|p| p.0).filter(|&b| b > pick).collect();
    (above.len() >= 3 && above.iter().any(|&b| b >= 8 * pick)).then_some(pick)
}

#[test]
fn sweep_reports_consistent_elasticities_and_knee_and_caches_them() {
    let Some(model) = hybridsn() else { return };
    let cache = tempfile::tempdir().unwrap();
    let r = sweep(cache.path(), &model, &["--batches", "8,1,2,4"]);
    let points = r["points"].as_array().unwrap();
    let batches: Vec<u64> = points.iter().map(|p| p["batch"].as_u64().unwrap()).collect();
    assert!(batches.starts_with(&[1, 2]), "sizes run ascending: {batches:?}");
    assert!(batches.windows(2).all(|w| w[0] < w[1]));
    assert_eq!(r["key"]["mode"], "dense");
    assert_eq!(r["key"]["tile"], hsiedge::job::DEFAULT_TILE as u64);
    assert_eq!(r["key"]["threads"], 2);
    assert_eq!(r["threads_used"], 2, "threads as used, not 0");
    let per: Vec<f64> = points
        .iter()
        .map(|p| {
            let (m, b) = (p["median_s"].as_f64().unwrap(), p["batch"].as_f64().unwrap());
            let samples = p["samples_s"].as_array().unwrap();
            assert_eq!(samples.len(), 2);
            assert!((p["per_unit_s"].as_f64().unwrap() - m / b).abs() < 1e-12);
            m / b
        })
        .collect();
    for i in 0..points.len() {
        let e = &points[i]["elasticity"];
        if i + 1 == points.len() {
            assert!(e.is_null(), "the last point has no step");
            continue;
        }
        let want = (per[i + 1] / per[i]).ln() / (batches[i + 1] as f64 / batches[i] as f64).ln();
        assert!((e.as_f64().unwrap() - want).abs() < 1e-9, "point {i}: {e} vs {want}");
    }
    assert_eq!(r["knee"].as_u64(), knee_by_rule(points), "{r}");
    let file = PathBuf::from(r["cache_file"].as_str().unwrap());
    assert!(file.starts_with(cache.path()) && file.is_file());
    let stored: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(stored["points"], r["points"]);
    assert_eq!(stored["knee"], r["knee"]);
}

#[test]
fn a_sweep_never_caches_a_knee_from_three_points() {
    let Some(model) = hybridsn() else { return };
    let cache = tempfile::tempdir().unwrap();
    // Whatever the timings, three sizes cannot confirm a plateau (the old rule cached 1 here).
    let r = sweep(cache.path(), &model, &["--mode", "patch", "--batches", "4,1,2"]);
    assert_eq!(r["points"].as_array().unwrap().len(), 3);
    assert!(r["knee"].is_null(), "{r}");
    let stored: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(r["cache_file"].as_str().unwrap()).unwrap()).unwrap();
    assert!(stored["knee"].is_null());
    assert!(r["stopped"].as_str().unwrap().contains("no knee"), "{r}");
}

#[test]
fn a_cached_knee_caps_auto_batch_and_a_broken_cache_is_ignored_loudly() {
    let Some(model) = hybridsn() else { return };
    let Some(data) = data() else { return };
    let scene = data.join("salinas_a/salinas_a.hdr");
    let cache = tempfile::tempdir().unwrap();
    let r = sweep(cache.path(), &model, &["--batches", "1,2"]);
    let file = PathBuf::from(r["cache_file"].as_str().unwrap());
    // The cap's wiring, independent of this machine's timings: the record's knee set to 2 tiles.
    let mut rec: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    rec["knee"] = 2.into();
    std::fs::write(&file, serde_json::to_vec(&rec).unwrap()).unwrap();
    let out = tempfile::tempdir().unwrap();
    let classify = |extra: &[&str]| {
        let mut a = vec![
            "classify",
            scene.to_str().unwrap(),
            "--model",
            model.to_str().unwrap(),
            "--out",
            out.path().to_str().unwrap(),
            "--mode",
            "dense",
            "--batch",
            "auto",
            "--threads",
            "2",
            "--json",
            "--sweep-cache",
            cache.path().to_str().unwrap(),
        ];
        a.extend_from_slice(extra);
        run(&a)
    };
    // Another tile size is another key: no cap from the default-tile sweep, so the in-run sweep
    // finds the knee.
    let o = classify(&["--tile", "16"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let s: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(s["batch_plan"]["knee_file"].is_null(), "{}", s["batch_plan"]);
    assert!(
        s["batch_plan"]["sweep"]["points"]
            .as_array()
            .is_some_and(|p| !p.is_empty())
    );

    let o = classify(&[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let s: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let plan = &s["batch_plan"]["plan"];
    assert_eq!(plan["knee"], 2, "{plan}");
    assert_eq!(plan["limited_by"], "knee", "{plan}");
    assert_eq!(s["batch"], 2);
    assert_eq!(s["batch_plan"]["knee_file"].as_str(), file.to_str());
    assert!(
        s["batch_plan"]["sweep"].is_null(),
        "a cached knee spares the in-run sweep"
    );

    std::fs::write(&file, b"not json").unwrap();
    let o = classify(&[]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("warning: ignoring the batch sweep cache") && err.contains(file.to_str().unwrap()),
        "{err}"
    );
    let s: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(s["batch_plan"]["knee_file"].is_null());
    assert!(s["batch_plan"]["sweep"].is_object(), "the in-run sweep stands in");
}

#[test]
fn bad_sweep_settings_are_clear_errors() {
    let Some(model) = hybridsn() else { return };
    let cache = tempfile::tempdir().unwrap();
    let o = run(&[
        "bench",
        "sweep",
        "--model",
        model.to_str().unwrap(),
        "--batches",
        "0,4",
        "--cache",
        cache.path().to_str().unwrap(),
    ]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("--batches needs positive sizes"), "{err}");
    assert_eq!(std::fs::read_dir(cache.path()).unwrap().count(), 0, "nothing cached");
}

fn salinas_a() -> Option<PathBuf> {
    Some(data()?.join("salinas_a/salinas_a.hdr"))
}

#[test]
fn auto_stops_at_the_plateau_not_at_the_whole_scene_in_patch_mode() {
    if emulator().is_some() {
        skip(
            "HybridSN patch-mode calibrations and sweeps take many minutes under an emulator; the native run covers this logic",
        );
        return;
    }
    let Some(model) = hybridsn() else { return };
    let Some(scene) = salinas_a() else { return };
    let out = tempfile::tempdir().unwrap();
    let s: serde_json::Value = serde_json::from_str(&ok(&[
        "classify",
        scene.to_str().unwrap(),
        "--model",
        model.to_str().unwrap(),
        "--out",
        out.path().to_str().unwrap(),
        "--mode",
        "patch",
        "--batch",
        "auto",
        "--threads",
        "2",
        "--json",
    ]))
    .unwrap();
    let pixels = 83 * 86;
    let batch = s["batch"].as_u64().unwrap();
    let auto = &s["batch_plan"];
    let plan = &auto["plan"];
    // The memory allows the whole scene: the ceiling is the scene, the batch is far below it.
    assert_eq!(plan["batch_ceiling"], pixels, "{plan}");
    assert_eq!(plan["ceiling_limited_by"], "scene", "{plan}");
    assert!(plan["memory_limit_units"].as_u64().unwrap() > pixels, "{plan}");
    let sweep = &auto["sweep"];
    let max = sweep["limits"]["max_batch"].as_u64().unwrap();
    assert_eq!(max, pixels / 10, "a size is timed only over ten batches of the scene");
    assert!(batch <= max, "batch {batch} of {pixels} pixels: {plan}");
    assert_eq!(sweep["pick"]["batch"], batch, "the batch is the sweep's pick");
    assert_eq!(plan["knee"], batch);
    // Limited by the knee, or by the scene if per-sample time was still falling at the largest
    // size the scene lets the sweep time.
    let limit = plan["limited_by"].as_str().unwrap();
    assert!(limit == "knee" || (limit == "scene" && batch == max), "{plan}");
    // The timings behind it are recorded: every point a median of several runs, the pick the
    // smallest within 5 % of the best by the documented rule.
    let points = sweep["points"].as_array().unwrap();
    assert!(points.len() >= 2, "{sweep}");
    for p in points {
        assert!(p["samples_s"].as_array().unwrap().len() >= 2, "{p}");
        assert!(p["batch"].as_u64().unwrap() <= max);
    }
    let best = points
        .iter()
        .map(|p| p["per_unit_s"].as_f64().unwrap())
        .fold(f64::INFINITY, f64::min);
    assert_eq!(sweep["pick"]["best_per_unit_s"].as_f64(), Some(best));
    assert!(sweep["sweep_s"].as_f64().unwrap() >= 0.0 && auto["calibration_s"].as_f64().unwrap() > 0.0);
}

#[test]
fn plan_names_the_real_limit_in_one_json_object() {
    if emulator().is_some() {
        skip(
            "HybridSN patch-mode calibrations and sweeps take many minutes under an emulator; the native run covers this logic",
        );
        return;
    }
    let Some(model) = hybridsn() else { return };
    let Some(scene) = salinas_a() else { return };
    let plan = |mode: &str, extra: &[&str]| {
        let mut a = vec![
            "plan",
            "--model",
            model.to_str().unwrap(),
            "--scene",
            scene.to_str().unwrap(),
            "--mode",
            mode,
            "--threads",
            "2",
        ];
        a.extend_from_slice(extra);
        ok(&a)
    };
    let text = plan("patch", &["--no-knee"]);
    assert!(text.contains("limited by the scene's pixels"), "{text}");
    assert!(!text.contains("configured maximum"), "{text}");
    let r: serde_json::Value = serde_json::from_str(&plan("dense", &["--no-knee", "--json"])).unwrap();
    assert!(r.is_object(), "one object, not an unnamed array: {r}");
    assert_eq!(r["kind"], "inference");
    assert_eq!(r["plan"]["batch_safe"], 4, "Salinas-A has four 64 x 64 tiles");
    assert_eq!(r["plan"]["limited_by"], "tiles");
    assert_eq!(r["verify"], serde_json::json!([]));
    assert!(r["wall"].is_null() && r["sweep"].is_null(), "--no-knee runs no sweep");
    let r: serde_json::Value =
        serde_json::from_str(&plan("patch", &["--no-knee", "--max-batch", "100", "--json"])).unwrap();
    assert_eq!(
        (r["plan"]["batch_safe"].as_u64(), r["plan"]["limited_by"].as_str()),
        (Some(100), Some("max_batch"))
    );
    // With the sweep, the plan shows the timings behind its knee.
    let text = plan("patch", &[]);
    assert!(text.contains("sweep") && text.contains("knee"), "{text}");
    let r: serde_json::Value = serde_json::from_str(&ok(&[
        "plan",
        "--model",
        model.to_str().unwrap(),
        "--train",
        "--classes",
        "6",
        "--json",
    ]))
    .unwrap();
    assert_eq!(r["kind"], "training");
}

#[test]
fn bench_auto_compares_auto_with_every_power_of_two_up_to_b_safe() {
    if emulator().is_some() {
        // `bench auto` runs each configuration as a fresh `hsiedge` process, and a process emulated
        // by qemu-user cannot exec an aarch64 binary (binfmt_misc is not mounted here).
        skip("bench auto under an emulator: it starts hsiedge processes of its own");
        return;
    }
    let Some(model) = hybridsn() else { return };
    let Some(scene) = salinas_a() else { return };
    let r: serde_json::Value = serde_json::from_str(&ok(&[
        "bench",
        "auto",
        scene.to_str().unwrap(),
        "--model",
        model.to_str().unwrap(),
        "--mode",
        "dense",
        "--threads",
        "2",
        "--repeat",
        "2",
        "--json",
    ]))
    .unwrap();
    // Four 64 x 64 tiles: B_safe is the scene's tiles, the fixed batches 1, 2 and 4.
    assert_eq!(
        (r["b_safe"].as_u64(), r["b_safe_limited_by"].as_str()),
        (Some(4), Some("tiles"))
    );
    let fixed: Vec<&str> = r["fixed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["batch"].as_str().unwrap())
        .collect();
    assert_eq!(fixed, ["1", "2", "4"]);
    assert_eq!(r["threads_used"], 2);
    let auto = &r["auto"];
    assert_eq!(auto["batch"], "auto");
    for c in r["fixed"].as_array().unwrap().iter().chain([auto]) {
        let runs = c["runs"].as_array().unwrap();
        assert_eq!(runs.len(), 2, "one run per repetition: {c}");
        for run in runs {
            assert!(run["pixels_per_s"].as_f64().unwrap() > 0.0 && run["peak_anon_bytes"].as_u64().unwrap() > 0);
        }
    }
    // Auto ran with its sweep (a tile count of 4 lets it time batch 1 only) and said why.
    for run in auto["runs"].as_array().unwrap() {
        assert_eq!(run["batch"], 1, "{run}");
        assert_eq!(run["limited_by"], "tiles", "{run}");
        assert!(run["calibration_s"].as_f64().is_some());
    }
    // The ratios are what the table says they are.
    let px = |c: &serde_json::Value| c["pixels_per_s"].as_f64().unwrap();
    let best = r["fixed"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["batch"].as_str() == Some(&r["best_batch"].to_string()))
        .unwrap();
    assert!((r["auto_over_best"].as_f64().unwrap() - px(auto) / px(best)).abs() < 1e-9);
    let peak = |c: &serde_json::Value| c["peak_anon_bytes"].as_f64().unwrap();
    let b_safe = &r["fixed"][2];
    assert!((r["auto_memory_over_b_safe"].as_f64().unwrap() - peak(auto) / peak(b_safe)).abs() < 1e-9);
    let one = &r["fixed"][0];
    let above = (peak(auto) - peak(one)) / (peak(b_safe) - peak(one));
    assert!((r["auto_batch_memory_over_b_safe"].as_f64().unwrap() - above).abs() < 1e-9);
}
