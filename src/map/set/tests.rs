use super::super::lock::Contention;
use super::*;

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    v.sort();
    v
}

fn lock(out: &Path) -> OutputDir {
    OutputDir::lock(out, Contention::Fail).unwrap()
}

#[test]
fn staged_files_appear_only_on_commit() {
    let dir = tempfile::tempdir().unwrap();
    let out = lock(&dir.path().join("out"));
    let mut s = Staged::new(&out).unwrap();
    let p = s.add("a.img", b"abc").unwrap();
    assert!(!p.exists());
    drop(s);
    assert_eq!(names(out.path()), [LOCK_NAME], "nothing left on drop");
    let mut s = Staged::new(&out).unwrap();
    let p = s.add("a.img", b"abc").unwrap();
    drop(s.commit().unwrap());
    assert_eq!(std::fs::read(&p).unwrap(), b"abc");
    assert_eq!(std::fs::read(out.path().join("current/a.img")).unwrap(), b"abc");
}

#[test]
fn files_are_made_readable_as_the_umask_allows() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let out = lock(&dir.path().join("out"));
    let mut s = Staged::new(&out).unwrap();
    let p = s.add("a.img", b"abc").unwrap();
    drop(s.commit().unwrap());
    // The umask cannot be read without setting it, so compare with a plain create.
    let probe = dir.path().join("probe");
    std::fs::write(&probe, b"").unwrap();
    let want = std::fs::metadata(&probe).unwrap().permissions().mode() & 0o777;
    assert_eq!(std::fs::metadata(&p).unwrap().permissions().mode() & 0o777, want);
    assert_ne!(want & 0o044, 0, "the test umask lets others read");
}

#[test]
fn reserved_files_are_written_in_place_and_one_never_written_fails_the_commit() {
    let dir = tempfile::tempdir().unwrap();
    let out = lock(&dir.path().join("out"));
    let o = out.path();
    let mut s = Staged::new(&out).unwrap();
    s.add("a.img", b"old a").unwrap();
    drop(s.commit().unwrap());
    let mut s = Staged::new(&out).unwrap();
    s.reserve("a.img").unwrap();
    s.reserve("b.img").unwrap();
    s.add("b.img", b"new b").unwrap();
    s.add("a.img", b"new a").unwrap();
    drop(s.commit().unwrap());
    assert_eq!(std::fs::read(o.join("a.img")).unwrap(), b"new a");
    assert_eq!(std::fs::read(o.join("b.img")).unwrap(), b"new b");
    let mut s = Staged::new(&out).unwrap();
    s.reserve("a.img").unwrap();
    s.reserve("c.img").unwrap();
    s.add("a.img", b"newer a").unwrap();
    let e = s.commit().unwrap_err();
    assert!(e.to_string().contains("c.img"), "{e}");
    assert!(format!("{e:?}").contains("reserved but never written"), "{e:?}");
    assert_eq!(
        std::fs::read(o.join("a.img")).unwrap(),
        b"new a",
        "the old set stays whole"
    );
    let sets: Vec<String> = names(o).into_iter().filter(|n| n.starts_with(SET_PREFIX)).collect();
    assert_eq!(sets.len(), 1, "only the current set: {sets:?}");
    assert_eq!(names(o), [LOCK_NAME, sets[0].as_str(), "a.img", "b.img", CURRENT]);
}

#[test]
fn a_new_set_replaces_the_old_whole_and_names_it_lacks_go() {
    let dir = tempfile::tempdir().unwrap();
    let out = lock(&dir.path().join("out"));
    let o = out.path();
    let mut s = Staged::new(&out).unwrap();
    s.add("a.img", b"old a").unwrap();
    s.add("b.img", b"old b").unwrap();
    drop(s.commit().unwrap());
    let old = std::fs::read_link(o.join(CURRENT)).unwrap();

    // Abandoned: the old set is untouched and nothing of the new one is left.
    let mut s = Staged::new(&out).unwrap();
    s.add("a.img", b"new a").unwrap();
    s.add("c.img", b"new c").unwrap();
    drop(s);
    assert_eq!(names(o), [LOCK_NAME, old.to_str().unwrap(), "a.img", "b.img", CURRENT]);
    assert_eq!(std::fs::read(o.join("a.img")).unwrap(), b"old a");

    // Committed: every name shows the new set, b.img (not in it) is gone, and the old set
    // stays readable until it is retired.
    let mut s = Staged::new(&out).unwrap();
    s.add("a.img", b"new a").unwrap();
    s.add("c.img", b"new c").unwrap();
    let retired = s.commit().unwrap();
    assert_eq!(std::fs::read(o.join("a.img")).unwrap(), b"new a");
    assert_eq!(std::fs::read(o.join("c.img")).unwrap(), b"new c");
    assert!(!o.join("b.img").exists() && std::fs::symlink_metadata(o.join("b.img")).is_err());
    assert_eq!(std::fs::read(o.join(&old).join("b.img")).unwrap(), b"old b");
    retired.remove_in_background().unwrap().join().unwrap();
    let new = std::fs::read_link(o.join(CURRENT)).unwrap();
    assert_eq!(names(o), [LOCK_NAME, new.to_str().unwrap(), "a.img", "c.img", CURRENT]);
}

#[test]
fn leftovers_of_killed_runs_are_removed_and_never_read() {
    let dir = tempfile::tempdir().unwrap();
    let out = lock(&dir.path().join("out"));
    let o = out.path();
    let mut s = Staged::new(&out).unwrap();
    s.add("a.img", b"a").unwrap();
    drop(s.commit().unwrap());
    let set = std::fs::read_link(o.join(CURRENT)).unwrap();
    // What kills at each step can leave: a whole set never switched to, a half-made switch,
    // a dangling stable link, and the hidden files of the old file-by-file layout.
    std::fs::create_dir(o.join(".set-1-2-3")).unwrap();
    std::fs::write(o.join(".set-1-2-3/a.img"), b"never current").unwrap();
    std::os::unix::fs::symlink(".set-1-2-3", o.join(".current.1-2-3.tmp")).unwrap();
    std::os::unix::fs::symlink("current/z.img", o.join("z.img")).unwrap();
    std::fs::write(o.join(".a.img.x1.tmp"), b"").unwrap();
    std::fs::write(o.join(".a.img.7-0.replaced"), b"").unwrap();
    std::fs::write(o.join("user.txt"), b"not ours").unwrap();
    assert_eq!(std::fs::read(o.join("a.img")).unwrap(), b"a");
    let s = Staged::new(&out).unwrap();
    let mut left = names(o);
    left.retain(|n| *n != s.set.file_name().unwrap().to_str().unwrap());
    assert_eq!(left, [LOCK_NAME, set.to_str().unwrap(), "a.img", CURRENT, "user.txt"]);
}

#[test]
fn plain_files_of_the_old_layout_become_links_after_the_switch() {
    let dir = tempfile::tempdir().unwrap();
    let out = lock(&dir.path().join("out"));
    let o = out.path();
    std::fs::write(o.join("a.img"), b"old plain a").unwrap();
    let mut s = Staged::new(&out).unwrap();
    s.add("a.img", b"new a").unwrap();
    drop(s.commit().unwrap());
    assert!(
        std::fs::symlink_metadata(o.join("a.img"))
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert_eq!(std::fs::read(o.join("a.img")).unwrap(), b"new a");
}

#[test]
fn a_current_that_cannot_be_replaced_fails_the_commit_and_keeps_the_folder_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let out = lock(&dir.path().join("out"));
    let o = out.path();
    std::fs::create_dir_all(o.join("current/x")).unwrap();
    let mut s = Staged::new(&out).unwrap();
    s.add("a.img", b"a").unwrap();
    let err = s.commit().unwrap_err();
    assert!(err.to_string().contains("current"), "{err}");
    assert_eq!(names(o), [LOCK_NAME, CURRENT]);
}

#[test]
fn inputs_in_the_way_of_the_set_are_named_and_others_pass() {
    let dir = tempfile::tempdir().unwrap();
    let out = lock(&dir.path().join("out"));
    let o = out.path();
    let mut s = Staged::new(&out).unwrap();
    s.add("scene.img", b"x").unwrap();
    drop(s.commit().unwrap());
    std::fs::write(o.join("class_map.img"), b"a scene named like a map").unwrap();
    std::fs::write(o.join("mine.hdr"), b"").unwrap();
    std::fs::write(dir.path().join("elsewhere.hdr"), b"").unwrap();
    std::os::unix::fs::symlink("out/class_map.img", dir.path().join("alias.img")).unwrap();
    let refused = |p: PathBuf| {
        let err = check_inputs_spared(&out, std::slice::from_ref(&p)).unwrap_err();
        assert!(matches!(err, MapError::WouldReplaceInput { .. }), "{p:?}: {err}");
        assert!(err.to_string().contains(&p.display().to_string()), "{err}");
    };
    refused(o.join("class_map.img"));
    refused(dir.path().join("alias.img"));
    // Inside the set in force (through the stable link, `current` or the set folder).
    refused(o.join("scene.img"));
    refused(o.join("current/scene.img"));
    refused(o.join(std::fs::read_link(o.join(CURRENT)).unwrap()).join("scene.img"));
    refused(o.join(LOCK_NAME));
    check_inputs_spared(&out, &[o.join("mine.hdr"), dir.path().join("elsewhere.hdr")]).unwrap();
}

#[test]
fn names_that_would_escape_or_shadow_the_set_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = lock(&dir.path().join("out"));
    let mut s = Staged::new(&out).unwrap();
    for bad in ["", "../x", "a/b", ".hidden", CURRENT] {
        assert!(s.reserve(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn appended_bytes_synced_early_and_finished_commit_whole() {
    let dir = tempfile::tempdir().unwrap();
    let out = lock(&dir.path().join("out"));
    let mut s = Staged::new(&out).unwrap();
    s.reserve("a.img").unwrap();
    for part in [&b"ab"[..], b"cd", b"ef"] {
        s.append("a.img", part).unwrap();
        s.sync_appended("a.img").unwrap();
    }
    let p = s.add("a.img", b"g").unwrap();
    // Only a file still being appended to can be synced early.
    assert!(s.sync_appended("a.img").is_err());
    drop(s.commit().unwrap());
    assert_eq!(std::fs::read(&p).unwrap(), b"abcdefg");
}
