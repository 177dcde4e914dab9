//! Delivery downstream of `hsiedge serve`, black-box, with a real mosquitto (docs/delivery.md,
//! docs/reliability.md): maps received over MQTT and over the CBOR socket equal `hsiedge classify`'s
//! byte for byte; a broker outage mid-stream is caught up in order with bounded memory; a
//! subscriber that never acknowledges fills the queue to its bound and pauses intake while MQTT
//! keeps receiving; two daemons through one broker reach one consumer group exactly once after
//! de-duplication; `kill -9` after a scene is queued loses nothing and keeps its sequence number;
//! a full outbox pauses intake until space returns.

mod common;
mod daemon_harness;
mod delivery_harness;

use std::time::{Duration, Instant};

use daemon_harness::*;
use delivery_harness::*;

fn tiny_model() -> [Model<'static>; 1] {
    // The manifest path lives for the test binary's life.
    let manifest: &'static std::path::Path = Box::leak(tiny().into_boxed_path());
    [Model {
        name: "tiny",
        manifest,
        mode: "dense",
        batch: 1,
    }]
}

#[test]
fn maps_received_over_mqtt_and_the_socket_equal_classify_byte_for_byte() {
    if !have_mosquitto() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let broker = Broker::start(&d.join("broker"));
    let consumer = Consumer::start(broker.port, "ground-1", "hsiedge/+/+/segment");
    write_config_with(
        d,
        &tiny_model(),
        "",
        &delivery_tables(d, "edge-1", 16, true, Some(&broker.addr())),
    );
    let daemon = Daemon::start(d);
    let scenes = [("pass-a", 40, 16), ("pass-b", 24, 12)];
    for (id, lines, samples) in scenes {
        let cube = tiny_cube(d, id, lines, samples);
        sensor_ok(&cube, &daemon.unix(), &["--scene-id", id]);
    }
    let received = subscribe(d, &d.join("sub"), 2);
    consumer.wait_distinct(2, Duration::from_secs(60));
    for (k, (id, _, _)) in scenes.iter().enumerate() {
        let want = d.join(format!("classify-{id}"));
        classify(&d.join(format!("{id}.hdr")), &tiny(), "dense", 1, &want);
        let seg = consumer.segment(id).unwrap();
        assert_eq!(
            (seg.node.as_str(), seg.sequence, seg.segment, seg.last),
            ("edge-1", k as u64, 0, true)
        );
        assert_eq!(seg.classes.len(), seg.colours.len());
        let line = received.iter().find(|r| r["scene_id"] == *id).unwrap();
        assert_eq!(line["sequence"], k as u64, "{line}");
        let folder = d.join("sub/edge-1").join(id).join("seg-000000");
        for f in ["class_map.img", "confidence.img"] {
            let w = read(&want.join(f));
            assert!(file(&seg, f) == w.as_slice(), "{id} {f}: MQTT differs from classify");
            assert!(
                read(&folder.join(f)) == w,
                "{id} {f}: the socket subscriber's differs from classify"
            );
        }
    }
    // The retained status names the node online; the queue is empty once both sinks acked.
    let status = consumer.status.lock().unwrap().clone();
    assert!(
        status
            .iter()
            .any(|(t, s)| t == "hsiedge/edge-1/status" && s.contains("\"online\"")),
        "{status:?}"
    );
    let start = Instant::now();
    while daemon.control(r#"{"cmd":"status"}"#)["delivery"]["queued"] != 0 {
        assert!(start.elapsed() < Duration::from_secs(20), "the queue did not empty");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(daemon.control(r#"{"cmd":"drain"}"#)["ok"], true);
    assert_eq!(daemon.wait(Duration::from_secs(60)), Some(0));
    // A clean stop leaves the retained status offline.
    wait_status(&consumer, "edge-1", "offline");
}

/// Waits until the newest status of `node` the consumer saw says `state`.
fn wait_status(consumer: &Consumer, node: &str, state: &str) {
    let start = Instant::now();
    let topic = format!("hsiedge/{node}/status");
    loop {
        let last = consumer
            .status
            .lock()
            .unwrap()
            .iter()
            .rev()
            .find(|(t, _)| *t == topic)
            .cloned();
        if last
            .as_ref()
            .is_some_and(|(_, s)| s.contains(&format!("\"state\":\"{state}\"")))
        {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{node} never {state}: {last:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_broker_outage_mid_stream_is_caught_up_in_order_with_bounded_memory() {
    if !have_mosquitto() {
        return;
    }
    let outage = std::env::var("HSIEDGE_TEST_OUTAGE_S")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .unwrap_or(5.0);
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut broker = Broker::start(&d.join("broker"));
    let consumer = Consumer::start(broker.port, "ground-1", "hsiedge/+/+/segment");
    write_config_with(
        d,
        &tiny_model(),
        "segment_lines = 16\n",
        &delivery_tables(d, "edge-1", 64, false, Some(&broker.addr())),
    );
    let daemon = Daemon::start(d);
    let pid = daemon.child.id();
    let cube = tiny_cube(d, "pass", 48, 16);
    sensor_ok(&cube, &daemon.unix(), &["--scene-id", "before"]);
    consumer.wait_distinct(3, Duration::from_secs(60));

    let before_kib = vm_rss_kib(pid);
    broker.stop();
    let t0 = Instant::now();
    let mut peak_kib = before_kib;
    for id in ["during-1", "during-2", "during-3"] {
        sensor_ok(&cube, &daemon.unix(), &["--scene-id", id]);
        peak_kib = peak_kib.max(vm_rss_kib(pid));
    }
    daemon.wait_for("scene_done", |v| v["scene_id"] == "during-3", Duration::from_secs(60));
    while t0.elapsed().as_secs_f64() < outage {
        peak_kib = peak_kib.max(vm_rss_kib(pid));
        std::thread::sleep(Duration::from_millis(100));
    }
    let backlog = daemon.control(r#"{"cmd":"status"}"#)["delivery"]["pending"]["mqtt"].clone();
    assert_eq!(backlog, 9, "three scenes of three segments wait for the broker");
    let down = daemon.wait_for("mqtt_down", |_| true, Duration::ZERO);
    assert!(down["msg"].as_str().unwrap().contains("retrying"), "{down}");
    broker.restart();
    let back = Instant::now();
    consumer.wait_distinct(12, Duration::from_secs(60));
    eprintln!(
        "broker down {:.1} s; backlog of 9 segments delivered {:.2} s after it returned; daemon VmRSS {} KiB before, peak {} KiB while down",
        outage,
        back.elapsed().as_secs_f64(),
        before_kib,
        peak_kib
    );
    // In order: by sequence overall, so by segment within each scene.
    let got = consumer.got.lock().unwrap().clone();
    let mut firsts = Vec::new();
    for s in &got {
        if !firsts
            .iter()
            .any(|(n, q): &(String, u64)| *n == s.node && *q == s.sequence)
        {
            firsts.push((s.node.clone(), s.sequence));
        }
    }
    let seqs: Vec<u64> = firsts.iter().map(|f| f.1).collect();
    assert_eq!(seqs, (0..12).collect::<Vec<_>>(), "first arrivals in sequence order");
    for id in ["during-1", "during-2", "during-3"] {
        let segs: Vec<u64> = got.iter().filter(|s| s.scene_id == id).map(|s| s.segment).collect();
        assert!(
            segs.windows(2).all(|w| w[0] <= w[1]) && segs.contains(&2),
            "{id}: {segs:?}"
        );
    }
}

#[test]
fn a_subscriber_that_never_acks_fills_the_queue_pauses_intake_and_mqtt_keeps_receiving() {
    if !have_mosquitto() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let broker = Broker::start(&d.join("broker"));
    let consumer = Consumer::start(broker.port, "ground-1", "hsiedge/+/+/segment");
    // Three segments a scene, a bound of two: the bound falls inside the first scene.
    write_config_with(
        d,
        &tiny_model(),
        "queue = 1\nsegment_lines = 8\n",
        &delivery_tables(d, "edge-1", 2, true, Some(&broker.addr())),
    );
    let daemon = Daemon::start(d);
    // A subscriber that reads and never acknowledges.
    let silent = std::os::unix::net::UnixStream::connect(d.join("sub.sock")).unwrap();
    let reader = {
        let mut s = silent.try_clone().unwrap();
        std::thread::spawn(move || {
            let mut sink = Vec::new();
            let _ = std::io::Read::read_to_end(&mut s, &mut sink);
        })
    };
    let cube = tiny_cube(d, "pass", 24, 12);
    let unix = daemon.unix();
    let sensors = std::thread::spawn(move || {
        for k in 0..5 {
            let out = sensor(&cube, &unix, &["--scene-id", &format!("s{k}")]);
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        }
    });
    // The first scene's third segment is committed and waits for room.
    let full = daemon.wait_for("delivery_full", |v| v["scene_id"] == "s0", Duration::from_secs(60));
    assert_eq!(
        (full["segment"].as_u64(), full["delivery"]["queued"].as_u64()),
        (Some(2), Some(2)),
        "{full}"
    );
    consumer.wait_distinct(2, Duration::from_secs(30));
    // Paused: the sensors are held back, nothing more is queued, the resends go on.
    std::thread::sleep(Duration::from_secs(2));
    let s = daemon.control(r#"{"cmd":"status"}"#);
    assert_eq!(
        (s["delivery"]["full"].as_bool(), s["delivery"]["queued"].as_u64()),
        (Some(true), Some(2)),
        "{s}"
    );
    assert_eq!(s["totals"]["scenes_done"], 0, "{s}");
    assert!(!sensors.is_finished(), "the sensor must see backpressure");
    assert!(!daemon.events("ack_timeout").is_empty());
    assert_eq!(consumer.distinct().len(), 2, "nothing past the bound was queued");

    // A real subscriber takes over: everything arrives, nothing was lost, and the queue never
    // held more than its bound on the way.
    let _ = silent.shutdown(std::net::Shutdown::Both);
    reader.join().unwrap();
    let sub = {
        let d = d.to_path_buf();
        std::thread::spawn(move || subscribe(&d, &d.join("sub"), 15))
    };
    let mut peak = 0;
    while !sub.is_finished() {
        let s = daemon.control(r#"{"cmd":"status"}"#);
        peak = peak.max(s["delivery"]["queued"].as_u64().unwrap_or(0));
        std::thread::sleep(Duration::from_millis(10));
    }
    let received = sub.join().unwrap();
    sensors.join().unwrap();
    assert!(peak <= 2, "the queue held {peak} entries, over its bound of 2");
    consumer.wait_distinct(15, Duration::from_secs(60));
    let seqs: std::collections::BTreeSet<u64> = received.iter().map(|r| r["sequence"].as_u64().unwrap()).collect();
    assert_eq!(seqs, (0..15).collect());
    let (logged, fill) = (daemon.events("queued"), daemon.events("delivery_full"));
    assert_eq!(logged.len(), 15, "{logged:?}");
    assert!(
        fill.iter().all(|v| v["delivery"]["queued"].as_u64() <= Some(2)),
        "{fill:?}"
    );
}

#[test]
fn two_daemons_through_one_broker_reach_a_consumer_group_exactly_once_after_dedup() {
    if !have_mosquitto() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let broker = Broker::start(&root.join("broker"));
    let group = "$share/ground/hsiedge/+/+/segment";
    let (c1, c2) = (
        Consumer::start(broker.port, "ground-1", group),
        Consumer::start(broker.port, "ground-2", group),
    );
    let mut daemons = Vec::new();
    for node in ["edge-a", "edge-b"] {
        let d = root.join(node);
        std::fs::create_dir_all(&d).unwrap();
        write_config_with(
            &d,
            &tiny_model(),
            "",
            &delivery_tables(&d, node, 16, false, Some(&broker.addr())),
        );
        daemons.push(Daemon::start(&d));
    }
    let cube = tiny_cube(root, "pass", 24, 12);
    let sends: Vec<_> = daemons
        .iter()
        .map(|dm| {
            let (cube, unix) = (cube.clone(), dm.unix());
            std::thread::spawn(move || {
                for k in 0..3 {
                    sensor_ok(&cube, &unix, &["--scene-id", &format!("s{k}")]);
                }
            })
        })
        .collect();
    for s in sends {
        s.join().unwrap();
    }
    let start = Instant::now();
    let all = || {
        let mut a = c1.distinct();
        a.extend(c2.distinct());
        a
    };
    while all().len() < 6 {
        assert!(start.elapsed() < Duration::from_secs(60), "{:?}", all());
        std::thread::sleep(Duration::from_millis(50));
    }
    let want: std::collections::BTreeSet<(String, u64)> = ["edge-a", "edge-b"]
        .iter()
        .flat_map(|n| (0..3).map(move |q| (n.to_string(), q)))
        .collect();
    assert_eq!(all(), want);
    // The group shares the work: every map went to one member or the other, once after de-dup.
    let (n1, n2) = (c1.got.lock().unwrap().len(), c2.got.lock().unwrap().len());
    eprintln!("consumer group: ground-1 got {n1}, ground-2 got {n2} (6 distinct)");
    assert!(n1 + n2 >= 6);
    // A node that vanishes is reported offline by the broker (its last will); the other stays online.
    wait_status(&c1, "edge-a", "online");
    daemons[0].signal("KILL");
    wait_status(&c1, "edge-a", "offline");
    wait_status(&c1, "edge-b", "online");
}

#[test]
fn a_daemon_killed_after_queueing_delivers_after_restart_with_the_same_sequence() {
    if !have_mosquitto() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let port = free_port();
    let broker_addr = format!("127.0.0.1:{port}");
    write_config_with(
        d,
        &tiny_model(),
        "",
        &delivery_tables(d, "edge-1", 16, true, Some(&broker_addr)),
    );
    let daemon = Daemon::start(d);
    let cube = tiny_cube(d, "pass", 24, 12);
    sensor_ok(&cube, &daemon.unix(), &["--scene-id", "kept"]);
    daemon.wait_for("queued", |v| v["scene_id"] == "kept", Duration::from_secs(60));
    // Neither sink can deliver (no broker, no subscriber): the segment is only in the queue.
    daemon.signal("KILL");
    let _ = daemon.wait(Duration::from_secs(10));

    let broker = Broker::start_on(&d.join("broker"), port);
    let consumer = Consumer::start(broker.port, "ground-1", "hsiedge/+/+/segment");
    let daemon = Daemon::start(d);
    let received = subscribe(d, &d.join("sub"), 1);
    consumer.wait_distinct(1, Duration::from_secs(60));
    assert_eq!(
        (received[0]["scene_id"].as_str(), received[0]["sequence"].as_u64()),
        (Some("kept"), Some(0))
    );
    assert_eq!(consumer.segment("kept").unwrap().sequence, 0);
    // The restarted daemon numbers on from there and kept the scene's folder.
    assert!(d.join("outbox/kept/seg-000000/class_map.img").is_file());
    sensor_ok(&cube, &daemon.unix(), &["--scene-id", "next"]);
    consumer.wait_distinct(2, Duration::from_secs(60));
    assert_eq!(consumer.segment("next").unwrap().sequence, 1);
}

#[test]
fn a_full_outbox_pauses_intake_with_a_clear_status_and_work_resumes_when_space_returns() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let Some(_fs) = Tmpfs::mount(&d.join("outbox"), "4m") else {
        return;
    };
    let tables = format!(
        "{}outbox_min_free_mib = 1\n",
        delivery_tables(d, "edge-1", 16, true, None)
    );
    write_config_with(d, &tiny_model(), "queue = 1\n", &tables);
    let daemon = Daemon::start(d);
    // The outbox's file system left with less than 1 MiB.
    let filler = d.join("outbox/filler");
    std::fs::write(&filler, vec![7u8; 3 << 20 | 512 << 10]).unwrap();
    let cube = tiny_cube(d, "pass", 40, 16);
    let unix = daemon.unix();
    let c = cube.clone();
    let sensor = std::thread::spawn(move || {
        let out = common::hsiedge()
            .args(["simulate-sensor", "--scene"])
            .arg(&c)
            .args(["--rate", "0", "--connect", &unix, "--scene-id", "full-1"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    });
    let full = daemon.wait_for("outbox_full", |_| true, Duration::from_secs(30));
    assert!(full["msg"].as_str().unwrap().contains("outbox_min_free_mib"), "{full}");
    std::thread::sleep(Duration::from_secs(1));
    let s = daemon.control(r#"{"cmd":"status"}"#);
    assert!(s["paused"]["tiny"].as_str().unwrap_or("").contains("MiB free"), "{s}");
    assert_eq!(s["totals"]["scenes_done"], 0, "{s}");
    assert!(!sensor.is_finished(), "the sensor must be held back");

    std::fs::remove_file(&filler).unwrap();
    daemon.wait_for("intake_resumed", |_| true, Duration::from_secs(30));
    sensor.join().unwrap();
    let received = subscribe(d, &d.join("sub"), 1);
    assert_eq!(received[0]["scene_id"], "full-1");
    let want = d.join("classify");
    classify(&cube, &tiny(), "dense", 1, &want);
    same_maps(&d.join("outbox/full-1"), &want);
    for f in ["class_map.img", "confidence.img"] {
        assert!(
            read(&d.join("sub/edge-1/full-1/seg-000000").join(f)) == read(&want.join(f)),
            "{f}"
        );
    }
    assert_eq!(daemon.control(r#"{"cmd":"drain"}"#)["ok"], true);
    assert_eq!(daemon.wait(Duration::from_secs(60)), Some(0));
}

#[test]
fn a_long_pass_is_delivered_segment_by_segment_while_it_streams() {
    if !have_mosquitto() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let broker = Broker::start(&d.join("broker"));
    let consumer = Consumer::start(broker.port, "ground-1", "hsiedge/+/+/segment");
    write_config_with(
        d,
        &tiny_model(),
        "segment_lines = 16\n",
        &delivery_tables(d, "edge-1", 64, false, Some(&broker.addr())),
    );
    let daemon = Daemon::start(d);
    let cube = tiny_cube(d, "pass", 96, 16);
    // 96 lines at 40 lines/s: 2.4 s of pass, six segments.
    let mut sensor = common::hsiedge()
        .args(["simulate-sensor", "--scene"])
        .arg(&cube)
        .args(["--rate", "40", "--connect", &daemon.unix(), "--scene-id", "long"])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    consumer.wait_distinct(1, Duration::from_secs(30));
    let first = consumer.got.lock().unwrap()[0].clone();
    assert_eq!((first.segment, first.last), (0, false));
    assert!(
        daemon.events("scene_done").is_empty(),
        "segment 0 must arrive while the pass still streams"
    );
    assert!(sensor.wait().unwrap().success());
    consumer.wait_distinct(6, Duration::from_secs(30));
    let segs: Vec<(u64, u64, bool)> = consumer
        .got
        .lock()
        .unwrap()
        .iter()
        .map(|s| (s.sequence, s.segment, s.last))
        .collect();
    assert_eq!(segs.last(), Some(&(5, 5, true)), "{segs:?}");
    let want = d.join("classify");
    classify(&cube, &tiny(), "dense", 1, &want);
    let joined: Vec<u8> = consumer
        .got
        .lock()
        .unwrap()
        .iter()
        .flat_map(|s| file(s, "class_map.img").to_vec())
        .collect();
    assert!(
        joined == read(&want.join("class_map.img")),
        "the segments put together differ from classify"
    );
}

#[test]
fn subscribe_fails_cleanly_naming_the_socket_nobody_serves_or_the_bad_value() {
    let dir = tempfile::tempdir().unwrap();
    let (sock, out) = (dir.path().join("none.sock"), dir.path().join("o"));
    let (sock, out) = (sock.to_str().unwrap(), out.to_str().unwrap());
    let err = common::fails(&["subscribe", "--socket", sock, "--out", out, "--connect-timeout-s", "0"]);
    assert!(err.contains("none.sock"), "{err}");
    // Values no timer holds are usage errors (exit 2), named with the flag, never a panic.
    for bad in ["-1", "1e30", "nan"] {
        let o = common::run(&[
            "subscribe",
            "--socket",
            sock,
            "--out",
            out,
            &format!("--connect-timeout-s={bad}"),
        ]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert!(err.contains("--connect-timeout-s") && err.contains(bad), "{err}");
    }
}
