//! Black-box tests of the output folder: a set switched in as a whole (killed at every step of its
//! writing), one writer per folder, file modes, and runs refused before they could harm an input.

mod common;

use std::os::unix::process::ExitStatusExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

const RUN_ID_KEY: &str = "hsiedge run id";
const SET_NAMES: [&str; 6] = [
    "class_map.hdr",
    "class_map.img",
    "confidence.hdr",
    "confidence.img",
    "quicklook.png",
    "summary.json",
];

fn tiny() -> PathBuf {
    root().join("models/fixtures/tiny/manifest.json")
}

/// A 4-band cube of `lines x samples` whose values depend on `seed`.
fn scene(dir: &Path, name: &str, lines: usize, samples: usize, seed: usize) -> PathBuf {
    write_cube(dir, name, lines, samples, 4, |l, b, s| {
        100.0 * (b + 1) as f32 + 7.0 * ((l * 3 + s * 5 + b + seed) % 11) as f32 - 30.0
    })
}

fn classify_cmd(scene: &Path, out: &Path, extra: &[&str]) -> Command {
    let mut c = hsiedge();
    c.args(["classify", scene.to_str().unwrap(), "--model", tiny().to_str().unwrap()])
        .args(["--out", out.to_str().unwrap(), "--batch", "16", "--threads", "1"])
        .args(extra);
    c
}

/// A header field's value (`key = value` on one line).
fn field(header: &str, key: &str) -> Option<String> {
    header.lines().find_map(|l| {
        let (k, v) = l.split_once('=')?;
        (k.trim() == key).then(|| v.trim().to_string())
    })
}

/// The set `out` shows, checked whole: every file of the set is there under its name, every
/// header and the quick-look carry the summary's run id, each data file is as long as its header
/// says, and nothing else of ours is visible. Returns (run id, scene, lines, samples).
fn whole_set(out: &Path) -> (String, String, usize, usize) {
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("summary.json")).expect("summary.json")).unwrap();
    let id = summary["run_id"].as_str().expect("run_id").to_string();
    let mut dims = None;
    for (hdr, img, bytes_per_pixel) in [
        ("class_map.hdr", "class_map.img", 1),
        ("confidence.hdr", "confidence.img", 4),
    ] {
        let text = std::fs::read_to_string(out.join(hdr)).unwrap_or_else(|e| panic!("{hdr}: {e}"));
        assert_eq!(
            field(&text, RUN_ID_KEY).as_deref(),
            Some(id.as_str()),
            "{hdr} of another run"
        );
        let lines: usize = field(&text, "lines").unwrap().parse().unwrap();
        let samples: usize = field(&text, "samples").unwrap().parse().unwrap();
        let len = std::fs::metadata(out.join(img)).unwrap().len() as usize;
        assert_eq!(len, lines * samples * bytes_per_pixel, "{img} does not fit {hdr}");
        assert!(dims.is_none_or(|d| d == (lines, samples)), "headers disagree");
        dims = Some((lines, samples));
    }
    let dec = png::Decoder::new(std::io::BufReader::new(
        std::fs::File::open(out.join("quicklook.png")).unwrap(),
    ));
    let reader = dec.read_info().unwrap();
    let text = &reader.info().uncompressed_latin1_text;
    assert!(
        text.iter().any(|t| t.keyword == RUN_ID_KEY && t.text == id),
        "quicklook.png of another run: {text:?}"
    );
    let mut visible: Vec<String> = std::fs::read_dir(out)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| !n.starts_with('.'))
        .collect();
    visible.sort();
    let mut want: Vec<String> = SET_NAMES
        .iter()
        .map(|s| s.to_string())
        .chain(["current".into()])
        .collect();
    want.sort();
    assert_eq!(visible, want);
    let (lines, samples) = dims.unwrap();
    (id, summary["scene"].as_str().unwrap().to_string(), lines, samples)
}

#[test]
fn a_writer_killed_at_any_step_leaves_one_whole_set_and_the_next_run_clears_its_leftovers() {
    let dir = tempfile::tempdir().unwrap();
    let a = scene(dir.path(), "a", 11, 9, 0);
    let b = scene(dir.path(), "b", 7, 15, 3);
    let out = dir.path().join("out");
    let first = classify_cmd(&a, &out, &[]).output().unwrap();
    assert!(first.status.success(), "{}", String::from_utf8_lossy(&first.stderr));
    let (id_a, ..) = whole_set(&out);
    let mut kills = 0;
    let mut shown_b = 0;
    for k in 1.. {
        assert!(k < 200, "the run never finished: the failpoint counts no step");
        let run = classify_cmd(&b, &out, &[])
            .env("HSIEDGE_FAILPOINT", format!("set-step:{k}"))
            .output()
            .unwrap();
        let (id, scene, lines, samples) = whole_set(&out);
        if run.status.success() {
            assert_eq!((lines, samples), (7, 15));
            assert!(scene.ends_with("b.hdr"), "{scene}");
            break;
        }
        assert_eq!(
            run.status.signal(),
            Some(9),
            "killed by its failpoint at step {k}: {run:?}"
        );
        kills += 1;
        // Before the switch the earlier set shows, whole; after it, the new one (a kill at a
        // later step, removing the old set, leaves B).
        if id == id_a {
            assert_eq!((lines, samples), (11, 9), "step {k}");
            assert!(scene.ends_with("a.hdr"), "step {k}: {scene}");
        } else {
            assert_eq!((lines, samples), (7, 15), "step {k}");
            shown_b += 1;
        }
    }
    assert!(kills >= 10, "only {kills} steps were tried");
    assert!(shown_b >= 1, "no kill landed after the switch");
    // The finished run removed what the killed ones left: only the set in force remains.
    let hidden: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with('.'))
        .collect();
    let current = std::fs::read_link(out.join("current")).unwrap();
    let mut want = vec![".hsiedge.lock".to_string(), current.to_str().unwrap().to_string()];
    want.sort();
    let mut hidden = hidden;
    hidden.sort();
    assert_eq!(hidden, want, "leftovers of killed runs");
}

#[test]
fn one_writer_per_folder_others_fail_naming_it_or_wait() {
    let dir = tempfile::tempdir().unwrap();
    let scenes: Vec<PathBuf> = (0..3)
        .map(|i| scene(dir.path(), &format!("s{i}"), 9 + 4 * i, 12 + 3 * i, i))
        .collect();
    let out = dir.path().join("out");

    // Waiting: all three finish, one after another, and the folder shows one of them whole.
    let children: Vec<_> = scenes
        .iter()
        .map(|s| classify_cmd(s, &out, &["--wait"]).spawn().unwrap())
        .collect();
    for c in children {
        let done = c.wait_with_output().unwrap();
        assert!(done.status.success(), "{}", String::from_utf8_lossy(&done.stderr));
    }
    let (_, scene, lines, samples) = whole_set(&out);
    let i = scenes.iter().position(|s| s.to_str() == Some(scene.as_str())).unwrap();
    assert_eq!((lines, samples), (9 + 4 * i, 12 + 3 * i));

    // Not waiting: while one holds the folder (a `flock` held by a shell, as a run holds it),
    // another fails at once naming the folder and the holder's pid.
    let mut holder = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "exec 9>>'{0}/.hsiedge.lock'; flock -x 9; echo $$ > '{0}/.hsiedge.lock'; echo locked; sleep 30",
            out.display()
        ))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(holder.stdout.as_mut().unwrap()), &mut line).unwrap();
    assert_eq!(line.trim(), "locked");
    let err = fails(&[
        "classify",
        scenes[0].to_str().unwrap(),
        "--model",
        tiny().to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    holder.kill().unwrap();
    holder.wait().unwrap();
    assert!(err.contains(&out.display().to_string()), "{err}");
    assert!(err.contains(&format!("pid {}", holder.id())), "{err}");
    assert!(err.contains("--wait"), "{err}");
    whole_set(&out);
}

#[test]
fn maps_are_created_with_the_mode_the_umask_allows() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let a = scene(dir.path(), "a", 6, 5, 0);
    for (umask, mode) in [("022", 0o644), ("077", 0o600), ("002", 0o664)] {
        let out = dir.path().join(format!("out{umask}"));
        let cmd = classify_cmd(&a, &out, &[]);
        let line = std::iter::once(cmd.get_program())
            .chain(cmd.get_args())
            .map(|a| format!("'{}'", a.to_str().unwrap()))
            .collect::<Vec<_>>()
            .join(" ");
        let run = Command::new("sh")
            .arg("-c")
            .arg(format!("umask {umask}; exec {line}"))
            .envs(cmd.get_envs().filter_map(|(k, v)| Some((k, v?))))
            .output()
            .unwrap();
        assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
        for name in SET_NAMES {
            let m = std::fs::metadata(out.join(name)).unwrap().permissions().mode() & 0o777;
            assert_eq!(m, mode, "{name} under umask {umask}: {m:o}");
        }
    }
}

#[test]
fn a_run_that_would_overwrite_its_input_is_refused_and_the_input_kept() {
    let dir = tempfile::tempdir().unwrap();
    // A scene whose names collide with the maps, classified into its own folder.
    let hdr = scene(dir.path(), "class_map", 6, 5, 0);
    let before = std::fs::read(dir.path().join("class_map.img")).unwrap();
    let err = fails(&[
        "classify",
        hdr.to_str().unwrap(),
        "--model",
        tiny().to_str().unwrap(),
        "--out",
        dir.path().to_str().unwrap(),
    ]);
    assert!(err.contains("would replace the input"), "{err}");
    assert!(err.contains("class_map"), "{err}");
    assert_eq!(std::fs::read(dir.path().join("class_map.img")).unwrap(), before);
    assert!(!dir.path().join("current").exists());

    // A scene inside an earlier output set (`hsiedge simulate` writes one) is retired by the
    // next commit into that folder: refused too.
    let sim = dir.path().join("sim");
    ok(&[
        "simulate",
        "--model",
        tiny().to_str().unwrap(),
        "--out",
        sim.to_str().unwrap(),
        "--lines",
        "8",
        "--samples",
        "8",
    ]);
    let err = fails(&[
        "classify",
        sim.join("scene.hdr").to_str().unwrap(),
        "--model",
        tiny().to_str().unwrap(),
        "--out",
        sim.to_str().unwrap(),
    ]);
    assert!(err.contains("would replace the input"), "{err}");
    // Beside it, into another folder, it runs.
    let out = dir.path().join("elsewhere");
    let run = classify_cmd(&sim.join("scene.hdr"), &out, &[]).output().unwrap();
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
}

#[test]
fn a_failed_run_leaves_no_folder_it_made() {
    let dir = tempfile::tempdir().unwrap();
    let a = scene(dir.path(), "a", 6, 5, 0);
    let out = dir.path().join("new/deeper/out");
    let err = fails(&[
        "classify",
        a.to_str().unwrap(),
        "--model",
        root().join("models/fixtures/bad_rank/manifest.json").to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(!err.is_empty());
    assert!(!dir.path().join("new").exists(), "a failed run left {}", out.display());
    // A folder that was there before stays.
    std::fs::create_dir(dir.path().join("kept")).unwrap();
    fails(&[
        "classify",
        a.to_str().unwrap(),
        "--model",
        root().join("models/fixtures/bad_rank/manifest.json").to_str().unwrap(),
        "--out",
        dir.path().join("kept").to_str().unwrap(),
    ]);
    assert!(dir.path().join("kept").is_dir());
}

#[test]
fn more_threads_than_cpus_is_refused_before_any_work() {
    let dir = tempfile::tempdir().unwrap();
    let a = scene(dir.path(), "a", 6, 5, 0);
    let out = dir.path().join("out");
    for threads in ["100000", "5000"] {
        let err = fails(&[
            "classify",
            a.to_str().unwrap(),
            "--model",
            tiny().to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--threads",
            threads,
        ]);
        assert!(err.contains("--threads") && err.contains(threads), "{err}");
        assert!(err.contains("at most"), "{err}");
    }
    assert!(!out.exists());
}
