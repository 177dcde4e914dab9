//! The Debian packages built by `cross/run deb` / `cross/run deb-amd64`: metadata (`dpkg-deb --info`) and
//! contents (`dpkg-deb --contents`). A package that has not been built is skipped, unless
//! `HSIEDGE_DEB_REQUIRED=1` (set by `cross/run deb*`, `cross/ci.sh`) makes that a failure.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The newest `target/debian/hsiedge_*_<arch>.deb`.
fn package(arch: &str) -> Option<PathBuf> {
    let dir = std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root().join("target"), PathBuf::from);
    let mut debs: Vec<(std::time::SystemTime, PathBuf)> = std::fs::read_dir(dir.join("debian"))
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("hsiedge_") && n.ends_with(&format!("_{arch}.deb")))
        })
        .filter_map(|p| Some((p.metadata().ok()?.modified().ok()?, p)))
        .collect();
    debs.sort();
    debs.pop().map(|(_, p)| p)
}

fn dpkg_deb(args: &[&str], deb: &Path) -> String {
    let out = Command::new("dpkg-deb")
        .args(args)
        .arg(deb)
        .output()
        .expect("run dpkg-deb");
    assert!(
        out.status.success(),
        "dpkg-deb {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

fn field<'a>(info: &'a str, name: &str) -> Option<&'a str> {
    info.lines()
        .find_map(|l| l.trim_start().strip_prefix(name).and_then(|r| r.strip_prefix(':')))
        .map(str::trim)
}

fn check(arch: &str) {
    let Some(deb) = package(arch) else {
        assert!(
            std::env::var("HSIEDGE_DEB_REQUIRED").as_deref() != Ok("1"),
            "no {arch} package under target/debian (run cross/run deb / deb-amd64)"
        );
        common::skip(format!(
            "no {arch} package under target/debian (cross/run deb / deb-amd64 builds it)"
        ));
        return;
    };
    let info = dpkg_deb(&["--info"], &deb);
    assert_eq!(field(&info, "Package"), Some("hsiedge"), "{info}");
    assert_eq!(field(&info, "Architecture"), Some(arch), "{info}");
    let version = field(&info, "Version").expect("Version");
    assert!(version.starts_with(env!("CARGO_PKG_VERSION")), "{version}");
    let depends = field(&info, "Depends").expect("Depends");
    assert!(depends.contains("libc6"), "shlibdeps ran: {depends}");
    if arch == "arm64" {
        // JetPack 5 is Ubuntu 20.04 (glibc 2.31): the arm64 binary is linked against 2.31.
        let need = depends
            .split(',')
            .map(str::trim)
            .find_map(|d| d.strip_prefix("libc6 (>= ").and_then(|v| v.strip_suffix(')')))
            .expect("a versioned libc6 dependency");
        let minor = |v: &str| -> (u32, u32) {
            let mut it = v.split(['.', '-', '+']).map(|x| x.parse().unwrap_or(0));
            (it.next().unwrap_or(0), it.next().unwrap_or(0))
        };
        assert!(
            minor(need) <= (2, 31),
            "libc6 (>= {need}) does not install on JetPack 5: {depends}"
        );
    }
    assert!(depends.contains("adduser"), "{depends}");
    assert!(field(&info, "Maintainer").is_some_and(|m| m.contains('@')), "{info}");
    for script in ["postinst", "postrm"] {
        assert!(info.contains(script), "{script} missing from control.tar:\n{info}");
    }

    let contents = dpkg_deb(&["--contents"], &deb);
    let files: Vec<(&str, &str)> = contents
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let mode = f.next()?;
            let path = f.nth(4)?;
            Some((mode, path.trim_start_matches('.')))
        })
        .collect();
    let has = |p: &str| files.iter().find(|(_, f)| *f == p).map(|(m, _)| *m);
    assert_eq!(has("/usr/bin/hsiedge"), Some("-rwxr-xr-x"), "{contents}");
    for doc in [
        "/usr/share/doc/hsiedge/copyright",
        "/usr/share/doc/hsiedge/changelog.Debian.gz",
        "/usr/share/doc/hsiedge/DEPLOY.md",
        "/usr/share/doc/hsiedge/MANIFEST.md",
        "/usr/share/man/man1/hsiedge.1.gz",
    ] {
        assert!(has(doc).is_some(), "{doc} missing:\n{contents}");
    }
    // The daemon's unit and its default configuration (a conffile, being under /etc).
    assert_eq!(
        has("/usr/lib/systemd/system/hsiedge.service"),
        Some("-rw-r--r--"),
        "{contents}"
    );
    assert_eq!(has("/etc/hsiedge/hsiedge.toml"), Some("-rw-r--r--"), "{contents}");
    // Every shipped model: manifest + the ONNX files it names, nothing from models/fixtures.
    let mut shipped = 0;
    for entry in std::fs::read_dir(root().join("models"))
        .expect("models/")
        .filter_map(|e| e.ok())
    {
        let dir = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        let manifest = dir.join("manifest.json");
        if name == "fixtures" || !manifest.is_file() {
            continue;
        }
        shipped += 1;
        let base = format!("/usr/share/hsiedge/models/{name}");
        assert_eq!(
            has(&format!("{base}/manifest.json")),
            Some("-rw-r--r--"),
            "{name}:\n{contents}"
        );
        let m: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&manifest).expect("read manifest")).expect("manifest JSON");
        for (_, file) in m["files"].as_object().expect("files").iter() {
            let file = file.as_str().expect("file name");
            if dir.join(file).is_file() {
                assert!(has(&format!("{base}/{file}")).is_some(), "{base}/{file} missing");
            }
        }
    }
    assert!(shipped > 0, "no models under models/");
    assert!(
        !files.iter().any(|(_, f)| f.contains("fixtures")),
        "test fixtures shipped:\n{contents}"
    );
    // Nothing outside the FHS places the package owns.
    for (_, f) in &files {
        assert!(
            [
                "/",
                "/usr/",
                "/usr/bin/",
                "/usr/share/",
                "/etc/",
                "/usr/lib/",
                "/usr/lib/systemd/"
            ]
            .contains(f)
                || f.starts_with("/usr/bin/hsiedge")
                || f.starts_with("/usr/share/hsiedge/")
                || f.starts_with("/usr/share/doc/")
                || f.starts_with("/usr/share/man/")
                || f.starts_with("/usr/share/lintian/")
                || f.starts_with("/etc/hsiedge/")
                || f.starts_with("/usr/lib/systemd/system/"),
            "unexpected path {f}"
        );
    }
}

#[test]
fn arm64_package() {
    check("arm64");
}

#[test]
fn amd64_package() {
    check("amd64");
}
