//! The CUDA, cuDNN and TensorRT libraries in the directories the dynamic loader searches.

use std::fs;
use std::path::{Path, PathBuf};

use super::*;

/// Native libraries looked for, and the provider that first needs each.
pub(super) const NATIVE: &[(&str, Requirement)] = &[
    ("libcudart", Requirement::Cuda),
    ("libcublas", Requirement::Cuda),
    ("libcudnn", Requirement::Cuda),
    ("libnvinfer", Requirement::Tensorrt),
    ("libnvinfer_plugin", Requirement::Tensorrt),
    ("libnvonnxparser", Requirement::Tensorrt),
];

pub(super) const CUDA_DIRS: &[&str] = &[
    "/usr/local/cuda/lib64",
    "/usr/local/cuda/targets/aarch64-linux/lib",
    "/usr/local/cuda/targets/sbsa-linux/lib",
    "/usr/local/cuda/targets/x86_64-linux/lib",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu/tegra",
    "/usr/lib/x86_64-linux-gnu",
    "/lib/aarch64-linux-gnu",
    "/lib/x86_64-linux-gnu",
    "/usr/local/lib",
    "/usr/lib",
];

/// The loader's directories: `LD_LIBRARY_PATH`, `/etc/ld.so.conf` (with includes), the CUDA and
/// Tegra folders, and the `lib` folders of Python `nvidia-*` wheels; paths on the inspected system.
pub(super) fn loader_dirs(opts: &DoctorOptions) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = opts.ld_library_path.clone();
    ld_so_conf(opts, Path::new("/etc/ld.so.conf"), 0, &mut dirs);
    dirs.extend(CUDA_DIRS.iter().map(PathBuf::from));
    for site in python_site_dirs(opts) {
        let nvidia = site.join("nvidia");
        let Ok(entries) = fs::read_dir(opts.at(&nvidia)) else {
            continue;
        };
        let mut subs: Vec<PathBuf> = entries
            .filter_map(|e| e.ok())
            .map(|e| nvidia.join(e.file_name()).join("lib"))
            .collect();
        subs.sort();
        dirs.extend(subs);
    }
    let mut seen = std::collections::HashSet::new();
    dirs.retain(|d| seen.insert(d.clone()));
    dirs
}

pub(super) fn ld_so_conf(opts: &DoctorOptions, file: &Path, depth: u32, out: &mut Vec<PathBuf>) {
    if depth > 4 {
        return;
    }
    let Ok(text) = fs::read_to_string(opts.at(file)) else {
        return;
    };
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        if let Some(pattern) = line.strip_prefix("include") {
            for inc in expand_include(opts, file, pattern.trim()) {
                ld_so_conf(opts, &inc, depth + 1, out);
            }
        } else if line.starts_with('/') {
            out.push(PathBuf::from(line));
        }
    }
}

/// Expands an `include` of ld.so.conf; only `*` in the file name is supported (as in practice:
/// `/etc/ld.so.conf.d/*.conf`).
pub(super) fn expand_include(opts: &DoctorOptions, from: &Path, pattern: &str) -> Vec<PathBuf> {
    let pat = Path::new(pattern);
    let pat = if pat.is_absolute() {
        pat.to_path_buf()
    } else {
        from.parent().unwrap_or(Path::new("/")).join(pat)
    };
    let (Some(dir), Some(name)) = (pat.parent(), pat.file_name().and_then(|n| n.to_str())) else {
        return Vec::new();
    };
    let (prefix, suffix) = name.split_once('*').unwrap_or((name, ""));
    let exact = !name.contains('*');
    let Ok(entries) = fs::read_dir(opts.at(dir)) else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .filter(|n| {
            if exact {
                n == name
            } else {
                n.len() >= prefix.len() + suffix.len() && n.starts_with(prefix) && n.ends_with(suffix)
            }
        })
        .map(|n| dir.join(n))
        .collect();
    out.sort();
    out
}

pub(super) fn find_native_libs(opts: &DoctorOptions) -> Vec<NativeLib> {
    let dirs = loader_dirs(opts);
    NATIVE
        .iter()
        .map(|(name, _)| {
            let stem = format!("{name}.so");
            for dir in &dirs {
                let Ok(entries) = fs::read_dir(opts.at(dir)) else {
                    continue;
                };
                let mut best: Option<(String, Option<String>)> = None;
                for e in entries.filter_map(|e| e.ok()) {
                    let Some(n) = e.file_name().to_str().map(str::to_string) else {
                        continue;
                    };
                    if n != stem && !n.starts_with(&format!("{stem}.")) {
                        continue;
                    }
                    let v = soname_version(&n, &stem);
                    let better = match &best {
                        None => true,
                        Some((_, bv)) => v.as_ref().map_or(0, String::len) > bv.as_ref().map_or(0, String::len),
                    };
                    if better {
                        best = Some((n, v));
                    }
                }
                if let Some((n, version)) = best {
                    return NativeLib {
                        name,
                        path: Some(dir.join(n)),
                        version,
                    };
                }
            }
            NativeLib {
                name,
                path: None,
                version: None,
            }
        })
        .collect()
}

pub(super) fn native_check(req: Requirement, ort: Option<&OrtFound>, libs: &[NativeLib]) -> Check {
    let needed = |r: Requirement| match req {
        Requirement::Cpu => false,
        Requirement::Cuda => r == Requirement::Cuda,
        Requirement::Tensorrt => true,
    };
    let mut details = Vec::new();
    let mut missing_needed = Vec::new();
    let mut found = Vec::new();
    for (lib, (_, r)) in libs.iter().zip(NATIVE) {
        match &lib.path {
            Some(p) => {
                found.push(format!("{} {}", lib.name, lib.version.as_deref().unwrap_or("?")));
                details.push(format!("{}: {}", lib.name, p.display()));
            }
            None => {
                details.push(format!("{}: not found", lib.name));
                if needed(*r) {
                    missing_needed.push(lib.name);
                }
            }
        }
    }
    let ep = match req {
        Requirement::Cpu => None,
        Requirement::Cuda => Some("CUDAExecutionProvider"),
        Requirement::Tensorrt => Some("TensorrtExecutionProvider"),
    };
    let ep_missing = match (ep, ort) {
        (Some(ep), Some(o)) => !o.providers.iter().any(|p| p == ep),
        _ => false,
    };
    if ep_missing && let Some(ep) = ep {
        details.push(format!(
            "the ONNX Runtime found has no {ep} (no provider library beside it): install an onnxruntime-gpu build"
        ));
    }
    let (status, summary) = if !missing_needed.is_empty() || ep_missing {
        let mut what: Vec<String> = missing_needed.iter().map(|s| s.to_string()).collect();
        if ep_missing && let Some(ep) = ep {
            what.push(ep.to_string());
        }
        (Status::Fail, format!("the {req} provider needs {}", what.join(", ")))
    } else if found.is_empty() {
        (Status::Info, "no CUDA, cuDNN or TensorRT libraries (CPU only)".into())
    } else {
        (Status::Ok, found.join(", "))
    };
    Check {
        name: "cuda",
        status,
        summary,
        details,
    }
}
