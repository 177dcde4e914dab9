//! The queue's unit tests: numbering, acks, reopening, crash tails, the bound, duplicates, moves.

use super::*;

fn entry(scene: &str, segment: u64) -> Entry {
    Entry {
        seq: 0,
        scene_id: scene.into(),
        scene_folder: format!("/o/{scene}").into(),
        segment,
        folder: format!("/o/{scene}/seg-{segment:06}").into(),
        first_line: segment * 8,
        lines: 8,
        samples: 4,
        last: false,
        model: "m".into(),
        classes: vec!["a".into(), "b".into()],
        colours: vec![[1, 2, 3], [4, 5, 6]],
        map_info: None,
        coordinate_system: None,
        digest: segment,
    }
}

fn seqs(p: Result<Vec<Pushed>, DeliveryError>) -> Vec<u64> {
    p.unwrap().iter().map(|p| p.seq).collect()
}

fn sinks() -> Vec<String> {
    vec!["socket".into(), "mqtt".into()]
}

#[test]
fn entries_leave_only_when_every_sink_acked_and_seqs_survive_reopening() {
    let t = tempfile::tempdir().unwrap();
    let q = Queue::open(t.path(), sinks(), 10).unwrap();
    assert_eq!(seqs(q.push(vec![entry("a", 0), entry("a", 1)])), vec![0, 1]);
    q.ack(0, "socket").unwrap();
    assert_eq!(q.len(), 2);
    assert_eq!(q.next_for("socket", Duration::ZERO).unwrap().seq, 1);
    assert_eq!(q.next_for("mqtt", Duration::ZERO).unwrap().seq, 0);
    q.ack(0, "mqtt").unwrap();
    assert_eq!(q.len(), 1);
    q.ack(1, "socket").unwrap();
    drop(q);

    // Reopened: the entry not yet acked by every sink is there with its number and its ack.
    let q = Queue::open(t.path(), sinks(), 10).unwrap();
    assert_eq!(q.len(), 1);
    assert!(q.next_for("socket", Duration::ZERO).is_none());
    let e = q.next_for("mqtt", Duration::ZERO).unwrap();
    assert_eq!((e.seq, e.segment), (1, 1));
    q.ack(1, "mqtt").unwrap();
    assert!(q.is_empty());
    drop(q);
    // Emptied and compacted: numbering goes on, never reusing a sequence number.
    let q = Queue::open(t.path(), sinks(), 10).unwrap();
    assert_eq!(seqs(q.push(vec![entry("b", 0)])), vec![2]);
    let len = std::fs::metadata(t.path().join(LOG)).unwrap().len();
    assert!(len < 400, "compacted log of {len} bytes");
}

#[test]
fn a_segment_queued_again_keeps_its_first_sequence_number_even_once_delivered() {
    let t = tempfile::tempdir().unwrap();
    let q = Queue::open(t.path(), vec!["mqtt".into()], 10).unwrap();
    let with = |segment, digest| Entry {
        digest,
        ..entry("a", segment)
    };
    assert_eq!(seqs(q.push(vec![with(0, 7), with(1, 8)])), vec![0, 1]);
    // The same scene run again: identical segments keep their numbers and are not queued
    // twice; a segment whose maps differ is a new one.
    let again = q.push(vec![with(0, 7), with(1, 9)]).unwrap();
    assert_eq!(again, vec![Pushed { seq: 0, new: false }, Pushed { seq: 2, new: true }]);
    assert_eq!(q.len(), 3);
    for s in 0..3 {
        q.ack(s, "mqtt").unwrap();
    }
    drop(q);
    // Delivered, compacted and reopened: still recognised.
    let q = Queue::open(t.path(), vec!["mqtt".into()], 10).unwrap();
    assert!(q.is_empty());
    assert_eq!(q.push(vec![with(1, 8)]).unwrap(), vec![Pushed { seq: 1, new: false }]);
    assert!(q.is_empty());
    assert_eq!(seqs(q.push(vec![with(1, 10)])), vec![3]);
}

#[test]
fn segments_of_a_scene_set_aside_are_read_from_where_it_went_after_reopening() {
    let t = tempfile::tempdir().unwrap();
    let q = Queue::open(t.path(), sinks(), 10).unwrap();
    q.push(vec![entry("a", 0)]).unwrap();
    // Not the last segment: the scene did not finish.
    assert!(!q.holds_scene(Path::new("/o/a")));
    q.relocate(Path::new("/o/a"), Path::new("/o/.failed/a")).unwrap();
    drop(q);
    let q = Queue::open(t.path(), sinks(), 10).unwrap();
    let e = q.next_for("mqtt", Duration::ZERO).unwrap();
    assert_eq!(e.folder, Path::new("/o/.failed/a/seg-000000"));
    assert_eq!(e.scene_folder, Path::new("/o/.failed/a"));
}

#[test]
fn a_record_cut_short_by_a_crash_is_dropped_and_the_rest_kept() {
    let t = tempfile::tempdir().unwrap();
    let q = Queue::open(t.path(), sinks(), 10).unwrap();
    q.push(vec![entry("a", 0)]).unwrap();
    q.push(vec![entry("a", 1)]).unwrap();
    drop(q);
    let path = t.path().join(LOG);
    let full = std::fs::read(&path).unwrap();
    std::fs::write(&path, &full[..full.len() - 5]).unwrap();
    let q = Queue::open(t.path(), sinks(), 10).unwrap();
    assert_eq!(q.len(), 1);
    // The cut record's number was never handed out, so it is given again.
    assert_eq!(seqs(q.push(vec![entry("a", 1)])), vec![1]);
    drop(q);
    // Garbage in the middle is refused, naming the file and offset.
    let mut bad = std::fs::read(&path).unwrap();
    bad[5] ^= 0xff;
    bad[6] ^= 0xff;
    std::fs::write(&path, &bad).unwrap();
    let err = Queue::open(t.path(), sinks(), 10).unwrap_err().to_string();
    assert!(err.contains(LOG) && err.contains("offset"), "{err}");
}

#[test]
fn a_full_queue_makes_intake_wait_until_a_sink_acks_or_a_drain_lifts_the_bound() {
    let t = tempfile::tempdir().unwrap();
    let q = std::sync::Arc::new(Queue::open(t.path(), vec!["socket".into()], 2).unwrap());
    q.push(vec![entry("a", 0), entry("a", 1)]).unwrap();
    assert!(q.full());
    assert!(!q.wait_for_room(Duration::from_millis(20)));
    let q2 = q.clone();
    let acker = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        q2.ack(0, "socket").unwrap();
    });
    assert!(q.wait_for_room(Duration::from_secs(10)));
    acker.join().unwrap();
    q.push(vec![entry("a", 2)]).unwrap();
    assert!(q.full());
    q.lift_bound();
    assert!(!q.full() && q.wait_for_room(Duration::ZERO));
    let s = q.status();
    assert_eq!((s.queued, s.pending["socket"]), (2, 2));
    q.push(vec![Entry {
        last: true,
        ..entry("a", 3)
    }])
    .unwrap();
    assert!(q.holds_scene(Path::new("/o/a")) && !q.holds_scene(Path::new("/o/b")));
}

#[test]
fn pushing_within_the_bound_waits_for_room_so_the_queue_never_holds_more_than_its_max() {
    let t = tempfile::tempdir().unwrap();
    let q = std::sync::Arc::new(Queue::open(t.path(), sinks(), 2).unwrap());
    let within = |q: &Queue, e: Entry, ms| q.push_within_bound(vec![e], Duration::from_millis(ms)).unwrap();
    assert!(within(&q, entry("a", 0), 0).is_some());
    assert!(within(&q, entry("a", 1), 0).is_some());
    // Full: a new segment gets no room, and the queue stays at its bound.
    assert!(within(&q, entry("a", 2), 50).is_none());
    assert_eq!(q.len(), 2);
    // A segment queued before takes no room: it keeps its sequence number.
    let again = within(&q, entry("a", 1), 0).unwrap();
    assert_eq!((again[0].seq, again[0].new), (1, false));
    // A pusher waiting is woken by the ack that makes room, and only then pushes.
    let waiting = {
        let q = q.clone();
        std::thread::spawn(move || q.push_within_bound(vec![entry("a", 2)], Duration::from_secs(30)))
    };
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(q.len(), 2);
    q.ack(0, "socket").unwrap();
    assert_eq!(q.len(), 2, "one sink's ack leaves the entry queued");
    q.ack(0, "mqtt").unwrap();
    let pushed = waiting.join().unwrap().unwrap().unwrap();
    assert_eq!(pushed[0].seq, 2);
    assert_eq!(q.len(), 2);
    // A drain lifts the bound: accepted scenes finish.
    q.lift_bound();
    assert!(within(&q, entry("a", 3), 0).is_some());
    assert_eq!(q.len(), 3);
}

#[test]
fn a_torn_append_is_cut_back_before_the_next_record() {
    let t = tempfile::tempdir().unwrap();
    let q = Queue::open(t.path(), sinks(), 10).unwrap();
    assert_eq!(seqs(q.push(vec![entry("a", 0)])), vec![0]);
    // What a full disk leaves: part of a record after the whole ones, and a cut that failed.
    {
        let mut inner = q.lock();
        let half = frame(&Record::Next { seq: 99 });
        inner.file.write_all(&half[..half.len() - 2]).unwrap();
        inner.torn = true;
    }
    assert_eq!(seqs(q.push(vec![entry("a", 1)])), vec![1]);
    drop(q);
    let q = Queue::open(t.path(), sinks(), 10).unwrap();
    assert_eq!(q.len(), 2);
    assert_eq!(seqs(q.push(vec![entry("a", 2)])), vec![2]);
}

#[test]
fn a_failed_append_leaves_no_bytes_and_the_next_one_lands() {
    let t = tempfile::tempdir().unwrap();
    let q = Queue::open(t.path(), sinks(), 10).unwrap();
    assert_eq!(seqs(q.push(vec![entry("a", 0)])), vec![0]);
    let writable = {
        let mut inner = q.lock();
        // A handle that cannot write: the append fails and so does the cut, which then waits
        // for the next append.
        let read_only = File::open(t.path().join(LOG)).unwrap();
        std::mem::replace(&mut inner.file, read_only)
    };
    assert!(q.push(vec![entry("a", 1)]).is_err());
    {
        let mut inner = q.lock();
        assert!(inner.torn);
        inner.file = writable;
    }
    assert_eq!(seqs(q.push(vec![entry("a", 1)])), vec![1]);
    drop(q);
    assert_eq!(Queue::open(t.path(), sinks(), 10).unwrap().len(), 2);
}
