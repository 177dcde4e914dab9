//! `kill -9` of `hsiedge serve` at random points across intake, inference and delivery, for a
//! streamed and a spooled scene at once (docs/reliability.md): after a restart every scene is
//! delivered over MQTT, its maps equal `hsiedge classify`'s byte for byte, each segment has one
//! sequence number (a scene run again after the kill is queued once), and a segment received more
//! than once carries that number and the same bytes. A scene cut after a journalled segment
//! resumes after it (counted, with the lines not computed again), and a stream read to its end is
//! finished from its recording. The number of kill points is `HSIEDGE_TEST_KILL_POINTS` (default
//! 3; docs/reliability.md records a 20-point run).

mod common;
mod daemon_harness;
mod delivery_harness;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::*;
use daemon_harness::*;
use delivery_harness::*;
use rand::Rng;

const LINES: usize = 128;
const SEGMENT: usize = 16;

fn config(d: &Path, broker: &str) {
    std::fs::write(
        d.join("hsiedge.toml"),
        format!(
            "[listen]\nunix = \"{d}/stream.sock\"\n\
             [paths]\noutbox = \"{d}/outbox\"\nstate = \"{d}/state\"\ncontrol = \"{d}/control.sock\"\n\
             spool = \"{d}/spool\"\n[intake]\ndefault_model = \"tiny\"\nsegment_lines = {SEGMENT}\n\
             {tables}\n\
             [models.tiny]\nmanifest = \"{m}\"\nmode = \"dense\"\nbatch = 1\ntile = 32\nthreads = 1\n",
            d = d.display(),
            m = tiny().display(),
            tables = delivery_tables(d, "edge-1", 64, false, Some(broker)),
        ),
    )
    .unwrap();
}

/// Drops `cube` into the spool as a producer must: data first, the header renamed in last.
fn drop_in_spool(incoming: &Path, cube: &Path, id: &str) {
    std::fs::create_dir_all(incoming).unwrap();
    std::fs::copy(cube.with_extension("img"), incoming.join(format!("{id}.img"))).unwrap();
    let tmp = incoming.join(format!(".{id}.hdr.tmp"));
    std::fs::copy(cube, &tmp).unwrap();
    std::fs::rename(&tmp, incoming.join(format!("{id}.hdr"))).unwrap();
}

#[test]
fn kill_9_at_random_points_loses_nothing_and_resends_keep_their_sequence() {
    if !have_mosquitto() {
        return;
    }
    let points: usize = std::env::var("HSIEDGE_TEST_KILL_POINTS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let broker = Broker::start(&d.join("broker"));
    let consumer = Consumer::start(broker.port, "ground-1", "hsiedge/+/+/segment");
    config(d, &broker.addr());
    let cubes = d.join("cubes");
    std::fs::create_dir_all(&cubes).unwrap();
    let cube = tiny_cube(&cubes, "pass", LINES, 16);
    let want = d.join("classify");
    classify(&cube, &tiny(), "dense", 1, &want);
    let mut rng = rand::rng();
    let mut ids = Vec::new();
    let mut resent = 0;
    let (mut resumed, mut saved, mut replayed) = (0, 0u64, 0);
    for k in 0..points {
        let (st, sp) = (format!("st-{k}"), format!("sp-{k}"));
        let daemon = Daemon::start(d);
        // 128 lines at 400 lines/s: the scene's intake and inference last about 0.3 s.
        let mut sensor = hsiedge()
            .args(["simulate-sensor", "--scene"])
            .arg(&cube)
            .args(["--rate", "400", "--connect", &daemon.unix(), "--scene-id", &st])
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        drop_in_spool(&d.join("spool/incoming"), &cube, &sp);
        let delay = Duration::from_millis(rng.random_range(0..600));
        std::thread::sleep(delay);
        daemon.signal("KILL");
        let log = daemon.log.clone();
        let _ = daemon.wait(Duration::from_secs(10));
        let _ = sensor.wait();
        std::thread::sleep(Duration::from_millis(100));
        let queued = log
            .lock()
            .unwrap()
            .iter()
            .any(|v| v["event"] == "queued" && v["scene_id"] == st.as_str() && v["last"] == true);
        eprintln!(
            "kill point {k}: after {} ms; streamed scene queued before the kill: {queued}",
            delay.as_millis()
        );

        let daemon = Daemon::start(d);
        // The sensor cannot tell whether the daemon took the scene in before it died, so it
        // sends it again (the spool keeps its cube by itself): a scene already queued is run
        // again and its identical segments keep their sequence numbers.
        sensor_ok(&cube, &daemon.unix(), &["--scene-id", &st]);
        if queued {
            daemon.wait_for(
                "queued",
                |v| v["scene_id"] == st.as_str() && v["last"] == true,
                Duration::from_secs(60),
            );
            resent += 1;
        }
        for id in [&st, &sp] {
            let start = Instant::now();
            while !consumer.got.lock().unwrap().iter().any(|s| s.scene_id == *id && s.last) {
                assert!(start.elapsed() < Duration::from_secs(60), "scene {id} not delivered");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        let log = daemon.log.clone();
        assert_eq!(daemon.control(r#"{"cmd":"drain"}"#)["ok"], true);
        assert_eq!(daemon.wait(Duration::from_secs(60)), Some(0));
        // A scene the kill cut after a committed segment resumed after it (the row journal); a
        // spooled cube done before the kill is not run again.
        // A stream read to its end before the kill was finished from its recording.
        replayed += log.lock().unwrap().iter().filter(|v| v["event"] == "replayed").count();
        for done in log.lock().unwrap().iter().filter(|v| v["event"] == "scene_done") {
            let from = done["resumed_from_row"].as_u64().unwrap_or(0);
            if from > 0 {
                resumed += 1;
                let computed = done["lines_computed"].as_u64().unwrap_or(LINES as u64);
                // At most the tile row holding the resume line and the row above it (its halo,
                // tile 32) are run again.
                assert!(computed + from <= LINES as u64 + 63, "{done}");
                saved += LINES as u64 - computed;
            }
        }
        ids.extend([st, sp]);
    }

    let got = consumer.got.lock().unwrap().clone();
    // A segment received more than once is the same segment: same sequence number, same bytes.
    let mut by_seq: BTreeMap<u64, &hsiedge::delivery::message::Segment> = BTreeMap::new();
    let mut duplicates = 0;
    for s in &got {
        match by_seq.get(&s.sequence) {
            Some(first) => {
                duplicates += 1;
                assert_eq!(*first, s, "sequence {} received with different content", s.sequence);
            }
            None => {
                by_seq.insert(s.sequence, s);
            }
        }
    }
    // Every scene: its segments, in order, put together, are the maps classify writes.
    let (class, conf) = (read(&want.join("class_map.img")), read(&want.join("confidence.img")));
    for id in &ids {
        let mut segs: BTreeMap<u64, &hsiedge::delivery::message::Segment> = BTreeMap::new();
        for s in by_seq.values().filter(|s| s.scene_id == *id) {
            // A scene run twice (re-sent, or re-claimed from the spool) is queued once.
            if let Some(prev) = segs.insert(s.segment, s) {
                panic!(
                    "{id} segment {} delivered as {} and {}",
                    s.segment, prev.sequence, s.sequence
                );
            }
        }
        assert_eq!(segs.len(), LINES / SEGMENT, "{id}: segments {:?}", segs.keys());
        let joined = |name: &str| segs.values().flat_map(|s| file(s, name).to_vec()).collect::<Vec<u8>>();
        assert!(
            joined("class_map.img") == class,
            "{id}: class map differs from classify"
        );
        assert!(
            joined("confidence.img") == conf,
            "{id}: confidence differs from classify"
        );
    }
    eprintln!(
        "{points} kill points: {} scenes delivered, {} segments received ({duplicates} duplicates, same sequence and bytes), {resent} streamed scenes run again after they had been queued, {resumed} scenes resumed from their journal ({saved} lines not computed again), {replayed} streams finished from their recorded input, lost 0",
        ids.len(),
        got.len()
    );
}

/// A spool daemon's configuration with one socket subscriber and a delivery queue of one segment.
fn spool_config(d: &Path) {
    std::fs::write(
        d.join("hsiedge.toml"),
        format!(
            "[paths]\noutbox = \"{d}/outbox\"\nstate = \"{d}/state\"\ncontrol = \"{d}/control.sock\"\n\
             spool = \"{d}/spool\"\n[intake]\ndefault_model = \"tiny\"\nsegment_lines = {SEGMENT}\n\
             {tables}\n\
             [models.tiny]\nmanifest = \"{m}\"\nmode = \"dense\"\nbatch = 1\ntile = 32\nthreads = 1\n",
            d = d.display(),
            m = tiny().display(),
            tables = delivery_tables(d, "edge-1", 1, true, None),
        ),
    )
    .unwrap();
}

/// Four small cubes for the spool, `c1` to `c4`.
fn four_cubes(d: &Path) -> (std::path::PathBuf, [&'static str; 4]) {
    let cubes = d.join("cubes");
    std::fs::create_dir_all(&cubes).unwrap();
    let names = ["c1", "c2", "c3", "c4"];
    for n in names {
        tiny_cube(&cubes, n, SEGMENT, 8);
    }
    (cubes, names)
}

#[test]
fn spooled_cubes_held_by_a_delivery_outage_are_not_failed_by_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    spool_config(d);
    let (cubes, names) = four_cubes(d);
    // No subscriber: the queue holds one segment and the next scene waits for room, the ones
    // after it in the model's queue. Four kills: more than the three started runs a cube that
    // crashes the daemon is allowed.
    for k in 0..4 {
        let daemon = Daemon::start(d);
        if k == 0 {
            for n in names {
                drop_in_spool(&d.join("spool/incoming"), &cubes.join(format!("{n}.hdr")), n);
            }
        }
        daemon.wait_for("delivery_full", |_| true, Duration::from_secs(60));
        daemon.signal("KILL");
        let _ = daemon.wait(Duration::from_secs(10));
    }
    let daemon = Daemon::start(d);
    let received = subscribe(d, &d.join("sub"), names.len());
    let mut got: Vec<&str> = received.iter().filter_map(|v| v["scene_id"].as_str()).collect();
    got.sort_unstable();
    got.dedup();
    assert_eq!(got, names, "{received:?}");
    // c1 went to done/ before the first kill; the others in this run.
    for n in &names[1..] {
        daemon.wait_for(
            "spool",
            |v| v["scene"] == *n && v["ok"] == true,
            Duration::from_secs(60),
        );
    }
    for n in names {
        assert!(d.join("spool/done").join(n).is_dir(), "{n} in done/");
    }
    let failed = d.join("spool/failed");
    let failed: Vec<_> = std::fs::read_dir(&failed).map_or(Vec::new(), |r| r.flatten().map(|e| e.path()).collect());
    assert!(failed.is_empty(), "{failed:?}");
}

#[test]
fn a_drain_leaves_the_cubes_it_has_not_started_in_the_spool() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    spool_config(d);
    let (cubes, names) = four_cubes(d);
    let daemon = Daemon::start(d);
    for n in names {
        drop_in_spool(&d.join("spool/incoming"), &cubes.join(format!("{n}.hdr")), n);
    }
    // c1 is queued; the queue is full, so the cubes after it wait in the model's queue.
    daemon.wait_for("delivery_full", |_| true, Duration::from_secs(60));
    daemon.signal("TERM");
    let log = daemon.log.clone();
    assert_eq!(daemon.wait(Duration::from_secs(60)), Some(0));
    let left: Vec<String> = log
        .lock()
        .unwrap()
        .iter()
        .filter(|v| v["event"] == "left")
        .filter_map(|v| v["scene_id"].as_str().map(String::from))
        .collect();
    assert!(!left.is_empty(), "a drain starts no queued cube");
    for n in &left {
        assert!(!d.join("spool/done").join(n).exists() && !d.join("spool/failed").join(n).exists());
    }
    // The next start takes them up and delivers everything.
    let daemon = Daemon::start(d);
    let received = subscribe(d, &d.join("sub"), names.len());
    assert_eq!(received.len(), names.len(), "{received:?}");
    for n in &left {
        daemon.wait_for(
            "spool",
            |v| v["scene"] == n.as_str() && v["ok"] == true,
            Duration::from_secs(60),
        );
    }
    for n in names {
        assert!(d.join("spool/done").join(n).is_dir(), "{n} in done/");
    }
}
