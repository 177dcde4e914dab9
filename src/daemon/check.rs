//! `hsiedge doctor --config FILE`: the daemon's configuration and folders, checked the way the
//! service will use them — the configuration validates, every model manifest is there, and the
//! outbox, state and socket folders exist (or can be created) with the service user as owner and
//! no write access for others.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::config;
use crate::doctor::{Check, Status};

/// The account the packaged unit runs the daemon as.
pub const SERVICE_USER: &str = "hsiedge";

/// The owner the daemon's folders should have: the uid of [`SERVICE_USER`] in `ROOT/etc/passwd`,
/// else the uid running the check (a daemon started by hand runs as its caller).
fn expected_owner(root: &Path) -> (u32, String) {
    let passwd = std::fs::read_to_string(root.join("etc/passwd")).unwrap_or_default();
    let service = passwd.lines().find_map(|l| {
        let mut f = l.split(':');
        (f.next() == Some(SERVICE_USER))
            .then(|| f.nth(1).and_then(|uid| uid.parse::<u32>().ok()))
            .flatten()
    });
    match service {
        Some(uid) => (uid, format!("user {SERVICE_USER} (uid {uid})")),
        None => {
            let uid = std::fs::metadata("/proc/self").map_or(0, |m| m.uid());
            (uid, format!("uid {uid} (no {SERVICE_USER} user: the caller)"))
        }
    }
}

/// `path` on the inspected system, under `root` (as given when the root is `/`).
fn under(root: &Path, path: &Path) -> PathBuf {
    if root == Path::new("/") {
        return path.to_path_buf();
    }
    root.join(path.strip_prefix("/").unwrap_or(path))
}

/// The checks for the configuration at `config_path` (a path on the system under `root`).
pub fn checks(root: &Path, config_path: &Path) -> Vec<Check> {
    let check = |name, status, summary: String, details: Vec<String>| Check {
        name,
        status,
        summary,
        details,
    };
    let c = match config::load(&under(root, config_path)) {
        Ok(c) => c,
        Err(e) => {
            return vec![check(
                "daemon config",
                Status::Fail,
                crate::engine::error_chain(&e),
                vec!["systemd/hsiedge.toml documents every key".into()],
            )];
        }
    };
    let mut out = vec![check(
        "daemon config",
        Status::Ok,
        format!(
            "{}: {} model(s), listening on {}",
            config_path.display(),
            c.models.len(),
            [
                c.tcp.map(|a| format!("tcp {a}")),
                c.unix.as_ref().map(|p| format!("unix {}", p.display()))
            ]
            .into_iter()
            .flatten()
            .collect::<Vec<_>>()
            .join(", ")
        ),
        Vec::new(),
    )];
    let missing: Vec<String> = c
        .models
        .iter()
        .filter(|(_, m)| !under(root, &m.session.manifest).is_file())
        .map(|(name, m)| {
            format!(
                "models.{name}.manifest: {} does not exist",
                m.session.manifest.display()
            )
        })
        .collect();
    out.push(if missing.is_empty() {
        check(
            "daemon models",
            Status::Ok,
            format!("{} manifest(s) present", c.models.len()),
            Vec::new(),
        )
    } else {
        check("daemon models", Status::Fail, missing.join("; "), missing)
    });
    let (uid, owner) = expected_owner(root);
    let mut folders = vec![
        ("daemon outbox", c.outbox.clone(), false),
        ("daemon state", c.state.clone(), false),
    ];
    if let Some(spool) = &c.spool {
        folders.push(("daemon spool", spool.clone(), false));
    }
    if let Some(parent) = c.control.parent() {
        folders.push(("daemon control socket folder", parent.to_path_buf(), true));
    }
    if let Some(parent) = c.unix.as_deref().and_then(Path::parent) {
        folders.push(("daemon stream socket folder", parent.to_path_buf(), true));
    }
    for (name, dir, runtime) in folders {
        let (status, summary) = folder_status(root, &dir, uid, &owner, runtime);
        out.push(check(name, status, summary, Vec::new()));
    }
    out
}

/// Whether the daemon (running as `uid`) can use `dir`, and what is wrong if not. A missing
/// `runtime` folder (under /run) is made by systemd's `RuntimeDirectory=` at start.
fn folder_status(root: &Path, dir: &Path, uid: u32, owner: &str, runtime: bool) -> (Status, String) {
    let at = under(root, dir);
    match std::fs::metadata(&at) {
        Ok(m) if !m.is_dir() => (Status::Fail, format!("{} is not a folder", dir.display())),
        Ok(m) => {
            let mode = m.mode() & 0o7777;
            if mode & 0o002 != 0 {
                (
                    Status::Fail,
                    format!(
                        "{} (mode {mode:04o}) is writable by every user: chmod o-w",
                        dir.display()
                    ),
                )
            } else if m.uid() != uid {
                (
                    Status::Fail,
                    format!(
                        "{} is owned by uid {}, not {owner}: the daemon cannot write it (chown)",
                        dir.display(),
                        m.uid()
                    ),
                )
            } else if mode & 0o300 != 0o300 {
                (
                    Status::Fail,
                    format!("{} (mode {mode:04o}) is not writable by its owner", dir.display()),
                )
            } else {
                (Status::Ok, format!("{} (mode {mode:04o}, {owner})", dir.display()))
            }
        }
        Err(_) => {
            let parent = dir.ancestors().skip(1).find(|a| under(root, a).is_dir());
            match parent {
                _ if runtime => (
                    Status::Info,
                    format!(
                        "{} is absent: the unit's RuntimeDirectory= makes it at start",
                        dir.display()
                    ),
                ),
                Some(p) if std::fs::metadata(under(root, p)).is_ok_and(|m| m.uid() == uid) => (
                    Status::Info,
                    format!("{} is absent: the daemon makes it at start", dir.display()),
                ),
                Some(p) => (
                    Status::Fail,
                    format!(
                        "{} is absent and {} is not {owner}'s: the daemon cannot make it",
                        dir.display(),
                        p.display()
                    ),
                ),
                None => (Status::Fail, format!("{} is absent", dir.display())),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn setup(extra: &str) -> (tempfile::TempDir, PathBuf) {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        std::fs::create_dir_all(r.join("etc/hsiedge")).unwrap();
        std::fs::create_dir_all(r.join("m")).unwrap();
        std::fs::write(r.join("m/manifest.json"), "{}").unwrap();
        std::fs::create_dir_all(r.join("var/spool/hsiedge/outbox")).unwrap();
        std::fs::create_dir_all(r.join("var/lib/hsiedge")).unwrap();
        let text = format!(
            "[listen]\nunix = \"/run/hsiedge/stream.sock\"\n[paths]\noutbox = \"/var/spool/hsiedge/outbox\"\n\
             state = \"/var/lib/hsiedge\"\ncontrol = \"/run/hsiedge/control.sock\"\n\
             [models.m]\nmanifest = \"/m/manifest.json\"\n{extra}"
        );
        std::fs::write(r.join("etc/hsiedge/hsiedge.toml"), text).unwrap();
        (root, PathBuf::from("/etc/hsiedge/hsiedge.toml"))
    }

    fn status_of(checks: &[Check], name: &str) -> (Status, String) {
        let c = checks
            .iter()
            .find(|c| c.name == name)
            .unwrap_or_else(|| panic!("{name}: {checks:?}"));
        (c.status, c.summary.clone())
    }

    #[test]
    fn folders_owned_by_the_caller_and_closed_to_others_pass() {
        let (root, config) = setup("");
        let c = checks(root.path(), &config);
        for name in ["daemon config", "daemon models", "daemon outbox", "daemon state"] {
            assert_eq!(status_of(&c, name).0, Status::Ok, "{name}: {c:?}");
        }
        // /run/hsiedge is the unit's to make.
        assert_eq!(status_of(&c, "daemon control socket folder").0, Status::Info);
    }

    #[test]
    fn a_world_writable_folder_a_foreign_owner_and_a_missing_manifest_fail() {
        let (root, config) = setup("");
        let r = root.path();
        std::fs::set_permissions(r.join("var/lib/hsiedge"), std::fs::Permissions::from_mode(0o777)).unwrap();
        std::fs::remove_file(r.join("m/manifest.json")).unwrap();
        // A service user whose uid owns nothing here.
        std::fs::write(
            r.join("etc/passwd"),
            "hsiedge:x:4242:4242::/var/lib/hsiedge:/usr/sbin/nologin\n",
        )
        .unwrap();
        let c = checks(r, &config);
        let (s, msg) = status_of(&c, "daemon state");
        assert_eq!(s, Status::Fail);
        assert!(msg.contains("writable by every user"), "{msg}");
        let (s, msg) = status_of(&c, "daemon outbox");
        assert_eq!(s, Status::Fail);
        assert!(msg.contains("not user hsiedge (uid 4242)"), "{msg}");
        let (s, msg) = status_of(&c, "daemon models");
        assert_eq!(s, Status::Fail);
        assert!(msg.contains("models.m.manifest"), "{msg}");
    }

    #[test]
    fn a_bad_configuration_is_one_failed_check_naming_the_key() {
        let (root, config) = setup("bogus = 1\n");
        let c = checks(root.path(), &config);
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].status, Status::Fail);
        assert!(c[0].summary.contains("bogus"), "{}", c[0].summary);
    }
}
