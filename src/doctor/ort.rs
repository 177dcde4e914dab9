//! The ONNX Runtime check: the library over the engine's search order, its version and providers.

use std::fs;
use std::path::{Path, PathBuf};

use super::*;

pub(super) const ORT_STEM: &str = "libonnxruntime.so";

/// The oldest ONNX Runtime the `ort` crate accepts: it is built with `api-18` and asks the library
/// for C API version 18, which ONNX Runtime 1.18 introduced; older libraries refuse it at load.
pub const MIN_ORT_VERSION: (u32, u32) = (1, 18);

/// `1.20.1` -> `(1, 20)`.
pub(super) fn major_minor(version: &str) -> Option<(u32, u32)> {
    let mut it = version.split('.');
    Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
}

/// Provider libraries ONNX Runtime loads at session creation, and the provider each enables.
pub(super) const PROVIDER_LIBS: &[(&str, &str)] = &[
    ("libonnxruntime_providers_cuda.so", "CUDAExecutionProvider"),
    ("libonnxruntime_providers_tensorrt.so", "TensorrtExecutionProvider"),
    ("libonnxruntime_providers_openvino.so", "OpenVINOExecutionProvider"),
    ("libonnxruntime_providers_rocm.so", "ROCMExecutionProvider"),
    ("libonnxruntime_providers_migraphx.so", "MIGraphXExecutionProvider"),
    ("libonnxruntime_providers_dnnl.so", "DnnlExecutionProvider"),
];

pub(super) fn check_ort(opts: &DoctorOptions, checks: &mut Vec<Check>) -> Option<OrtFound> {
    let (found, tried) = match locate_ort(opts) {
        Ok(found) => found,
        Err(fail) => {
            checks.push(fail);
            return None;
        }
    };
    let Some((path, source, python_pkg)) = found else {
        let mut details = vec!["looked in:".to_string()];
        details.extend(tried.iter().map(|p| format!("  {}", p.display())));
        details.push(
            "install onnxruntime (on a Jetson: the onnxruntime-gpu wheel for your JetPack, see cross/README.md), \
             or pass --ort-lib / set ORT_DYLIB_PATH"
                .into(),
        );
        checks.push(Check {
            name: "onnxruntime",
            status: Status::Fail,
            summary: "libonnxruntime not found".into(),
            details,
        });
        return None;
    };
    let here = opts.at(&path);
    let version =
        version_of(&here, &path, opts).or_else(|| python_pkg.as_deref().and_then(|p| python_version(&opts.at(p))));
    let mut providers = vec!["CPUExecutionProvider".to_string()];
    if let Some(dir) = here.parent() {
        for (lib, ep) in PROVIDER_LIBS {
            if dir.join(lib).is_file() {
                providers.push((*ep).to_string());
            }
        }
    }
    let mut found = OrtFound {
        path,
        source,
        version,
        providers,
        build_info: None,
    };
    let mut details = vec![format!("providers: {}", found.providers.join(", "))];
    let mut status = Status::Ok;
    if let Some((major, minor)) = found.version.as_deref().and_then(major_minor)
        && (major, minor) < MIN_ORT_VERSION
    {
        status = Status::Fail;
        details.push(format!(
            "hsiedge needs ONNX Runtime >= {}.{} (C API 18); this one is {major}.{minor}",
            MIN_ORT_VERSION.0, MIN_ORT_VERSION.1
        ));
    }
    if opts.load {
        let options = engine::EngineOptions {
            ort_lib: Some(here.clone()),
            ..engine::EngineOptions::default()
        };
        match engine::Runtime::new(options) {
            Ok(rt) => {
                let info = rt.build_info();
                if found.version.is_none() {
                    found.version = version_from_build_info(&info);
                }
                details.push(format!("loaded: {info}"));
                found.build_info = Some(info);
                // The registration the engine makes for `--ep`, on this very library.
                let provider = opts.requirement.provider();
                if provider != engine::Provider::Cpu {
                    match rt.check_provider(provider) {
                        Ok(()) => details.push(format!("{} registers", provider.ort_name())),
                        Err(reason) => {
                            status = Status::Fail;
                            details.push(format!(
                                "{} does not register: {reason}; it needs {}",
                                provider.ort_name(),
                                provider.needs()
                            ));
                        }
                    }
                }
            }
            Err(e) => {
                status = Status::Fail;
                details.push(format!("cannot load: {}", crate::engine::error_chain(&e)));
            }
        }
    }
    if opts.root == Path::new("/") && opts.ort_env == config::ORT_DYLIB_PATH.path() {
        // Cross-check against the engine's own search (same process environment).
        if let Ok(loc) = engine::find_library(opts.ort_lib.as_deref())
            && loc.path != found.path
        {
            status = status.max(Status::Warn);
            details.push(format!(
                "the engine's search finds {} instead; hsiedge classify will use that one",
                loc.path.display()
            ));
        }
    }
    let source_name = match found.source {
        LibSource::Flag => "--ort-lib",
        LibSource::Env => "ORT_DYLIB_PATH",
        LibSource::BesideExecutable => "beside the executable",
        LibSource::System => "system library path",
        LibSource::Python => "Python onnxruntime package",
    };
    checks.push(Check {
        name: "onnxruntime",
        status,
        summary: format!(
            "{} (version {}, from {source_name})",
            found.path.display(),
            found.version.as_deref().unwrap_or("unknown")
        ),
        details,
    });
    Some(found)
}

type Located = (Option<(PathBuf, LibSource, Option<PathBuf>)>, Vec<PathBuf>);

/// The search order of [`engine::find_library`], under the root. `Err` is a failed check (a named
/// library that does not exist: the engine does not fall back in that case either).
pub(super) fn locate_ort(opts: &DoctorOptions) -> Result<Located, Check> {
    for (named, flag, source) in [
        (&opts.ort_lib, "--ort-lib", LibSource::Flag),
        (&opts.ort_env, config::ORT_DYLIB_PATH.name, LibSource::Env),
    ] {
        if let Some(p) = named {
            if opts.at(p).is_file() {
                return Ok((Some((p.clone(), source, None)), Vec::new()));
            }
            return Err(Check {
                name: "onnxruntime",
                status: Status::Fail,
                summary: format!("{flag} names {}, which does not exist", p.display()),
                details: vec!["the engine does not fall back to other locations when a library is named".into()],
            });
        }
    }
    let mut dirs: Vec<(PathBuf, LibSource)> = Vec::new();
    if let Some(exe) = &opts.exe_dir {
        for d in engine::beside_executable(exe) {
            dirs.push((d, LibSource::BesideExecutable));
        }
    }
    for d in &opts.ld_library_path {
        dirs.push((d.clone(), LibSource::System));
    }
    for d in engine::SYSTEM_LIB_DIRS {
        dirs.push((PathBuf::from(d), LibSource::System));
    }
    let mut tried = Vec::new();
    for (dir, source) in dirs {
        if let Some(p) = lib_in(&opts.at(&dir)).and_then(|p| p.file_name().map(|n| dir.join(n))) {
            return Ok((Some((p, source, None)), tried));
        }
        tried.push(dir);
    }
    for pkg in engine::python_packages(opts.python_package.clone(), |p| opts.at(p)) {
        let capi = pkg.join("capi");
        if let Some(p) = lib_in(&opts.at(&capi)).and_then(|p| p.file_name().map(|n| capi.join(n))) {
            return Ok((Some((p, LibSource::Python, Some(pkg))), tried));
        }
        if opts.at(&capi).is_dir() {
            // Wheels before 1.19 link ONNX Runtime into the Python module and ship no libonnxruntime.so.
            tried.push(capi.join("(a Python onnxruntime package without libonnxruntime.so: wheels before 1.19)"));
        } else {
            tried.push(capi);
        }
    }
    Ok((None, tried))
}

/// Same choice as the engine ([`engine::lib_in`]).
pub(super) fn lib_in(dir: &Path) -> Option<PathBuf> {
    engine::lib_in(dir)
}

/// The engine's Python install folders ([`engine::python_site_dirs`]) on the inspected system.
pub(super) fn python_site_dirs(opts: &DoctorOptions) -> Vec<PathBuf> {
    engine::python_site_dirs(|p| opts.at(p))
}

/// The version in a library's file name (following symlinks, relative ones under the root).
pub(super) fn version_of(here: &Path, path: &Path, opts: &DoctorOptions) -> Option<String> {
    let mut name = path.file_name()?.to_str()?.to_string();
    let mut cur = here.to_path_buf();
    for _ in 0..8 {
        if let Some(v) = soname_version(&name, ORT_STEM) {
            return Some(v);
        }
        let target = fs::read_link(&cur).ok()?;
        cur = if target.is_absolute() {
            opts.at(&target)
        } else {
            cur.parent()?.join(&target)
        };
        name = target.file_name()?.to_str()?.to_string();
    }
    None
}

/// `libfoo.so.1.2.3` with stem `libfoo.so` -> `1.2.3`.
pub(super) fn soname_version(name: &str, stem: &str) -> Option<String> {
    let v = name.strip_prefix(stem)?.strip_prefix('.')?;
    (!v.is_empty()
        && v.split('.')
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit())))
    .then(|| v.to_string())
}

/// `__version__ = "1.20.1"` from the package's `__init__.py`.
pub(super) fn python_version(pkg: &Path) -> Option<String> {
    let text = fs::read_to_string(pkg.join("__init__.py")).ok()?;
    text.lines().find_map(|l| {
        let rest = l.trim().strip_prefix("__version__")?.trim_start().strip_prefix('=')?;
        let v = rest.trim().trim_matches(|c| c == '"' || c == '\'');
        (!v.is_empty()).then(|| v.to_string())
    })
}

/// `git-branch=rel-1.20.1` in ONNX Runtime's build string -> `1.20.1`.
pub(super) fn version_from_build_info(info: &str) -> Option<String> {
    let at = info.find("git-branch=rel-")? + "git-branch=rel-".len();
    let v: String = info[at..]
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    (!v.is_empty()).then_some(v)
}
