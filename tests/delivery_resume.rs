//! The row journal (docs/delivery.md): `kill -9` of `hsiedge serve` in the middle of a scene,
//! after some of its segments were committed and queued, then a restart: the scene resumes after
//! its last journalled segment (fewer lines computed), its maps equal `hsiedge classify`'s byte for
//! byte, and the segments queued before the kill keep their sequence numbers.
//!
//! The moment of the kill is made certain, not timed: a CBOR subscriber socket is configured with
//! no subscriber and `queue_max = N`, so the scene stops when its segment N waits for room (log
//! `delivery_full`), with N segments journalled.
//!
//! Also here: a segment that finds the outbox's file system full pauses its scene (a tmpfs outbox,
//! root only, skipped with the reason otherwise), which goes on from its last committed segment
//! when space returns; and a stream of unannounced length that is an exact multiple of `segment_lines` has its
//! last segment marked `last`, in the outbox and in the delivered message.

mod common;
mod daemon_harness;
mod delivery_harness;

use std::path::Path;
use std::time::Duration;

use common::*;
use daemon_harness::*;
use delivery_harness::*;

/// 300 lines at tile 32: ten balanced tile rows of 30 lines; segments of 10 lines. Long enough
/// that a scene stopped early has not been read to its end (the producer reads a few rows ahead).
const LINES: usize = 300;
const SEGMENT: usize = 10;
/// Segments queued (and journalled) before the scene stops: resumes from line 60.
const QUEUE_MAX: usize = 6;

fn config(d: &Path, queue_max: usize) {
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
            tables = delivery_tables(d, "edge-1", queue_max, true, None),
        ),
    )
    .unwrap();
}

/// Kills the daemon once `id` waits for room for its segment `queue_max`, with the segments
/// before it queued as sequence numbers 0.., restarts it with `resend` (the stream's sensor
/// sending again, or nothing: a spooled cube the spool takes back, a stream recorded whole) and
/// checks that the run resumed from `from` computing `computed` lines.
fn killed_mid_scene_resumes(
    d: &Path,
    id: &str,
    queue_max: usize,
    (from, computed): (usize, usize),
    journal_files: Vec<String>,
    start: impl FnOnce(&Daemon),
    resend: impl FnOnce(&Daemon),
) {
    config(d, queue_max);
    let want = d.join("classify");
    let cube = d.join("cubes/pass.hdr");
    classify(&cube, &tiny(), "dense", 1, &want);

    let daemon = Daemon::start(d);
    start(&daemon);
    daemon.wait_for(
        "delivery_full",
        |v| v["scene_id"] == id && v["segment"] == queue_max,
        Duration::from_secs(60),
    );
    let before: Vec<(u64, u64)> = daemon
        .events("queued")
        .iter()
        .filter(|v| v["scene_id"] == id)
        .map(|v| (v["segment"].as_u64().unwrap(), v["sequences"][0].as_u64().unwrap()))
        .collect();
    assert_eq!(
        before,
        (0..queue_max as u64).map(|k| (k, k)).collect::<Vec<_>>(),
        "queued before the kill"
    );
    daemon.signal("KILL");
    let _ = daemon.wait(Duration::from_secs(10));
    // What the kill left: the journal, and for a stream its lines as recorded so far (whole
    // and renamed in once the scene's last line was read: the cube's data byte for byte).
    let journal = d.join("state/journal");
    let mut left: Vec<String> = std::fs::read_dir(&journal)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left, journal_files, "left in {}", journal.display());
    if left.iter().any(|f| f.ends_with(".img")) {
        assert!(read(&journal.join(format!("{id}.img"))) == read(&cube.with_extension("img")));
    }

    let daemon = Daemon::start(d);
    daemon.wait_for(
        "recovered",
        |v| v["folder"].as_str().is_some_and(|f| f.ends_with(id)),
        Duration::from_secs(10),
    );
    // The subscriber comes: the queue drains, the paused worker takes the scene again.
    let out = d.join("received");
    let sub = {
        let (d, out) = (d.to_path_buf(), out.clone());
        std::thread::spawn(move || subscribe(&d, &out, LINES / SEGMENT))
    };
    resend(&daemon);
    let received = sub.join().unwrap();
    let resumed = daemon.wait_for("resumed", |v| v["scene_id"] == id, Duration::from_secs(60));
    assert_eq!(resumed["resumed_from_row"], queue_max * SEGMENT);
    let done = daemon.wait_for("scene_done", |v| v["scene_id"] == id, Duration::from_secs(60));
    assert_eq!(done["resumed_from_row"], from, "{done}");
    assert_eq!(done["lines_computed"], computed, "{done}");
    assert_eq!(done["lines"], LINES, "{done}");
    assert!(done["lines_computed"].as_u64().unwrap() < LINES as u64);

    // Every segment once, those queued before the kill with their sequence numbers.
    let mut seqs: Vec<(u64, u64)> = received
        .iter()
        .filter(|r| r["scene_id"] == id && r["duplicate"] == false)
        .map(|r| (r["segment"].as_u64().unwrap(), r["sequence"].as_u64().unwrap()))
        .collect();
    seqs.sort();
    assert_eq!(seqs.len(), LINES / SEGMENT, "{received:?}");
    assert_eq!(&seqs[..queue_max], &before[..]);
    assert!(seqs.iter().enumerate().all(|(k, (s, _))| *s == k as u64));
    let last: Vec<bool> = received.iter().map(|r| r["last"] == true).collect();
    assert_eq!(
        last.iter().filter(|l| **l).count(),
        1,
        "exactly one segment is the last"
    );

    // The segments put together are classify's maps, byte for byte.
    for name in ["class_map.img", "confidence.img"] {
        let joined: Vec<u8> = (0..LINES / SEGMENT)
            .flat_map(|k| read(&out.join("edge-1").join(id).join(format!("seg-{k:06}")).join(name)))
            .collect();
        assert!(joined == read(&want.join(name)), "{id}: {name} differs from classify");
    }
    // Nothing is left to resume.
    assert_eq!(std::fs::read_dir(d.join("state/journal")).unwrap().count(), 0);
    assert_eq!(daemon.control(r#"{"cmd":"drain"}"#)["ok"], true);
    assert_eq!(daemon.wait(Duration::from_secs(60)), Some(0));
}

fn files(id: &str, exts: &[&str]) -> Vec<String> {
    exts.iter().map(|e| format!("{id}.{e}")).collect()
}

fn setup() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path(), QUEUE_MAX);
    let cubes = dir.path().join("cubes");
    std::fs::create_dir_all(&cubes).unwrap();
    tiny_cube(&cubes, "pass", LINES, 16);
    dir
}

#[test]
fn a_streamed_scene_killed_mid_run_resumes_after_its_last_committed_row_when_re_sent() {
    let dir = setup();
    let d = dir.path();
    let cube = d.join("cubes/pass.hdr");
    let mut first = None;
    // Line 60 starts the tile row 60..90; its halo row 30..60 is run again and dropped.
    killed_mid_scene_resumes(
        d,
        "st",
        QUEUE_MAX,
        (60, 270),
        files("st", &["log", "part"]),
        |daemon| {
            first = Some(
                hsiedge()
                    .args(["simulate-sensor", "--scene"])
                    .arg(&cube)
                    .args(["--rate", "0", "--connect", &daemon.unix(), "--scene-id", "st"])
                    .stderr(std::process::Stdio::null())
                    .spawn()
                    .unwrap(),
            )
        },
        |daemon| sensor_ok(&cube, &daemon.unix(), &["--scene-id", "st"]),
    );
    // The first sensor saw its connection cut by the kill.
    let _ = first.map(|mut c| c.wait());
}

#[test]
fn a_spooled_cube_killed_mid_run_resumes_after_its_last_committed_row_without_a_resend() {
    let dir = setup();
    let d = dir.path();
    killed_mid_scene_resumes(
        d,
        "sp",
        QUEUE_MAX,
        (60, 270),
        files("sp", &["log"]),
        |_| {
            let incoming = d.join("spool/incoming");
            std::fs::create_dir_all(&incoming).unwrap();
            let cube = d.join("cubes/pass.hdr");
            std::fs::copy(cube.with_extension("img"), incoming.join("sp.img")).unwrap();
            std::fs::copy(&cube, incoming.join(".sp.hdr.tmp")).unwrap();
            std::fs::rename(incoming.join(".sp.hdr.tmp"), incoming.join("sp.hdr")).unwrap();
        },
        |_| {},
    );
}

#[test]
fn a_stream_read_to_its_end_before_the_kill_is_finished_from_its_recorded_input_without_a_resend() {
    let dir = setup();
    let d = dir.path();
    let cube = d.join("cubes/pass.hdr");
    let mut first = None;
    // Stopped at segment 27, in the last tile row (270..300): every line was read and
    // recorded. Line 270 starts that row; its halo row 240..270 is run again.
    killed_mid_scene_resumes(
        d,
        "rec",
        27,
        (270, 60),
        files("rec", &["hdr", "img", "log"]),
        |daemon| {
            first = Some(
                hsiedge()
                    .args(["simulate-sensor", "--scene"])
                    .arg(&cube)
                    .args(["--rate", "0", "--connect", &daemon.unix(), "--scene-id", "rec"])
                    .stderr(std::process::Stdio::null())
                    .spawn()
                    .unwrap(),
            )
        },
        |daemon| {
            daemon.wait_for("replayed", |v| v["scene_id"] == "rec", Duration::from_secs(10));
        },
    );
    let _ = first.map(|mut c| c.wait());
}

#[test]
fn an_unannounced_stream_whose_length_is_a_multiple_of_the_segment_marks_its_last_segment() {
    use hsiedge::source::stream::{Faults, SceneHeader, SensorStream};
    use hsiedge::source::{FileSource, LineSource};
    let dir = setup();
    let d = dir.path();
    let cube = tiny_cube(&d.join("cubes"), "short", 3 * SEGMENT, 16);
    let daemon = Daemon::start(d);
    let mut src = FileSource::open(&cube, Some("un")).unwrap();
    let mut header = SceneHeader::from_info(src.info());
    header.lines = None;
    let conn = std::os::unix::net::UnixStream::connect(d.join("stream.sock")).unwrap();
    let mut tx = SensorStream::new(conn, Faults::default());
    tx.begin(&header).unwrap();
    let mut line = vec![0u8; src.info().line_bytes()];
    let mut n = 0;
    while src.next_line(&mut line).unwrap().is_some() {
        tx.line(n, &line).unwrap();
        n += 1;
    }
    tx.end(n).unwrap();
    let received = subscribe(d, &d.join("received"), 3);
    let marks: Vec<(u64, bool)> = received
        .iter()
        .map(|r| (r["segment"].as_u64().unwrap(), r["last"] == true))
        .collect();
    assert_eq!(marks, vec![(0, false), (1, false), (2, true)]);
    for (k, last) in marks {
        let summary: serde_json::Value = serde_json::from_slice(&read(
            &d.join("outbox/un").join(format!("seg-{k:06}")).join("summary.json"),
        ))
        .unwrap();
        assert_eq!(summary["last"], last, "outbox segment {k}: {summary}");
    }
    let done = daemon.wait_for("scene_done", |v| v["scene_id"] == "un", Duration::from_secs(30));
    assert_eq!(done["lines"], 3 * SEGMENT);
    drop(tx);
}

/// Fills the outbox's file system to about `left` bytes free; returns the filler.
fn fill(outbox: &Path, left: u64) -> std::path::PathBuf {
    let free = hsiedge::ffi::available_bytes(outbox).unwrap();
    let filler = outbox.join("filler");
    std::fs::write(&filler, vec![7u8; free.saturating_sub(left) as usize]).unwrap();
    filler
}

/// Waits for `id` to pause for space, checks what it says, frees the space and checks the scene
/// went on to maps equal to `want`, with every segment delivered once.
fn pauses_for_space_and_goes_on(daemon: &Daemon, d: &Path, id: &str, filler: &Path, want: &Path) {
    let full = daemon.wait_for("outbox_full", |v| v["scene_id"] == id, Duration::from_secs(60));
    let msg = full["msg"].as_str().unwrap();
    assert!(msg.contains("no space left in") && msg.contains("MiB needed"), "{full}");
    assert_eq!(full["path"], d.join("outbox").display().to_string(), "{full}");
    assert!(full["needed_bytes"].as_u64().unwrap() > full["free_bytes"].as_u64().unwrap());
    let s = daemon.control(r#"{"cmd":"status"}"#);
    assert!(
        s["paused"]["tiny"].as_str().unwrap_or("").contains("no space left"),
        "{s}"
    );
    assert_eq!(s["totals"]["scenes_failed"], 0, "{s}");
    std::fs::remove_file(filler).unwrap();
    let out = d.join(format!("received-{id}"));
    let received = subscribe(d, &out, LINES / SEGMENT);
    assert_eq!(received.len(), LINES / SEGMENT, "{received:?}");
    let done = daemon.wait_for("scene_done", |v| v["scene_id"] == id, Duration::from_secs(60));
    assert!(done["resumed_from_row"].as_u64().unwrap() > 0, "{done}");
    assert_eq!(done["lines"], LINES, "{done}");
    for name in ["class_map.img", "confidence.img"] {
        let joined: Vec<u8> = (0..LINES / SEGMENT)
            .flat_map(|k| read(&out.join("edge-1").join(id).join(format!("seg-{k:06}")).join(name)))
            .collect();
        assert!(joined == read(&want.join(name)), "{id}: {name} differs from classify");
    }
}

#[test]
fn a_segment_that_finds_the_outbox_full_pauses_its_scene_which_goes_on_when_space_returns() {
    let dir = setup();
    let d = dir.path();
    let Some(_fs) = Tmpfs::mount(&d.join("outbox"), "4m") else {
        return;
    };
    config(d, 64);
    let cube = d.join("cubes/pass.hdr");
    let want = d.join("classify");
    classify(&cube, &tiny(), "dense", 1, &want);
    let daemon = Daemon::start(d);
    // Room for a few of the scene's 30 segments, not for all.
    let outbox = d.join("outbox");

    // A stream: read again from its recording, then from its connection, which waited.
    let filler = fill(&outbox, 160 << 10);
    let (c, unix) = (cube.clone(), daemon.unix());
    let sensor = std::thread::spawn(move || sensor_ok(&c, &unix, &["--scene-id", "nst"]));
    pauses_for_space_and_goes_on(&daemon, d, "nst", &filler, &want);
    sensor.join().unwrap();

    // A spooled cube: read again from its file.
    let filler = fill(&outbox, 160 << 10);
    let incoming = d.join("spool/incoming");
    std::fs::create_dir_all(&incoming).unwrap();
    std::fs::copy(cube.with_extension("img"), incoming.join("nsp.img")).unwrap();
    std::fs::copy(&cube, incoming.join(".nsp.hdr.tmp")).unwrap();
    std::fs::rename(incoming.join(".nsp.hdr.tmp"), incoming.join("nsp.hdr")).unwrap();
    pauses_for_space_and_goes_on(&daemon, d, "nsp", &filler, &want);

    assert_eq!(std::fs::read_dir(outbox.join(".failed")).unwrap().count(), 0);
    assert_eq!(daemon.control(r#"{"cmd":"drain"}"#)["ok"], true);
    assert_eq!(daemon.wait(Duration::from_secs(60)), Some(0));
}
