//! `hsiedge doctor`: can this machine run the configured deployment?
//!
//! Every check reads files under a root directory (`/` in production), so tests run on fake trees
//! (`tests/fixtures/doctor/`). The checks:
//!
//! * **ONNX Runtime**: found over the engine's search order ([`crate::engine::find_library`]):
//!   `--ort-lib`, `ORT_DYLIB_PATH`, beside the executable (`.`, `../lib`, `../lib/hsiedge`),
//!   `LD_LIBRARY_PATH` and the system library directories, then an installed Python
//!   `onnxruntime` package. The version comes from the file name (or the Python package); the
//!   execution providers from the provider libraries beside it; when the root is `/` the library is
//!   also loaded and its build string reported.
//! * **CUDA / cuDNN / TensorRT** libraries (`libcudart`, `libcublas`, `libcudnn`, `libnvinfer`) in
//!   the directories the dynamic loader uses (`/etc/ld.so.conf`, its includes, the CUDA and Tegra
//!   library folders, Python `nvidia-*` wheels).
//! * **Jetson** model (`/proc/device-tree/model`) and L4T / JetPack release (`/etc/nv_tegra_release`,
//!   the `nvidia-jetpack` package in the dpkg status file).
//! * **Memory** sources the budget reads (`/proc/meminfo`, the cgroup limit).
//! * **Power rails**: INA3221 hwmon labels under `/sys/bus/i2c/devices/*/hwmon/hwmon*/in*_label`.
//! * **nvpmodel**: `/etc/nvpmodel.conf` (its `POWER_MODEL` entries), the `nvpmodel` binary and the
//!   current mode (`/var/lib/nvpmodel/status`).
//!
//! The report is ready (exit code 0) only when no check failed: ONNX Runtime found (and loadable,
//! when loaded), the libraries the requested provider needs present, and the memory budget
//! readable. Jetson-only checks warn on a Jetson and are informational elsewhere.

use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde::Serialize;

use crate::budget::system::{self, JetsonInfo};
use crate::config;
use crate::engine::{self, LibSource};
pub use crate::platform::{Nvpmodel, PowerMode, Rail, parse_nvpmodel_conf};

/// Errors of the doctor's own inputs (the checks themselves never fail; they report).
#[derive(Debug, thiserror::Error)]
pub enum DoctorError {
    /// `--provider` named something unknown.
    #[error("unknown provider {0:?}: expected cpu, cuda or tensorrt")]
    UnknownProvider(String),
    /// The report could not be written as JSON.
    #[error("cannot serialise the doctor report: {0}")]
    Json(#[from] serde_json::Error),
}

/// The execution provider the deployment is configured for; it decides which libraries must exist.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Requirement {
    /// ONNX Runtime's CPU provider only.
    #[default]
    Cpu,
    /// The CUDA provider: CUDA runtime, cuBLAS, cuDNN and ORT's CUDA provider library.
    Cuda,
    /// The TensorRT provider: everything CUDA needs plus `libnvinfer`.
    Tensorrt,
}

impl FromStr for Requirement {
    type Err = DoctorError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "cpu" => Ok(Self::Cpu),
            "cuda" => Ok(Self::Cuda),
            "tensorrt" | "trt" => Ok(Self::Tensorrt),
            _ => Err(DoctorError::UnknownProvider(s.to_string())),
        }
    }
}

impl Requirement {
    /// The execution provider the engine registers for this requirement.
    pub fn provider(self) -> engine::Provider {
        match self {
            Self::Cpu => engine::Provider::Cpu,
            Self::Cuda => engine::Provider::Cuda,
            Self::Tensorrt => engine::Provider::Tensorrt,
        }
    }
}

impl fmt::Display for Requirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Cpu => "cpu",
            Self::Cuda => "cuda",
            Self::Tensorrt => "tensorrt",
        })
    }
}

/// What the doctor inspects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DoctorOptions {
    /// The root the checks read under (`/` in production).
    pub root: PathBuf,
    /// `--ort-lib`, a path on the inspected system.
    pub ort_lib: Option<PathBuf>,
    /// The value of `ORT_DYLIB_PATH`, a path on the inspected system.
    pub ort_env: Option<PathBuf>,
    /// The folder holding the `hsiedge` executable, a path on the inspected system.
    pub exe_dir: Option<PathBuf>,
    /// `LD_LIBRARY_PATH` entries, paths on the inspected system.
    pub ld_library_path: Vec<PathBuf>,
    /// An installed Python `onnxruntime` package folder found by asking the interpreter; the
    /// standard `site-packages` / `dist-packages` folders under the root are searched regardless.
    pub python_package: Option<PathBuf>,
    /// The provider the deployment is configured for.
    pub requirement: Requirement,
    /// Load the library found to read its build string (only meaningful for the running system).
    pub load: bool,
    /// The daemon's configuration (`--config`), a path on the inspected system: its folders are
    /// checked too ([`crate::daemon::check`]).
    pub daemon_config: Option<PathBuf>,
}

impl DoctorOptions {
    /// Options that inspect the tree under `root` alone: no environment, no executable folder,
    /// no loading.
    pub fn for_root(root: impl Into<PathBuf>) -> Self {
        Self {
            root: root.into(),
            ort_lib: None,
            ort_env: None,
            exe_dir: None,
            ld_library_path: Vec::new(),
            python_package: None,
            requirement: Requirement::Cpu,
            load: false,
            daemon_config: None,
        }
    }

    /// Options for the running system: root `/`, `ORT_DYLIB_PATH`, `LD_LIBRARY_PATH`, the
    /// executable's folder and the Python package the configured interpreter reports; the library
    /// found is loaded.
    pub fn for_this_system(ort_lib: Option<PathBuf>, requirement: Requirement) -> Self {
        Self {
            root: PathBuf::from("/"),
            ort_lib,
            ort_env: config::ORT_DYLIB_PATH.path(),
            exe_dir: std::env::current_exe()
                .ok()
                .and_then(|e| e.parent().map(Path::to_path_buf)),
            ld_library_path: config::LD_LIBRARY_PATH.paths(),
            python_package: engine::python_onnxruntime_dir(),
            requirement,
            load: true,
            daemon_config: None,
        }
    }

    /// `path` (a path on the inspected system) as seen from here.
    fn at(&self, path: &Path) -> PathBuf {
        if self.root == Path::new("/") {
            return path.to_path_buf();
        }
        match path.strip_prefix("/") {
            Ok(rel) => self.root.join(rel),
            Err(_) => self.root.join(path),
        }
    }
}

/// Outcome of one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Present and usable.
    Ok,
    /// Not applicable here, or for information only.
    Info,
    /// Missing but not needed by the configured deployment.
    Warn,
    /// The configured deployment cannot run.
    Fail,
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(match self {
            Self::Ok => "ok",
            Self::Info => "info",
            Self::Warn => "warn",
            Self::Fail => "FAIL",
        })
    }
}

/// One line of the report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    /// Short name, e.g. `onnxruntime`.
    pub name: &'static str,
    /// The outcome.
    pub status: Status,
    /// One-line summary.
    pub summary: String,
    /// Further lines (paths tried, hints).
    pub details: Vec<String>,
}

/// The ONNX Runtime library found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OrtFound {
    /// The shared object, as a path on the inspected system.
    pub path: PathBuf,
    /// Which step of the search order found it.
    pub source: LibSource,
    /// Version from the file name or the Python package, e.g. `1.20.1`.
    pub version: Option<String>,
    /// Execution providers: CPU plus those whose provider library lies beside the library.
    pub providers: Vec<String>,
    /// ONNX Runtime's build string, when the library was loaded.
    pub build_info: Option<String>,
}

/// A native library looked for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NativeLib {
    /// The soname stem, e.g. `libcudart`.
    pub name: &'static str,
    /// Where it was found, as a path on the inspected system.
    pub path: Option<PathBuf>,
    /// The version in the file name, e.g. `12.2.140`.
    pub version: Option<String>,
}

/// Memory the budget reads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Memory {
    /// `MemTotal`.
    pub total_bytes: u64,
    /// `MemAvailable`.
    pub available_bytes: u64,
    /// `NvMapMemUsed` (Jetson kernels).
    pub nvmap_used_bytes: Option<u64>,
    /// The cgroup's effective limit, when one is set.
    pub cgroup_limit_bytes: Option<u64>,
}

/// The doctor's findings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Report {
    /// The root inspected.
    pub root: PathBuf,
    /// The provider the deployment is configured for.
    pub requirement: Requirement,
    /// The ONNX Runtime library, when found.
    pub ort: Option<OrtFound>,
    /// CUDA, cuDNN and TensorRT libraries.
    pub native_libs: Vec<NativeLib>,
    /// The Jetson board, when this is one.
    pub jetson: Option<JetsonInfo>,
    /// The JetPack release (from the `nvidia-jetpack` package, else mapped from L4T).
    pub jetpack: Option<String>,
    /// Memory sources, when readable.
    pub memory: Option<Memory>,
    /// Power rails.
    pub rails: Vec<Rail>,
    /// nvpmodel.
    pub nvpmodel: Nvpmodel,
    /// Every check, in report order.
    pub checks: Vec<Check>,
}

impl Report {
    /// True when no check failed: the configured deployment can run.
    pub fn ready(&self) -> bool {
        self.checks.iter().all(|c| c.status != Status::Fail)
    }

    /// The process exit code: 0 when [`Report::ready`], else 1.
    pub fn exit_code(&self) -> i32 {
        if self.ready() { 0 } else { 1 }
    }

    /// The check called `name`.
    pub fn check(&self, name: &str) -> Option<&Check> {
        self.checks.iter().find(|c| c.name == name)
    }

    /// The report as pretty JSON.
    pub fn to_json(&self) -> Result<String, DoctorError> {
        Ok(serde_json::to_string_pretty(self)?)
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "hsiedge doctor (root {}, provider {})",
            self.root.display(),
            self.requirement
        )?;
        for c in &self.checks {
            writeln!(f, "  [{:>4}] {:<12} {}", c.status, c.name, c.summary)?;
            for d in &c.details {
                writeln!(f, "         {:<12} {d}", "")?;
            }
        }
        let failed: Vec<&str> = self
            .checks
            .iter()
            .filter(|c| c.status == Status::Fail)
            .map(|c| c.name)
            .collect();
        if failed.is_empty() {
            write!(f, "ready: the {} deployment can run here", self.requirement)
        } else {
            write!(f, "NOT ready: failed {}", failed.join(", "))
        }
    }
}

/// Command-line arguments of `hsiedge doctor` (flatten into the binary's subcommand).
#[derive(Debug, Clone, clap::Args)]
pub struct DoctorArgs {
    /// ONNX Runtime library (else ORT_DYLIB_PATH, beside the executable, system paths, Python onnxruntime).
    #[arg(long, value_name = "PATH")]
    pub ort_lib: Option<PathBuf>,
    /// Execution provider the deployment uses: cpu, cuda or tensorrt.
    #[arg(long, default_value = "cpu")]
    pub provider: String,
    /// Inspect the system mounted at this root instead of the running one (no environment, no loading).
    #[arg(long, value_name = "DIR")]
    pub root: Option<PathBuf>,
    /// Do not load the library found (file checks only).
    #[arg(long)]
    pub no_load: bool,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Also check the daemon's configuration and its folders (owner, permissions).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
}

/// Runs `hsiedge doctor` with `args`: prints the report on stdout and returns the exit code
/// (0 ready, 1 not ready, 2 bad arguments).
pub fn main(args: &DoctorArgs) -> i32 {
    let requirement = match args.provider.parse::<Requirement>() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("hsiedge doctor: {e}");
            return 2;
        }
    };
    let options = match &args.root {
        Some(root) if root != Path::new("/") => DoctorOptions {
            ort_lib: args.ort_lib.clone(),
            requirement,
            ..DoctorOptions::for_root(root)
        },
        _ => DoctorOptions {
            load: !args.no_load,
            ..DoctorOptions::for_this_system(args.ort_lib.clone(), requirement)
        },
    };
    let options = DoctorOptions {
        daemon_config: args.config.clone(),
        ..options
    };
    let report = run(&options);
    if args.json {
        match report.to_json() {
            Ok(j) => println!("{j}"),
            Err(e) => {
                eprintln!("hsiedge doctor: {e}");
                return 1;
            }
        }
    } else {
        println!("{report}");
    }
    report.exit_code()
}

/// Runs every check.
pub fn run(opts: &DoctorOptions) -> Report {
    let mut checks = Vec::new();

    let ort = check_ort(opts, &mut checks);

    let native_libs = find_native_libs(opts);
    checks.push(native_check(opts.requirement, ort.as_ref(), &native_libs));

    let jetson = system::detect_jetson(&opts.root);
    let jetpack = jetpack_release(opts, jetson.as_ref());
    checks.push(jetson_check(jetson.as_ref(), jetpack.as_deref()));

    let memory = check_memory(opts, &mut checks);

    let on_jetson = jetson.is_some();
    let rails = crate::platform::find_rails(&opts.root);
    checks.push(rails_check(&rails, on_jetson));

    let nvpmodel = crate::platform::read_nvpmodel(&opts.root);
    checks.push(nvpmodel_check(&nvpmodel, on_jetson));

    if let Some(config) = &opts.daemon_config {
        checks.extend(crate::daemon::check::checks(&opts.root, config));
    }

    Report {
        root: opts.root.clone(),
        requirement: opts.requirement,
        ort,
        native_libs,
        jetson,
        jetpack,
        memory,
        rails,
        nvpmodel,
        checks,
    }
}

// ---------------------------------------------------------------------------------------------
// ONNX Runtime

const ORT_STEM: &str = "libonnxruntime.so";

/// The oldest ONNX Runtime the `ort` crate accepts: it is built with `api-18` and asks the library
/// for C API version 18, which ONNX Runtime 1.18 introduced; older libraries refuse it at load.
pub const MIN_ORT_VERSION: (u32, u32) = (1, 18);

/// `1.20.1` -> `(1, 20)`.
fn major_minor(version: &str) -> Option<(u32, u32)> {
    let mut it = version.split('.');
    Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
}

/// Provider libraries ONNX Runtime loads at session creation, and the provider each enables.
const PROVIDER_LIBS: &[(&str, &str)] = &[
    ("libonnxruntime_providers_cuda.so", "CUDAExecutionProvider"),
    ("libonnxruntime_providers_tensorrt.so", "TensorrtExecutionProvider"),
    ("libonnxruntime_providers_openvino.so", "OpenVINOExecutionProvider"),
    ("libonnxruntime_providers_rocm.so", "ROCMExecutionProvider"),
    ("libonnxruntime_providers_migraphx.so", "MIGraphXExecutionProvider"),
    ("libonnxruntime_providers_dnnl.so", "DnnlExecutionProvider"),
];

fn check_ort(opts: &DoctorOptions, checks: &mut Vec<Check>) -> Option<OrtFound> {
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
fn locate_ort(opts: &DoctorOptions) -> Result<Located, Check> {
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
fn lib_in(dir: &Path) -> Option<PathBuf> {
    engine::lib_in(dir)
}

/// The engine's Python install folders ([`engine::python_site_dirs`]) on the inspected system.
fn python_site_dirs(opts: &DoctorOptions) -> Vec<PathBuf> {
    engine::python_site_dirs(|p| opts.at(p))
}

/// The version in a library's file name (following symlinks, relative ones under the root).
fn version_of(here: &Path, path: &Path, opts: &DoctorOptions) -> Option<String> {
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
fn soname_version(name: &str, stem: &str) -> Option<String> {
    let v = name.strip_prefix(stem)?.strip_prefix('.')?;
    (!v.is_empty()
        && v.split('.')
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit())))
    .then(|| v.to_string())
}

/// `__version__ = "1.20.1"` from the package's `__init__.py`.
fn python_version(pkg: &Path) -> Option<String> {
    let text = fs::read_to_string(pkg.join("__init__.py")).ok()?;
    text.lines().find_map(|l| {
        let rest = l.trim().strip_prefix("__version__")?.trim_start().strip_prefix('=')?;
        let v = rest.trim().trim_matches(|c| c == '"' || c == '\'');
        (!v.is_empty()).then(|| v.to_string())
    })
}

/// `git-branch=rel-1.20.1` in ONNX Runtime's build string -> `1.20.1`.
fn version_from_build_info(info: &str) -> Option<String> {
    let at = info.find("git-branch=rel-")? + "git-branch=rel-".len();
    let v: String = info[at..]
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    (!v.is_empty()).then_some(v)
}

// ---------------------------------------------------------------------------------------------
// CUDA, cuDNN, TensorRT

/// Native libraries looked for, and the provider that first needs each.
const NATIVE: &[(&str, Requirement)] = &[
    ("libcudart", Requirement::Cuda),
    ("libcublas", Requirement::Cuda),
    ("libcudnn", Requirement::Cuda),
    ("libnvinfer", Requirement::Tensorrt),
    ("libnvinfer_plugin", Requirement::Tensorrt),
    ("libnvonnxparser", Requirement::Tensorrt),
];

const CUDA_DIRS: &[&str] = &[
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
fn loader_dirs(opts: &DoctorOptions) -> Vec<PathBuf> {
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

fn ld_so_conf(opts: &DoctorOptions, file: &Path, depth: u32, out: &mut Vec<PathBuf>) {
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
fn expand_include(opts: &DoctorOptions, from: &Path, pattern: &str) -> Vec<PathBuf> {
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

fn find_native_libs(opts: &DoctorOptions) -> Vec<NativeLib> {
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

fn native_check(req: Requirement, ort: Option<&OrtFound>, libs: &[NativeLib]) -> Check {
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

// ---------------------------------------------------------------------------------------------
// Jetson, JetPack

/// L4T release prefixes and the JetPack they ship with, newest first. [Reported: NVIDIA's JetPack
/// archive and L4T release notes; not verified on hardware here.]
const L4T_TO_JETPACK: &[(&str, &str)] = &[
    ("R36.4.3", "6.2"),
    ("R36.4", "6.1"),
    ("R36.3", "6.0"),
    ("R36.2", "6.0 DP"),
    ("R35.6", "5.1.4"),
    ("R35.5", "5.1.3"),
    ("R35.4", "5.1.2"),
    ("R35.3", "5.1.1"),
    ("R35.2", "5.1"),
    ("R35.1", "5.0.2"),
    ("R34.1", "5.0 DP"),
    ("R32.7", "4.6.x"),
];

/// JetPack from L4T, e.g. `R36.3.0` -> `6.0`.
pub fn jetpack_for_l4t(l4t: &str) -> Option<&'static str> {
    L4T_TO_JETPACK
        .iter()
        .find(|(prefix, _)| l4t == *prefix || l4t.strip_prefix(prefix).is_some_and(|rest| rest.starts_with('.')))
        .map(|(_, jp)| *jp)
}

fn jetpack_release(opts: &DoctorOptions, jetson: Option<&JetsonInfo>) -> Option<String> {
    if let Ok(status) = fs::read_to_string(opts.at(Path::new("/var/lib/dpkg/status"))) {
        for para in status.split("\n\n") {
            let mut lines = para.lines();
            if lines.clone().any(|l| l.trim() == "Package: nvidia-jetpack")
                && let Some(v) = lines.find_map(|l| l.strip_prefix("Version:"))
            {
                return Some(v.trim().to_string());
            }
        }
    }
    jetson
        .and_then(|j| j.l4t_release.as_deref())
        .and_then(jetpack_for_l4t)
        .map(str::to_string)
}

fn jetson_check(jetson: Option<&JetsonInfo>, jetpack: Option<&str>) -> Check {
    match jetson {
        None => Check {
            name: "jetson",
            status: Status::Info,
            summary: "not a Jetson (no nvidia,tegra* device-tree entry, no /etc/nv_tegra_release)".into(),
            details: Vec::new(),
        },
        Some(j) => {
            let mut details = Vec::new();
            if let Some(soc) = &j.soc {
                details.push(format!("SoC: {soc}"));
            }
            let status = if j.l4t_release.is_some() {
                Status::Ok
            } else {
                details.push("/etc/nv_tegra_release missing or unreadable: JetPack unknown".into());
                Status::Warn
            };
            Check {
                name: "jetson",
                status,
                summary: format!(
                    "{}, L4T {}, JetPack {}",
                    j.model.as_deref().unwrap_or("unknown model"),
                    j.l4t_release.as_deref().unwrap_or("unknown"),
                    jetpack.unwrap_or("unknown")
                ),
                details,
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Memory

fn check_memory(opts: &DoctorOptions, checks: &mut Vec<Check>) -> Option<Memory> {
    let mi = match system::read_meminfo(&opts.root) {
        Ok(m) => m,
        Err(e) => {
            checks.push(Check {
                name: "memory",
                status: Status::Fail,
                summary: format!("the memory budget cannot be read: {e}"),
                details: vec!["--batch auto sizes batches from /proc/meminfo".into()],
            });
            return None;
        }
    };
    let mut details = Vec::new();
    let mut status = Status::Ok;
    let cgroup_limit = match system::find_cgroup(&opts.root) {
        Ok(Some(cg)) => {
            details.push(format!(
                "cgroup {:?} {}: limit {}",
                cg.version,
                cg.cgroup_path,
                cg.limit_bytes.map_or("none".to_string(), mib)
            ));
            cg.limit_bytes
        }
        Ok(None) => {
            details.push("no memory cgroup found".into());
            None
        }
        Err(e) => {
            status = Status::Warn;
            details.push(format!("cgroup unreadable: {e}"));
            None
        }
    };
    if let Some(n) = mi.nvmap_used_bytes {
        details.push(format!("NvMapMemUsed {}", mib(n)));
    }
    checks.push(Check {
        name: "memory",
        status,
        summary: format!(
            "MemTotal {}, MemAvailable {}{}",
            mib(mi.total_bytes),
            mib(mi.available_bytes),
            cgroup_limit.map_or(String::new(), |l| format!(", cgroup limit {}", mib(l)))
        ),
        details,
    });
    Some(Memory {
        total_bytes: mi.total_bytes,
        available_bytes: mi.available_bytes,
        nvmap_used_bytes: mi.nvmap_used_bytes,
        cgroup_limit_bytes: cgroup_limit,
    })
}

fn mib(bytes: u64) -> String {
    format!("{} MiB", bytes / (1024 * 1024))
}

// ---------------------------------------------------------------------------------------------
// Power rails

fn rails_check(rails: &[Rail], on_jetson: bool) -> Check {
    if rails.is_empty() {
        return Check {
            name: "power",
            status: if on_jetson { Status::Warn } else { Status::Info },
            summary: "no INA3221 rails under /sys/bus/i2c/devices/*/hwmon/hwmon*/in*_label".into(),
            details: if on_jetson {
                vec!["power per frame will not be reported".into()]
            } else {
                Vec::new()
            },
        };
    }
    let readable = rails.iter().filter(|r| r.millivolts.is_some()).count();
    let details = rails
        .iter()
        .map(|r| {
            let mw = match (r.millivolts, r.milliamps) {
                (Some(v), Some(i)) => format!("{} mW", v.saturating_mul(i) / 1000),
                (Some(v), None) => format!("{v} mV"),
                _ => "unreadable".into(),
            };
            format!("{} (in{}): {mw}", r.label, r.channel)
        })
        .collect();
    Check {
        name: "power",
        status: if readable == rails.len() {
            Status::Ok
        } else {
            Status::Warn
        },
        summary: format!(
            "{} rails ({}), {readable} readable",
            rails.len(),
            rails.iter().map(|r| r.label.as_str()).collect::<Vec<_>>().join(", ")
        ),
        details,
    }
}

// ---------------------------------------------------------------------------------------------
// nvpmodel

fn nvpmodel_check(n: &Nvpmodel, on_jetson: bool) -> Check {
    let missing = if on_jetson { Status::Warn } else { Status::Info };
    match (&n.conf, &n.binary) {
        (None, None) => Check {
            name: "nvpmodel",
            status: missing,
            summary: "no /etc/nvpmodel.conf, no nvpmodel binary".into(),
            details: Vec::new(),
        },
        _ => {
            let current = n
                .current
                .map(|id| {
                    let name = n.modes.iter().find(|m| m.id == id).map_or("?", |m| m.name.as_str());
                    format!(", current mode {id} ({name})")
                })
                .unwrap_or_default();
            let mut details = Vec::new();
            if !n.modes.is_empty() {
                details.push(format!(
                    "modes: {}",
                    n.modes
                        .iter()
                        .map(|m| format!("{}={}", m.id, m.name))
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
            let status = if n.conf.is_some() && n.binary.is_some() {
                Status::Ok
            } else {
                details.push(if n.binary.is_none() {
                    "nvpmodel binary missing: modes cannot be switched".into()
                } else {
                    "/etc/nvpmodel.conf missing: modes unknown".into()
                });
                missing
            };
            Check {
                name: "nvpmodel",
                status,
                summary: format!(
                    "{} modes in /etc/nvpmodel.conf{current}{}",
                    n.modes.len(),
                    n.binary
                        .as_ref()
                        .map_or(String::new(), |b| format!(", {}", b.display()))
                ),
                details,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_from_names() {
        assert_eq!(
            soname_version("libonnxruntime.so.1.20.1", ORT_STEM).as_deref(),
            Some("1.20.1")
        );
        assert_eq!(soname_version("libonnxruntime.so", ORT_STEM), None);
        assert_eq!(soname_version("libonnxruntime.so.1.x", ORT_STEM), None);
        assert_eq!(
            soname_version("libcudart.so.12.2.140", "libcudart.so").as_deref(),
            Some("12.2.140")
        );
        assert_eq!(
            version_from_build_info("ORT Build Info: git-branch=rel-1.20.1, git-commit-id=5c1b7cc").as_deref(),
            Some("1.20.1")
        );
        assert_eq!(version_from_build_info("no branch"), None);
    }

    #[test]
    fn version_floor() {
        assert_eq!(major_minor("1.20.1"), Some((1, 20)));
        assert!(major_minor("1.16.3").is_some_and(|v| v < MIN_ORT_VERSION));
        assert!(major_minor("1.18.0").is_some_and(|v| v >= MIN_ORT_VERSION));
        assert_eq!(major_minor("x"), None);
    }

    #[test]
    fn jetpack_mapping() {
        assert_eq!(jetpack_for_l4t("R36.3.0"), Some("6.0"));
        assert_eq!(jetpack_for_l4t("R36.4.3"), Some("6.2"));
        assert_eq!(jetpack_for_l4t("R36.4.0"), Some("6.1"));
        assert_eq!(jetpack_for_l4t("R35.4.1"), Some("5.1.2"));
        assert_eq!(jetpack_for_l4t("R35.40.1"), None);
        assert_eq!(jetpack_for_l4t("R99"), None);
    }

    #[test]
    fn requirement_parses() {
        assert_eq!("TensorRT".parse::<Requirement>().ok(), Some(Requirement::Tensorrt));
        assert!("npu".parse::<Requirement>().is_err());
    }

    #[test]
    fn empty_root_is_not_ready() {
        let dir = tempfile::tempdir().map_err(|e| e.to_string());
        let Ok(dir) = dir else { return };
        let report = run(&DoctorOptions::for_root(dir.path()));
        assert!(!report.ready());
        assert_eq!(report.check("onnxruntime").map(|c| c.status), Some(Status::Fail));
        assert_eq!(report.check("memory").map(|c| c.status), Some(Status::Fail));
        assert_eq!(report.check("jetson").map(|c| c.status), Some(Status::Info));
        assert_eq!(report.exit_code(), 1);
    }
}
