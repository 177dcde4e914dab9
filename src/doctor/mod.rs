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
use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde::Serialize;

use crate::budget::system::{self, JetsonInfo};
use crate::config;
use crate::engine::{self, LibSource};

mod board;
mod native;
mod ort;

pub use crate::platform::{Nvpmodel, PowerMode, Rail, parse_nvpmodel_conf};
use board::*;
use native::*;
use ort::*;

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

#[cfg(test)]
mod tests;
