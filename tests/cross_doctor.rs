//! `hsiedge doctor` on fake system trees (`tests/fixtures/doctor/`), through the library API and the binary.

mod common;

use std::path::{Path, PathBuf};

use hsiedge::doctor::{DoctorOptions, Report, Requirement, Status, run};
use hsiedge::engine::LibSource;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/doctor")
        .join(name)
}

fn doctor(name: &str, requirement: Requirement) -> Report {
    run(&DoctorOptions {
        requirement,
        ..DoctorOptions::for_root(fixture(name))
    })
}

fn status(r: &Report, check: &str) -> Status {
    r.check(check)
        .map(|c| c.status)
        .unwrap_or_else(|| panic!("no check {check} in\n{r}"))
}

#[test]
fn orin_nano_jetpack6_is_ready_for_tensorrt() {
    let r = doctor("orin_nano_jp6", Requirement::Tensorrt);
    assert!(r.ready(), "{r}");
    assert_eq!(r.exit_code(), 0);
    let ort = r.ort.as_ref().expect("ort found");
    assert_eq!(ort.source, LibSource::Python);
    assert_eq!(
        ort.path,
        Path::new("/usr/local/lib/python3.10/dist-packages/onnxruntime/capi/libonnxruntime.so.1.18.0")
    );
    assert_eq!(ort.version.as_deref(), Some("1.18.0"));
    assert!(
        ort.providers.iter().any(|p| p == "TensorrtExecutionProvider"),
        "{:?}",
        ort.providers
    );
    assert!(ort.providers.iter().any(|p| p == "CUDAExecutionProvider"));
    let lib = |n: &str| r.native_libs.iter().find(|l| l.name == n).expect(n);
    assert_eq!(lib("libcudart").version.as_deref(), Some("12.2.140"));
    assert_eq!(
        lib("libcudart").path.as_deref(),
        Some(Path::new(
            "/usr/local/cuda-12.2/targets/aarch64-linux/lib/libcudart.so.12.2.140"
        ))
    );
    assert_eq!(lib("libnvinfer").version.as_deref(), Some("8.6.2"));
    assert_eq!(lib("libcudnn").version.as_deref(), Some("8.9.4"));
    let j = r.jetson.as_ref().expect("jetson");
    assert_eq!(j.model.as_deref(), Some("NVIDIA Jetson Orin Nano Developer Kit"));
    assert_eq!(j.l4t_release.as_deref(), Some("R36.3.0"));
    assert_eq!(
        r.jetpack.as_deref(),
        Some("6.0+b106"),
        "dpkg's nvidia-jetpack wins over the L4T mapping"
    );
    let labels: Vec<&str> = r.rails.iter().map(|x| x.label.as_str()).collect();
    assert_eq!(labels, ["VDD_IN", "VDD_CPU_GPU_CV", "VDD_SOC"]);
    assert_eq!(r.rails[0].millivolts, Some(5080));
    assert_eq!(r.rails[0].milliamps, Some(1304));
    assert_eq!(status(&r, "power"), Status::Ok);
    assert_eq!(r.nvpmodel.modes.len(), 3);
    assert_eq!(r.nvpmodel.current, Some(0));
    assert_eq!(status(&r, "nvpmodel"), Status::Ok);
    let mem = r.memory.as_ref().expect("memory");
    assert_eq!(mem.total_bytes, 7_620_876 * 1024);
    assert_eq!(mem.nvmap_used_bytes, Some(190_340 * 1024));
    let text = r.to_string();
    assert!(text.contains("JetPack 6.0+b106"), "{text}");
    assert!(text.ends_with("ready: the tensorrt deployment can run here"), "{text}");
    let json: serde_json::Value = serde_json::from_str(&r.to_json().expect("json")).expect("parse");
    assert_eq!(json["ort"]["version"], "1.18.0");
    assert_eq!(json["requirement"], "tensorrt");
}

#[test]
fn xavier_jetpack5_cpu_only() {
    let cpu = doctor("xavier_nx_jp5", Requirement::Cpu);
    assert!(cpu.ready(), "{cpu}");
    let ort = cpu.ort.as_ref().expect("ort");
    assert_eq!(ort.source, LibSource::System);
    assert_eq!(ort.path, Path::new("/usr/lib/hsiedge/libonnxruntime.so.1.18.0"));
    assert_eq!(ort.providers, ["CPUExecutionProvider"]);
    assert_eq!(cpu.jetpack.as_deref(), Some("5.1.2"), "mapped from L4T R35.4.1");
    assert_eq!(status(&cpu, "power"), Status::Warn, "one rail has no readings\n{cpu}");
    assert_eq!(status(&cpu, "nvpmodel"), Status::Warn, "conf without binary\n{cpu}");
    assert_eq!(status(&cpu, "cuda"), Status::Ok);

    let cuda = doctor("xavier_nx_jp5", Requirement::Cuda);
    assert!(!cuda.ready());
    let c = cuda.check("cuda").expect("cuda check");
    assert_eq!(c.status, Status::Fail);
    assert!(c.summary.contains("CUDAExecutionProvider"), "{}", c.summary);

    let trt = doctor("xavier_nx_jp5", Requirement::Tensorrt);
    let c = trt.check("cuda").expect("cuda check");
    assert!(c.summary.contains("libnvinfer"), "{}", c.summary);
    assert_eq!(trt.exit_code(), 1);
}

#[test]
fn host_without_ort_is_not_ready() {
    let r = doctor("x86_host_no_ort", Requirement::Cpu);
    assert!(!r.ready());
    let c = r.check("onnxruntime").expect("check");
    assert_eq!(c.status, Status::Fail);
    assert!(c.details.iter().any(|d| d.contains("/usr/lib/hsiedge")), "{c:?}");
    assert!(
        c.details.iter().any(|d| d.contains("without libonnxruntime.so")),
        "{c:?}"
    );
    assert_eq!(status(&r, "jetson"), Status::Info);
    assert_eq!(status(&r, "power"), Status::Info);
    assert_eq!(status(&r, "nvpmodel"), Status::Info);
    assert_eq!(
        r.memory.as_ref().and_then(|m| m.cgroup_limit_bytes),
        Some(256 << 20),
        "{r}"
    );
    assert!(r.to_string().ends_with("NOT ready: failed onnxruntime"), "{r}");
}

#[test]
fn named_library_that_is_missing_fails_without_fallback() {
    let r = run(&DoctorOptions {
        ort_env: Some(PathBuf::from("/opt/nowhere/libonnxruntime.so")),
        ..DoctorOptions::for_root(fixture("xavier_nx_jp5"))
    });
    let c = r.check("onnxruntime").expect("check");
    assert_eq!(c.status, Status::Fail);
    assert!(c.summary.contains("ORT_DYLIB_PATH"), "{}", c.summary);
    let r = run(&DoctorOptions {
        ort_lib: Some(PathBuf::from("/usr/lib/hsiedge/libonnxruntime.so.1.18.0")),
        ort_env: Some(PathBuf::from("/opt/nowhere/libonnxruntime.so")),
        ..DoctorOptions::for_root(fixture("xavier_nx_jp5"))
    });
    assert_eq!(
        r.ort.as_ref().map(|o| o.source),
        Some(LibSource::Flag),
        "--ort-lib wins over the env"
    );
}

#[test]
fn onnxruntime_older_than_1_18_fails() {
    let r = run(&DoctorOptions {
        ort_lib: Some(PathBuf::from("/opt/ort-1.16.3/lib/libonnxruntime.so.1.16.3")),
        ..DoctorOptions::for_root(fixture("xavier_nx_jp5"))
    });
    let c = r.check("onnxruntime").expect("check");
    assert_eq!(c.status, Status::Fail, "{r}");
    assert!(c.details.iter().any(|d| d.contains(">= 1.18")), "{c:?}");
}

/// The binary's `doctor` subcommand (`hsiedge doctor --root DIR`): exit status and JSON per root.
#[test]
fn binary_doctor_subcommand() {
    for (root, provider, code) in [
        ("orin_nano_jp6", "tensorrt", 0),
        ("xavier_nx_jp5", "cpu", 0),
        ("xavier_nx_jp5", "cuda", 1),
        ("x86_host_no_ort", "cpu", 1),
    ] {
        let mut cmd = common::hsiedge();
        let out = cmd
            .args(["doctor", "--json", "--provider", provider, "--root"])
            .arg(fixture(root))
            .output()
            .expect("spawn hsiedge doctor");
        assert_eq!(
            out.status.code(),
            Some(code),
            "{root} {provider}: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("doctor --json");
        assert_eq!(json["requirement"], provider);
    }
}
