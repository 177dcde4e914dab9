//! Finding the ONNX Runtime shared library: the search order `hsiedge doctor` repeats.

use std::path::{Path, PathBuf};

use super::EngineError;
use crate::config;

/// Where the library was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LibSource {
    /// `--ort-lib`.
    Flag,
    /// `ORT_DYLIB_PATH`.
    Env,
    /// Beside the executable (or in `../lib` from it).
    BesideExecutable,
    /// A system library directory.
    System,
    /// An installed Python `onnxruntime` package.
    Python,
}

/// A located library.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct LibLocation {
    /// The shared object.
    pub path: PathBuf,
    /// How it was found.
    pub source: LibSource,
}

/// Finds libonnxruntime: `explicit` (`--ort-lib`), then `ORT_DYLIB_PATH`, then beside the executable,
/// then system library paths, then an installed Python `onnxruntime`: the configured interpreter's,
/// then one under [`PYTHON_LIB_BASES`]. `hsiedge doctor` searches the same places in the same order.
pub fn find_library(explicit: Option<&Path>) -> Result<LibLocation, EngineError> {
    if let Some(p) = explicit {
        return existing(p, "--ort-lib", LibSource::Flag);
    }
    if let Some(p) = config::ORT_DYLIB_PATH.path() {
        return existing(&p, config::ORT_DYLIB_PATH.name, LibSource::Env);
    }
    let mut tried = Vec::new();
    let mut dirs: Vec<(PathBuf, LibSource)> = Vec::new();
    if let Ok(exe) = std::env::current_exe()
        && let Some(dir) = exe.parent()
    {
        for d in beside_executable(dir) {
            dirs.push((d, LibSource::BesideExecutable));
        }
    }
    for d in system_lib_dirs() {
        dirs.push((d, LibSource::System));
    }
    for (dir, source) in dirs {
        if let Some(p) = lib_in(&dir) {
            return Ok(LibLocation { path: p, source });
        }
        tried.push(dir);
    }
    // The interpreter's own package first, then the usual install folders: a service's
    // environment may not have on its PATH the Python that installed the package.
    let interpreter = python_onnxruntime_dir();
    if interpreter.is_none() {
        tried.push(PathBuf::from(format!(
            "python onnxruntime package ({} -c 'import onnxruntime')",
            config::python()
        )));
    }
    for pkg in python_packages(interpreter, Path::to_path_buf) {
        let capi = pkg.join("capi");
        if let Some(p) = lib_in(&capi) {
            return Ok(LibLocation {
                path: p,
                source: LibSource::Python,
            });
        }
        tried.push(capi);
    }
    Err(EngineError::LibraryNotFound { tried })
}

fn existing(p: &Path, source_name: &str, source: LibSource) -> Result<LibLocation, EngineError> {
    if p.is_file() {
        Ok(LibLocation {
            path: p.to_path_buf(),
            source,
        })
    } else {
        Err(EngineError::NamedLibraryMissing {
            source_name: source_name.into(),
            path: p.to_path_buf(),
        })
    }
}

/// The folders searched "beside the executable" in `exe_dir`, in order: the folder itself, an
/// installed layout's `../lib` and `../lib/hsiedge`, and a build tree's `../ort/ARCH` and
/// `../../ort/ARCH` (where `make ort` puts the library for `target/release/hsiedge` and
/// `target/TRIPLE/release/hsiedge`).
pub fn beside_executable(exe_dir: &Path) -> Vec<PathBuf> {
    vec![
        exe_dir.to_path_buf(),
        exe_dir.join("../lib"),
        exe_dir.join("../lib/hsiedge"),
        exe_dir.join("../ort").join(std::env::consts::ARCH),
        exe_dir.join("../../ort").join(std::env::consts::ARCH),
    ]
}

/// The `libonnxruntime.so*` chosen in `dir`: plain `libonnxruntime.so` first, else the versioned
/// name of the highest version (compared number by number: 1.31.1 above 1.9.0).
pub fn lib_in(dir: &Path) -> Option<PathBuf> {
    let plain = dir.join("libonnxruntime.so");
    if plain.is_file() {
        return Some(plain);
    }
    std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter_map(|p| {
            let version: Vec<u64> = p
                .file_name()?
                .to_str()?
                .strip_prefix("libonnxruntime.so.")?
                .split('.')
                .map(|n| n.parse().ok())
                .collect::<Option<_>>()?;
            p.is_file().then_some((version, p))
        })
        .max()
        .map(|(_, p)| p)
}

/// The system library folders searched after `LD_LIBRARY_PATH`.
pub const SYSTEM_LIB_DIRS: &[&str] = &[
    "/usr/local/lib",
    "/usr/lib",
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib/hsiedge",
];

fn system_lib_dirs() -> Vec<PathBuf> {
    let mut v = config::LD_LIBRARY_PATH.paths();
    v.extend(SYSTEM_LIB_DIRS.iter().map(PathBuf::from));
    v
}

/// The folders of the usual Python installs whose `python3*/{dist,site}-packages` are searched for an
/// `onnxruntime` package after the configured interpreter's own.
pub const PYTHON_LIB_BASES: &[&str] = &["/usr/lib", "/usr/local/lib", "/opt/hsiedge/venv/lib"];

/// The `dist-packages` and `site-packages` folders under [`PYTHON_LIB_BASES`] that exist, in search
/// order, as paths on the system inspected; `at` maps such a path to where it is read from here
/// (the identity for this system, a root prefix for `hsiedge doctor --root`).
pub fn python_site_dirs(at: impl Fn(&Path) -> PathBuf) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for base in PYTHON_LIB_BASES {
        let Ok(entries) = std::fs::read_dir(at(Path::new(base))) else {
            continue;
        };
        let mut pys: Vec<String> = entries
            .filter_map(|e| e.ok())
            .filter_map(|e| e.file_name().to_str().map(str::to_string))
            .filter(|n| n.starts_with("python3"))
            .collect();
        pys.sort();
        for py in pys {
            for sub in ["dist-packages", "site-packages"] {
                let d = Path::new(base).join(&py).join(sub);
                if at(&d).is_dir() {
                    out.push(d);
                }
            }
        }
    }
    out
}

/// The `onnxruntime` package folders searched, in order: `interpreter`'s (what the configured
/// Python reports), then one in each of [`python_site_dirs`] (`at` as there).
pub fn python_packages(interpreter: Option<PathBuf>, at: impl Fn(&Path) -> PathBuf) -> Vec<PathBuf> {
    let mut packages: Vec<PathBuf> = interpreter.into_iter().collect();
    packages.extend(python_site_dirs(at).into_iter().map(|d| d.join("onnxruntime")));
    packages
}

/// Asks the configured Python (`HSIEDGE_PYTHON`, else `python3`) where its `onnxruntime` package lives.
pub fn python_onnxruntime_dir() -> Option<PathBuf> {
    let python = config::python();
    let out = std::process::Command::new(python)
        .args([
            "-c",
            "import importlib.util as u, os; s = u.find_spec('onnxruntime'); print(os.path.dirname(s.origin) if s else '')",
        ])
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    let dir = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!dir.is_empty()).then(|| PathBuf::from(dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_site_dirs_are_the_python3_package_folders_in_search_order() {
        let root = tempfile::tempdir().unwrap();
        let at = |p: &Path| root.path().join(p.strip_prefix("/").unwrap());
        for d in [
            "/usr/local/lib/python3.11/site-packages",
            "/usr/lib/python3.12/dist-packages",
            "/usr/lib/python3.10/dist-packages",
            "/usr/lib/python3.10/site-packages",
            "/usr/lib/python2.7/dist-packages",
            "/opt/hsiedge/venv/lib/python3.10/site-packages",
        ] {
            std::fs::create_dir_all(at(Path::new(d))).unwrap();
        }
        // A file, not a folder: not a package folder.
        std::fs::create_dir_all(at(Path::new("/usr/lib/python3.9"))).unwrap();
        std::fs::write(at(Path::new("/usr/lib/python3.9/dist-packages")), b"").unwrap();
        let got = python_site_dirs(at);
        let want: Vec<PathBuf> = [
            "/usr/lib/python3.10/dist-packages",
            "/usr/lib/python3.10/site-packages",
            "/usr/lib/python3.12/dist-packages",
            "/usr/local/lib/python3.11/site-packages",
            "/opt/hsiedge/venv/lib/python3.10/site-packages",
        ]
        .iter()
        .map(PathBuf::from)
        .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn the_highest_version_is_chosen_number_by_number() {
        let dir = tempfile::tempdir().unwrap();
        for n in [
            "libonnxruntime.so.1.9.0",
            "libonnxruntime.so.1.31.1",
            "libonnxruntime.so.1.x",
            "other.so",
        ] {
            std::fs::write(dir.path().join(n), b"").unwrap();
        }
        assert_eq!(lib_in(dir.path()), Some(dir.path().join("libonnxruntime.so.1.31.1")));
        std::fs::write(dir.path().join("libonnxruntime.so"), b"").unwrap();
        assert_eq!(lib_in(dir.path()), Some(dir.path().join("libonnxruntime.so")));
    }

    #[test]
    fn a_build_tree_finds_the_library_make_ort_provisions() {
        let dirs = beside_executable(Path::new("/src/target/release"));
        let ort = Path::new("/src/target/release/../ort").join(std::env::consts::ARCH);
        assert!(dirs.contains(&ort), "{dirs:?}");
    }
}
