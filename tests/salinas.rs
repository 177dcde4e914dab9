//! End-to-end on the real Salinas-A scene with every shipped classifier: dense and patch modes agree,
//! and `hsiedge classify` reproduces the Python evaluation recorded in each model's `metrics.json`.

mod common;

use std::path::Path;

use common::*;

const CLASSIFIERS: &[&str] = &["hybridsn_salinas_a", "cnn3d_salinas_a", "spectral1d_salinas_a"];

fn classify(scene: &Path, model: &Path, out: &Path, mode: &str) -> serde_json::Value {
    summary(&ok(&[
        "classify",
        scene.to_str().unwrap(),
        "--model",
        model.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--mode",
        mode,
        "--keep-scores",
        "--threads",
        "2",
        "--json",
    ]))
}

/// Test-mask rule from metrics.json: labelled pixels with `a*row + b*col >= test_min`.
fn test_mask(metrics: &serde_json::Value, labels: &[u8], samples: usize) -> Vec<bool> {
    let m = &metrics["ort_full_scene"]["test_mask"];
    assert_eq!(m["kind"], "linear", "unknown mask kind {m}");
    let (a, b, min) = (
        m["a"].as_i64().unwrap(),
        m["b"].as_i64().unwrap(),
        m["test_min"].as_i64().unwrap(),
    );
    labels
        .iter()
        .enumerate()
        .map(|(i, &l)| {
            let (row, col) = ((i / samples) as i64, (i % samples) as i64);
            l > 0 && a * row + b * col >= min
        })
        .collect()
}

fn oa(pred: &[u8], labels: &[u8], mask: &[bool]) -> (f64, usize) {
    let n = mask.iter().filter(|m| **m).count();
    let ok = pred
        .iter()
        .zip(labels)
        .zip(mask)
        .filter(|((p, l), m)| **m && p == l)
        .count();
    (ok as f64 / n as f64, n)
}

#[test]
fn every_classifier_reproduces_its_published_accuracy_in_both_modes() {
    let Some(data) = data() else { return };
    let scene = data.join("salinas_a/salinas_a.hdr");
    let labels = std::fs::read(data.join("salinas_a/salinas_a_gt.img")).unwrap();
    let mut tested = 0;
    for name in CLASSIFIERS {
        let Some(model) = model(name) else { continue };
        let metrics: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(model.with_file_name("metrics.json")).unwrap()).unwrap();
        let manifest: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&model).unwrap()).unwrap();
        if emulator().is_some() && manifest["patch"].as_u64().is_some_and(|p| p > 1) {
            // A 3-D CNN's patch mode through an emulated CPU takes most of an hour; the native run
            // checks its accuracy and tests/cross_e2e.rs its aarch64 maps against the host's.
            skip(format!("{name}: patch-mode accuracy under an emulator"));
            continue;
        }
        let dir = tempfile::tempdir().unwrap();
        let patch = dir.path().join("patch");
        let s = classify(&scene, &model, &patch, "patch");
        assert_eq!(s["pixels"], 83 * 86);
        let pred = std::fs::read(patch.join("class_map.img")).unwrap();
        let mask = test_mask(&metrics, &labels, 86);
        let (got, n) = oa(&pred, &labels, &mask);
        let want = metrics["ort_full_scene"]["oa_test"].as_f64().unwrap();
        assert_eq!(
            n as u64,
            metrics["ort_full_scene"]["n_test"].as_u64().unwrap(),
            "{name}: test mask size"
        );
        assert!(
            (got - want).abs() <= 0.001,
            "{name}: OA {got} on {n} test pixels, Python evaluation {want}"
        );
        let all = vec![true; labels.len()];
        let labelled: Vec<bool> = labels.iter().zip(&all).map(|(l, _)| *l > 0).collect();
        let (got_all, _) = oa(&pred, &labels, &labelled);
        let want_all = metrics["ort_full_scene"]["oa_all_labelled"].as_f64().unwrap();
        assert!(
            (got_all - want_all).abs() <= 0.001,
            "{name}: OA over all labelled {got_all} vs {want_all}"
        );
        if manifest["files"]["dense"].is_string() {
            let dense = dir.path().join("dense");
            let sd = classify(&scene, &model, &dense, "dense");
            assert_eq!(sd["mode"], "dense");
            let dpred = std::fs::read(dense.join("class_map.img")).unwrap();
            let same = pred.iter().zip(&dpred).filter(|(a, b)| a == b).count();
            assert!(
                same as f64 >= 0.999 * pred.len() as f64,
                "{name}: dense and patch agree on {same} of {}",
                pred.len()
            );
            let (a, b) = (read_f32(&patch.join("scores.img")), read_f32(&dense.join("scores.img")));
            let max = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
            assert!(max <= 1e-4, "{name}: max logit difference {max}");
            eprintln!(
                "{name}: OA {got:.4} (python {want:.4}), dense/patch agreement {same}/{}, max logit diff {max:.2e}",
                pred.len()
            );
        }
        tested += 1;
    }
    assert!(
        tested > 0 || std::env::var("CI").is_err(),
        "CI must test at least one shipped classifier"
    );
}

#[test]
fn labels_flag_reports_accuracy_against_the_ground_truth() {
    let Some(data) = data() else { return };
    let Some(model) = model("hybridsn_salinas_a") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let s = summary(&ok(&[
        "classify",
        data.join("salinas_a/salinas_a.hdr").to_str().unwrap(),
        "--model",
        model.to_str().unwrap(),
        "--out",
        dir.path().join("o").to_str().unwrap(),
        "--labels",
        data.join("salinas_a/salinas_a_gt.hdr").to_str().unwrap(),
        "--json",
    ]));
    assert_eq!(s["accuracy"]["labelled_pixels"], 5348);
    assert!(s["accuracy"]["overall_accuracy"].as_f64().unwrap() > 0.95, "{s}");
}

/// `hsiedge bench classify` on Salinas-A with `model`, two threads, JSON out, plus `extra`.
fn bench(scene: &Path, model: &Path, extra: &[&str]) -> serde_json::Value {
    let mut args = vec![
        "bench",
        "classify",
        scene.to_str().unwrap(),
        "--model",
        model.to_str().unwrap(),
        "--threads",
        "2",
        "--json",
    ];
    args.extend_from_slice(extra);
    serde_json::from_str(&ok(&args)).expect("bench JSON")
}

#[test]
fn bench_classify_reports_the_parts_of_end_to_end_time() {
    let (Some(data), Some(model)) = (data(), model("hybridsn_salinas_a")) else {
        return;
    };
    let scene = data.join("salinas_a/salinas_a.hdr");
    let r = bench(
        &scene,
        &model,
        &["--only", "dense", "--dense-repeat", "3", "--no-python"],
    );
    let d = &r["dense"];
    let secs = |k: &str| d[k].as_f64().unwrap_or_else(|| panic!("dense.{k} missing: {d}"));
    let (e2e, inf, tiling, wait, write) = (
        secs("end_to_end_s"),
        secs("inference_s"),
        secs("tiling_s"),
        secs("wait_s"),
        secs("write_s"),
    );
    assert_eq!(d["batches"], 4, "{d}");
    assert_eq!(r["dense_repeat"], 3, "{r}");
    assert_eq!(d["end_to_end_samples_s"].as_array().map(Vec::len), Some(3), "{d}");
    assert!(inf > 0.0 && tiling > 0.0 && write > 0.0 && wait >= 0.0, "{d}");
    assert!(tiling < e2e && write < e2e && wait < e2e, "{d}");
    // Each repetition's end to end is paired with the pure inference timed right after it.
    assert_paired_ratio(
        &r,
        &r["dense_e2e_over_inference"],
        &d["e2e_over_inference_quartiles"],
        &d["end_to_end_samples_s"],
        &d["inference_samples_s"],
    );
    assert!(r["patch"].is_null() && r["python"].is_null(), "{r}");
}

fn floats(v: &serde_json::Value) -> Vec<f64> {
    v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect()
}

/// `ratio` is the upper median of `a[i] / b[i]`, as the benchmark computes it, and `quartiles`
/// bracket it (within 1e-12: serde_json's default float parsing may be one ulp off the printed value).
fn assert_paired_ratio(
    r: &serde_json::Value,
    ratio: &serde_json::Value,
    quartiles: &serde_json::Value,
    a: &serde_json::Value,
    b: &serde_json::Value,
) {
    let (a, b) = (floats(a), floats(b));
    assert_eq!(a.len(), b.len());
    let mut per_rep: Vec<f64> = a.iter().zip(&b).map(|(a, b)| a / b).collect();
    per_rep.sort_by(f64::total_cmp);
    let (ratio, want) = (ratio.as_f64().unwrap(), per_rep[per_rep.len() / 2]);
    assert!((ratio - want).abs() < 1e-12, "{ratio} vs {want}: {r}");
    let q = floats(quartiles);
    assert!(q.len() == 2 && q[0] <= ratio + 1e-12 && ratio <= q[1] + 1e-12, "{r}");
}

#[test]
fn bench_classify_pairs_each_repetition_with_one_of_the_python_loop() {
    let (Some(data), Some(model)) = (data(), model("spectral1d_salinas_a")) else {
        return;
    };
    let Some(python) = python_with(&["onnxruntime", "numpy"]) else {
        return;
    };
    let scene = data.join("salinas_a/salinas_a.hdr");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/ort_patch_loop.py");
    let r = bench(
        &scene,
        &model,
        &[
            "--only",
            "patch",
            "--repeat",
            "3",
            "--python",
            &python,
            "--script",
            script.to_str().unwrap(),
        ],
    );
    let (p, py) = (&r["patch"], &r["python"]);
    assert_eq!(p["end_to_end_samples_s"].as_array().map(Vec::len), Some(3), "{r}");
    assert_eq!(py["run_loop_samples_s"].as_array().map(Vec::len), Some(3), "{r}");
    assert!(py["onnxruntime"].as_str().is_some_and(|v| !v.is_empty()), "{r}");
    let run = py["run_loop_s"].as_f64().unwrap();
    assert!(run > 0.0 && py["with_gather_s"].as_f64().unwrap() > 0.0, "{r}");
    assert_paired_ratio(
        &r,
        &r["patch_over_python_loop"],
        &r["patch_over_python_loop_quartiles"],
        &p["end_to_end_samples_s"],
        &py["run_loop_samples_s"],
    );
    assert!(r["dense"].is_null(), "{r}");
}
