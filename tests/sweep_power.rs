//! `hsiedge bench sweep --power-modes` on recorded Orin trees with a stand-in `nvpmodel`, and the
//! sweep's `--fp16` and `--plot`, through the binary.
//!
//! The stand-in is a shell script written per test: it logs every call, answers `-q` from the
//! tree's `var/lib/nvpmodel/status`, and on `-m N` writes that status and sets the current of the
//! module's first rail to 1000 + 500 N mA, so each mode draws a known, different power. No test
//! bounds a timing; energy is checked as power (from the rails) times the window's length.

mod common;

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

use common::*;

/// A copy of `tests/fixtures/telemetry/<board>` and a stand-in nvpmodel that fails on `fail_on`.
struct Board {
    dir: tempfile::TempDir,
    nvpmodel: PathBuf,
}

impl Board {
    fn new(board: &str, fail_on: Option<u32>) -> Self {
        let dir = tempfile::tempdir().unwrap();
        copy_tree(&root().join("tests/fixtures/telemetry").join(board), dir.path());
        let rail = "sys/bus/i2c/devices/1-0040/hwmon/hwmon1/curr1_input";
        assert_eq!(dir.path().join(rail).is_file(), board != "x86_host", "{board}");
        let nvpmodel = dir.path().join("nvpmodel");
        let script = format!(
            r#"#!/bin/sh
ROOT='{root}'
echo "$*" >> "$ROOT/nvpmodel.log"
case "$1" in
  -q)
    id=$(sed -n 's/.*pmode:0*\([0-9][0-9]*\).*/\1/p' "$ROOT/var/lib/nvpmodel/status")
    echo "NV Fan Mode:quiet"
    echo "NV Power Mode: (name not parsed)"
    echo "$id"
    ;;
  -m)
    if [ "$2" = "{fail}" ]; then echo "NVPM ERROR: cannot set mode $2" >&2; exit 1; fi
    printf 'pmode:%04d fmode:quiet\n' "$2" > "$ROOT/var/lib/nvpmodel/status"
    echo $((1000 + 500 * $2)) > "$ROOT/{rail}"
    ;;
  *) exit 2 ;;
esac
"#,
            root = dir.path().display(),
            fail = fail_on.map_or("none".to_string(), |f| f.to_string()),
        );
        std::fs::write(&nvpmodel, script).unwrap();
        std::process::Command::new("chmod")
            .arg("755")
            .arg(&nvpmodel)
            .status()
            .unwrap();
        Self { dir, nvpmodel }
    }

    fn root(&self) -> &Path {
        self.dir.path()
    }

    /// The stand-in's calls, one per line.
    fn log(&self) -> Vec<String> {
        std::fs::read_to_string(self.root().join("nvpmodel.log"))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    fn status(&self) -> String {
        std::fs::read_to_string(self.root().join("var/lib/nvpmodel/status")).unwrap()
    }

    fn args(&self, modes: &str, settle: &str) -> Vec<String> {
        let tiny = root().join("models/fixtures/tiny/manifest.json");
        [
            "bench",
            "sweep",
            "--model",
            tiny.to_str().unwrap(),
            "--mode",
            "patch",
            "--batches",
            "1,2,4",
            "--repeat",
            "3",
            "--threads",
            "1",
            "--no-cache",
            "--power-modes",
            modes,
            "--platform-root",
            self.root().to_str().unwrap(),
            "--nvpmodel",
            self.nvpmodel.to_str().unwrap(),
            "--settle-s",
            settle,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    }

    fn run(&self, modes: &str, extra: &[&str]) -> Output {
        let mut a = self.args(modes, "0");
        a.extend(extra.iter().map(|s| s.to_string()));
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        run(&a)
    }
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dst = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_tree(&e.path(), &dst);
        } else {
            std::fs::copy(e.path(), &dst).unwrap();
        }
    }
}

/// Checks one mode's sweep: energy is the rail power over each timed window, per pixel and per
/// joule consistent, and the best-energy batch the one with the fewest joules per pixel.
fn check_mode(m: &serde_json::Value, watts: f64) {
    let stats = m["sweep"]["stats"].as_array().unwrap();
    assert_eq!(stats.len(), 3, "{m}");
    let mut best = (0, f64::INFINITY);
    for s in stats {
        let e = &s["energy"];
        let (j, secs, px) = (
            e["joules"].as_f64().unwrap(),
            e["seconds"].as_f64().unwrap(),
            e["pixels"].as_u64().unwrap(),
        );
        assert!(secs > 0.0 && e["samples"].as_u64().unwrap() >= 2, "{e}");
        // The rails hold still during a mode: power is exactly the recorded one.
        assert!(
            (e["mean_watts"].as_f64().unwrap() - watts).abs() < 1e-6 * watts,
            "{e} vs {watts} W"
        );
        assert!((j - watts * secs).abs() < 1e-6 * j.max(1e-9), "{e}");
        // Patch mode: one pixel per sample, every timed run counted.
        assert_eq!(px, s["batch"].as_u64().unwrap() * 3);
        let jpp = e["joules_per_pixel"].as_f64().unwrap();
        assert!((jpp - j / px as f64).abs() < 1e-12 * jpp.max(1e-30) + 1e-18);
        assert!((e["pixels_per_joule"].as_f64().unwrap() * jpp - 1.0).abs() < 1e-9);
        if jpp < best.1 {
            best = (s["batch"].as_u64().unwrap(), jpp);
        }
    }
    assert_eq!(m["best_energy"]["batch"].as_u64(), Some(best.0), "{m}");
}

#[test]
fn orin_nano_every_mode_swept_with_energy_and_the_original_mode_restored() {
    let board = Board::new("orin_nano", None);
    let o = board.run("all", &["--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let modes = r["modes"].as_array().unwrap();
    let ids: Vec<u64> = modes.iter().map(|m| m["mode"]["id"].as_u64().unwrap()).collect();
    assert_eq!(ids, [0, 1, 2]);
    let names: Vec<&str> = modes.iter().map(|m| m["mode"]["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["15W", "7W", "MAXN_SUPER"]);
    for (m, id) in modes.iter().zip(ids) {
        // VDD_IN: 5056 mV at the current the stand-in set for this mode.
        check_mode(m, (5056 * (1000 + 500 * id) / 1000) as f64 / 1e3);
        assert_eq!(
            m["sweep"]["key"]["power_mode"].as_str(),
            Some(format!("pmode:{id:04} fmode:quiet").as_str()),
            "each mode's sweep is keyed by its mode"
        );
    }
    assert_eq!(r["original"]["id"], 0);
    assert_eq!(r["restored"], true);
    assert_eq!(board.log(), ["-q", "-m 0", "-m 1", "-m 2", "-m 0"]);
    assert!(board.status().starts_with("pmode:0000"));
    assert!(String::from_utf8_lossy(&o.stderr).contains("power mode restored to 0 (15W)"));
}

#[test]
fn agx_orin_energy_is_the_sum_of_its_rails_and_mode_3_is_restored() {
    let board = Board::new("agx_orin", None);
    let o = board.run("1,2", &["--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let modes = r["modes"].as_array().unwrap();
    for (m, id) in modes.iter().zip([1u64, 2]) {
        assert_eq!(m["mode"]["id"].as_u64(), Some(id));
        // No VDD_IN on AGX Orin: VDD_GPU_SOC (changed per mode) + VDD_CPU_CV + VIN_SYS_5V0 +
        // VDDQ_VDD2_1V8AO, each mV x mA / 1000 rounded down; the NC channel is not a supply.
        let mw = 4984 * (1000 + 500 * id) / 1000 + 4984 * 799 / 1000 + 4992 * 903 / 1000 + 4992 * 152 / 1000;
        check_mode(m, mw as f64 / 1e3);
    }
    let (a, b) = (
        modes[0]["best_energy"]["joules_per_pixel"].as_f64().unwrap(),
        modes[1]["best_energy"]["joules_per_pixel"].as_f64().unwrap(),
    );
    assert!(a > 0.0 && b > 0.0 && a != b, "each mode has its own energy figure");
    assert_eq!(r["original"]["name"], "50W");
    assert_eq!(board.log(), ["-q", "-m 1", "-m 2", "-m 3"]);
    assert!(board.status().starts_with("pmode:0003"));
}

#[test]
fn a_failed_switch_is_an_error_and_the_original_mode_is_restored() {
    let board = Board::new("orin_nano", Some(2));
    let o = board.run("1,2", &[]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("-m 2` failed") && err.contains("NVPM ERROR: cannot set mode 2"),
        "{err}"
    );
    assert_eq!(board.log(), ["-q", "-m 1", "-m 2", "-m 0"]);
    assert!(board.status().starts_with("pmode:0000"));
    assert!(err.contains("power mode restored to 0 (15W)"), "{err}");
}

#[test]
fn ctrl_c_during_a_sweep_restores_the_original_mode() {
    let board = Board::new("orin_nano", None);
    // A long settle: the signal comes while the board is in mode 1.
    let args = board.args("1,2", "60");
    let start = Instant::now();
    let child = hsiedge()
        .args(&args)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    while !board.log().iter().any(|l| l == "-m 1") {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "never switched: {:?}",
            board.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let killed = std::process::Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(130), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        start.elapsed() < Duration::from_secs(50),
        "the settle was not cut short"
    );
    assert_eq!(board.log(), ["-q", "-m 1", "-m 0"]);
    assert!(board.status().starts_with("pmode:0000"));
    assert!(String::from_utf8_lossy(&o.stderr).contains("interrupted; restoring the power mode"));
}

#[test]
fn a_dry_run_prints_the_plan_and_switches_nothing() {
    let board = Board::new("agx_orin", None);
    let o = board.run("all", &["--dry-run", "--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let ids: Vec<u64> = r["modes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_u64().unwrap())
        .collect();
    assert_eq!(ids, [0, 1, 2, 3]);
    assert_eq!(r["batches"], serde_json::json!([1, 2, 4]));
    let cmds = r["commands"].as_array().unwrap();
    assert_eq!(cmds.len(), 5);
    assert!(cmds[4].as_str().unwrap().contains("-m 3  # restore 50W"), "{r}");
    assert_eq!(board.log(), ["-q"], "a dry run only asks");
    let text = board.run("0", &["--dry-run"]);
    let out = String::from_utf8_lossy(&text.stdout);
    assert!(
        out.contains("dry run: the mode now is 3 (50W)") && out.contains("-m 0  # MAXN"),
        "{out}"
    );
}

#[test]
fn an_unknown_mode_is_refused_before_any_switch() {
    let board = Board::new("orin_nano", None);
    let err = String::from_utf8_lossy(&board.run("0,7", &[]).stderr).to_string();
    assert!(
        err.contains("--power-modes 0,7: no mode 7") && err.contains("0=15W, 1=7W, 2=MAXN_SUPER"),
        "{err}"
    );
    assert!(board.log().is_empty(), "{:?}", board.log());
    let x86 = Board::new("x86_host", None);
    let err = String::from_utf8_lossy(&x86.run("all", &[]).stderr).to_string();
    assert!(err.contains("etc/nvpmodel.conf: no power modes"), "{err}");
}

#[test]
fn plots_are_svg_with_the_curves_and_marks() {
    let board = Board::new("orin_nano", None);
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("power.svg");
    let o = board.run("0,1", &["--plot", svg.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.starts_with("<svg"), "{}", &text[..100.min(text.len())]);
    for want in ["energy per output pixel", "mode 0 (15W)", "1 (7W)", "batch 4"] {
        assert!(text.contains(want), "{want} missing from the power plot");
    }
    let tiny = root().join("models/fixtures/tiny/manifest.json");
    let svg = dir.path().join("sweep.svg");
    ok(&[
        "bench",
        "sweep",
        "--model",
        tiny.to_str().unwrap(),
        "--batches",
        "1,2,4,8,16,32",
        "--repeat",
        "3",
        "--threads",
        "1",
        "--no-cache",
        "--plot",
        svg.to_str().unwrap(),
    ]);
    let text = std::fs::read_to_string(&svg).unwrap();
    for want in [
        "tiny (dense mode",
        "RssAnon MiB",
        "tiles per second",
        "predicted memory wall",
    ] {
        assert!(text.contains(want), "{want} missing from the sweep plot");
    }
    let err =
        String::from_utf8_lossy(&board.run("0", &["--dry-run", "--plot", svg.to_str().unwrap()]).stderr).to_string();
    assert!(err.contains("a dry run measures nothing to plot"), "{err}");
}

#[test]
fn fp16_is_timed_over_the_same_sizes_and_its_ratio_reported() {
    let Some(model) = model("spectral1d_salinas_a") else {
        return;
    };
    let r: serde_json::Value = serde_json::from_str(&ok(&[
        "bench",
        "sweep",
        "--model",
        model.to_str().unwrap(),
        "--batches",
        "1,4,16",
        "--repeat",
        "3",
        "--threads",
        "1",
        "--no-cache",
        "--fp16",
        "--json",
    ]))
    .unwrap();
    let p = &r["precision"];
    assert!(p["fp16_file"].as_str().unwrap().ends_with("patch_fp16.onnx"), "{p}");
    let fp32 = r["stats"].as_array().unwrap();
    let fp16 = p["fp16"].as_array().unwrap();
    let ratios = p["ratio_fp16_over_fp32"].as_array().unwrap();
    assert_eq!((fp16.len(), ratios.len()), (fp32.len(), fp32.len()));
    let mut rs = Vec::new();
    for ((a, b), q) in fp32.iter().zip(fp16).zip(ratios) {
        assert_eq!(a["batch"], b["batch"]);
        assert_eq!(q[0], a["batch"]);
        let want = b["median_s"].as_f64().unwrap() / a["median_s"].as_f64().unwrap();
        assert!((q[1].as_f64().unwrap() - want).abs() < 1e-9 * want, "{q} vs {want}");
        rs.push(want);
    }
    rs.sort_by(f64::total_cmp);
    assert!((p["median_ratio"].as_f64().unwrap() - rs[rs.len() / 2]).abs() < 1e-9 * rs[rs.len() / 2]);
    // A manifest without an fp16 graph: the error names the field.
    let tiny = root().join("models/fixtures/tiny/manifest.json");
    let err = fails(&[
        "bench",
        "sweep",
        "--model",
        tiny.to_str().unwrap(),
        "--mode",
        "patch",
        "--batches",
        "1",
        "--no-cache",
        "--fp16",
    ]);
    assert!(
        err.contains("files.patch_fp16") && err.contains("tiny/manifest.json"),
        "{err}"
    );
}
