//! End to end across architectures: `hsiedge classify` on Salinas-A with the binary under test (the aarch64
//! one under qemu when `cross/run test` runs the suite) and with the x86_64 host binary, comparing the maps.
//!
//! `cross/run test` sets `HSIEDGE_E2E_HOST_BIN` (the x86_64 `hsiedge`) and `HSIEDGE_E2E_HOST_ORT` (its
//! libonnxruntime); without them the test has nothing to compare against and says so. The binary under test
//! is prefixed by `HSIEDGE_TEST_RUNNER` (`qemu-aarch64 -L /`): a process emulated by
//! qemu-user cannot `exec` another aarch64 binary itself (binfmt_misc is not mounted here), while the x86_64
//! host binary it spawns runs natively.
//!
//! Class maps must be equal byte for byte; confidences (float32 softmax maxima) may differ by the rounding of
//! the two CPUs' kernels (MLAS NEON vs AVX), bounded by [`CONFIDENCE_TOLERANCE`].

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

/// Largest allowed |confidence_aarch64 - confidence_x86_64|.
const CONFIDENCE_TOLERANCE: f32 = 1e-4;

fn classify(mut cmd: Command, scene: &Path, model: &Path, out: &Path) -> serde_json::Value {
    let o = cmd
        .arg("classify")
        .arg(scene)
        .arg("--model")
        .arg(model)
        .arg("--out")
        .arg(out)
        .args(["--json", "--threads", "1"])
        .output()
        .expect("spawn hsiedge");
    assert!(
        o.status.success(),
        "classify failed ({:?}):\n{}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).expect("classify --json prints JSON")
}

fn f32s(path: &Path) -> Vec<f32> {
    let b = std::fs::read(path).expect("read map");
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

#[test]
fn salinas_a_class_map_matches_host() {
    let (Some(host_bin), Some(host_ort)) = (
        std::env::var_os("HSIEDGE_E2E_HOST_BIN").map(PathBuf::from),
        std::env::var_os("HSIEDGE_E2E_HOST_ORT").map(PathBuf::from),
    ) else {
        common::skip("HSIEDGE_E2E_HOST_BIN / HSIEDGE_E2E_HOST_ORT not set (cross/run test sets them)");
        return;
    };
    let data = std::env::var_os("HSIEDGE_DATA").map_or_else(|| common::root().join("../shared/data"), PathBuf::from);
    let scene = data.join("salinas_a/salinas_a.hdr");
    if !scene.is_file() {
        assert!(std::env::var("CI").is_err(), "CI must have {}", scene.display());
        common::skip(format!("{} not present", scene.display()));
        return;
    }
    let mut models: Vec<PathBuf> = std::fs::read_dir(common::root().join("models"))
        .expect("models/")
        .filter_map(|e| e.ok().map(|e| e.path().join("manifest.json")))
        .filter(|m| m.is_file() && m.parent().and_then(|p| p.file_name()).is_some_and(|n| n != "fixtures"))
        .filter(|m| {
            std::fs::read_to_string(m)
                .ok()
                .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
                .is_some_and(|j| j["task"] == "classification" && j["input"]["bands"] == 204)
        })
        .collect();
    models.sort();
    assert!(!models.is_empty(), "no Salinas-A classification model under models/");
    let tmp = tempfile::tempdir().expect("tempdir");
    for model in &models {
        let name = model
            .parent()
            .and_then(|p| p.file_name())
            .and_then(|n| n.to_str())
            .unwrap_or("model");
        let ours = tmp.path().join(format!("{name}-test"));
        let host = tmp.path().join(format!("{name}-host"));
        let a = classify(common::hsiedge(), &scene, model, &ours);
        let mut hc = Command::new(&host_bin);
        hc.env("ORT_DYLIB_PATH", &host_ort);
        let b = classify(hc, &scene, model, &host);
        assert_eq!(a["pixels"], b["pixels"], "{name}");
        let (ma, mb) = (
            std::fs::read(ours.join("class_map.img")).expect("class map"),
            std::fs::read(host.join("class_map.img")).expect("host class map"),
        );
        let differing = ma.iter().zip(&mb).filter(|(x, y)| x != y).count();
        assert_eq!(ma.len(), mb.len(), "{name}: class map sizes");
        assert_eq!(
            differing,
            0,
            "{name}: {differing} of {} class-map pixels differ",
            ma.len()
        );
        let (ca, cb) = (f32s(&ours.join("confidence.img")), f32s(&host.join("confidence.img")));
        assert_eq!(ca.len(), cb.len());
        let worst = ca.iter().zip(&cb).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
        assert!(
            worst <= CONFIDENCE_TOLERANCE,
            "{name}: confidence differs by up to {worst}"
        );
        eprintln!(
            "{name}: class map identical ({} px), max |confidence diff| {worst:e}; first batch {} s here, {} s on host",
            ma.len(),
            a["first_batch_s"],
            b["first_batch_s"]
        );
    }
}
