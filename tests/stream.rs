//! Black-box tests of the line stream: the real `hsiedge simulate-sensor` replays a cube to a TCP
//! or Unix socket listener in this process, which reads it with `StreamSource` and compares every
//! line with the same cube's `FileSource` lines.

mod common;

use std::io::Read;
use std::net::TcpListener;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Output, Stdio};
use std::time::{Duration, Instant};

use common::*;
use hsiedge::cube::{DataType, Interleave};
use hsiedge::source::stream::Limits;
use hsiedge::source::{FileSource, LineSource, LineStatus, SourceStats, StreamSource};

/// The real scene, or `None` (printed) when the shared data is absent.
fn salinas() -> Option<PathBuf> {
    data().map(|d| d.join("salinas_a/salinas_a.hdr"))
}

/// Starts `hsiedge simulate-sensor` with `args`.
fn sensor(args: &[&str]) -> Child {
    hsiedge()
        .arg("simulate-sensor")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn hsiedge")
}

/// Polls `accept` until a connection comes or the child exits (then fails with its stderr).
fn accept<S>(child: &mut Child, mut accept: impl FnMut() -> std::io::Result<S>) -> S {
    let start = Instant::now();
    loop {
        match accept() {
            Ok(s) => return s,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => panic!("accept: {e}"),
        }
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
            panic!("simulate-sensor exited ({status}) before connecting: {err}");
        }
        assert!(start.elapsed() < Duration::from_secs(120), "no connection in 120 s");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// What the listener saw of one scene: its id, the status of every line, its stats.
#[derive(Debug)]
struct Seen {
    id: String,
    statuses: Vec<LineStatus>,
    stats: SourceStats,
}

/// Reads every scene of a connection, checking each received line byte for byte against the
/// cube's own lines, until the sensor closes the connection.
fn receive<R: Read + Send>(mut reader: R, peer: &str, cube: &Path, model: Option<&str>) -> Vec<Seen> {
    let mut seen = Vec::new();
    while let Some(mut src) = StreamSource::open(reader, peer, Limits::default()).unwrap() {
        let mut file = FileSource::open(cube, Some(&src.info().id)).unwrap();
        let (got, want) = (src.info().clone(), file.info().clone());
        assert_eq!(
            (
                got.samples,
                got.bands,
                got.data_type,
                got.interleave,
                got.byte_order,
                got.lines
            ),
            (
                want.samples,
                want.bands,
                want.data_type,
                want.interleave,
                want.byte_order,
                want.lines
            )
        );
        assert_eq!(got.header.wavelength, want.header.wavelength);
        assert_eq!(got.model.as_deref(), model);
        let mut line = vec![0u8; got.line_bytes()];
        let mut expected = vec![0u8; got.line_bytes()];
        let mut statuses = Vec::new();
        while let Some(status) = src.next_line(&mut line).unwrap() {
            assert_eq!(file.next_line(&mut expected).unwrap(), Some(LineStatus::Received));
            if status == LineStatus::Received {
                assert!(
                    line == expected,
                    "scene {} line {}: bytes differ",
                    got.id,
                    statuses.len()
                );
            }
            statuses.push(status);
        }
        assert_eq!(
            file.next_line(&mut expected).unwrap(),
            None,
            "lines short of the file's"
        );
        seen.push(Seen {
            id: got.id.clone(),
            statuses,
            stats: src.stats(),
        });
        reader = src.into_inner();
    }
    seen
}

/// Waits for the sensor and asserts it succeeded, returning its stderr.
fn finished(child: Child) -> String {
    let out: Output = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "simulate-sensor failed ({}): {err}", out.status);
    assert!(!err.contains("warning"), "{err}");
    err
}

#[test]
fn a_real_scene_over_tcp_arrives_byte_for_byte() {
    let Some(scene) = salinas() else { return };
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = format!("tcp:{}", listener.local_addr().unwrap());
    let mut child = sensor(&[
        "--scene",
        scene.to_str().unwrap(),
        "--rate",
        "0",
        "--connect",
        &addr,
        "--model",
        "cnn3d_salinas_a",
    ]);
    let (conn, peer) = accept(&mut child, || listener.accept());
    conn.set_nonblocking(false).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let seen = receive(conn, &format!("tcp {peer}"), &scene, Some("cnn3d_salinas_a"));
    let err = finished(child);
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].id, "salinas_a");
    assert_eq!(seen[0].statuses, vec![LineStatus::Received; 83]);
    assert_eq!(
        seen[0].stats,
        SourceStats {
            lines: 83,
            ..SourceStats::default()
        }
    );
    assert!(
        err.contains(&format!(
            "sent 83 lines (1 scene(s) of 83; 83 line messages, 0 dropped, 0 duplicated, 0 swapped) to {addr} in "
        )),
        "{err}"
    );
}

#[test]
fn faults_over_a_unix_socket_come_out_as_missing_lines_and_dropped_repeats() {
    let Some(scene) = salinas() else { return };
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("lines.sock");
    let listener = UnixListener::bind(&sock).unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = format!("unix:{}", sock.display());
    let mut child = sensor(&[
        "--scene",
        scene.to_str().unwrap(),
        "--rate",
        "0",
        "--connect",
        &addr,
        "--scene-id",
        "pass",
        "--drop",
        "5,9,82",
        "--duplicate",
        "7",
        "--swap",
        "20",
        "--repeat",
        "2",
    ]);
    let (conn, _) = accept(&mut child, || listener.accept());
    conn.set_nonblocking(false).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let seen = receive(conn, &sock.display().to_string(), &scene, None);
    let err = finished(child);
    assert_eq!(
        seen.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(),
        ["pass-1", "pass-2"]
    );
    for s in &seen {
        let missing: Vec<usize> = (0..s.statuses.len())
            .filter(|&i| s.statuses[i] == LineStatus::Missing)
            .collect();
        // Line 20 went after 21: its place was reported missing and the late copy dropped.
        assert_eq!(missing, [5, 9, 20, 82], "{}", s.id);
        assert_eq!(
            s.stats,
            SourceStats {
                lines: 83,
                missing: vec![[5, 5], [9, 9], [20, 20], [82, 82]],
                duplicates: 2,
            }
        );
    }
    assert!(
        err.contains("sent 166 lines (2 scene(s) of 83; 162 line messages, 6 dropped, 2 duplicated, 2 swapped)"),
        "{err}"
    );
}

#[test]
fn lines_are_paced_at_the_rate_asked() {
    let Some(scene) = salinas() else { return };
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = format!("tcp:{}", listener.local_addr().unwrap());
    let rate = 100.0;
    let start = Instant::now();
    let mut child = sensor(&["--scene", scene.to_str().unwrap(), "--rate", "100", "--connect", &addr]);
    let (conn, peer) = accept(&mut child, || listener.accept());
    conn.set_nonblocking(false).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let seen = receive(conn, &format!("tcp {peer}"), &scene, None);
    let received = start.elapsed().as_secs_f64();
    let err = finished(child);
    assert_eq!(seen[0].stats.lines, 83);
    // The last line leaves when its line time ends: 83 lines take at least 0.83 s. No upper
    // bound: the machine may be busy.
    let floor = 83.0 / rate;
    assert!(
        received >= floor * 0.99,
        "all lines in {received:.3} s, under {floor} s"
    );
    let elapsed: f64 = err
        .split(" in ")
        .nth(1)
        .and_then(|s| s.split(" s ").next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no elapsed time in {err}"));
    assert!(elapsed >= floor * 0.99, "reported {elapsed} s: {err}");
}

#[test]
fn a_bsq_cube_streams_as_bil() {
    let dir = tempfile::tempdir().unwrap();
    let (lines, samples, bands) = (5usize, 4usize, 3usize);
    let v = |l: usize, b: usize, s: usize| (100 * l + 10 * b + s) as u16;
    let mut bytes = Vec::new();
    for b in 0..bands {
        for l in 0..lines {
            for s in 0..samples {
                bytes.extend(v(l, b, s).to_le_bytes());
            }
        }
    }
    std::fs::write(dir.path().join("cube.img"), bytes).unwrap();
    let hdr = dir.path().join("cube.hdr");
    std::fs::write(
        &hdr,
        format!(
            "ENVI\nsamples = {samples}\nlines = {lines}\nbands = {bands}\nheader offset = 0\n\
             data type = 12\ninterleave = bsq\nbyte order = 0\nwavelength = {{400, 500, 600.5}}\n"
        ),
    )
    .unwrap();
    let sock = dir.path().join("s.sock");
    let listener = UnixListener::bind(&sock).unwrap();
    listener.set_nonblocking(true).unwrap();
    let mut child = sensor(&[
        "--scene",
        hdr.to_str().unwrap(),
        "--rate",
        "0",
        "--connect",
        &format!("unix:{}", sock.display()),
    ]);
    let (conn, _) = accept(&mut child, || listener.accept());
    conn.set_nonblocking(false).unwrap();
    let mut src = StreamSource::open(conn, "sock", Limits::default()).unwrap().unwrap();
    let info = src.info().clone();
    assert_eq!(
        (info.interleave, info.data_type, info.lines),
        (Interleave::Bil, DataType::U16, Some(lines))
    );
    assert_eq!(info.header.wavelength, [400.0, 500.0, 600.5]);
    let mut line = vec![0u8; info.line_bytes()];
    for l in 0..lines {
        assert_eq!(src.next_line(&mut line).unwrap(), Some(LineStatus::Received));
        let got: Vec<u16> = line.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect();
        let want: Vec<u16> = (0..bands).flat_map(|b| (0..samples).map(move |s| v(l, b, s))).collect();
        assert_eq!(got, want, "line {l}");
    }
    assert_eq!(src.next_line(&mut line).unwrap(), None);
    drop(src);
    finished(child);
}

#[test]
fn a_receiver_that_refuses_the_stream_fails_the_sensor_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let hdr = write_cube(dir.path(), "scene", 400, 64, 32, |l, b, s| (l + b + s) as f32);
    let sock = dir.path().join("s.sock");
    let listener = UnixListener::bind(&sock).unwrap();
    listener.set_nonblocking(true).unwrap();
    let mut child = sensor(&[
        "--scene",
        hdr.to_str().unwrap(),
        "--rate",
        "0",
        "--connect",
        &format!("unix:{}", sock.display()),
    ]);
    let (conn, _) = accept(&mut child, || listener.accept());
    conn.set_nonblocking(false).unwrap();
    // As a daemon refusing the scene does: read its header, then close with the lines unread.
    let src = StreamSource::open(&conn, "sock", Limits::default()).unwrap().unwrap();
    assert_eq!(src.info().id, "scene");
    drop(src);
    drop(conn);
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("the receiver closed the connection"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn bad_options_fail_before_connecting() {
    let dir = tempfile::tempdir().unwrap();
    let hdr = write_cube(dir.path(), "scene", 10, 4, 3, |l, b, s| (l + b + s) as f32);
    let hdr = hdr.to_str().unwrap();
    let nowhere = format!("unix:{}", dir.path().join("none.sock").display());
    for (args, want) in [
        (vec!["--scene-id", "../x"], "scene id `../x`: starts with `.`"),
        (vec!["--scene-id", "a/b"], "scene id `a/b`: holds a path separator"),
        (vec!["--model", "../m"], "field `model`"),
        (vec!["--drop", "10"], "--drop 10: the scene has 10 lines"),
    ] {
        let mut all = vec!["simulate-sensor", "--scene", hdr, "--connect", &nowhere, "--rate", "0"];
        all.extend(args);
        let err = fails(&all);
        assert!(err.contains(want), "{all:?}: {err}");
        assert!(!err.contains("connecting"), "{all:?}: {err}");
    }
    // A rate no timer holds is a usage error (exit 2) naming the flag and the value.
    for bad in ["-1", "1e-300", "nan"] {
        let rate = format!("--rate={bad}");
        let o = common::run(&["simulate-sensor", "--scene", hdr, "--connect", &nowhere, &rate]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert!(
            err.contains("--rate") && err.contains(bad) && !err.contains("connecting"),
            "{err}"
        );
    }
    let err = fails(&["simulate-sensor", "--scene", hdr, "--rate", "0", "--connect", &nowhere]);
    assert!(err.contains(&format!("connecting to {nowhere}")), "{err}");
    let err = fails(&[
        "simulate-sensor",
        "--scene",
        hdr,
        "--rate",
        "0",
        "--connect",
        "somewhere",
    ]);
    assert!(
        err.contains("address `somewhere`: expected tcp:HOST:PORT, unix:PATH or HOST:PORT"),
        "{err}"
    );
}
