use super::*;

#[test]
fn versions_from_names() {
    assert_eq!(
        soname_version("libonnxruntime.so.1.20.1", ORT_STEM).as_deref(),
        Some("1.20.1")
    );
    assert_eq!(soname_version("libonnxruntime.so", ORT_STEM), None);
    assert_eq!(soname_version("libonnxruntime.so.1.x", ORT_STEM), None);
    assert_eq!(
        soname_version("libcudart.so.12.2.140", "libcudart.so").as_deref(),
        Some("12.2.140")
    );
    assert_eq!(
        version_from_build_info("ORT Build Info: git-branch=rel-1.20.1, git-commit-id=5c1b7cc").as_deref(),
        Some("1.20.1")
    );
    assert_eq!(version_from_build_info("no branch"), None);
}

#[test]
fn version_floor() {
    assert_eq!(major_minor("1.20.1"), Some((1, 20)));
    assert!(major_minor("1.16.3").is_some_and(|v| v < MIN_ORT_VERSION));
    assert!(major_minor("1.18.0").is_some_and(|v| v >= MIN_ORT_VERSION));
    assert_eq!(major_minor("x"), None);
}

#[test]
fn jetpack_mapping() {
    assert_eq!(jetpack_for_l4t("R36.3.0"), Some("6.0"));
    assert_eq!(jetpack_for_l4t("R36.4.3"), Some("6.2"));
    assert_eq!(jetpack_for_l4t("R36.4.0"), Some("6.1"));
    assert_eq!(jetpack_for_l4t("R35.4.1"), Some("5.1.2"));
    assert_eq!(jetpack_for_l4t("R35.40.1"), None);
    assert_eq!(jetpack_for_l4t("R99"), None);
}

#[test]
fn requirement_parses() {
    assert_eq!("TensorRT".parse::<Requirement>().ok(), Some(Requirement::Tensorrt));
    assert!("npu".parse::<Requirement>().is_err());
}

#[test]
fn empty_root_is_not_ready() {
    let dir = tempfile::tempdir().map_err(|e| e.to_string());
    let Ok(dir) = dir else { return };
    let report = run(&DoctorOptions::for_root(dir.path()));
    assert!(!report.ready());
    assert_eq!(report.check("onnxruntime").map(|c| c.status), Some(Status::Fail));
    assert_eq!(report.check("memory").map(|c| c.status), Some(Status::Fail));
    assert_eq!(report.check("jetson").map(|c| c.status), Some(Status::Info));
    assert_eq!(report.exit_code(), 1);
}
