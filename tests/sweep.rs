//! `hsiedge bench sweep` and the knee cap it hands to `--batch auto`, through the binary.

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

#[test]
fn sweep_reports_consistent_elasticities_and_knee_and_caches_them() {
    let Some(model) = hybridsn() else { return };
    let cache = tempfile::tempdir().unwrap();
    let r = sweep(cache.path(), &model, &["--batches", "4,1,2"]);
    let points = r["points"].as_array().unwrap();
    let batches: Vec<u64> = points.iter().map(|p| p["batch"].as_u64().unwrap()).collect();
    assert_eq!(batches, [1, 2, 4], "sizes run ascending");
    assert_eq!(r["key"]["mode"], "dense");
    assert_eq!(r["key"]["tile"], hsiedge::job::DEFAULT_TILE as u64);
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
    // The knee by the documented rule: first step gaining less than elasticity 0.05, within 5 %
    // of the fastest per-tile time.
    let best = per.iter().copied().fold(f64::INFINITY, f64::min);
    let want = (0..per.len() - 1)
        .find(|&i| points[i]["elasticity"].as_f64().unwrap() > -0.05 && per[i] <= best * 1.05)
        .map(|i| batches[i]);
    assert_eq!(r["knee"].as_u64(), want, "{r}");
    let file = PathBuf::from(r["cache_file"].as_str().unwrap());
    assert!(file.starts_with(cache.path()) && file.is_file());
    let stored: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(stored["points"], r["points"]);
    assert_eq!(stored["knee"], r["knee"]);
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
    // Another tile size is another key: no cap from the default-tile sweep.
    let o = classify(&["--tile", "16"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let s: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(s["batch_plan"]["plan"]["knee"].is_null(), "{}", s["batch_plan"]);
    assert!(s["batch"].as_u64().unwrap() > 2);

    let o = classify(&[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let s: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let plan = &s["batch_plan"]["plan"];
    assert_eq!(plan["knee"], 2, "{plan}");
    assert_eq!(plan["limited_by"], "knee", "{plan}");
    assert_eq!(s["batch"], 2);
    assert_eq!(s["batch_plan"]["knee_file"].as_str(), file.to_str());

    std::fs::write(&file, b"not json").unwrap();
    let o = classify(&[]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("warning: ignoring the batch sweep cache") && err.contains(file.to_str().unwrap()),
        "{err}"
    );
    let s: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(s["batch_plan"]["plan"]["knee"].is_null());
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
