//! Shared helpers of the black-box tests: running the binary, locating data, writing small cubes.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The repository root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The `hsiedge` binary as a command; `HSIEDGE_TEST_RUNNER` (e.g. `qemu-aarch64 -L /`)
/// prefixes it when the tests run a cross-compiled binary under emulation.
pub fn hsiedge() -> Command {
    let argv = hsiedge_argv();
    let mut c = Command::new(&argv[0]);
    c.args(&argv[1..]);
    c.env("HSIEDGE_CACHE_DIR", no_sweep_cache());
    c
}

/// The words that start `hsiedge`: the emulator's (`HSIEDGE_TEST_RUNNER`), then the binary.
pub fn hsiedge_argv() -> Vec<String> {
    let mut argv: Vec<String> = emulator().unwrap_or_default();
    argv.push(env!("CARGO_BIN_EXE_hsiedge").to_string());
    argv
}

/// The emulator the binary runs under (`HSIEDGE_TEST_RUNNER`, e.g. `qemu-aarch64 -L /`), split
/// into words; `None` when it runs natively.
pub fn emulator() -> Option<Vec<String>> {
    std::env::var("HSIEDGE_TEST_RUNNER")
        .ok()
        .filter(|s| !s.trim().is_empty())
        .map(|s| s.split_whitespace().map(str::to_string).collect())
}

/// A sweep cache folder that does not exist, so a developer's cached sweeps (whose knee would cap
/// `--batch auto`) never reach a test; tests of the cache pass their own.
pub fn no_sweep_cache() -> std::path::PathBuf {
    std::env::temp_dir().join(format!("hsiedge-tests-no-sweep-cache-{}", std::process::id()))
}

/// Runs `hsiedge` with `args`, returning its output.
pub fn run(args: &[&str]) -> Output {
    hsiedge().args(args).output().expect("spawn hsiedge")
}

/// Runs `hsiedge` and asserts success, returning stdout.
pub fn ok(args: &[&str]) -> String {
    let out = run(args);
    assert!(
        out.status.success(),
        "hsiedge {args:?} failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs `hsiedge`, asserts failure without a panic, and returns stderr.
pub fn fails(args: &[&str]) -> String {
    let out = run(args);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "hsiedge {args:?} should fail");
    assert_eq!(
        out.status.code(),
        Some(1),
        "clean error exit expected, got {}: {err}",
        out.status
    );
    assert!(!err.contains("panicked"), "panic: {err}");
    err
}

/// Where skipped tests record why (set by `make test`, which prints the records and their count
/// after `cargo test`: cargo hides what a passing test prints).
pub const SKIP_DIR_VAR: &str = "HSIEDGE_TEST_SKIP_DIR";

/// Marks the calling test as skipped for `reason`: printed on stderr (seen with `--nocapture`)
/// and appended as one line, `<test binary> <test>: <reason>`, to a file under
/// `$HSIEDGE_TEST_SKIP_DIR` when that is set. The caller then returns.
pub fn skip(reason: impl std::fmt::Display) {
    eprintln!("skipped: {reason}");
    let Some(dir) = std::env::var_os(SKIP_DIR_VAR).filter(|d| !d.is_empty()) else {
        return;
    };
    let thread = std::thread::current();
    let line = format!(
        "{} {}: {reason}\n",
        env!("CARGO_CRATE_NAME"),
        thread.name().unwrap_or("?")
    );
    let file = Path::new(&dir).join(format!("{}-{}.txt", env!("CARGO_CRATE_NAME"), std::process::id()));
    // One append per line, so the test threads of one binary never interleave within a line.
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&file)
        .and_then(|mut f| std::io::Write::write_all(&mut f, line.as_bytes()));
    if let Err(e) = written {
        panic!("cannot record the skip in {}: {e}", file.display());
    }
}

/// The Python interpreter the tests use: `$HSIEDGE_TEST_PYTHON` (`make test` sets it to the
/// target/venv it provisions from .ci/requirements.txt), else `python3`.
pub fn python() -> String {
    std::env::var("HSIEDGE_TEST_PYTHON")
        .ok()
        .filter(|p| !p.trim().is_empty())
        .unwrap_or_else(|| "python3".into())
}

/// [`python`] when it imports every one of `modules`; otherwise `None` with the reason recorded
/// by [`skip`]. In CI a missing module is a failure, not a skip.
pub fn python_with(modules: &[&str]) -> Option<String> {
    let py = python();
    let import = format!("import {}", modules.join(", "));
    let why = match Command::new(&py).args(["-c", &import]).output() {
        Ok(o) if o.status.success() => return Some(py),
        Ok(o) => String::from_utf8_lossy(&o.stderr)
            .lines()
            .last()
            .unwrap_or("")
            .trim()
            .to_string(),
        Err(e) => e.to_string(),
    };
    let reason = format!(
        "`{py} -c '{import}'` failed ({why}); `make test` provisions target/venv from .ci/requirements.txt \
         and sets HSIEDGE_TEST_PYTHON to it"
    );
    assert!(
        std::env::var("CI").is_err(),
        "CI must have the Python packages: {reason}"
    );
    skip(reason);
    None
}

/// The shared benchmark data, or `None` (with the reason printed) when it is absent outside CI.
/// In CI the data must be there: its absence fails the test.
pub fn data() -> Option<PathBuf> {
    let dir = std::env::var("HSIEDGE_DATA")
        .map(PathBuf::from)
        .unwrap_or_else(|_| root().join("../shared/data"));
    if dir.join("salinas_a/salinas_a.hdr").is_file() {
        return Some(dir);
    }
    assert!(
        std::env::var("CI").is_err(),
        "CI must have the shared data at {}",
        dir.display()
    );
    skip(format!("no shared data at {}", dir.display()));
    None
}

/// A model manifest under `models/`, or `None` (printed) when the model has not been trained yet.
pub fn model(name: &str) -> Option<PathBuf> {
    let p = root().join("models").join(name).join("manifest.json");
    if p.is_file() {
        return Some(p);
    }
    // The trained models are committed: in CI a missing one is a failure, not a skip.
    assert!(std::env::var("CI").is_err(), "CI must have the model {}", p.display());
    skip(format!("model {name} not present"));
    None
}

/// Writes a little-endian float32 BIL cube whose value at (line, band, sample) is `f(line, band, sample)`.
pub fn write_cube(
    dir: &Path,
    name: &str,
    lines: usize,
    samples: usize,
    bands: usize,
    f: impl Fn(usize, usize, usize) -> f32,
) -> PathBuf {
    let mut bytes = Vec::with_capacity(lines * samples * bands * 4);
    for l in 0..lines {
        for b in 0..bands {
            for s in 0..samples {
                bytes.extend(f(l, b, s).to_le_bytes());
            }
        }
    }
    std::fs::write(dir.join(format!("{name}.img")), bytes).unwrap();
    let hdr = dir.join(format!("{name}.hdr"));
    std::fs::write(
        &hdr,
        format!(
            "ENVI\ndescription = {{test cube}}\nsamples = {samples}\nlines = {lines}\nbands = {bands}\n\
             header offset = 0\nfile type = ENVI Standard\ndata type = 4\ninterleave = bil\nbyte order = 0\n"
        ),
    )
    .unwrap();
    hdr
}

/// Reads a little-endian float32 file.
pub fn read_f32(path: &Path) -> Vec<f32> {
    std::fs::read(path)
        .unwrap()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Parses a `--json` summary.
pub fn summary(stdout: &str) -> serde_json::Value {
    serde_json::from_str(stdout).unwrap_or_else(|e| panic!("summary is not JSON ({e}): {stdout}"))
}
