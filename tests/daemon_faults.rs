//! `hsiedge serve` facing faults: bad streams refused while it keeps serving, configurations it
//! cannot serve, the control socket (status, reload, drain), systemd's notifications, a drain
//! that runs out of time.

mod common;
mod daemon_harness;

use std::io::{BufRead, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::*;
use daemon_harness::*;
use serde_json::Value;

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
fn a_configuration_that_cannot_serve_stops_the_start_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let tiny_model = tiny();
    let config = write_config(
        d,
        &[Model {
            name: "tiny",
            manifest: &tiny_model,
            mode: "dense",
            batch: 1,
        }],
        "",
    );
    let good = std::fs::read_to_string(&config).unwrap();
    let cfg = config.to_str().unwrap();
    // An unknown key: the file, the key and its line.
    std::fs::write(&config, good.replace("[models.tiny]", "[models.tiny]\nbatch_size = 4")).unwrap();
    let err = fails(&["serve", "--config", cfg]);
    assert!(
        err.contains(cfg) && err.contains("batch_size") && err.contains("line"),
        "{err}"
    );
    // A wrong type.
    std::fs::write(&config, good.replace("batch = 1", "batch = true")).unwrap();
    let err = fails(&["serve", "--config", cfg]);
    assert!(err.contains("batch") && err.contains("invalid type"), "{err}");
    // A manifest that is not there: the model is named.
    std::fs::write(
        &config,
        good.replace(tiny_model.to_str().unwrap(), "/nonexistent/manifest.json"),
    )
    .unwrap();
    let err = fails(&["serve", "--config", cfg]);
    assert!(
        err.contains("model `tiny`") && err.contains("/nonexistent/manifest.json"),
        "{err}"
    );
    // A TCP address another process holds.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    std::fs::write(&config, good.replace("127.0.0.1:0", &addr)).unwrap();
    let err = fails(&["serve", "--config", cfg]);
    assert!(err.contains(&format!("binding tcp {addr}")), "{err}");
    // No file at all.
    let err = fails(&["serve", "--config", d.join("missing.toml").to_str().unwrap()]);
    assert!(err.contains("missing.toml"), "{err}");
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
fn systemd_hears_ready_status_watchdog_and_stopping() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
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
    let notify = std::os::unix::net::UnixDatagram::bind(d.join("notify.sock")).unwrap();
    notify.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut command = hsiedge();
    command
        .env("NOTIFY_SOCKET", d.join("notify.sock"))
        // A 200 ms watchdog: pings every 100 ms.
        .env("WATCHDOG_USEC", "200000");
    let daemon = Daemon::start_with(command, d);
    let mut got: Vec<String> = Vec::new();
    let mut buf = [0u8; 4096];
    let mut recv = |got: &mut Vec<String>| {
        let n = notify.recv(&mut buf).expect("a notification within 10 s");
        got.push(String::from_utf8_lossy(&buf[..n]).into_owned());
    };
    while got.iter().filter(|m| *m == "WATCHDOG=1").count() < 3 {
        recv(&mut got);
    }
    assert!(
        got[0].starts_with("READY=1\nSTATUS=serving: 0 scene(s) in flight"),
        "{got:?}"
    );
    daemon.signal("TERM");
    while !got.iter().any(|m| m.starts_with("STOPPING=1")) {
        recv(&mut got);
    }
    assert_eq!(daemon.wait(Duration::from_secs(30)), Some(0));
}

#[test]
fn a_drain_that_runs_out_of_time_cuts_the_scene_and_moves_it_aside() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let cube = tiny_cube(d, "endless", 400, 16);
    write_config(
        d,
        &[Model {
            name: "tiny",
            manifest: &tiny(),
            mode: "dense",
            batch: 1,
        }],
        "drain_timeout_s = 1.0\nsegment_lines = 16\n",
    );
    let daemon = Daemon::start(d);
    // 400 lines at 20 lines/s: 20 s, far past the drain's 1 s.
    let mut sensor = hsiedge()
        .args(["simulate-sensor", "--scene"])
        .arg(&cube)
        .args(["--rate", "20", "--connect", &daemon.unix(), "--scene-id", "long"])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let seg = d.join("outbox/long/seg-000000/class_map.img");
    let start = Instant::now();
    while !seg.exists() {
        assert!(start.elapsed() < Duration::from_secs(30), "no segment committed");
        std::thread::sleep(Duration::from_millis(20));
    }
    let t = Instant::now();
    daemon.signal("TERM");
    daemon.wait_for("drain_timeout", |_| true, Duration::from_secs(10));
    let failed = daemon.wait_for("scene_failed", |v| v["scene_id"] == "long", Duration::from_secs(10));
    assert_eq!(daemon.wait(Duration::from_secs(20)), Some(0));
    eprintln!(
        "stopped {:.2} s after SIGTERM with a 1 s drain timeout",
        t.elapsed().as_secs_f64()
    );
    let _ = sensor.kill();
    let _ = sensor.wait();
    assert!(
        failed["moved_to"].as_str().unwrap().ends_with(".failed/long"),
        "{failed}"
    );
    // What was committed before the cut is kept, with the reason beside it.
    assert!(d.join("outbox/.failed/long/seg-000000/class_map.img").is_file());
    assert!(d.join("outbox/.failed/long/error.json").is_file());
    assert!(std::fs::read_dir(d.join("state/in-flight")).unwrap().next().is_none());
}
