//! The spool folder through the library's API with real files: concurrent claimers (threads and
//! processes) hand out each scene once, a claimer killed with SIGKILL loses nothing, a cube still
//! being copied is not taken, and a real scene goes through whole.
//!
//! The child processes are this test binary run again on one `#[ignore]`d helper test; the
//! parent tells them the folder through a file named after its own pid (see [`child_folder`]).

mod common;

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use hsiedge::cube::Cube;
use hsiedge::source::LineSource as _;
use hsiedge::source::spool::{Spool, SpoolOptions, Wait};

fn options() -> SpoolOptions {
    SpoolOptions {
        poll: Duration::from_millis(5),
        ..SpoolOptions::default()
    }
}

/// Delivers a small cube `name` into `incoming` as a producer should: the data file first, the
/// header written aside and renamed in last. Returns the data bytes.
fn deliver(incoming: &Path, name: &str, seed: usize) -> Vec<u8> {
    let staging = tempfile::tempdir_in(incoming.parent().unwrap()).unwrap();
    let hdr = common::write_cube(staging.path(), name, 3, 4, 2, |l, b, s| {
        (seed * 1000 + l * 100 + b * 10 + s) as f32
    });
    std::fs::rename(hdr.with_extension("img"), incoming.join(format!("{name}.img"))).unwrap();
    std::fs::rename(&hdr, incoming.join(format!("{name}.hdr"))).unwrap();
    std::fs::read(incoming.join(format!("{name}.img"))).unwrap()
}

/// Fails on any notice: these tests deliver only good scenes.
fn no_notices(spool: &mut Spool) {
    let notices = spool.take_notices();
    assert!(notices.is_empty(), "refused or skipped: {notices:?}");
}

/// The scene folders in `dir`, sorted.
fn folders(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    v.sort();
    v
}

#[test]
fn two_threads_on_one_spool_claim_each_of_20_scenes_once() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("spool");
    let incoming = Spool::open(&root, options()).unwrap().incoming().to_path_buf();
    // Half are there before the claimers start, half arrive while they claim.
    let mut sent: BTreeMap<String, Vec<u8>> = (0..10)
        .map(|i| (format!("s{i:02}"), deliver(&incoming, &format!("s{i:02}"), i)))
        .collect();
    let finished = Arc::new(AtomicUsize::new(0));
    let start = Arc::new(Barrier::new(3));
    let claimers: Vec<_> = (0..2)
        .map(|_| {
            let (root, finished, start) = (root.clone(), finished.clone(), start.clone());
            std::thread::spawn(move || {
                let mut spool = Spool::open(&root, options()).unwrap();
                let mut got = Vec::new();
                start.wait();
                while finished.load(Ordering::SeqCst) < 20 {
                    match spool.claim_next().unwrap() {
                        Some(c) => {
                            assert!(!c.recovered());
                            got.push((c.id().to_string(), std::fs::read(c.data_path()).unwrap()));
                            c.done(&serde_json::json!({"by": format!("{:?}", std::thread::current().id())}))
                                .unwrap();
                            finished.fetch_add(1, Ordering::SeqCst);
                        }
                        None => {
                            spool.wait_ready(Duration::from_millis(50)).unwrap();
                        }
                    }
                }
                no_notices(&mut spool);
                got
            })
        })
        .collect();
    start.wait();
    for i in 10..20 {
        sent.insert(format!("s{i:02}"), deliver(&incoming, &format!("s{i:02}"), i));
        std::thread::sleep(Duration::from_millis(3));
    }
    let mut claimed = BTreeMap::new();
    let mut per_thread = Vec::new();
    for t in claimers {
        let got = t.join().unwrap();
        per_thread.push(got.len());
        for (id, data) in got {
            assert!(claimed.insert(id.clone(), data).is_none(), "{id} handed out twice");
        }
    }
    assert_eq!(claimed, sent, "every scene once, whole");
    assert_eq!(
        folders(&root.join("done")),
        sent.keys().cloned().collect::<Vec<_>>(),
        "no ~N duplicates"
    );
    assert!(folders(&incoming).is_empty());
    assert!(folders(&root.join("work")).is_empty(), "owner folders removed");
    eprintln!("scenes per thread: {per_thread:?}");
}

/// The file through which this process tells its child (role `role`) the test folder.
fn child_folder(parent: u32, role: &str) -> PathBuf {
    std::env::temp_dir().join(format!("hsiedge-spool-test-{parent}-{role}"))
}

/// Tells children of role `role` the test folder: written whole (aside, then renamed), before
/// any child starts, so no child reads it half written.
fn tell_children(role: &str, folder: &Path) {
    let file = child_folder(std::process::id(), role);
    let tmp = file.with_extension("tmp");
    std::fs::write(&tmp, folder.as_os_str().as_encoded_bytes()).unwrap();
    std::fs::rename(&tmp, &file).unwrap();
}

/// Child processes, killed (if still running) and their folder file removed when dropped, so a
/// failing test leaves no child behind.
struct Children {
    role: &'static str,
    procs: Vec<Child>,
    /// Each child's output (its test harness prints a failing test's panic there).
    logs: Vec<PathBuf>,
}

impl Children {
    /// Runs `n` children of the helper test `role` of this binary, working in `folder`.
    fn spawn(role: &'static str, folder: &Path, n: usize) -> Self {
        tell_children(role, folder);
        let logs: Vec<PathBuf> = (0..n).map(|i| folder.join(format!("{role}-{i}.log"))).collect();
        let procs = logs
            .iter()
            .map(|log| {
                let out = std::fs::File::create(log).unwrap();
                // Under an emulator (qemu-user cannot exec another aarch64 binary itself), the
                // child runs through it too.
                let mut argv = common::emulator().unwrap_or_default();
                argv.push(std::env::current_exe().unwrap().display().to_string());
                Command::new(&argv[0])
                    .args(&argv[1..])
                    .args(["--ignored", "--exact", "--test-threads=1", role])
                    .stdout(out.try_clone().unwrap())
                    .stderr(out)
                    .spawn()
                    .unwrap()
            })
            .collect();
        Self { role, procs, logs }
    }
}

impl Drop for Children {
    fn drop(&mut self) {
        for c in &mut self.procs {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_file(child_folder(std::process::id(), self.role));
        if std::thread::panicking() {
            for log in &self.logs {
                eprintln!(
                    "{}:\n{}",
                    log.display(),
                    std::fs::read_to_string(log).unwrap_or_default()
                );
            }
        }
    }
}

/// In a child process: the folder its parent test gave it, `None` when run by hand.
fn my_folder(role: &str) -> Option<PathBuf> {
    let file = child_folder(std::os::unix::process::parent_id(), role);
    match std::fs::read_to_string(&file) {
        Ok(s) if !s.is_empty() => Some(PathBuf::from(s)),
        _ => {
            eprintln!(
                "skipped: a helper of other tests, run by them as a child process ({} absent)",
                file.display()
            );
            None
        }
    }
}

/// Appends `line` to `path` (a child's report to its parent).
fn report(path: &Path, line: &str) {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap();
    // One write, so a reader never sees the line without its end.
    f.write_all(format!("{line}\n").as_bytes()).unwrap();
}

/// Waits up to 60 s for `path` to hold a line, returning its lines.
fn await_report(path: &Path) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(s) = std::fs::read_to_string(path)
            && s.ends_with('\n')
        {
            return s.lines().map(str::to_string).collect();
        }
        assert!(Instant::now() < deadline, "no report in {}", path.display());
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
#[ignore = "a helper: run as a child process by the tests below"]
fn child_claims_all() {
    let Some(folder) = my_folder("child_claims_all") else {
        return;
    };
    let mut spool = Spool::open(&folder.join("spool"), options()).unwrap();
    report(&folder.join(format!("ready-{}", std::process::id())), "ready");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !folder.join("go").exists() {
        assert!(Instant::now() < deadline, "no go from the parent test");
        std::thread::sleep(Duration::from_millis(1));
    }
    let log = folder.join(format!("claimed-{}", std::process::id()));
    while let Some(c) = spool.claim_next().unwrap() {
        report(&log, c.id());
        c.done(&serde_json::json!({"pid": std::process::id()})).unwrap();
    }
    no_notices(&mut spool);
    report(&log, "end");
}

#[test]
#[ignore = "a helper: run as a child process by the tests below"]
fn child_claims_one_and_hangs() {
    let Some(folder) = my_folder("child_claims_one_and_hangs") else {
        return;
    };
    let mut spool = Spool::open(&folder.join("spool"), options()).unwrap();
    let mut c = spool.claim_next().unwrap().expect("a scene to claim");
    // Its run starts, then the process dies mid-run.
    assert_eq!(c.start().unwrap(), 1);
    report(&folder.join("claimed"), c.id());
    std::thread::sleep(Duration::from_secs(120));
}

#[test]
fn two_processes_on_one_spool_claim_each_of_20_scenes_once() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("spool");
    let incoming = Spool::open(&root, options()).unwrap().incoming().to_path_buf();
    let sent: Vec<String> = (0..20).map(|i| format!("p{i:02}")).collect();
    for (i, name) in sent.iter().enumerate() {
        deliver(&incoming, name, i);
    }
    let mut children = Children::spawn("child_claims_all", tmp.path(), 2);
    for c in &children.procs {
        await_report(&tmp.path().join(format!("ready-{}", c.id())));
    }
    std::fs::write(tmp.path().join("go"), "").unwrap();
    let mut all = Vec::new();
    for c in &mut children.procs {
        assert!(c.wait().unwrap().success());
        let lines = await_report(&tmp.path().join(format!("claimed-{}", c.id())));
        assert_eq!(lines.last().map(String::as_str), Some("end"));
        eprintln!("pid {}: {} scenes", c.id(), lines.len() - 1);
        all.extend(lines[..lines.len() - 1].iter().cloned());
    }
    all.sort();
    assert_eq!(all, sent, "each scene claimed exactly once");
    assert_eq!(folders(&root.join("done")), sent);
    assert!(folders(&incoming).is_empty());
}

#[test]
fn a_claimer_killed_with_sigkill_loses_nothing_and_its_scene_is_recovered() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("spool");
    let incoming = Spool::open(&root, options()).unwrap().incoming().to_path_buf();
    let data = deliver(&incoming, "victim", 7);
    let header = std::fs::read(incoming.join("victim.hdr")).unwrap();
    let mut children = Children::spawn("child_claims_one_and_hangs", tmp.path(), 1);
    assert_eq!(await_report(&tmp.path().join("claimed")), ["victim"]);
    let child = &mut children.procs[0];
    child.kill().unwrap();
    let status = child.wait().unwrap();
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(9));
    assert!(folders(&incoming).is_empty(), "claimed before the kill");

    let mut spool = Spool::open(&root, options()).unwrap();
    let mut c = spool.claim_next().unwrap().expect("the dead claimer's scene");
    assert_eq!((c.id(), c.recovered(), c.attempts()), ("victim", true, 1));
    assert_eq!(c.start().unwrap(), 2);
    assert_eq!(std::fs::read(c.header_path()).unwrap(), header);
    assert_eq!(std::fs::read(c.data_path()).unwrap(), data);
    assert!(spool.claim_next().unwrap().is_none(), "held: not handed out twice");
    let done = c.done(&serde_json::Value::Null).unwrap();
    assert_eq!(done, root.join("done/victim"));
    no_notices(&mut spool);
    drop(spool);
    assert!(
        folders(&root.join("work")).is_empty(),
        "the dead owner's folder is gone"
    );
}

#[test]
fn a_claim_cut_between_its_two_renames_recovers_the_scene_whole() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("spool");
    let incoming = Spool::open(&root, options()).unwrap().incoming().to_path_buf();
    let data = deliver(&incoming, "cut", 3);
    let header = std::fs::read(incoming.join("cut.hdr")).unwrap();
    // What a claimer killed after its first rename leaves: an unlocked owner folder holding
    // the data file, the header still in incoming/ (the layout docs/spool.md describes).
    let dead = root.join("work/owner-killed");
    std::fs::create_dir_all(dead.join("cut")).unwrap();
    std::fs::write(dead.join(".lock"), "").unwrap();
    std::fs::rename(incoming.join("cut.img"), dead.join("cut/cut.img")).unwrap();

    let mut spool = Spool::open(&root, options()).unwrap();
    assert_eq!(spool.wait_ready(Duration::from_secs(5)).unwrap(), Wait::Ready);
    let c = spool.claim_next().unwrap().expect("recovered");
    assert_eq!((c.id(), c.recovered()), ("cut", true));
    assert_eq!(std::fs::read(c.header_path()).unwrap(), header);
    assert_eq!(std::fs::read(c.data_path()).unwrap(), data);
    assert!(folders(&incoming).is_empty());
    let done = c.done(&serde_json::Value::Null).unwrap();
    assert_eq!(folders(&done), ["cut.hdr", "cut.img", "cut.json"]);
    no_notices(&mut spool);
}

#[test]
fn a_cube_still_being_copied_is_not_claimed_before_its_header_arrives() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("spool");
    let mut spool = Spool::open(&root, options()).unwrap();
    let incoming = spool.incoming().to_path_buf();
    let staging = tempfile::tempdir().unwrap();
    let hdr = common::write_cube(staging.path(), "slow", 40, 16, 8, |l, b, s| {
        (l * 1000 + b * 10 + s) as f32
    });
    let data = std::fs::read(hdr.with_extension("img")).unwrap();
    let header = std::fs::read_to_string(&hdr).unwrap();
    let data_done = Arc::new(AtomicBool::new(false));
    let producer = {
        let (incoming, data, data_done) = (incoming.clone(), data.clone(), data_done.clone());
        std::thread::spawn(move || {
            let mut f = std::fs::File::create(incoming.join("slow.img")).unwrap();
            for chunk in data.chunks(data.len() / 20) {
                f.write_all(chunk).unwrap();
                f.flush().unwrap();
                std::thread::sleep(Duration::from_millis(25));
            }
            f.sync_all().unwrap();
            data_done.store(true, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(100));
            let tmp = incoming.join(".slow.hdr.tmp");
            std::fs::write(&tmp, header).unwrap();
            std::fs::rename(&tmp, incoming.join("slow.hdr")).unwrap();
        })
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut scans = 0;
    let c = loop {
        scans += 1;
        if let Some(c) = spool.claim_next().unwrap() {
            break c;
        }
        assert!(Instant::now() < deadline, "never claimed");
        std::thread::sleep(Duration::from_millis(2));
    };
    assert!(
        data_done.load(Ordering::SeqCst),
        "claimed while the data was still being written"
    );
    producer.join().unwrap();
    assert!(scans > 10, "the claimer looked while the copy went on ({scans} scans)");
    assert_eq!(std::fs::read(c.data_path()).unwrap(), data);
    no_notices(&mut spool);
}

#[test]
fn a_real_scene_goes_through_the_spool_whole() {
    let Some(data_dir) = common::data() else { return };
    let original = Cube::open(&data_dir.join("salinas_a/salinas_a.hdr")).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let mut spool = Spool::open(&tmp.path().join("spool"), options()).unwrap();
    let incoming = spool.incoming().to_path_buf();
    std::fs::copy(original.data_path(), incoming.join("salinas_a.img")).unwrap();
    std::fs::copy(original.header_path(), incoming.join(".salinas_a.hdr.part")).unwrap();
    std::fs::rename(incoming.join(".salinas_a.hdr.part"), incoming.join("salinas_a.hdr")).unwrap();
    let c = spool.claim_next().unwrap().expect("salinas_a");
    let mut src = c.open_source().unwrap();
    assert_eq!(src.info().id, "salinas_a");
    assert_eq!(
        (src.info().samples, src.info().bands, src.info().lines),
        (86, 204, Some(83))
    );
    let (mut got, mut want) = (vec![0u8; src.info().line_bytes()], vec![0u8; src.info().line_bytes()]);
    for l in 0..original.lines() {
        assert!(src.next_line(&mut got).unwrap().is_some());
        original.raw_line(l, &mut want);
        assert_eq!(got, want, "line {l}");
    }
    assert!(src.next_line(&mut got).unwrap().is_none());
    drop(src);
    let done = c.done(&serde_json::json!({"lines": original.lines()})).unwrap();
    assert_eq!(
        std::fs::read(done.join("salinas_a.img")).unwrap(),
        std::fs::read(original.data_path()).unwrap()
    );
    no_notices(&mut spool);
}
