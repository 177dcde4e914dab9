use std::os::unix::fs::MetadataExt as _;
use std::time::Duration;

use super::*;
use crate::cube::{DataType, Header, Interleave};
use crate::source::LineSource as _;

/// Options for tests: no grace unless a test sets one, a quick poll.
fn quick() -> SpoolOptions {
    SpoolOptions {
        grace: Duration::ZERO,
        poll: Duration::from_millis(10),
        max_attempts: 3,
    }
}

/// A 2-line, 3-sample, 2-band float32 cube's header text and data bytes.
fn cube_bytes(seed: u8) -> (String, Vec<u8>) {
    let header = Header::new(3, 2, 2, DataType::F32, Interleave::Bil).to_text();
    let data = (0..12)
        .flat_map(|i| (f32::from(seed) * 100.0 + i as f32).to_le_bytes())
        .collect();
    (header, data)
}

/// Delivers scene `name` into `dir` as the convention says: data, then the header renamed in.
fn deliver(dir: &Path, name: &str, seed: u8) -> Vec<u8> {
    let (header, data) = cube_bytes(seed);
    std::fs::write(dir.join(format!("{name}.img")), &data).unwrap();
    let tmp = dir.join(format!(".{name}.hdr.tmp"));
    std::fs::write(&tmp, header).unwrap();
    std::fs::rename(&tmp, dir.join(format!("{name}.hdr"))).unwrap();
    data
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    v.sort();
    v
}

fn rejected(notices: &[Notice]) -> Vec<(String, String)> {
    notices
        .iter()
        .filter_map(|n| match n {
            Notice::Rejected { to, reason, .. } => Some((to.file_name()?.to_str()?.to_string(), reason.clone())),
            Notice::Skipped(e) => panic!("skipped: {}", crate::engine::error_chain(e)),
        })
        .collect()
}

#[test]
fn a_delivered_scene_is_claimed_by_renames_and_done_moves_it_whole() {
    let root = tempfile::tempdir().unwrap();
    let mut spool = Spool::open(root.path(), quick()).unwrap();
    for d in ["incoming", "work", "done", "failed"] {
        assert!(root.path().join(d).is_dir(), "{d}");
    }
    let data = deliver(spool.incoming(), "pass-1", 1);
    let ino = |p: &Path| std::fs::metadata(p).unwrap().ino();
    let (hdr_ino, img_ino) = (
        ino(&spool.incoming().join("pass-1.hdr")),
        ino(&spool.incoming().join("pass-1.img")),
    );
    let mut c = spool.claim_next().unwrap().expect("a ready scene");
    assert_eq!((c.id(), c.recovered(), c.attempts()), ("pass-1", false, 0));
    assert_eq!(c.start().unwrap(), 1);
    // The very files, moved: a claim copies nothing.
    assert_eq!((ino(c.header_path()), ino(c.data_path())), (hdr_ino, img_ino));
    assert!(c.dir().starts_with(root.path().join("work")));
    assert!(names(spool.incoming()).is_empty());
    let mut src = c.open_source().unwrap();
    let mut line = vec![0u8; src.info().line_bytes()];
    src.next_line(&mut line).unwrap();
    assert_eq!(line, data[..24]);
    assert!(spool.claim_next().unwrap().is_none(), "handed out once");
    let to = c.done(&serde_json::json!({"maps": ["class_map.hdr"]})).unwrap();
    assert_eq!(to, spool.done_dir().join("pass-1"));
    assert_eq!(names(&to), ["pass-1.hdr", "pass-1.img", "pass-1.json"]);
    assert_eq!(std::fs::read(to.join("pass-1.img")).unwrap(), data);
    let record: serde_json::Value = serde_json::from_slice(&std::fs::read(to.join("pass-1.json")).unwrap()).unwrap();
    assert_eq!(record["scene"], "pass-1");
    assert_eq!(record["record"]["maps"][0], "class_map.hdr");
    assert_eq!(record["attempts"], 1);
    assert!(spool.take_notices().is_empty());
}

#[test]
fn a_name_that_is_no_scene_id_goes_to_failed_with_its_reason() {
    let root = tempfile::tempdir().unwrap();
    let mut spool = Spool::open(root.path(), SpoolOptions::default()).unwrap();
    deliver(spool.incoming(), "bad name", 1);
    deliver(spool.incoming(), "good", 2);
    let c = spool.claim_next().unwrap().expect("the good one");
    assert_eq!(c.id(), "good");
    let r = rejected(&spool.take_notices());
    assert_eq!(r.len(), 1, "{r:?}");
    assert_eq!(r[0].0, "bad_name");
    assert!(r[0].1.contains("character other than"), "{}", r[0].1);
    let failed = spool.failed_dir().join("bad_name");
    assert_eq!(names(&failed), ["bad name.hdr", "bad name.img", "bad_name.reason"]);
    let reason = std::fs::read_to_string(failed.join("bad_name.reason")).unwrap();
    assert!(reason.starts_with("scene id `bad name`: holds a character"), "{reason}");
    assert!(reason.contains("\ntime: "), "{reason}");
    assert!(names(spool.incoming()).is_empty());
}

#[test]
fn hidden_and_header_less_files_are_left_alone() {
    let root = tempfile::tempdir().unwrap();
    let mut spool = Spool::open(root.path(), quick()).unwrap();
    let (header, data) = cube_bytes(1);
    std::fs::write(spool.incoming().join(".a.hdr.tmp"), header).unwrap();
    std::fs::write(spool.incoming().join("a.img"), data).unwrap();
    std::fs::write(spool.incoming().join(".b.hdr"), "junk").unwrap();
    for _ in 0..2 {
        assert!(spool.claim_next().unwrap().is_none());
    }
    assert!(spool.take_notices().is_empty());
    assert_eq!(names(spool.incoming()), [".a.hdr.tmp", ".b.hdr", "a.img"]);
}

#[test]
fn a_short_data_file_is_not_ready_until_it_is_whole() {
    let root = tempfile::tempdir().unwrap();
    let options = SpoolOptions {
        grace: Duration::from_secs(3600),
        ..quick()
    };
    let mut spool = Spool::open(root.path(), options).unwrap();
    let (header, data) = cube_bytes(3);
    let img = spool.incoming().join("s.img");
    std::fs::write(&img, &data[..40]).unwrap();
    std::fs::write(spool.incoming().join("s.hdr"), header).unwrap();
    assert!(spool.claim_next().unwrap().is_none());
    assert_eq!(spool.wait_ready(Duration::from_millis(30)).unwrap(), Wait::TimedOut);
    std::fs::write(&img, &data).unwrap();
    assert_eq!(spool.wait_ready(Duration::from_secs(5)).unwrap(), Wait::Ready);
    let c = spool.claim_next().unwrap().expect("whole now");
    assert_eq!(std::fs::read(c.data_path()).unwrap(), data);
    assert!(spool.take_notices().is_empty());
}

#[test]
fn a_header_without_data_past_the_grace_goes_to_failed() {
    let root = tempfile::tempdir().unwrap();
    let options = SpoolOptions {
        grace: Duration::from_millis(200),
        ..quick()
    };
    let mut spool = Spool::open(root.path(), options).unwrap();
    let (header, _) = cube_bytes(1);
    std::fs::write(spool.incoming().join("lonely.hdr"), header).unwrap();
    assert!(spool.claim_next().unwrap().is_none());
    assert!(spool.take_notices().is_empty(), "still in its grace");
    assert!(spool.incoming().join("lonely.hdr").is_file());
    // The wait sees the grace run out: a scene to refuse is something to do.
    assert_eq!(spool.wait_ready(Duration::from_secs(5)).unwrap(), Wait::Ready);
    assert!(spool.claim_next().unwrap().is_none());
    let r = rejected(&spool.take_notices());
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].0, "lonely");
    assert!(r[0].1.starts_with("incomplete and unchanged for 0.2 s: "), "{}", r[0].1);
    assert!(r[0].1.contains("no data file found"), "{}", r[0].1);
    assert_eq!(
        names(&spool.failed_dir().join("lonely")),
        ["lonely.hdr", "lonely.reason"]
    );
    assert!(names(spool.incoming()).is_empty());
}

#[test]
fn a_growing_data_file_restarts_the_grace() {
    let root = tempfile::tempdir().unwrap();
    let options = SpoolOptions {
        grace: Duration::from_secs(1),
        ..quick()
    };
    let mut spool = Spool::open(root.path(), options).unwrap();
    let (header, data) = cube_bytes(1);
    let img = spool.incoming().join("slow.img");
    std::fs::write(spool.incoming().join("slow.hdr"), header).unwrap();
    // 2.3 s of growth, a step every 100 ms: never unchanged for the 1 s grace.
    for n in 1..=23 {
        std::fs::write(&img, &data[..n * 2]).unwrap();
        assert!(spool.claim_next().unwrap().is_none());
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(spool.take_notices().is_empty());
    std::fs::write(&img, &data).unwrap();
    assert_eq!(spool.claim_next().unwrap().expect("whole").id(), "slow");
}

#[test]
fn collisions_in_done_and_failed_get_a_suffix() {
    let root = tempfile::tempdir().unwrap();
    let mut spool = Spool::open(root.path(), quick()).unwrap();
    let mut to = Vec::new();
    for seed in 0..3 {
        let data = deliver(spool.incoming(), "same", seed);
        let c = spool.claim_next().unwrap().unwrap();
        to.push((c.done(&serde_json::Value::Null).unwrap(), data));
    }
    for (k, (dir, data)) in to.iter().enumerate() {
        let want = if k == 0 {
            "same".to_string()
        } else {
            format!("same~{}", k + 1)
        };
        assert_eq!(dir.file_name().unwrap().to_str().unwrap(), want);
        assert_eq!(&std::fs::read(dir.join("same.img")).unwrap(), data);
    }
    deliver(spool.incoming(), "same", 9);
    let f1 = spool.claim_next().unwrap().unwrap().failed("model crashed").unwrap();
    deliver(spool.incoming(), "same", 9);
    let f2 = spool.claim_next().unwrap().unwrap().failed("again").unwrap();
    assert_eq!(
        (f1.file_name().unwrap(), f2.file_name().unwrap()),
        ("same".as_ref(), "same~2".as_ref())
    );
    let reason = std::fs::read_to_string(f2.join("same.reason")).unwrap();
    assert!(reason.starts_with("again\nscene: same\ntime: "), "{reason}");
}

#[test]
fn a_second_scene_of_a_held_id_waits_for_the_first() {
    let root = tempfile::tempdir().unwrap();
    let mut spool = Spool::open(root.path(), quick()).unwrap();
    deliver(spool.incoming(), "dup", 1);
    let first = spool.claim_next().unwrap().unwrap();
    deliver(spool.incoming(), "dup", 2);
    assert!(spool.claim_next().unwrap().is_none(), "the first still holds `dup`");
    // Nothing to do until then: a wait does not return at once (a daemon would spin).
    assert_eq!(spool.wait_ready(Duration::from_millis(100)).unwrap(), Wait::TimedOut);
    first.done(&serde_json::Value::Null).unwrap();
    assert_eq!(spool.wait_ready(Duration::from_secs(5)).unwrap(), Wait::Ready);
    let second = spool.claim_next().unwrap().expect("free now");
    assert_eq!(std::fs::read(second.data_path()).unwrap(), cube_bytes(2).1);
}

#[test]
fn scenes_of_a_dead_owner_are_recovered_first_and_a_dropped_claim_is_handed_out_again() {
    let root = tempfile::tempdir().unwrap();
    let data = {
        let mut a = Spool::open(root.path(), quick()).unwrap();
        let data = deliver(a.incoming(), "kept", 1);
        let mut c = a.claim_next().unwrap().unwrap();
        c.start().unwrap();
        // Dropping the spool and its claim releases the lock as a dying process would.
        drop(c);
        drop(a);
        data
    };
    let mut b = Spool::open(root.path(), quick()).unwrap();
    deliver(b.incoming(), "fresh", 2);
    let c = b.claim_next().unwrap().expect("recovered first");
    assert_eq!((c.id(), c.recovered(), c.attempts()), ("kept", true, 1));
    assert_eq!(std::fs::read(c.data_path()).unwrap(), data);
    // Handed out and dropped before its run started (a queue a crash emptied): not counted.
    drop(c);
    // Started, then dropped while waiting for room downstream: not counted either.
    let mut c = b.claim_next().unwrap().unwrap();
    assert_eq!(c.start().unwrap(), 2);
    c.attempt_mark().waiting(true).unwrap();
    drop(c);
    let mut c = b.claim_next().unwrap().unwrap();
    assert_eq!((c.id(), c.attempts()), ("kept", 1));
    assert_eq!(c.start().unwrap(), 2);
    // Dropped again mid-run: the same spool hands it out once more.
    drop(c);
    let mut c = b.claim_next().unwrap().unwrap();
    assert_eq!((c.id(), c.attempts()), ("kept", 2));
    assert_eq!(c.start().unwrap(), 3);
    drop(c);
    // Three runs started and none finished: failed instead of a fourth.
    let next = b.claim_next().unwrap().unwrap();
    assert_eq!(next.id(), "fresh");
    let r = rejected(&b.take_notices());
    assert_eq!(r.len(), 1);
    assert!(r[0].1.starts_with("started 3 times without finishing"), "{}", r[0].1);
    let reason = std::fs::read_to_string(b.failed_dir().join("kept/kept.reason")).unwrap();
    assert!(reason.contains("attempts: 3"), "{reason}");
    next.done(&serde_json::Value::Null).unwrap();
    drop(b);
    assert!(
        names(&root.path().join("work")).is_empty(),
        "owner folders are removed once empty"
    );
}

#[test]
fn a_claim_cut_between_its_renames_is_finished_by_recovery() {
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("incoming")).unwrap();
    let data = deliver(&root.path().join("incoming"), "half", 4);
    // A dead owner's folder: the data file renamed in, the header not yet; and one cut even
    // before that (an empty scene folder).
    let dead = root.path().join("work/owner-dead");
    std::fs::create_dir_all(dead.join("half")).unwrap();
    std::fs::create_dir_all(dead.join("empty")).unwrap();
    std::fs::rename(root.path().join("incoming/half.img"), dead.join("half/half.img")).unwrap();
    let mut spool = Spool::open(root.path(), quick()).unwrap();
    let c = spool.claim_next().unwrap().expect("recovered");
    assert_eq!((c.id(), c.recovered(), c.attempts()), ("half", true, 0));
    assert_eq!(c.header_path(), dead.join("half/half.hdr"));
    assert_eq!(std::fs::read(c.data_path()).unwrap(), data);
    assert!(names(spool.incoming()).is_empty());
    assert!(!dead.join("empty").exists());
    c.done(&serde_json::Value::Null).unwrap();
    assert!(spool.claim_next().unwrap().is_none());
    assert!(!dead.exists(), "an adopted folder is let go once empty");
}

#[test]
fn a_refusal_cut_midway_is_finished_by_recovery() {
    let root = tempfile::tempdir().unwrap();
    let dead = root.path().join("work/owner-dead/.reject-0");
    std::fs::create_dir_all(&dead).unwrap();
    std::fs::write(dead.join("x_y.reason"), "bad\n").unwrap();
    std::fs::write(dead.join("x y.hdr"), "ENVI\n").unwrap();
    let mut spool = Spool::open(root.path(), quick()).unwrap();
    assert!(spool.claim_next().unwrap().is_none());
    assert_eq!(names(&spool.failed_dir().join("x_y")), ["x y.hdr", "x_y.reason"]);
    assert_eq!(rejected(&spool.take_notices()).len(), 1);
}

#[test]
fn a_stop_handle_ends_a_wait_and_a_delivery_ends_it_too() {
    let root = tempfile::tempdir().unwrap();
    let mut spool = Spool::open(root.path(), SpoolOptions::default()).unwrap();
    let incoming = spool.incoming().to_path_buf();
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        deliver(&incoming, "later", 1);
    });
    let start = Instant::now();
    assert_eq!(spool.wait_ready(Duration::from_secs(20)).unwrap(), Wait::Ready);
    assert!(start.elapsed() < Duration::from_secs(5), "{:?}", start.elapsed());
    t.join().unwrap();
    // Held: a dropped claim would be something to do again.
    let _held = spool.claim_next().unwrap().expect("delivered");
    let stop = spool.stop_handle();
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        stop.stop();
    });
    let start = Instant::now();
    assert_eq!(spool.wait_ready(Duration::from_secs(60)).unwrap(), Wait::Stopped);
    assert!(start.elapsed() < Duration::from_secs(5), "{:?}", start.elapsed());
    t.join().unwrap();
    assert_eq!(spool.wait_ready(Duration::from_secs(60)).unwrap(), Wait::Stopped);
}

#[test]
fn a_young_half_made_owner_folder_is_left_alone_and_an_old_one_removed() {
    let root = tempfile::tempdir().unwrap();
    let staging = root.path().join("work/.new-x");
    std::fs::create_dir_all(&staging).unwrap();
    std::fs::write(staging.join(".lock"), "").unwrap();
    // Another spool may be about to lock it: leave it.
    drop(Spool::open(root.path(), quick()).unwrap());
    assert!(staging.join(".lock").is_file());
    let old = std::time::SystemTime::now() - Duration::from_secs(120);
    std::fs::File::open(&staging).unwrap().set_modified(old).unwrap();
    drop(Spool::open(root.path(), quick()).unwrap());
    assert!(!staging.exists());
}

#[test]
fn a_spool_and_its_claims_can_move_between_threads() {
    fn send<T: Send>() {}
    send::<Spool>();
    send::<Claimed>();
    send::<StopHandle>();
}

#[test]
fn notices_are_capped_at_the_latest() {
    let root = tempfile::tempdir().unwrap();
    let mut spool = Spool::open(root.path(), quick()).unwrap();
    for i in 0..MAX_NOTICES + 5 {
        spool.notice(Notice::Rejected {
            name: i.to_string(),
            to: PathBuf::new(),
            reason: String::new(),
        });
    }
    let n = spool.take_notices();
    assert_eq!(n.len(), MAX_NOTICES);
    assert!(matches!(&n[0], Notice::Rejected { name, .. } if name == "5"));
    assert!(spool.take_notices().is_empty());
}

#[test]
fn after_an_empty_scan_the_wait_looks_again_only_after_a_poll() {
    let root = tempfile::tempdir().unwrap();
    let options = SpoolOptions {
        poll: Duration::from_millis(300),
        ..quick()
    };
    let mut spool = Spool::open(root.path(), options).unwrap();
    assert!(spool.claim_next().unwrap().is_none());
    deliver(spool.incoming(), "a", 1);
    let start = Instant::now();
    assert_eq!(spool.wait_ready(Duration::from_secs(5)).unwrap(), Wait::Ready);
    assert!(start.elapsed() >= Duration::from_millis(300), "{:?}", start.elapsed());
    let _a = spool.claim_next().unwrap().unwrap();
    // After a scan that handed something out, the next wait looks at once.
    deliver(spool.incoming(), "b", 2);
    let start = Instant::now();
    assert_eq!(spool.wait_ready(Duration::from_secs(5)).unwrap(), Wait::Ready);
    assert!(start.elapsed() < Duration::from_millis(300), "{:?}", start.elapsed());
}

#[test]
fn a_run_that_commits_a_segment_forgives_the_runs_before_it() {
    let root = tempfile::tempdir().unwrap();
    let mut spool = Spool::open(root.path(), quick()).unwrap();
    deliver(spool.incoming(), "long", 1);
    let mut c = spool.claim_next().unwrap().unwrap();
    c.start().unwrap();
    // Stopped mid-run (a drain that ran out of time), twice.
    drop(c);
    let mut c = spool.claim_next().unwrap().unwrap();
    assert_eq!(c.start().unwrap(), 2);
    c.attempt_mark().progressed(1).unwrap();
    drop(c);
    let mut c = spool.claim_next().unwrap().unwrap();
    assert_eq!(c.attempts(), 1, "only the run that got further counts");
    assert_eq!(c.start().unwrap(), 2);
    // Committing what an earlier run reached again (a run started over) forgives nothing.
    c.attempt_mark().progressed(1).unwrap();
    drop(c);
    let mut c = spool.claim_next().unwrap().unwrap();
    assert_eq!(c.attempts(), 2);
    assert_eq!(c.start().unwrap(), 3);
    c.attempt_mark().progressed(2).unwrap();
    drop(c);
    assert_eq!(spool.claim_next().unwrap().unwrap().attempts(), 1);
}
