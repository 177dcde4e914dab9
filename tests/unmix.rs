//! End-to-end unmixing on the real Jasper Ridge and Samson scenes: `hsiedge classify` writes abundance
//! maps whose RMSE against the reference abundances reproduces each model's `metrics.json`.

mod common;

use common::*;

fn check(model_name: &str, scene: &str, reference: &str) {
    let Some(data) = data() else { return };
    let Some(model) = model(model_name) else { return };
    let metrics: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(model.with_file_name("metrics.json")).unwrap()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("o");
    let s = summary(&ok(&[
        "classify",
        data.join(scene).to_str().unwrap(),
        "--model",
        model.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--threads",
        "2",
        "--json",
    ]));
    assert_eq!(s["task"], "abundance");
    assert!(s["class_map"].is_null(), "no class map for an unmixing model");
    let got = read_f32(&out.join("abundance.img"));
    let want = read_f32(&data.join(reference));
    assert_eq!(got.len(), want.len(), "{model_name}: abundance bands x pixels");
    let h = hsiedge::cube::Header::read(&data.join(reference).with_extension("hdr")).unwrap();
    let (lines, samples, bands) = (h.lines, h.samples, h.bands);
    let n = lines * samples;
    for p in 0..n {
        let sum: f32 = (0..bands).map(|k| got[k * n + p]).sum();
        assert!(
            (sum - 1.0).abs() < 1e-4 && (0..bands).all(|k| got[k * n + p] >= 0.0),
            "{model_name}: pixel {p}"
        );
    }
    // RMSE over (pixel, endmember) pairs, on all pixels and on the spatially disjoint test rows.
    let rmse = |rows: std::ops::Range<usize>| {
        let mut se = 0f64;
        let mut count = 0usize;
        for k in 0..bands {
            for row in rows.clone() {
                for col in 0..samples {
                    let i = k * n + row * samples + col;
                    se += f64::from(got[i] - want[i]).powi(2);
                    count += 1;
                }
            }
        }
        (se / count as f64).sqrt()
    };
    let all = rmse(0..lines);
    let want_all = metrics["ort_full_scene"]["rmse_all_pixels"].as_f64().unwrap();
    assert!(
        (all - want_all).abs() <= 1e-3,
        "{model_name}: RMSE over all pixels {all} vs Python {want_all}"
    );
    let split = &metrics["splits"]["spatial_disjoint"];
    assert_eq!(split["split"]["axis"], "row");
    let test_min = split["split"]["test_min"].as_u64().unwrap() as usize;
    let test = rmse(test_min..lines);
    let want_test = split["metrics"]["rmse"].as_f64().unwrap();
    assert!(
        (test - want_test).abs() <= 1e-3,
        "{model_name}: held-out RMSE {test} vs Python {want_test}"
    );
    assert!(
        test <= 0.10,
        "{model_name}: held-out RMSE {test} above the 0.10 acceptance"
    );
    eprintln!("{model_name}: RMSE all {all:.4} (python {want_all:.4}), held-out {test:.4} (python {want_test:.4})");
}

#[test]
fn jasper_ridge_abundances_reproduce_the_python_evaluation() {
    check(
        "unmix_jasper_ridge",
        "jasper_ridge/jasper_ridge.hdr",
        "jasper_ridge/jasper_ridge_abundance.img",
    );
}

#[test]
fn samson_abundances_reproduce_the_python_evaluation() {
    check("unmix_samson", "samson/samson.hdr", "samson/samson_abundance.img");
}
