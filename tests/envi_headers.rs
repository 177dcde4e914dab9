//! Black-box tests of ENVI headers and data files as other tools write them: Latin-1 free text,
//! CR-only and CRLF line endings, repeated fields, trailing data, and data paths that are not
//! regular files. `inspect` and `classify` (with the committed tiny fixture model) are run on
//! small generated scenes.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::*;

fn tiny() -> PathBuf {
    root().join("models/fixtures/tiny/manifest.json")
}

/// A 4-band cube of 13 x 17 pixels, `dir/scene.hdr`, the same scene as tests/cli.rs classifies.
fn tiny_cube(dir: &Path) -> PathBuf {
    write_cube(dir, "scene", 13, 17, 4, |l, b, s| {
        100.0 * (b + 1) as f32 + 7.0 * ((l * 3 + s * 5 + b) % 11) as f32 - 30.0
    })
}

/// Replaces `scene`'s header with `bytes`.
fn set_header(scene: &Path, bytes: &[u8]) {
    std::fs::write(scene, bytes).unwrap();
}

/// The header `write_cube` wrote, with `from` replaced by `to` (bytes, so they may be Latin-1).
fn edited_header(scene: &Path, from: &str, to: &[u8]) -> Vec<u8> {
    let text = std::fs::read_to_string(scene).unwrap();
    let at = text.find(from).unwrap_or_else(|| panic!("`{from}` not in {text}"));
    let mut bytes = text.as_bytes()[..at].to_vec();
    bytes.extend_from_slice(to);
    bytes.extend_from_slice(&text.as_bytes()[at + from.len()..]);
    bytes
}

/// `bytes` with each `\n` replaced by `ending`.
fn with_endings(bytes: &[u8], ending: &[u8]) -> Vec<u8> {
    bytes
        .iter()
        .flat_map(|&b| if b == b'\n' { ending.to_vec() } else { vec![b] })
        .collect()
}

/// The arguments of `hsiedge classify` of `scene` with the tiny model into `out`.
fn classify_args(scene: &Path, out: &Path) -> Vec<String> {
    let mut args = vec!["classify".to_string(), path_str(scene), "--model".into()];
    args.extend([path_str(&tiny()), "--out".into(), path_str(out), "--json".into()]);
    args
}

fn path_str(p: &Path) -> String {
    p.to_str().unwrap().to_string()
}

fn strs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

/// Runs `hsiedge` and asserts success, returning (stdout, stderr).
fn ok_with_stderr(args: &[&str]) -> (String, String) {
    let out = run(args);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "hsiedge {args:?} failed ({}):\n{err}", out.status);
    (String::from_utf8_lossy(&out.stdout).into_owned(), err)
}

/// Runs `hsiedge`, killing it and failing the test if it has not exited within 30 s (a blocked
/// read of a FIFO).
fn run_within_30s(args: &[&str]) -> Output {
    let mut child = hsiedge()
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn hsiedge");
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(30) {
            child.kill().unwrap();
            panic!("hsiedge {args:?} still running after 30 s: it blocked on the FIFO");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

fn mkfifo(path: &Path) {
    let status = Command::new("mkfifo").arg(path).status().expect("run mkfifo");
    assert!(status.success(), "mkfifo {}", path.display());
}

#[test]
fn inspect_reads_latin1_text_under_any_line_ending_and_warns_with_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let scene = tiny_cube(dir.path());
    // "Café" in ISO-8859-1.
    let latin1 = edited_header(&scene, "description = {test cube}", b"description = {Caf\xE9}");
    for (name, ending) in [("LF", "\n"), ("CRLF", "\r\n"), ("CR", "\r")] {
        set_header(&scene, &with_endings(&latin1, ending.as_bytes()));
        let (stdout, stderr) = ok_with_stderr(&["inspect", scene.to_str().unwrap()]);
        let h = summary(&stdout);
        assert_eq!(h["description"], "Caf\u{FFFD}", "{name}: {h}");
        assert_eq!(
            (h["samples"].as_u64(), h["lines"].as_u64(), h["bands"].as_u64()),
            (Some(17), Some(13), Some(4))
        );
        assert_eq!(h["interleave"], "bil", "{name}");
        assert_eq!(
            stderr.trim_end(),
            format!(
                "hsiedge: warning: {}: line 2: `description` holds bytes that are not UTF-8 (the first: \
                 0xE9 at column 19); read with U+FFFD in their place",
                scene.display()
            ),
            "{name}"
        );
    }
}

#[test]
fn a_scene_written_by_other_tools_classifies_exactly_like_the_clean_one() {
    let dir = tempfile::tempdir().unwrap();
    let clean_dir = dir.path().join("clean");
    let wild_dir = dir.path().join("wild");
    std::fs::create_dir_all(&clean_dir).unwrap();
    std::fs::create_dir_all(&wild_dir).unwrap();
    let clean = tiny_cube(&clean_dir);
    let wild = tiny_cube(&wild_dir);
    // Latin-1 description, CR-only line endings, fields repeated with the same value as it reads,
    // and 64 bytes after the described data.
    let mut bytes = edited_header(&wild, "description = {test cube}", b"description = {Caf\xE9}");
    bytes.extend_from_slice(b"bands = 4\ninterleave = BIL\ndata type = 4\n");
    set_header(&wild, &with_endings(&bytes, b"\r"));
    let img = wild.with_extension("img");
    let mut data = std::fs::read(&img).unwrap();
    let described = data.len();
    data.extend([0xFFu8; 64]);
    std::fs::write(&img, &data).unwrap();

    let (clean_out, wild_out) = (dir.path().join("clean_out"), dir.path().join("wild_out"));
    let (_, clean_err) = ok_with_stderr(&strs(&classify_args(&clean, &clean_out)));
    assert!(!clean_err.contains("warning"), "{clean_err}");
    let (stdout, stderr) = ok_with_stderr(&strs(&classify_args(&wild, &wild_out)));
    assert_eq!(summary(&stdout)["pixels"], 13 * 17);
    assert!(
        stderr.contains(&format!(
            "hsiedge: warning: {}: line 2: `description` holds bytes that are not UTF-8",
            wild.display()
        )),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "hsiedge: warning: {}: file is {} bytes but the header ({}) describes {described} bytes; \
             the 64 bytes after them are ignored",
            img.display(),
            described + 64,
            wild.display()
        )),
        "{stderr}"
    );
    let map = |out: &Path| std::fs::read(out.join("class_map.img")).unwrap();
    assert_eq!(map(&wild_out), map(&clean_out), "the class maps differ");
}

#[test]
fn a_non_utf8_number_and_a_field_repeated_with_another_value_are_errors_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let scene = tiny_cube(dir.path());
    let out = dir.path().join("o");
    set_header(&scene, &edited_header(&scene, "samples = 17", b"samples = 1\xB97"));
    let err = fails(&strs(&classify_args(&scene, &out)));
    assert!(
        err.contains(&format!(
            "{}: header field `samples`: line 3: byte 0xB9 at column 12 is not UTF-8",
            scene.display()
        )),
        "{err}"
    );
    let err = fails(&["inspect", scene.to_str().unwrap()]);
    assert!(
        err.contains("header field `samples`") && err.contains("not UTF-8"),
        "{err}"
    );

    let scene = tiny_cube(dir.path());
    set_header(&scene, &edited_header(&scene, "bands = 4\n", b"bands = 4\nBands = 5\n"));
    let err = fails(&strs(&classify_args(&scene, &out)));
    assert!(
        err.contains("header field `bands`: given twice with different values: `4` (line 5) and `5` (line 6)"),
        "{err}"
    );
}

#[test]
fn a_data_file_that_is_a_directory_or_a_fifo_is_named_as_such_and_never_read() {
    let dir = tempfile::tempdir().unwrap();
    let scene = tiny_cube(dir.path());
    let out = dir.path().join("o");
    let img = scene.with_extension("img");
    std::fs::remove_file(&img).unwrap();
    std::fs::create_dir(&img).unwrap();
    let err = fails(&strs(&classify_args(&scene, &out)));
    assert!(
        err.contains(&format!("{}: is a directory, not a data file", img.display())),
        "{err}"
    );
    std::fs::remove_dir(&img).unwrap();
    mkfifo(&img);
    let run = run_within_30s(&strs(&classify_args(&scene, &out)));
    let err = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("{}: is a FIFO (named pipe), not a data file", img.display())),
        "{err}"
    );
    // A header that is a FIFO is refused by `inspect` too, without reading it.
    let fifo_hdr = dir.path().join("pipe.hdr");
    mkfifo(&fifo_hdr);
    let run = run_within_30s(&["inspect", fifo_hdr.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "{}: is a FIFO (named pipe), not a header file",
            fifo_hdr.display()
        )),
        "{err}"
    );
}
