//! `hsiedge serve` as a real process on real sockets: scenes streamed by `simulate-sensor` give the
//! maps `hsiedge classify` gives byte for byte; bad streams are refused while the daemon keeps
//! serving; SIGTERM drains; the control socket answers status, drain and reload; a killed daemon's
//! scene in flight is moved aside at restart; memory stays flat over 100 scenes.

mod common;

use std::io::{BufRead, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

/// A running `hsiedge serve` whose log lines (JSON) are collected as they come.
struct Daemon {
    child: Child,
    log: Arc<Mutex<Vec<Value>>>,
    dir: PathBuf,
}

/// One model table of the configuration.
struct Model<'a> {
    name: &'a str,
    manifest: &'a Path,
    mode: &'a str,
    batch: usize,
}

fn write_config(dir: &Path, models: &[Model], extra_intake: &str) -> PathBuf {
    let mut text = format!(
        "[listen]\ntcp = \"127.0.0.1:0\"\nunix = \"{d}/stream.sock\"\n\
         [paths]\noutbox = \"{d}/outbox\"\nstate = \"{d}/state\"\ncontrol = \"{d}/control.sock\"\n\
         [intake]\ndefault_model = \"{first}\"\n{extra_intake}\n",
        d = dir.display(),
        first = models[0].name
    );
    for m in models {
        text.push_str(&format!(
            "[models.{}]\nmanifest = \"{}\"\nmode = \"{}\"\nbatch = {}\ntile = 32\nthreads = 1\n",
            m.name,
            m.manifest.display(),
            m.mode,
            m.batch
        ));
    }
    let path = dir.join("hsiedge.toml");
    std::fs::write(&path, text).unwrap();
    path
}

impl Daemon {
    fn start(dir: &Path) -> Self {
        let mut child = hsiedge()
            .args(["serve", "--config"])
            .arg(dir.join("hsiedge.toml"))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn hsiedge serve");
        let log = Arc::new(Mutex::new(Vec::new()));
        let (stderr, sink, pid) = (child.stderr.take().unwrap(), log.clone(), child.id());
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("[serve] {line}");
                let mut v: Value = serde_json::from_str(&line).unwrap_or_else(|_| serde_json::json!({"raw": line}));
                // The daemon's resident memory when it reported the scene done.
                if v["event"] == "scene_done" {
                    v["vm_rss_kib"] = vm_rss_kib(pid).into();
                }
                sink.lock().unwrap().push(v);
            }
        });
        let d = Self {
            child,
            log,
            dir: dir.to_path_buf(),
        };
        d.wait_for("ready", |_| true, Duration::from_secs(60));
        d
    }

    /// The first log line of `event` that `pred` accepts, waiting up to `timeout`.
    fn wait_for(&self, event: &str, pred: impl Fn(&Value) -> bool, timeout: Duration) -> Value {
        let start = Instant::now();
        loop {
            if let Some(v) = self.log.lock().unwrap().iter().find(|v| v["event"] == event && pred(v)) {
                return v.clone();
            }
            assert!(
                start.elapsed() < timeout,
                "no `{event}` log line within {timeout:?}; log:\n{:#?}",
                self.log.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn events(&self, event: &str) -> Vec<Value> {
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter(|v| v["event"] == event)
            .cloned()
            .collect()
    }

    fn tcp(&self) -> String {
        let l = self.wait_for(
            "listening",
            |v| v["listener"].as_str().unwrap().starts_with("tcp "),
            Duration::ZERO,
        );
        format!("tcp:{}", &l["listener"].as_str().unwrap()[4..])
    }

    fn unix(&self) -> String {
        format!("unix:{}", self.dir.join("stream.sock").display())
    }

    fn control(&self, cmd: &str) -> Value {
        let mut s = UnixStream::connect(self.dir.join("control.sock")).expect("control socket");
        s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
        writeln!(s, "{cmd}").unwrap();
        let mut line = String::new();
        std::io::BufReader::new(s).read_line(&mut line).unwrap();
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"))
    }

    fn signal(&self, sig: &str) {
        let ok = std::process::Command::new("kill")
            .args([&format!("-{sig}"), &self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -{sig}");
    }

    /// Waits for the process to end; its exit code.
    fn wait(mut self, timeout: Duration) -> Option<i32> {
        let start = Instant::now();
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s.code();
            }
            assert!(start.elapsed() < timeout, "the daemon did not exit within {timeout:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn vm_rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Runs `simulate-sensor` to completion.
fn sensor(scene: &Path, addr: &str, extra: &[&str]) -> std::process::Output {
    hsiedge()
        .args(["simulate-sensor", "--scene"])
        .arg(scene)
        .args(["--rate", "0", "--connect", addr])
        .args(extra)
        .output()
        .expect("spawn simulate-sensor")
}

fn sensor_ok(scene: &Path, addr: &str, extra: &[&str]) {
    let out = sensor(scene, addr, extra);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "simulate-sensor {extra:?}: {err}");
    assert!(!err.contains("not confirmed"), "{err}");
}

fn classify(scene: &Path, model: &Path, mode: &str, batch: usize, out: &Path) {
    ok(&[
        "classify",
        scene.to_str().unwrap(),
        "--model",
        model.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--mode",
        mode,
        "--batch",
        &batch.to_string(),
        "--tile",
        "32",
        "--threads",
        "1",
    ]);
}

fn read(p: &Path) -> Vec<u8> {
    std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Asserts the maps of outbox folder `got` (one segment) equal those `classify` wrote in `want`.
fn same_maps(got: &Path, want: &Path) {
    for f in ["class_map.img", "confidence.img"] {
        let (g, w) = (read(&got.join("seg-000000").join(f)), read(&want.join(f)));
        assert!(g == w, "{f}: {} differs from {}", got.display(), want.display());
    }
}

fn tiny() -> PathBuf {
    root().join("models/fixtures/tiny/manifest.json")
}

/// A 4-band cube the tiny model runs on.
fn tiny_cube(dir: &Path, name: &str, lines: usize, samples: usize) -> PathBuf {
    write_cube(dir, name, lines, samples, 4, |l, b, s| {
        100.0 * (b + 1) as f32 + ((l * 7 + s * 3 + b) % 23) as f32
    })
}

#[test]
fn streamed_scenes_give_the_maps_classify_gives_in_dense_and_patch_mode() {
    let (Some(data), Some(model)) = (data(), common::model("hybridsn_salinas_a")) else {
        return;
    };
    let scene = data.join("salinas_a/salinas_a.hdr");
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write_config(
        d,
        &[
            Model {
                name: "hs_dense",
                manifest: &model,
                mode: "dense",
                batch: 2,
            },
            Model {
                name: "hs_patch",
                manifest: &model,
                mode: "patch",
                batch: 64,
            },
        ],
        "",
    );
    let daemon = Daemon::start(d);
    // Dense over TCP, patch over the Unix socket.
    let t = Instant::now();
    sensor_ok(
        &scene,
        &daemon.tcp(),
        &["--scene-id", "sa-dense", "--model", "hs_dense"],
    );
    eprintln!("dense scene streamed and served in {:.2} s", t.elapsed().as_secs_f64());
    let t = Instant::now();
    sensor_ok(
        &scene,
        &daemon.unix(),
        &["--scene-id", "sa-patch", "--model", "hs_patch"],
    );
    eprintln!("patch scene streamed and served in {:.2} s", t.elapsed().as_secs_f64());
    for (id, mode, batch) in [("sa-dense", "dense", 2), ("sa-patch", "patch", 64)] {
        let done = daemon.wait_for("scene_done", |v| v["scene_id"] == id, Duration::from_secs(120));
        assert_eq!((done["lines"].as_u64(), done["mode"].as_str()), (Some(83), Some(mode)));
        let want = d.join(format!("classify-{mode}"));
        classify(&scene, &model, mode, batch, &want);
        same_maps(&d.join("outbox").join(id), &want);
    }
    let status = daemon.control(r#"{"cmd":"status"}"#);
    assert_eq!(status["totals"]["scenes_done"], 2, "{status}");
    assert_eq!(daemon.control(r#"{"cmd":"drain"}"#)["ok"], true);
    assert_eq!(daemon.wait(Duration::from_secs(60)), Some(0));
}

#[test]
fn a_full_size_synthetic_scene_gives_the_maps_classify_gives() {
    let Some(model) = common::model("hybridsn_salinas_a") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // The Pavia University field size, 610 x 340, drawn from the model's class statistics.
    let sim = d.join("sim");
    let said = ok(&[
        "simulate",
        "--model",
        model.to_str().unwrap(),
        "--out",
        sim.to_str().unwrap(),
        "--lines",
        "610",
        "--samples",
        "340",
    ]);
    // "SYNTHETIC scene PATH (labels PATH)"
    let scene = PathBuf::from(
        said.trim()
            .strip_prefix("SYNTHETIC scene ")
            .and_then(|r| r.split(" (labels ").next())
            .unwrap_or_else(|| panic!("{said}")),
    );
    write_config(
        d,
        &[Model {
            name: "hs",
            manifest: &model,
            mode: "dense",
            batch: 2,
        }],
        "",
    );
    let daemon = Daemon::start(d);
    let t = Instant::now();
    sensor_ok(&scene, &daemon.unix(), &["--scene-id", "pavia-size"]);
    let done = daemon.wait_for(
        "scene_done",
        |v| v["scene_id"] == "pavia-size",
        Duration::from_secs(600),
    );
    eprintln!(
        "610 x 340 dense: streamed and served in {:.1} s (daemon: {} s)",
        t.elapsed().as_secs_f64(),
        done["elapsed_s"]
    );
    assert_eq!(done["lines"], 610);
    let want = d.join("classify");
    classify(&scene, &model, "dense", 2, &want);
    same_maps(&d.join("outbox/pavia-size"), &want);
}

/// A frame: a 4-byte big-endian length, then the CBOR of `v`.
fn frame(v: &ciborium::Value) -> Vec<u8> {
    let mut body = Vec::new();
    ciborium::into_writer(v, &mut body).unwrap();
    let mut f = (body.len() as u32).to_be_bytes().to_vec();
    f.extend(body);
    f
}

fn scene_msg(id: &str, bands: u64, model: Option<&str>) -> ciborium::Value {
    use ciborium::Value as V;
    let mut m = vec![
        (V::Text("type".into()), V::Text("scene".into())),
        (V::Text("scene_id".into()), V::Text(id.into())),
        (V::Text("samples".into()), V::Integer(8.into())),
        (V::Text("bands".into()), V::Integer(bands.into())),
        (V::Text("data_type".into()), V::Integer(4.into())),
        (V::Text("interleave".into()), V::Text("bil".into())),
        (V::Text("byte_order".into()), V::Integer(0.into())),
        (V::Text("version".into()), V::Integer(1.into())),
    ];
    if let Some(model) = model {
        m.push((V::Text("model".into()), V::Text(model.into())));
    }
    V::Map(m)
}

/// Sends `bytes` on a new connection and says whether the daemon closed it (end of stream or a
/// reset) within 10 s.
fn closed_after(addr: &Path, bytes: &[u8]) -> bool {
    let mut s = UnixStream::connect(addr).unwrap();
    // The daemon may close before everything is written: a broken pipe is a close too. The
    // writing side is closed after, so a frame cut short ends there.
    let _ = s.write_all(bytes);
    let _ = s.shutdown(std::net::Shutdown::Write);
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut buf = [0u8; 16];
    match s.read(&mut buf) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => matches!(
            e.kind(),
            std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe
        ),
    }
}

/// Every path under `dir`, relative.
fn tree(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap().filter_map(Result::ok) {
            let p = e.path();
            out.push(p.strip_prefix(dir).unwrap().to_path_buf());
            if e.file_type().unwrap().is_dir() {
                todo.push(p);
            }
        }
    }
    out
}

#[test]
fn bad_streams_are_refused_naming_the_fault_and_the_daemon_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let cubes = d.join("cubes");
    std::fs::create_dir(&cubes).unwrap();
    let cube = tiny_cube(&cubes, "good", 24, 16);
    write_config(
        d,
        &[Model {
            name: "tiny",
            manifest: &tiny(),
            mode: "dense",
            batch: 1,
        }],
        "max_line_bytes = 4096\n",
    );
    let daemon = Daemon::start(d);
    let sock = d.join("stream.sock");
    let huge_line = {
        let mut m = scene_msg("wide", 4, None);
        if let ciborium::Value::Map(fields) = &mut m {
            fields[2].1 = ciborium::Value::Integer(100_000.into());
        }
        m
    };
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "a frame cut short",
            vec![0, 0, 0, 40, 1, 2, 3],
            "connection closed inside a message",
        ),
        (
            "an oversized length",
            vec![0xff, 0xff, 0xff, 0xff, 0],
            "a message of 4294967295 bytes",
        ),
        (
            "bytes that are not CBOR",
            [&[0u8, 0, 0, 4][..], &[0xff, 0xfe, 0x00, 0x13]].concat(),
            "waiting for a scene message",
        ),
        (
            "a scene id with `..`",
            frame(&scene_msg("../x", 4, None)),
            "starts with `.`",
        ),
        (
            "a scene id with a separator",
            frame(&scene_msg("a/b", 4, None)),
            "path separator",
        ),
        (
            "a wrong band count",
            frame(&scene_msg("bands5", 5, None)),
            "field `input.bands` says 4",
        ),
        (
            "an unknown model",
            frame(&scene_msg("m", 4, Some("nosuch"))),
            "`nosuch`, which is not configured",
        ),
        ("a line over max_line_bytes", frame(&huge_line), "max_line_bytes"),
    ];
    for (k, (what, bytes, want)) in cases.iter().enumerate() {
        assert!(closed_after(&sock, bytes), "{what}: the connection stayed open");
        // The log line may reach the test after the close does.
        let start = Instant::now();
        while daemon.events("refused").len() <= k && start.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(20));
        }
        let all = daemon.events("refused");
        assert_eq!(all.len(), k + 1, "{what}: {all:#?}");
        let msg = all[k]["msg"].as_str().unwrap().to_string();
        assert!(msg.contains("refused") && msg.contains("unix "), "{what}: {msg}");
        assert!(msg.contains(want), "{what}: expected `{want}` in: {msg}");
        // A good scene still goes through after each refusal.
        sensor_ok(&cube, &daemon.unix(), &["--scene-id", &format!("good-{k}")]);
    }
    // A good scene whose stream then breaks the protocol mid-scene fails, and moves aside.
    let mut s = UnixStream::connect(&sock).unwrap();
    s.write_all(&frame(&scene_msg("broken", 4, None))).unwrap();
    s.write_all(&[0, 0, 0, 3, 0xa0, 0xa0, 0xa0]).unwrap();
    let failed = daemon.wait_for("scene_failed", |v| v["scene_id"] == "broken", Duration::from_secs(10));
    assert!(failed["error"].as_str().unwrap().contains("broken"), "{failed}");
    assert!(d.join("outbox/.failed/broken/error.json").is_file());

    // Nothing was written outside the daemon's folders: no `x`, `a`, `b` or `bands5` anywhere.
    let mut expected: Vec<PathBuf> = [
        "hsiedge.toml",
        "stream.sock",
        "control.sock",
        "cubes",
        "outbox",
        "state",
    ]
    .iter()
    .map(PathBuf::from)
    .collect();
    expected.extend(["cubes/good.hdr", "cubes/good.img"].iter().map(PathBuf::from));
    for p in tree(d) {
        let top = p
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy()
            .into_owned();
        assert!(
            expected.contains(&p) || ["outbox", "state"].contains(&top.as_str()),
            "unexpected {}",
            p.display()
        );
    }
    let outbox: Vec<String> = std::fs::read_dir(d.join("outbox"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        outbox.iter().all(|n| n.starts_with("good-") || n == ".failed"),
        "{outbox:?}"
    );
    assert_eq!(outbox.len(), cases.len() + 1);
    assert_eq!(daemon.control(r#"{"cmd":"status"}"#)["totals"]["refused"], cases.len());
}

#[test]
fn sigterm_mid_scene_finishes_the_scene_then_exits_zero() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let cube = tiny_cube(d, "slow", 40, 16);
    write_config(
        d,
        &[Model {
            name: "tiny",
            manifest: &tiny(),
            mode: "dense",
            batch: 1,
        }],
        "",
    );
    let daemon = Daemon::start(d);
    // 40 lines at 20 lines/s: two seconds of scene.
    let sensor = hsiedge()
        .args(["simulate-sensor", "--scene"])
        .arg(&cube)
        .args(["--rate", "20", "--connect", &daemon.unix(), "--scene-id", "pass-1"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    loop {
        let s = daemon.control(r#"{"cmd":"status"}"#);
        if s["in_flight"][0]["lines"].as_u64().unwrap_or(0) >= 5 {
            assert_eq!(s["in_flight"][0]["scene_id"], "pass-1");
            assert!(s["in_flight"][0]["lines_per_s"].as_f64().unwrap() > 0.0, "{s}");
            assert_eq!(s["in_flight"][0]["batch"], 1);
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the scene never started: {s}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    daemon.signal("TERM");
    daemon.wait_for("draining", |_| true, Duration::from_secs(5));
    // Intake has stopped: a new connection is not served.
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        UnixStream::connect(d.join("stream.sock")).is_err(),
        "still listening while draining"
    );
    let done = daemon.wait_for("scene_done", |v| v["scene_id"] == "pass-1", Duration::from_secs(30));
    assert_eq!(done["lines"], 40);
    let log = daemon.log.clone();
    assert_eq!(daemon.wait(Duration::from_secs(30)), Some(0));
    let out = sensor.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let want = d.join("classify");
    classify(&cube, &tiny(), "dense", 1, &want);
    same_maps(&d.join("outbox/pass-1"), &want);
    let summary: Value = serde_json::from_slice(&read(&d.join("outbox/pass-1/seg-000000/summary.json"))).unwrap();
    assert_eq!(
        (summary["lines"].as_u64(), summary["last"].as_bool()),
        (Some(40), Some(true))
    );
    assert!(log.lock().unwrap().iter().any(|v| v["event"] == "stopped"));
    assert!(!d.join("stream.sock").exists() && !d.join("control.sock").exists());
}

#[test]
fn a_scene_in_flight_when_the_daemon_is_killed_is_moved_aside_at_restart() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let cube = tiny_cube(d, "cut", 200, 16);
    write_config(
        d,
        &[Model {
            name: "tiny",
            manifest: &tiny(),
            mode: "dense",
            batch: 1,
        }],
        "segment_lines = 32\n",
    );
    let daemon = Daemon::start(d);
    let mut sensor = hsiedge()
        .args(["simulate-sensor", "--scene"])
        .arg(&cube)
        .args(["--rate", "100", "--connect", &daemon.unix(), "--scene-id", "pass-9"])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Wait for the first committed segment, then kill without a drain.
    let seg = d.join("outbox/pass-9/seg-000000/class_map.img");
    let start = Instant::now();
    while !seg.exists() {
        assert!(start.elapsed() < Duration::from_secs(30), "no segment committed");
        std::thread::sleep(Duration::from_millis(20));
    }
    daemon.signal("KILL");
    let _ = daemon.wait(Duration::from_secs(10));
    let _ = sensor.wait();
    assert!(d.join("state/in-flight/pass-9").is_file(), "the marker is left");

    let again = Daemon::start(d);
    let r = again.wait_for("recovered", |_| true, Duration::ZERO);
    assert!(r["msg"].as_str().unwrap().contains("pass-9"), "{r}");
    let aside = d.join("outbox/.failed/pass-9");
    assert!(
        aside.join("seg-000000/class_map.img").is_file(),
        "committed segments kept"
    );
    let error = String::from_utf8(read(&aside.join("error.json"))).unwrap();
    assert!(error.contains("interrupted"), "{error}");
    // The sensor resends the scene: it gets its own folder again.
    sensor_ok(&cube, &again.unix(), &["--scene-id", "pass-9"]);
    again.wait_for("scene_done", |v| v["scene_id"] == "pass-9", Duration::from_secs(30));
    assert!(d.join("outbox/pass-9/seg-000006/class_map.img").is_file());
}

#[test]
fn the_control_socket_reports_reloads_and_drains() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let cube = tiny_cube(d, "c", 16, 16);
    let models = |b_batch| {
        write_config(
            d,
            &[
                Model {
                    name: "a",
                    manifest: &tiny(),
                    mode: "dense",
                    batch: 1,
                },
                Model {
                    name: "b",
                    manifest: &tiny(),
                    mode: "patch",
                    batch: b_batch,
                },
            ],
            "",
        )
    };
    let config = models(8);
    let daemon = Daemon::start(d);
    for sock in ["control.sock", "stream.sock"] {
        let mode = std::fs::metadata(d.join(sock)).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o660, "{sock}");
    }
    let s = daemon.control(r#"{"cmd":"status"}"#);
    assert_eq!(s["ok"], true);
    assert_eq!(s["state"], "serving");
    assert_eq!(s["models"]["b"]["batch"], 8);
    assert_eq!(s["models"]["b"]["mode"], "patch");
    assert!(
        s["models"]["b"]["batch_reason"]
            .as_str()
            .unwrap()
            .contains("models.b.batch = 8"),
        "{s}"
    );
    assert!(s["memory_budget"]["binding"].is_string(), "{s}");
    assert!(s["listening"].as_array().unwrap().len() == 2, "{s}");

    // Model b changes, a does not: a keeps its sessions.
    models(16);
    let r = daemon.control(r#"{"cmd":"reload"}"#);
    assert_eq!(r["ok"], true, "{r}");
    assert_eq!(
        (r["kept"].clone(), r["started"].clone()),
        (serde_json::json!(["a"]), serde_json::json!(["b"]))
    );
    assert_eq!(daemon.control(r#"{"cmd":"status"}"#)["models"]["b"]["batch"], 16);
    sensor_ok(&cube, &daemon.unix(), &["--scene-id", "after-reload", "--model", "b"]);
    daemon.wait_for(
        "scene_done",
        |v| v["scene_id"] == "after-reload" && v["batch"] == 16,
        Duration::from_secs(30),
    );

    // A bad file is refused naming the key; what is in force stays.
    let good = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, good.replace("[models.b]", "[models.b]\nbatches = 3")).unwrap();
    let r = daemon.control(r#"{"cmd":"reload"}"#);
    assert_eq!(r["ok"], false);
    assert!(r["error"].as_str().unwrap().contains("batches"), "{r}");
    assert_eq!(daemon.control(r#"{"cmd":"status"}"#)["models"]["b"]["batch"], 16);
    // A folder change needs a restart: named, and the old folder stays in use.
    std::fs::write(&config, good.replace("/outbox\"", "/elsewhere\"")).unwrap();
    let r = daemon.control(r#"{"cmd":"reload"}"#);
    assert_eq!(r["restart_needed"], serde_json::json!(["paths.outbox"]), "{r}");
    std::fs::write(&config, &good).unwrap();
    // SIGHUP reloads too.
    daemon.signal("HUP");
    daemon.wait_for(
        "reloaded",
        |v| v["msg"].as_str().unwrap().contains("SIGHUP"),
        Duration::from_secs(30),
    );

    // Requests that are not understood get an error and the connection stays usable.
    let mut s = UnixStream::connect(d.join("control.sock")).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    writeln!(s, "{{\"cmd\":\"explode\"}}\nnot json\n{{\"cmd\":\"status\"}}").unwrap();
    let mut lines = std::io::BufReader::new(s).lines();
    let e1: Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert!(
        e1["error"].as_str().unwrap().contains("unknown command `explode`"),
        "{e1}"
    );
    let e2: Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert_eq!(e2["ok"], false);
    let e3: Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert_eq!(e3["ok"], true);

    assert_eq!(daemon.control(r#"{"cmd":"drain"}"#)["state"], "draining");
    assert_eq!(daemon.wait(Duration::from_secs(30)), Some(0));
    assert!(!d.join("elsewhere").exists());
}

#[test]
fn memory_stays_flat_across_100_consecutive_scenes() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let cube = tiny_cube(d, "small", 48, 32);
    write_config(
        d,
        &[Model {
            name: "tiny",
            manifest: &tiny(),
            mode: "dense",
            batch: 1,
        }],
        "",
    );
    let daemon = Daemon::start(d);
    let t = Instant::now();
    sensor_ok(&cube, &daemon.unix(), &["--repeat", "100", "--scene-id", "r"]);
    daemon.wait_for("scene_done", |v| v["scene_id"] == "r-100", Duration::from_secs(300));
    let elapsed = t.elapsed().as_secs_f64();
    let rss = |id: &str| {
        daemon.wait_for("scene_done", |v| v["scene_id"] == id, Duration::ZERO)["vm_rss_kib"]
            .as_u64()
            .unwrap()
    };
    let (first, last) = (rss("r-10"), rss("r-100"));
    let anon = |id: &str| {
        daemon.wait_for("scene_done", |v| v["scene_id"] == id, Duration::ZERO)["memory"]["rss_anon_end"]
            .as_u64()
            .unwrap()
    };
    eprintln!(
        "100 scenes of 48 x 32 in {elapsed:.2} s; VmRSS after scene 10: {first} KiB, after scene 100: {last} KiB \
         (RssAnon {} -> {} KiB)",
        anon("r-10") / 1024,
        anon("r-100") / 1024
    );
    assert_eq!(daemon.events("scene_done").len(), 100);
    // Each scene allocates its source, ring and segment buffers afresh (well under 1 MiB here) and
    // frees them; 8 MiB of growth over 90 scenes (~90 KiB a scene) would be a leak, while allocator
    // noise and lazily faulted library pages stay far below it.
    assert!(
        last <= first + 8 * 1024,
        "VmRSS grew from {first} KiB to {last} KiB over 90 scenes"
    );
}

/// Puts a cube into a spool's inbox as docs/spool.md says a producer must: the data file first,
/// the header renamed into place last.
fn deliver(incoming: &Path, cube: &Path) {
    let name = cube.file_stem().unwrap().to_str().unwrap();
    std::fs::copy(cube.with_extension("img"), incoming.join(format!("{name}.img"))).unwrap();
    let tmp = incoming.join(format!(".{name}.hdr.tmp"));
    std::fs::copy(cube, &tmp).unwrap();
    std::fs::rename(&tmp, incoming.join(format!("{name}.hdr"))).unwrap();
}

#[test]
fn cubes_dropped_into_the_spool_are_classified_and_moved_to_done_or_failed() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let cubes = d.join("cubes");
    std::fs::create_dir(&cubes).unwrap();
    let good = tiny_cube(&cubes, "pass-01", 9, 11);
    let other = tiny_cube(&cubes, "pass-02", 13, 7);
    let wrong_bands = write_cube(&cubes, "pass-03", 5, 5, 3, |l, b, s| (l + b + s) as f32);
    std::fs::write(
        d.join("hsiedge.toml"),
        format!(
            "[paths]\noutbox = \"{d}/outbox\"\nstate = \"{d}/state\"\ncontrol = \"{d}/control.sock\"\n\
             spool = \"{d}/spool\"\n[intake]\ndefault_model = \"tiny\"\n\
             [models.tiny]\nmanifest = \"{m}\"\nmode = \"dense\"\nbatch = 2\ntile = 32\nthreads = 1\n",
            d = d.display(),
            m = tiny().display()
        ),
    )
    .unwrap();
    let daemon = Daemon::start(d);
    let incoming = d.join("spool/incoming");
    assert!(incoming.is_dir(), "the spool's inbox is made at start");
    for c in [&good, &other, &wrong_bands] {
        deliver(&incoming, c);
    }
    for (id, cube) in [("pass-01", &good), ("pass-02", &other)] {
        daemon.wait_for("scene_done", |v| v["scene_id"] == id, Duration::from_secs(60));
        let want = d.join(format!("classify-{id}"));
        classify(cube, &tiny(), "dense", 2, &want);
        same_maps(&d.join("outbox").join(id), &want);
        daemon.wait_for("spool", |v| v["scene"] == id, Duration::from_secs(30));
        assert!(
            d.join("spool/done").join(id).join(format!("{id}.hdr")).is_file(),
            "{id} in done/"
        );
    }
    let refused = daemon.wait_for(
        "refused",
        |v| v["msg"].as_str().is_some_and(|m| m.contains("pass-03")),
        Duration::from_secs(30),
    );
    assert!(refused["msg"].as_str().unwrap().contains("bands"), "{refused}");
    let reason = d.join("spool/failed/pass-03/pass-03.reason");
    let start = Instant::now();
    while !reason.is_file() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "pass-03 never reached failed/"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(std::fs::read_to_string(&reason).unwrap().contains("bands"));
    assert!(
        !d.join("outbox/pass-03").exists(),
        "nothing written for a refused scene"
    );
    assert!(
        std::fs::read_dir(&incoming).unwrap().next().is_none(),
        "the inbox is empty"
    );
    assert_eq!(daemon.control(r#"{"cmd":"drain"}"#)["ok"], true);
    assert_eq!(daemon.wait(Duration::from_secs(60)), Some(0));
}
