//! Execution providers through the binary: TensorRT (absent from every machine here) fails with the
//! libraries it needs or falls back loudly when the preference allows; on a machine whose ONNX
//! Runtime has a working CUDA provider, Salinas-A classified on CUDA agrees with the CPU. Where the
//! CUDA provider does not register the CUDA tests skip with ONNX Runtime's reason.

mod common;

use std::path::{Path, PathBuf};

use common::*;

fn salinas() -> Option<(PathBuf, PathBuf)> {
    let data = data()?;
    let model = model("hybridsn_salinas_a")?;
    Some((data.join("salinas_a/salinas_a.hdr"), model))
}

fn classify_args<'a>(scene: &'a Path, model: &'a Path, out: &'a Path, mode: &'a str, ep: &'a str) -> Vec<&'a str> {
    vec![
        "classify",
        scene.to_str().unwrap(),
        "--model",
        model.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--mode",
        mode,
        "--batch",
        "64",
        "--threads",
        "2",
        "--ep",
        ep,
        "--json",
    ]
}

#[test]
fn tensorrt_alone_is_an_error_naming_the_libraries_it_needs() {
    let Some((scene, model)) = salinas() else { return };
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let err = fails(&classify_args(&scene, &model, &out, "patch", "tensorrt"));
    assert!(
        err.contains("execution provider tensorrt could not be registered"),
        "{err}"
    );
    assert!(
        err.contains("libnvinfer.so.10") && err.contains("libnvonnxparser.so.10"),
        "{err}"
    );
    assert!(
        err.contains("--ep tensorrt,cpu"),
        "the documented fallback is named: {err}"
    );
    assert!(!out.join("current").exists(), "no output set after a failed start");
}

#[test]
fn a_listed_fallback_is_printed_and_recorded_in_the_summary() {
    let Some((scene, model)) = salinas() else { return };
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let telemetry = dir.path().join("telemetry.jsonl");
    let mut args = classify_args(&scene, &model, &out, "dense", "tensorrt,cpu");
    args.extend(["--telemetry", telemetry.to_str().unwrap()]);
    let o = run(&args);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    assert!(
        stderr.contains("execution provider tensorrt did not register") && stderr.contains("falling back to cpu"),
        "{stderr}"
    );
    let s = summary(&String::from_utf8_lossy(&o.stdout));
    assert_eq!(s["provider"], "CPUExecutionProvider");
    let fb = s["provider_fallbacks"].as_array().unwrap();
    assert_eq!(fb.len(), 1, "{s}");
    assert_eq!(
        (fb[0]["from"].as_str(), fb[0]["to"].as_str()),
        (Some("tensorrt"), Some("cpu"))
    );
    let written: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    assert_eq!(written["provider_fallbacks"], s["provider_fallbacks"]);
    // Every telemetry snapshot names the provider and the fallback.
    let lines = std::fs::read_to_string(&telemetry).unwrap();
    assert!(!lines.trim().is_empty());
    for line in lines.lines() {
        let snap: serde_json::Value = serde_json::from_str(line).unwrap();
        assert_eq!(snap["provider"], "CPUExecutionProvider", "{snap}");
        let fb = snap["provider_fallbacks"].as_array().unwrap();
        assert!(
            fb.len() == 1 && fb[0].as_str().unwrap().contains("tensorrt did not register"),
            "{snap}"
        );
    }
}

#[test]
fn doctor_checks_the_registration_the_engine_makes() {
    let o = run(&["doctor", "--provider", "tensorrt", "--json"]);
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let ort = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "onnxruntime")
        .unwrap();
    if ort["status"] == "fail" && !ort.to_string().contains("register") {
        skip(format!("ONNX Runtime not loadable here: {ort}"));
        return;
    }
    assert_eq!(o.status.code(), Some(1), "TensorRT is nowhere here: {report}");
    assert!(
        ort.to_string().contains("TensorrtExecutionProvider does not register"),
        "{ort}"
    );
}

/// `Some(reason)` when the CUDA provider does not register with the ONNX Runtime found.
fn cuda_missing() -> Option<String> {
    let o = run(&["doctor", "--provider", "cuda", "--json"]);
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).ok()?;
    let ort = report["checks"]
        .as_array()?
        .iter()
        .find(|c| c["name"] == "onnxruntime")?
        .clone();
    let text = ort.to_string();
    (!text.contains("CUDAExecutionProvider registers")).then_some(text)
}

#[test]
fn cuda_classify_gives_the_cpu_labels_fp32_and_reports_fp16() {
    let Some((scene, model)) = salinas() else { return };
    if let Some(why) = cuda_missing() {
        skip(format!("the CUDA provider does not register here: {why}"));
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    for mode in ["patch", "dense"] {
        let cpu_out = dir.path().join(format!("cpu-{mode}"));
        let s = summary(&ok(&classify_args(&scene, &model, &cpu_out, mode, "cpu")));
        assert_eq!(s["provider"], "CPUExecutionProvider");
        let cpu = std::fs::read(cpu_out.join("class_map.img")).unwrap();
        for (precision, io, graph) in [
            ("fp32", "host", false),
            ("fp32", "device", false),
            ("fp32", "device", true),
            ("fp16", "host", false),
            ("fp16", "device", false),
        ] {
            let out = dir.path().join(format!("cuda-{mode}-{precision}-{io}-{graph}"));
            let mut args = classify_args(&scene, &model, &out, mode, "cuda");
            args.extend(["--precision", precision, "--io", io]);
            if graph {
                args.push("--cuda-graph");
            }
            let s = summary(&ok(&args));
            assert_eq!(s["provider"], "CUDAExecutionProvider");
            assert_eq!(s["io"], io, "{s}");
            if io == "device" {
                // Only labels and confidence come back: 8 bytes a pixel (a dense edge tile's
                // padding a little more).
                let d2h = s["device_io"]["d2h_bytes_per_pixel"].as_f64().unwrap();
                assert!((8.0..9.0).contains(&d2h), "{s}");
                assert!(s["device_peak_bytes"].as_u64().unwrap() > 0, "{s}");
            }
            assert!(s["provider_fallbacks"].as_array().unwrap().is_empty());
            let got = std::fs::read(out.join("class_map.img")).unwrap();
            assert_eq!(got.len(), cpu.len());
            let same = got.iter().zip(&cpu).filter(|(a, b)| a == b).count();
            let agreement = same as f64 / cpu.len() as f64;
            eprintln!(
                "GPU-RESULT agreement mode={mode} precision={precision} io={io} cuda_graph={graph} {agreement:.6} ({same} of {})",
                cpu.len()
            );
            if precision == "fp32" {
                assert!(
                    agreement >= 0.999,
                    "{mode} fp32 cuda_graph={graph} agreement {agreement}"
                );
            }
        }
    }
}

#[test]
fn the_device_path_on_a_cpu_session_is_an_error_naming_the_flag() {
    let Some((scene, model)) = salinas() else { return };
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let mut args = classify_args(&scene, &model, &out, "dense", "cpu");
    args.extend(["--io", "device"]);
    let err = fails(&args);
    assert!(
        err.contains("--io device") && err.contains("needs the cuda provider") && err.contains("--io host"),
        "{err}"
    );
    assert!(!out.join("current").exists(), "no output set after a failed start");
    // `--io auto` on the CPU provider is the host path, silently: nothing fell back.
    let s = summary(&ok(&classify_args(
        &scene,
        &model,
        &dir.path().join("auto"),
        "dense",
        "cpu",
    )));
    assert_eq!(s["io"], "host");
    assert!(s["io_fallback"].is_null() && s["device_io"].is_null(), "{s}");
}
