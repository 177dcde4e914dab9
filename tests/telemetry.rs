//! Telemetry from the outside: `classify --telemetry FILE` writes JSON lines while the run goes
//! on, `classify --metrics ADDR` and `serve` with `[telemetry] metrics` serve a Prometheus
//! endpoint that `promtool check metrics` accepts when scraped during a run or a streamed scene,
//! and bad telemetry arguments fail before any work.

mod common;
mod daemon_harness;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{data, emulator, fails, hsiedge, model, skip};

/// `promtool`, or `None` (printed) when absent outside CI; in CI it must be installed
/// (`.ci/run` installs Debian's `prometheus` package, which ships it).
fn promtool() -> Option<&'static str> {
    let found = Command::new("promtool")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if found {
        return Some("promtool");
    }
    assert!(
        std::env::var("CI").is_err(),
        "CI must have promtool (apt package prometheus)"
    );
    eprintln!("skipped: promtool not installed (apt-get install prometheus)");
    None
}

/// `promtool check metrics` on `text`: its exit status and what it printed.
fn promtool_check(promtool: &str, text: &str) -> (bool, String) {
    let child = Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = child.expect("spawn promtool");
    child
        .stdin
        .take()
        .expect("promtool stdin")
        .write_all(text.as_bytes())
        .expect("write to promtool");
    let out = child.wait_with_output().expect("promtool output");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), said)
}

/// `GET path` on `addr`: the status line and the body.
fn http_get(addr: &str, path: &str) -> std::io::Result<(String, String)> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n")?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    Ok((head.lines().next().unwrap_or("").to_string(), body.to_string()))
}

/// The value of an unlabelled sample in an exposition.
fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

#[test]
fn json_lines_during_a_patch_run() {
    if emulator().is_some() {
        skip(
            "a HybridSN patch-mode run takes minutes under an emulator; the native run covers telemetry, which is not architecture-specific",
        );
        return;
    }
    let (Some(data), Some(model)) = (data(), model("hybridsn_salinas_a")) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("telemetry.jsonl");
    let out = hsiedge()
        .args(["classify", data.join("salinas_a/salinas_a.hdr").to_str().unwrap()])
        .args(["--model", model.to_str().unwrap()])
        .args(["--out", dir.path().join("out").to_str().unwrap()])
        .args(["--mode", "patch", "--batch", "64", "--json"])
        .args(["--telemetry", file.to_str().unwrap()])
        .output()
        .expect("spawn hsiedge");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let summary = common::summary(&String::from_utf8_lossy(&out.stdout));
    let text = std::fs::read_to_string(&file).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    // A patch run takes seconds: at least one periodic snapshot, then the final one.
    assert!(lines.len() >= 2, "{text}");
    let get = |v: &serde_json::Value, k: &str| v[k].as_f64().unwrap_or_else(|| panic!("{k} in {v}"));
    for (i, l) in lines.iter().enumerate() {
        assert!(l.is_object());
        assert_eq!(l["seq"].as_u64(), Some(i as u64));
        assert_eq!(l["final"].as_bool(), Some(i == lines.len() - 1));
        assert_eq!(l["batch"].as_u64(), Some(64));
        assert_eq!(l["batch_reason"].as_str(), Some("fixed"));
        assert!(l["memory"]["available_bytes"].as_u64().is_some_and(|b| b > 0), "{l}");
    }
    let pixels: Vec<f64> = lines.iter().map(|l| get(l, "pixels_done")).collect();
    assert!(
        pixels.windows(2).all(|w| w[0] <= w[1]),
        "pixels went backwards: {pixels:?}"
    );
    // A snapshot during the run saw part of the scene done (the first may come before the first
    // batch on a slow machine or under an emulator).
    let end = pixels[pixels.len() - 1];
    assert!(pixels.iter().any(|&p| p > 0.0 && p < end), "{pixels:?}");
    let last = &lines[lines.len() - 1];
    assert_eq!(last["pixels_done"].as_u64(), summary["pixels"].as_u64());
    assert_eq!(last["pixels_total"].as_u64(), Some(83 * 86));
    assert_eq!(last["batches"].as_u64(), summary["batches"].as_u64());
    // No record was dropped, so the latency count covers every batch.
    assert_eq!(last["batch_latency_count"].as_u64(), summary["batches"].as_u64());
    // The first snapshot with a batch in it (under an emulator the first may come before any).
    let first_q = &lines
        .iter()
        .find(|l| l["batches"].as_u64().is_some_and(|b| b > 0))
        .unwrap_or_else(|| panic!("no snapshot counted a batch: {text}"))["batch_latency_s"];
    assert!(get(first_q, "p50") <= get(first_q, "p95") && get(first_q, "p95") <= get(first_q, "p99"));
    assert!(get(first_q, "p50") > 0.0);
    // Absent sources (on a host without INA3221 rails: power) are reported once, not per line.
    let notices: Vec<&str> = lines
        .iter()
        .flat_map(|l| l["notices"].as_array().into_iter().flatten())
        .filter_map(|n| n.as_str())
        .collect();
    let mut unique = notices.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), notices.len(), "a notice repeated: {notices:?}");
    if !Path::new("/sys/bus/i2c/devices").exists() {
        assert!(
            lines[0]["notices"].as_array().is_some_and(|n| n
                .iter()
                .any(|n| n.as_str().is_some_and(|n| n.starts_with("power: no INA3221")))),
            "{}",
            lines[0]
        );
    }
    // Periodic snapshots are a second apart.
    for l in &lines[..lines.len() - 1] {
        assert!((get(l, "window_s") - 1.0).abs() < 0.5, "{l}");
    }
}

#[test]
fn metrics_scraped_during_a_patch_run_pass_promtool() {
    if emulator().is_some() {
        skip(
            "a HybridSN patch-mode run takes minutes under an emulator; the native run covers telemetry, which is not architecture-specific",
        );
        return;
    }
    let (Some(data), Some(model)) = (data(), model("hybridsn_salinas_a")) else {
        return;
    };
    let Some(promtool) = promtool() else { return };
    let dir = tempfile::tempdir().unwrap();
    let mut child = hsiedge()
        .args(["classify", data.join("salinas_a/salinas_a.hdr").to_str().unwrap()])
        .args(["--model", model.to_str().unwrap()])
        .args(["--out", dir.path().join("out").to_str().unwrap()])
        // One intra-op thread keeps the run several seconds long on any machine.
        .args(["--mode", "patch", "--batch", "32", "--threads", "1"])
        .args(["--metrics", "127.0.0.1:0"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn hsiedge");
    let mut stderr = BufReader::new(child.stderr.take().expect("stderr"));
    let mut line = String::new();
    let addr = loop {
        line.clear();
        if stderr.read_line(&mut line).unwrap_or(0) == 0 {
            panic!("hsiedge ended without printing the metrics address");
        }
        if let Some(rest) = line.trim().strip_prefix("hsiedge: metrics on http://") {
            break rest.trim_end_matches("/metrics").to_string();
        }
    };
    // The rest of stderr is drained so the child never blocks on it.
    let rest = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    // Scrape until a periodic snapshot with pixels in it is served, while the run still goes on.
    let t0 = Instant::now();
    let body = loop {
        assert!(
            child.try_wait().ok().flatten().is_none(),
            "the run ended before a scrape saw pixels"
        );
        let (status, body) = http_get(&addr, "/metrics").expect("scrape");
        assert_eq!(status, "HTTP/1.1 200 OK");
        if sample(&body, "hsiedge_pixels_total").is_some_and(|p| p > 0.0) {
            break body;
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "no snapshot in 60 s:\n{body}");
        std::thread::sleep(Duration::from_millis(100));
    };
    let during = child.try_wait().ok().flatten().is_none();
    let (not_found, _) = http_get(&addr, "/").expect("scrape /");
    let status = child.wait().expect("wait");
    let err = rest.join().unwrap_or_default();
    assert!(status.success(), "{err}");
    assert!(during, "the scrape was not served during the run");
    assert!(not_found.starts_with("HTTP/1.1 404"), "{not_found}");
    assert!(
        sample(&body, "hsiedge_scene_pixels") == Some((83 * 86) as f64),
        "{body}"
    );
    assert!(
        body.contains("hsiedge_batch_latency_seconds{quantile=\"0.99\"}"),
        "{body}"
    );
    let (ok, said) = promtool_check(promtool, &body);
    assert!(ok && said.trim().is_empty(), "promtool check metrics: {said}\n{body}");
    // The endpoint is gone with the run.
    assert!(TcpStream::connect(&addr).is_err());
}

/// Every family (rails, temperatures, nvpmodel, NVML) passes promtool, not only those an x86
/// host has.
#[test]
fn a_full_exposition_passes_promtool() {
    use hsiedge::platform::{MemorySample, NvmlSample};
    use hsiedge::telemetry::snapshot::{PowerModeNow, Quantiles, RailPower, Temperature};
    let Some(promtool) = promtool() else { return };
    let s = hsiedge::telemetry::Snapshot {
        seq: 3,
        pixels_done: 5000,
        pixels_total: Some(7138),
        batches: 80,
        pixels_per_s: 1200.0,
        batch_latency_s: Some(Quantiles {
            count: 16,
            p50: 0.04,
            p95: 0.05,
            p99: 0.06,
            max: 0.07,
        }),
        batch_latency_sum_s: 3.2,
        batch_latency_count: 80,
        queue_depth: 2,
        batch: 64,
        batch_reason: "auto: memory".into(),
        memory: Some(MemorySample {
            total_bytes: 8 << 30,
            available_bytes: 5 << 30,
            nvmap_used_bytes: Some(400 << 20),
            cgroup_usage_bytes: Some(1 << 30),
            cgroup_limit_bytes: Some(4 << 30),
            process_rss_bytes: Some(800 << 20),
        }),
        power_w: Some(6.623),
        rails: ["VDD_IN", "VDD_CPU_GPU_CV", "VDD_SOC"]
            .iter()
            .map(|l| RailPower {
                label: (*l).into(),
                volts: 5.056,
                amps: 0.5,
                watts: 2.528,
            })
            .collect(),
        energy_j: Some(21.0),
        energy_per_megapixel_j: Some(4.2),
        temperatures: vec![
            Temperature {
                zone: "cpu-thermal".into(),
                celsius: 48.5,
            },
            Temperature {
                zone: "gpu-thermal".into(),
                celsius: 47.9,
            },
        ],
        gpu_load: Some(0.627),
        gpu_freq_hz: Some(624_750_000),
        nvpmodel: Some(PowerModeNow {
            id: 2,
            name: Some("MAXN_SUPER".into()),
        }),
        nvml: vec![NvmlSample {
            index: 0,
            name: "NVIDIA H100".into(),
            power_w: Some(120.5),
            utilization: Some(0.93),
            memory_used_bytes: Some(3 << 30),
            memory_total_bytes: Some(80 << 30),
            temperature_c: Some(41.0),
        }],
        dropped_records: 0,
        ..Default::default()
    };
    let text = hsiedge::telemetry::prometheus::render(Some(&s));
    for family in [
        "hsiedge_rail_power_watts{rail=\"VDD_SOC\"}",
        "hsiedge_temperature_celsius{zone=\"gpu-thermal\"}",
        "hsiedge_nvpmodel_info{id=\"2\",name=\"MAXN_SUPER\"}",
        "hsiedge_nvml_utilization_ratio{gpu=\"0\"}",
        "hsiedge_energy_joules_total",
    ] {
        assert!(text.contains(family), "{family} missing:\n{text}");
    }
    let (ok, said) = promtool_check(promtool, &text);
    assert!(ok && said.trim().is_empty(), "promtool check metrics: {said}\n{text}");
}

#[test]
fn bad_telemetry_arguments_fail_before_any_work() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let base = |extra: &[&str]| {
        let mut args = vec![
            "classify",
            "no-such-scene.hdr",
            "--model",
            "no-such-manifest.json",
            "--out",
            out.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        fails(&args)
    };
    let err = base(&["--metrics", "0.0.0.0:9184"]);
    assert!(
        err.contains("metrics endpoint 0.0.0.0:9184: not a loopback address"),
        "{err}"
    );
    let err = base(&["--metrics", "localhost"]);
    assert!(err.contains("metrics endpoint localhost: not an address"), "{err}");
    let err = base(&["--telemetry", "/no-such-dir/t.jsonl"]);
    assert!(err.contains("telemetry creating /no-such-dir/t.jsonl"), "{err}");
    assert!(!Path::new(&out).exists());
}

#[test]
fn telemetry_never_overwrites_an_input_or_a_file_of_the_output_set() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let cube = common::write_cube(d, "scene", 6, 5, 4, |l, b, s| (l * 3 + b + s) as f32);
    let data = std::fs::read(d.join("scene.img")).unwrap();
    let tiny = daemon_harness::tiny();
    let out = d.join("out");
    let args = |telemetry: &Path| -> Vec<String> {
        [
            "classify",
            cube.to_str().unwrap(),
            "--model",
            tiny.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--telemetry",
            telemetry.to_str().unwrap(),
        ]
        .map(String::from)
        .to_vec()
    };
    let run = |telemetry: &Path| {
        let a = args(telemetry);
        fails(&a.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let err = run(&d.join("scene.img"));
    assert!(err.contains("is the run's input"), "{err}");
    assert_eq!(
        std::fs::read(d.join("scene.img")).unwrap(),
        data,
        "the scene is untouched"
    );
    let err = run(&tiny);
    assert!(err.contains("is the run's input"), "{err}");
    // A first run makes the set; the second's telemetry may not write through it.
    let a = args(&d.join("t.jsonl"));
    common::ok(&a.iter().map(String::as_str).collect::<Vec<_>>());
    let err = run(&out.join("summary.json"));
    assert!(err.contains("of the output set, which the run replaces"), "{err}");
}

#[test]
fn serve_metrics_scraped_during_a_streamed_scene_pass_promtool() {
    use daemon_harness::{Daemon, Model, tiny, tiny_cube, write_config_with};
    let Some(promtool) = promtool() else { return };
    let dir = tempfile::tempdir().unwrap();
    let manifest = tiny();
    write_config_with(
        dir.path(),
        &[Model {
            name: "tiny",
            manifest: &manifest,
            mode: "patch",
            batch: 16,
        }],
        "",
        "[telemetry]\nmetrics = \"127.0.0.1:0\"\n",
    );
    let daemon = Daemon::start(dir.path());
    let event = daemon.wait_for("metrics", |_| true, Duration::from_secs(10));
    let addr = event["addr"]
        .as_str()
        .expect("the metrics event names its address")
        .to_string();
    // Before any scene: an exposition without run samples, still valid.
    let (status, idle) = http_get(&addr, "/metrics").expect("scrape before a scene");
    assert_eq!(status, "HTTP/1.1 200 OK");
    let (ok, said) = promtool_check(promtool, &idle);
    assert!(ok, "promtool on the idle endpoint: {said}\n{idle}");
    // 300 lines at 60 lines/s: the scene streams for about five seconds.
    let scene = tiny_cube(dir.path(), "scene", 300, 48);
    let mut sensor = hsiedge()
        .args(["simulate-sensor", "--scene", scene.to_str().unwrap()])
        .args(["--rate", "60", "--connect", &daemon.tcp()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn simulate-sensor");
    let t0 = Instant::now();
    let body = loop {
        let (status, body) = http_get(&addr, "/metrics").expect("scrape");
        assert_eq!(status, "HTTP/1.1 200 OK");
        if sample(&body, "hsiedge_pixels_total").is_some_and(|p| p > 0.0) {
            break body;
        }
        assert!(
            sensor.try_wait().ok().flatten().is_none(),
            "the scene ended before a scrape saw pixels:\n{body}"
        );
        assert!(t0.elapsed() < Duration::from_secs(60), "no snapshot in 60 s:\n{body}");
        std::thread::sleep(Duration::from_millis(100));
    };
    let during = daemon.events("scene_done").is_empty();
    let out = sensor.wait_with_output().expect("sensor");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(during, "the scrape was not served during the scene");
    assert_eq!(
        sample(&body, "hsiedge_batch_units{reason=\"the model's configured batch\"}"),
        Some(16.0),
        "{body}"
    );
    assert!(
        body.contains("hsiedge_batch_latency_seconds{quantile=\"0.5\"}"),
        "{body}"
    );
    let (ok, said) = promtool_check(promtool, &body);
    assert!(ok && said.trim().is_empty(), "promtool check metrics: {said}\n{body}");
    // After the scene its final snapshot stays: every pixel of the scene.
    daemon.wait_for("scene_done", |_| true, Duration::from_secs(60));
    let (_, after) = http_get(&addr, "/metrics").expect("scrape after the scene");
    assert_eq!(
        sample(&after, "hsiedge_pixels_total"),
        Some((300 * 48) as f64),
        "{after}"
    );
}
