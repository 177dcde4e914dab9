//! The receiver's policy and refusals, on streams written by the sender or by hand.

use std::io::Cursor;

use super::scene::SceneHeader;
use super::wire::{self, Limits};
use super::{Faults, SensorStream, StreamSource};
use crate::source::{LineSource, LineStatus, SourceError};

const PEER: &str = "tcp 127.0.0.1:5555";
/// 3 samples x 2 bands of u16.
const LINE: usize = 12;

fn header(id: &str, lines: Option<u64>) -> SceneHeader {
    SceneHeader {
        scene_id: id.into(),
        samples: 3,
        bands: 2,
        data_type: 12,
        interleave: "bil".into(),
        byte_order: 0,
        lines,
        wavelengths: None,
        model: None,
        version: 1,
    }
}

/// One message of a hand-made stream.
#[derive(Clone)]
enum M {
    Scene(&'static str),
    /// A line of the right size whose bytes are all its number.
    L(u64),
    End(u64),
    Raw(Vec<u8>),
}

fn bytes(msgs: &[M]) -> Vec<u8> {
    let (mut out, mut buf) = (Vec::new(), Vec::new());
    for m in msgs {
        match m {
            M::Scene(id) => wire::encode_scene(&header(id, None), &mut buf),
            M::L(seq) => wire::encode_line(*seq, &[*seq as u8; LINE], &mut buf),
            M::End(n) => wire::encode_end(*n, &mut buf),
            M::Raw(b) => buf.clone_from(b),
        }
        out.extend_from_slice(&buf);
    }
    out
}

fn open(data: Vec<u8>, limits: Limits) -> Result<Option<StreamSource<Cursor<Vec<u8>>>>, SourceError> {
    StreamSource::open(Cursor::new(data), PEER, limits)
}

/// Drains a scene: `R` for a received line (checked against its number), `M` for a missing one
/// (checked to leave the buffer alone), and the error when one ends it.
fn drain(src: &mut StreamSource<Cursor<Vec<u8>>>) -> (String, Option<String>) {
    let mut got = String::new();
    let mut line = [0xeeu8; LINE];
    let mut n = 0u64;
    loop {
        line.fill(0xee);
        match src.next_line(&mut line) {
            Ok(Some(LineStatus::Received)) => {
                assert_eq!(line, [n as u8; LINE], "line {n}");
                got.push('R');
            }
            Ok(Some(LineStatus::Missing)) => {
                assert_eq!(line, [0xee; LINE], "a missing line {n} is left alone");
                got.push('M');
            }
            Ok(None) => {
                assert_eq!(src.next_line(&mut line).unwrap(), None, "None stays None");
                return (got, None);
            }
            Err(e) => return (got, Some(e.to_string())),
        }
        n += 1;
    }
}

#[test]
fn gaps_are_filled_and_flagged_and_repeats_dropped() {
    use M::{End, L};
    /// Lines sent, what comes out, missing ranges, duplicates.
    type Case = (Vec<M>, &'static str, Vec<[u64; 2]>, u64);
    let cases: Vec<Case> = vec![
        (vec![L(0), L(1), L(2), End(3)], "RRR", vec![], 0),
        (vec![L(0), L(3), End(4)], "RMMR", vec![[1, 2]], 0),
        (vec![L(2), End(3)], "MMR", vec![[0, 1]], 0),
        (vec![L(0), L(1), L(1), L(2), End(3)], "RRR", vec![], 1),
        (vec![L(0), L(0), L(0), End(1)], "R", vec![], 2),
        // A swapped pair: the early line leaves its predecessor missing; that one, late, is dropped.
        (vec![L(0), L(2), L(1), L(3), End(4)], "RMRR", vec![[1, 1]], 1),
        (vec![L(0), End(3)], "RMM", vec![[1, 2]], 0),
        (
            vec![L(1), L(3), L(5), End(7)],
            "MRMRMRM",
            vec![[0, 0], [2, 2], [4, 4], [6, 6]],
            0,
        ),
        (vec![End(0)], "", vec![], 0),
        (vec![End(2)], "MM", vec![[0, 1]], 0),
    ];
    for (i, (sent, want, missing, duplicates)) in cases.into_iter().enumerate() {
        let mut msgs = vec![M::Scene("s")];
        msgs.extend(sent);
        let mut src = open(bytes(&msgs), Limits::default()).unwrap().unwrap();
        let (got, err) = drain(&mut src);
        assert_eq!((got.as_str(), err), (want, None), "case {i}");
        let stats = src.stats();
        assert_eq!(stats.lines, want.len() as u64, "case {i}");
        assert_eq!(stats.missing, missing, "case {i}");
        assert_eq!(stats.duplicates, duplicates, "case {i}");
        assert!(src.ended());
    }
}

#[test]
fn broken_scenes_end_the_connection_naming_peer_scene_and_last_line() {
    use M::{End, L, Raw, Scene};
    let mut trailing = bytes(&[L(1)]);
    trailing.push(0xf6);
    let len = (trailing.len() - 4) as u32;
    trailing[..4].copy_from_slice(&len.to_be_bytes());
    let mut short_line = Vec::new();
    wire::encode_line(1, &[1; LINE - 1], &mut short_line);
    let mut long_line = Vec::new();
    wire::encode_line(1, &[1; LINE + 1], &mut long_line);
    let unknown = {
        let mut body = Vec::new();
        let v = ciborium::Value::Map(vec![("type".into(), "pause".into())]);
        ciborium::into_writer(&v, &mut body).unwrap();
        let mut f = (body.len() as u32).to_be_bytes().to_vec();
        f.extend(body);
        f
    };
    let limits = Limits {
        max_gap: 10,
        ..Limits::default()
    };
    let over = (limits.max_header_bytes + 1) as u32;
    let cases: Vec<(Vec<M>, &str, &str)> = vec![
        (
            vec![L(0), L(1)],
            "RR",
            "closed before the end message (last line received: 1)",
        ),
        (vec![], "", "closed before the end message (no line received)"),
        (
            vec![L(0), Raw(vec![0, 0, 0, 40, 1, 2])],
            "R",
            "closed inside a message (6 of its 44 bytes arrived) (last line received: 0)",
        ),
        (vec![L(0), Raw(vec![0, 0])], "R", "inside a length prefix"),
        (
            vec![L(0), Raw(over.to_be_bytes().to_vec())],
            "R",
            "a message of 65537 bytes, more than the 65536 allowed here",
        ),
        (
            vec![L(0), Raw(short_line)],
            "R",
            "line 1 has 11 bytes, not the 12 of 3 samples x 2 bands of U16",
        ),
        (vec![L(0), Raw(long_line)], "R", "line 1 has 13 bytes"),
        (vec![L(0), Raw(trailing)], "R", "1 bytes after the line message"),
        (vec![L(0), Raw(unknown)], "R", "unknown type `pause`"),
        (
            vec![L(0), Scene("next")],
            "R",
            "a scene message (`next`) before this scene's end message",
        ),
        (vec![L(0), L(1), End(1)], "RR", "the end message says 1 lines after 2"),
        (
            vec![L(0), L(12)],
            "R",
            "line 12 would leave lines 1 to 11 missing, more than the 10 allowed",
        ),
        (
            vec![L(0), End(12)],
            "R",
            "an end message of 12 lines would leave lines 1 to 11 missing",
        ),
        (vec![L(0), L(11), End(12)], "RMMMMMMMMMMR", ""),
    ];
    for (sent, want, err) in cases {
        let mut msgs = vec![Scene("s")];
        msgs.extend(sent);
        let mut src = open(bytes(&msgs), limits).unwrap().unwrap();
        let (got, e) = drain(&mut src);
        assert_eq!(got, want, "{err}");
        match e {
            Some(e) => {
                assert!(!err.is_empty(), "unexpected error {e}");
                assert!(e.starts_with(&format!("{PEER}: scene `s`: ")), "{e}");
                assert!(e.contains(err), "want {err:?}, got {e}");
            }
            None => assert!(err.is_empty(), "no error, want {err}"),
        }
    }
}

#[test]
fn a_scene_that_announced_its_lines_is_held_to_them() {
    for (sent, err) in [
        (vec![M::L(0), M::L(3)], "line 3 of a scene announced with 3 lines"),
        (
            vec![M::L(0), M::End(4)],
            "the end message says 4 lines; the scene message said 3",
        ),
        (
            vec![M::L(0), M::End(2)],
            "the end message says 2 lines; the scene message said 3",
        ),
    ] {
        let mut data = Vec::new();
        wire::encode_scene(&header("s", Some(3)), &mut data);
        data.extend(bytes(&sent));
        let mut src = open(data, Limits::default()).unwrap().unwrap();
        assert_eq!(src.info().lines, Some(3));
        assert_eq!(src.info().header.lines, 3);
        let (_, e) = drain(&mut src);
        let e = e.unwrap();
        assert!(e.contains(err), "{e}");
    }
}

#[test]
fn a_connection_that_does_not_start_with_a_good_scene_is_refused() {
    let bad_id = |id: &str| {
        let mut b = Vec::new();
        wire::encode_scene(&header(id, None), &mut b);
        b
    };
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (bad_id("../x"), "scene id `../x`: starts with `.`"),
        (bad_id("a/b"), "scene id `a/b`: holds a path separator"),
        (bad_id(".."), "scene id `..`: starts with `.`"),
        (
            bytes(&[M::L(0)]),
            "a message of type `line` where a scene message must come first",
        ),
        (bytes(&[M::End(0)]), "a message of type `end` where"),
        (
            vec![0, 1, 0, 1],
            "a message of 65537 bytes, more than the 65536 allowed here",
        ),
        (
            vec![0, 0, 0, 2, 0xa0],
            "closed inside a message (5 of its 6 bytes arrived)",
        ),
        (vec![0, 0, 0, 1, 0xff], "not a stream message"),
    ];
    for (data, err) in cases {
        let e = open(data, Limits::default()).unwrap_err().to_string();
        assert!(e.contains(err), "want {err:?}, got {e}");
    }
    assert!(
        open(Vec::new(), Limits::default()).unwrap().is_none(),
        "a clean close is no error"
    );
}

#[test]
fn several_scenes_follow_one_another_on_one_connection() {
    use M::{End, L, Scene};
    let data = bytes(&[
        Scene("first"),
        L(0),
        L(1),
        End(2),
        Scene("second"),
        L(0),
        L(2),
        End(3),
        Scene("third"),
        End(0),
    ]);
    let mut reader = Cursor::new(data);
    let mut seen = Vec::new();
    while let Some(mut src) = StreamSource::open(reader, PEER, Limits::default()).unwrap() {
        let (got, e) = drain(&mut src);
        assert_eq!(e, None);
        seen.push((src.info().id.clone(), got, src.stats().missing));
        reader = src.into_inner();
    }
    assert_eq!(
        seen,
        [
            ("first".to_string(), "RR".to_string(), vec![]),
            ("second".to_string(), "RMR".to_string(), vec![[1, 1]]),
            ("third".to_string(), String::new(), vec![]),
        ]
    );
}

#[test]
fn the_sender_injects_its_faults_and_the_receiver_sees_them() {
    let faults = Faults {
        drop: [2, 6].into(),
        duplicate: [4].into(),
        swap: [8].into(),
    };
    let mut tx = SensorStream::new(Vec::new(), faults);
    for scene in ["a", "b"] {
        tx.begin(&header(scene, Some(10))).unwrap();
        for seq in 0..10u64 {
            tx.line(seq, &[seq as u8; LINE]).unwrap();
        }
        tx.end(10).unwrap();
    }
    let s = tx.stats();
    assert_eq!(
        (s.scenes, s.line_messages, s.dropped, s.duplicated, s.swapped),
        (2, 18, 4, 2, 2)
    );
    let mut reader = Cursor::new(tx.into_inner());
    for scene in ["a", "b"] {
        let mut src = StreamSource::open(reader, PEER, Limits::default()).unwrap().unwrap();
        assert_eq!(src.info().id, scene);
        let (got, e) = drain(&mut src);
        // Line 8 went after 9: it is reported missing and its late copy dropped.
        assert_eq!((got.as_str(), e), ("RRMRRRMRMR", None));
        let st = src.stats();
        assert_eq!(st.missing, [[2, 2], [6, 6], [8, 8]]);
        assert_eq!(st.duplicates, 2);
        reader = src.into_inner();
    }
    assert!(StreamSource::open(reader, PEER, Limits::default()).unwrap().is_none());
}

#[test]
fn a_swapped_last_line_goes_out_before_the_end() {
    let faults = Faults {
        swap: [2].into(),
        ..Faults::default()
    };
    let mut tx = SensorStream::new(Vec::new(), faults);
    tx.begin(&header("s", None)).unwrap();
    for seq in 0..3u64 {
        tx.line(seq, &[seq as u8; LINE]).unwrap();
    }
    tx.end(3).unwrap();
    assert_eq!(tx.stats().swapped, 0, "no successor to swap with");
    let mut src = open(tx.into_inner(), Limits::default()).unwrap().unwrap();
    assert_eq!(drain(&mut src), ("RRR".to_string(), None));
}
