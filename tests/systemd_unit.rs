//! systemd/hsiedge.service: `systemd-analyze verify` accepts it without a word, `systemd-analyze
//! security --offline=true` rates its exposure at most 3.0, and it agrees with the example
//! configuration and the Debian package metadata about where the daemon reads and writes.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

/// Exposure the unit may reach (systemd's scale: 0 best, 10 worst; up to 3.9 is "OK").
const MAX_EXPOSURE: f64 = 3.0;

fn unit_path() -> PathBuf {
    common::root().join("systemd/hsiedge.service")
}

fn unit_text() -> String {
    std::fs::read_to_string(unit_path()).expect("read systemd/hsiedge.service")
}

/// `systemd-analyze`, or `None` (printed) where it is missing; CI machines must have it.
fn analyze() -> Option<Command> {
    match Command::new("systemd-analyze").arg("--version").output() {
        Ok(o) if o.status.success() => Some(Command::new("systemd-analyze")),
        _ => {
            assert!(std::env::var("CI").is_err(), "CI must have systemd-analyze");
            eprintln!("skipped: systemd-analyze is not installed");
            None
        }
    }
}

/// A copy of the unit (same file name, which `verify` checks against) in `dir`, whose ExecStart
/// runs the binary under test: `verify` checks that the command exists, and /usr/bin/hsiedge
/// exists only where the package is installed.
fn testable_copy(dir: &Path, edit: impl Fn(String) -> String) -> PathBuf {
    let text = unit_text().replace("/usr/bin/hsiedge", env!("CARGO_BIN_EXE_hsiedge"));
    let path = dir.join("hsiedge.service");
    std::fs::write(&path, edit(text)).unwrap();
    path
}

/// Runs `systemd-analyze verify --man=no` (the man page is installed only by the package) and
/// returns (success, stderr).
fn verify(unit: &Path) -> (bool, String) {
    let Some(mut c) = analyze() else {
        return (true, String::new());
    };
    let out = c
        .args(["verify", "--man=no"])
        .arg(unit)
        .output()
        .expect("run systemd-analyze");
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn systemd_verifies_the_unit_without_a_warning() {
    if analyze().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (ok, err) = verify(&testable_copy(dir.path(), |t| t));
    assert!(ok && err.trim().is_empty(), "systemd-analyze verify: {err}");
    // The check can fail: a misspelt directive and a missing binary are both reported.
    let (_, err) = verify(&testable_copy(dir.path(), |t| {
        t.replace("ProtectHome=", "ProtectHomes=")
    }));
    assert!(err.contains("ProtectHomes"), "{err}");
    let (ok, err) = verify(&testable_copy(dir.path(), |t| {
        t.replace(env!("CARGO_BIN_EXE_hsiedge"), "/nonexistent/hsiedge")
    }));
    assert!(!ok && err.contains("/nonexistent/hsiedge"), "{err}");
}

#[test]
fn the_units_exposure_is_at_most_three() {
    let Some(mut c) = analyze() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let unit = testable_copy(dir.path(), |t| t);
    let out = c
        .args(["security", "--offline=true", "--no-pager"])
        .arg(&unit)
        .output()
        .expect("run systemd-analyze");
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.contains("Overall exposure level for hsiedge.service:"))
        .unwrap_or_else(|| panic!("no exposure line:\n{text}\n{}", String::from_utf8_lossy(&out.stderr)));
    let exposure: f64 = line
        .split(':')
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("unparsable: {line}"));
    eprintln!("{}", line.trim());
    assert!(exposure <= MAX_EXPOSURE, "{line}");
}

/// The value of `key=` lines in the unit (all of them, in order).
fn directives(text: &str, key: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix(&format!("{key}=")))
        .map(str::to_string)
        .collect()
}

#[test]
fn the_unit_has_what_the_service_needs() {
    let text = unit_text();
    let one = |key: &str| {
        let v = directives(&text, key);
        assert_eq!(v.len(), 1, "{key}= must be set once: {v:?}");
        v[0].clone()
    };
    assert_eq!(one("Type"), "notify");
    assert_eq!(one("Restart"), "on-failure");
    assert_eq!(one("User"), "hsiedge");
    assert_eq!(one("ProtectSystem"), "strict");
    assert_eq!(one("StateDirectory"), "hsiedge");
    assert_eq!(one("RuntimeDirectory"), "hsiedge");
    for yes in ["NoNewPrivileges", "PrivateTmp", "ProtectHome"] {
        assert_eq!(one(yes), "yes", "{yes}");
    }
    assert_eq!(one("RestrictAddressFamilies"), "AF_UNIX AF_INET AF_INET6");
    assert!(directives(&text, "SystemCallFilter").contains(&"@system-service".to_string()));
    assert!(one("WatchdogSec").ends_with('s'));
    assert!(text.contains("#MemoryMax="), "the optional MemoryMax is documented");
    assert_eq!(
        one("ExecStart"),
        "/usr/bin/hsiedge serve --config /etc/hsiedge/hsiedge.toml"
    );
}

#[test]
fn the_default_configuration_writes_only_where_the_unit_lets_it() {
    let text = unit_text();
    let config = hsiedge::daemon::config::load(&common::root().join("systemd/hsiedge.toml")).expect("example config");
    let state_dir = Path::new("/var/lib").join(&directives(&text, "StateDirectory")[0]);
    let runtime_dir = Path::new("/run").join(&directives(&text, "RuntimeDirectory")[0]);
    let writable: Vec<PathBuf> = directives(&text, "ReadWritePaths").iter().map(PathBuf::from).collect();
    assert!(
        config.outbox.starts_with(&writable[0]),
        "{:?} vs {writable:?}",
        config.outbox
    );
    assert_eq!(config.state, state_dir);
    assert!(config.control.starts_with(&runtime_dir), "{:?}", config.control);
    let unix = config.unix.expect("the example listens on a Unix socket");
    assert!(unix.starts_with(&runtime_dir), "{unix:?}");
    // The drain ends before systemd's stop timeout kills the service.
    let stop = directives(&text, "TimeoutStopSec")[0]
        .trim_end_matches('s')
        .parse::<f64>()
        .unwrap();
    assert!(config.intake.drain_timeout.as_secs_f64() < stop);
}

#[test]
fn both_debian_packages_ship_the_unit_and_the_default_configuration() {
    let cargo: toml::Table = std::fs::read_to_string(common::root().join("Cargo.toml"))
        .unwrap()
        .parse()
        .unwrap();
    let deb = &cargo["package"]["metadata"]["deb"];
    let assets = deb["assets"].as_array().unwrap();
    assert!(
        assets.iter().any(|a| a[0].as_str() == Some("systemd/hsiedge.toml")
            && a[1].as_str() == Some("etc/hsiedge/hsiedge.toml")),
        "{assets:?}"
    );
    assert_eq!(deb["systemd-units"]["unit-scripts"].as_str(), Some("systemd/"));
    // The arm64 (jetson) variant inherits both: it overrides neither.
    for (name, variant) in deb["variants"].as_table().unwrap() {
        assert!(
            variant.get("assets").is_none() && variant.get("systemd-units").is_none(),
            "{name}"
        );
    }
    // cargo-deb refuses to build without the token where it puts the unit's snippets.
    for script in ["postinst", "postrm"] {
        let text = std::fs::read_to_string(common::root().join("cross/debian").join(script)).unwrap();
        assert!(text.contains("#DEBHELPER#"), "{script}");
    }
}
