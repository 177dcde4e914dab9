//! ONNX Runtime: finding the shared library, choosing an execution provider, and running graphs.
//!
//! The `ort` crate is the one FFI wrapper around ONNX Runtime (status codes become `Result`, handles
//! are released in `Drop`); this module adds library discovery, provider selection that reports every
//! fallback, and a session type that checks its graph against the model manifest.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use ort::session::Session;
use ort::session::builder::GraphOptimizationLevel;
use ort::value::TensorRef;

use crate::config;
use crate::model::{self, Manifest, Role, TensorSig};

/// Version of ONNX Runtime that `make ort` provisions and the docs name.
pub const ORT_VERSION: &str = "1.31.1";

/// Errors from ONNX Runtime and its discovery.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// More intra-op threads than CPUs this process may use.
    #[error(
        "invalid value `{threads}` for --threads: at most {cpus}, the CPUs this process may use \
         (its affinity mask and cgroup CPU quota); 0 picks one per core"
    )]
    Threads {
        /// The count asked for.
        threads: usize,
        /// The CPUs available.
        cpus: usize,
    },
    /// No libonnxruntime was found anywhere it is looked for.
    #[error(
        "ONNX Runtime library not found; looked in:\n  {}\n\
         install it with `make ort` in the source tree (puts libonnxruntime {ORT_VERSION} in \
         target/ort/ARCH, found from target/release/hsiedge), `pip install onnxruntime=={ORT_VERSION}`, \
         or pass --ort-lib / set ORT_DYLIB_PATH to the libonnxruntime.so.{ORT_VERSION} file",
        tried.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join("\n  ")
    )]
    LibraryNotFound {
        /// Every path or source consulted, in order.
        tried: Vec<PathBuf>,
    },
    /// A library was named explicitly but does not exist.
    #[error("{source_name} names {path}, which does not exist")]
    NamedLibraryMissing {
        /// `--ort-lib` or `ORT_DYLIB_PATH`.
        source_name: String,
        /// The path given.
        path: PathBuf,
    },
    /// The library exists but could not be opened as ONNX Runtime (dlopen, API, version).
    #[error("{path}: cannot load ONNX Runtime{}", loader.as_ref().map(|l| format!(" ({l})")).unwrap_or_default())]
    Open {
        /// The library.
        path: PathBuf,
        /// The dynamic loader's own reason, when it refused the file.
        loader: Option<String>,
        /// What the dynamic loader or the version check reported.
        #[source]
        source: ort::LoadDynamicError,
    },
    /// The library loaded, but its environment could not be created.
    #[error("{path}: cannot initialise ONNX Runtime")]
    Load {
        /// The library.
        path: PathBuf,
        /// What ONNX Runtime reported.
        #[source]
        source: ort::Error,
    },
    /// The library loaded, but the shared CPU arena sessions allocate from could not be registered.
    #[error("{path}: cannot register the CPU arena with ONNX Runtime")]
    Arena {
        /// The library.
        path: PathBuf,
        /// The failed C API call and its status message.
        #[source]
        source: crate::ffi::OrtCallError,
    },
    /// ONNX Runtime was already initialised from another library in this process.
    #[error("ONNX Runtime is already loaded from {loaded}; cannot switch to {requested} in the same process")]
    AlreadyLoaded {
        /// The library in use.
        loaded: PathBuf,
        /// The one asked for now.
        requested: PathBuf,
    },
    /// A graph failed to load or has an unusable signature.
    #[error("{path}: {message}")]
    Graph {
        /// The ONNX file.
        path: PathBuf,
        /// What failed.
        message: String,
    },
    /// The graph does not match its manifest.
    #[error(transparent)]
    Model(#[from] model::ModelError),
    /// A run failed.
    #[error("{path}: inference on input {shape:?} failed: {message}")]
    Run {
        /// The ONNX file.
        path: PathBuf,
        /// The input shape.
        shape: Vec<usize>,
        /// ONNX Runtime's message.
        message: String,
    },
}

/// The message of the innermost cause of `e`, when it has one: libloading keeps `dlerror`'s text
/// (a missing dependency, another architecture, not an ELF file) as the source of an error whose
/// own message is only "dlopen failed", and `ort` does not pass that source on.
fn innermost_message(e: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut cause = e.source()?;
    while let Some(next) = cause.source() {
        cause = next;
    }
    Some(cause.to_string())
}

/// `e` and each of its causes, joined by `: ` (what the binary prints for an error).
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

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

/// Execution providers. Only the CPU provider exists in this build; GPU providers are added here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Provider {
    /// ONNX Runtime's default CPU provider (MLAS).
    Cpu,
}

impl Provider {
    /// ONNX Runtime's name for the provider.
    pub fn ort_name(self) -> &'static str {
        match self {
            Self::Cpu => "CPUExecutionProvider",
        }
    }
}

/// The tiling thread's default nice increment (measured on Salinas-A patch mode,
/// 2 cores: end to end over pure inference 1.11 at 0, 1.06 at 19).
pub const DEFAULT_PRODUCER_NICE: i32 = 19;

/// The CPU memory arena sessions allocate from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Arena {
    /// One arena per process that extends by exactly what is requested (`kSameAsRequested`) and
    /// is reused run after run (the default). With the memory pattern off (the default) each run
    /// reuses the chunks of the run before, so a steady run holds its live tensors once: measured
    /// within 2 % of the arena-free peak, and 7-10 % faster (Salinas-A patch inference 1.34 against
    /// 1.49 s). With the memory pattern on, the pattern's block does not fit in the first run's
    /// freed chunks and a run holds both: 1.4-1.6x (cnn3d dense 16 tiles: 810 against 512 MiB).
    #[default]
    Exact,
    /// ONNX Runtime's default per-session arena, which extends by powers of two (a step function
    /// of the batch, up to twice the need).
    Pow2,
    /// No arena: every run maps and faults its large blocks afresh and unmaps them after.
    Off,
}

impl std::str::FromStr for Arena {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "exact" => Ok(Self::Exact),
            "pow2" => Ok(Self::Pow2),
            "off" => Ok(Self::Off),
            other => Err(format!("`{other}` is not an arena (exact, pow2 or off)")),
        }
    }
}

/// How sessions are built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineOptions {
    /// `--ort-lib`.
    pub ort_lib: Option<PathBuf>,
    /// Intra-op threads (0: ONNX Runtime's default, one per core).
    pub threads: usize,
    /// Execution provider.
    pub provider: Provider,
    /// Let idle intra-op threads spin. Off by default: the tiling thread shares the cores, and a
    /// spinning pool starves it on small devices.
    pub spin: bool,
    /// Which CPU memory arena sessions allocate from.
    pub arena: Arena,
    /// ONNX Runtime's memory pattern (one block per input shape, planned on the first run of each
    /// shape). Off by default: with the exact arena it doubles the steady peak (see [`Arena`]) and
    /// gains 3 % at most on the shipped models.
    pub memory_pattern: bool,
    /// Nice increment of the tiling thread, so it fills the intra-op threads' idle gaps instead of preempting them (0: keep its priority;
    /// choose 0 where other processes keep every core busy, or the tiling thread may starve).
    pub producer_nice: i32,
}

impl Default for EngineOptions {
    fn default() -> Self {
        Self {
            ort_lib: None,
            threads: 0,
            provider: Provider::Cpu,
            spin: false,
            arena: Arena::Exact,
            memory_pattern: false,
            producer_nice: DEFAULT_PRODUCER_NICE,
        }
    }
}

/// A loaded ONNX Runtime: the library and its environment, shared by every session of the process.
#[derive(Debug)]
pub struct Runtime {
    env: ort::environment::Environment,
    location: LibLocation,
    options: EngineOptions,
}

/// The process's one ONNX Runtime environment and the library it came from.
static LOADED: OnceLock<(LibLocation, ort::environment::Environment)> = OnceLock::new();
static LOADING: std::sync::Mutex<()> = std::sync::Mutex::new(());

impl Runtime {
    /// Finds and loads ONNX Runtime. A process loads one library; asking for another is an error.
    /// Fails with [`EngineError::Threads`] when more intra-op threads are asked than the process
    /// may run at once: oversubscribed threads only wait on each other.
    pub fn new(options: EngineOptions) -> Result<Self, EngineError> {
        let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
        if options.threads > cpus {
            return Err(EngineError::Threads {
                threads: options.threads,
                cpus,
            });
        }
        let location = find_library(options.ort_lib.as_deref())?;
        let _guard = LOADING.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((loaded, env)) = LOADED.get() {
            if loaded.path != location.path {
                return Err(EngineError::AlreadyLoaded {
                    loaded: loaded.path.clone(),
                    requested: location.path,
                });
            }
            return Ok(Self {
                env: env.clone(),
                location,
                options,
            });
        }
        let builder = ort::init_from(&location.path).map_err(|source| EngineError::Open {
            loader: match &source {
                ort::LoadDynamicError::Dlopen { error, .. } => innermost_message(error),
                _ => None,
            },
            path: location.path.clone(),
            source,
        })?;
        let env = builder
            .with_name("hsiedge")
            .build()
            .map_err(|source| EngineError::Load {
                path: location.path.clone(),
                source,
            })?;
        crate::ffi::register_cpu_arena(&env).map_err(|source| EngineError::Arena {
            path: location.path.clone(),
            source,
        })?;
        let _ = LOADED.set((location.clone(), env.clone()));
        Ok(Self { env, location, options })
    }

    /// Where the library came from.
    pub fn location(&self) -> &LibLocation {
        &self.location
    }

    /// The library's build string (version, commit).
    pub fn build_info(&self) -> String {
        ort::info().to_string()
    }

    /// The provider sessions use.
    pub fn provider(&self) -> Provider {
        self.options.provider
    }

    /// Builds a session for `path` and checks it against `manifest` in `role`.
    pub fn graph(&self, manifest: &Manifest, role: Role, path: &Path) -> Result<Graph, EngineError> {
        let g = |message: String| EngineError::Graph {
            path: path.to_path_buf(),
            message,
        };
        let mut b = Session::builder(&self.env).map_err(|e| g(e.to_string()))?;
        b = b
            .with_optimization_level(GraphOptimizationLevel::All)
            .map_err(|e| g(e.to_string()))?;
        b = b
            .with_intra_op_spinning(self.options.spin)
            .map_err(|e| g(e.to_string()))?;
        b = b
            .with_memory_pattern(self.options.memory_pattern)
            .map_err(|e| g(e.to_string()))?;
        b = b
            .with_execution_providers([ort::ep::CPU::default()
                .with_arena_allocator(self.options.arena != Arena::Off)
                .build()])
            .map_err(|e| g(e.to_string()))?;
        if self.options.arena == Arena::Exact {
            b = b.with_env_allocators().map_err(|e| g(e.to_string()))?;
        }
        if self.options.threads > 0 {
            b = b
                .with_intra_threads(self.options.threads)
                .map_err(|e| g(e.to_string()))?;
        }
        let session = b.commit_from_file(path).map_err(|e| g(e.to_string()))?;
        let sig = |outlet: &ort::value::Outlet| -> Result<TensorSig, EngineError> {
            let shape = outlet
                .dtype()
                .tensor_shape()
                .ok_or_else(|| g(format!("`{}` is not a tensor", outlet.name())))?;
            match outlet.dtype().tensor_type() {
                Some(ort::value::TensorElementType::Float32) => {}
                other => {
                    return Err(g(format!(
                        "`{}` has element type {other:?}, expected float32",
                        outlet.name()
                    )));
                }
            }
            Ok(TensorSig {
                name: outlet.name().to_string(),
                dims: shape.iter().map(|d| usize::try_from(*d).ok()).collect(),
            })
        };
        let (input, output) = match (session.inputs(), session.outputs()) {
            ([i], [o]) => (sig(i)?, sig(o)?),
            (i, o) => {
                return Err(g(format!(
                    "has {} inputs and {} outputs; hsiedge runs graphs with one of each",
                    i.len(),
                    o.len()
                )));
            }
        };
        model::check_io(manifest, role, path, &input, &output)?;
        let mut shrink_options = ort::session::RunOptions::new().map_err(|e| g(e.to_string()))?;
        shrink_options
            .set("memory.enable_memory_arena_shrinkage", "cpu:0")
            .map_err(|e| g(e.to_string()))?;
        let mut graph = Graph {
            session,
            path: path.to_path_buf(),
            input,
            output,
            shrink_next: false,
            shrink_options,
            arena: self.options.arena,
        };
        if role == Role::Dense {
            graph.check_halo(manifest)?;
        }
        Ok(graph)
    }
}

/// A session over one graph with one float32 input and one float32 output.
pub struct Graph {
    session: Session,
    path: PathBuf,
    input: TensorSig,
    output: TensorSig,
    shrink_next: bool,
    shrink_options: ort::session::RunOptions,
    arena: Arena,
}

impl std::fmt::Debug for Graph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Graph")
            .field("path", &self.path)
            .field("input", &self.input)
            .field("output", &self.output)
            .field("shrink_next", &self.shrink_next)
            .finish_non_exhaustive()
    }
}

impl Graph {
    /// The ONNX file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The input tensor's signature.
    pub fn input(&self) -> &TensorSig {
        &self.input
    }

    /// The output tensor's signature.
    pub fn output(&self) -> &TensorSig {
        &self.output
    }

    /// Has the CPU arena give its unused regions back to the system at the end of the next run.
    ///
    /// The arena keeps what the largest run needed; when the batch shrinks because memory got
    /// scarce, that surplus has to leave the process, not just sit free inside it.
    /// Without an arena there is nothing to give back and this does nothing.
    pub fn shrink_arena_after_next_run(&mut self) {
        self.shrink_next = self.arena != Arena::Off;
    }

    /// Runs a dense twin once over a window of `2 * halo + 2` pixels a side, which must give the
    /// 2 x 2 centre: a twin that trims another halo than the manifest's would otherwise fail (or
    /// shift every tile) only once a run is under way.
    fn check_halo(&mut self, manifest: &Manifest) -> Result<(), EngineError> {
        let side = 2 * manifest.halo + 2;
        let shape = manifest.input.layout.shape(1, manifest.input.bands, side, side);
        let zeros = vec![0f32; shape.iter().product()];
        let (got, _) = self.run(&zeros, &shape)?;
        let want = [1, manifest.classes(), 2, 2];
        if got != want {
            return Err(model::ModelError::Mismatch {
                onnx: self.path.clone(),
                tensor: self.output.name.clone(),
                detail: format!(
                    "is {} for a {side} x {side} window",
                    got.iter().map(ToString::to_string).collect::<Vec<_>>().join(" x ")
                ),
                manifest: manifest.path.clone(),
                field: "halo".into(),
                expected: format!(
                    "says {}, so the twin must give 1 x {} x 2 x 2 ({side} - 2 x {})",
                    manifest.halo,
                    manifest.classes(),
                    manifest.halo
                ),
            }
            .into());
        }
        Ok(())
    }

    /// Runs the graph on `data` of `shape`, returning the output's shape and values.
    pub fn run(&mut self, data: &[f32], shape: &[usize]) -> Result<(Vec<usize>, Vec<f32>), EngineError> {
        let fail = |message: String| EngineError::Run {
            path: self.path.clone(),
            shape: shape.to_vec(),
            message,
        };
        let tensor = TensorRef::from_array_view((shape.to_vec(), data)).map_err(|e| fail(e.to_string()))?;
        let inputs = ort::inputs![self.input.name.as_str() => tensor];
        let outputs = if std::mem::take(&mut self.shrink_next) {
            self.session.run_with_options(inputs, &self.shrink_options)
        } else {
            self.session.run(inputs)
        }
        .map_err(|e| fail(e.to_string()))?;
        let (out_shape, values) = outputs[0]
            .try_extract_tensor::<f32>()
            .map_err(|e| fail(e.to_string()))?;
        let dims = out_shape.iter().map(|d| usize::try_from(*d).unwrap_or(0)).collect();
        Ok((dims, values.to_vec()))
    }
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
