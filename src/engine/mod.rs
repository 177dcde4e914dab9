//! ONNX Runtime: finding the shared library, choosing an execution provider, and running graphs.
//!
//! The `ort` crate is the one FFI wrapper around ONNX Runtime (status codes become `Result`, handles
//! are released in `Drop`); this module adds library discovery, provider selection that reports every
//! fallback, and a session type that checks its graph against the model manifest.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use ort::ep::ArbitrarilyConfigurableExecutionProvider;

use ort::session::Session;
use ort::session::builder::GraphOptimizationLevel;

use crate::model::{self, Manifest, Role, TensorSig};

mod error;
mod library;
mod provider;
mod session;

use error::innermost_message;
pub use error::{EngineError, error_chain};
pub use library::*;
pub use provider::*;
pub use session::Graph;

/// ONNX Runtime's run option naming the CUDA graph a run captures or replays, and its value for
/// a run that does neither (`kOrtRunOptionsConfigCudaGraphAnnotation`, `kCudaGraphAnnotationSkip`).
const CUDA_GRAPH_ID: &str = "gpu_graph_id";
const CUDA_GRAPH_SKIP: &str = "-1";

/// Version of ONNX Runtime that `make ort` provisions and the docs name.
pub const ORT_VERSION: &str = "1.31.1";

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
    /// Execution providers in order of preference (`--ep`); a later one is a fallback.
    pub providers: Preference,
    /// CUDA and TensorRT settings.
    pub gpu: GpuOptions,
    /// The graph's precision: the manifest's fp32 or fp16 files.
    pub precision: Precision,
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
            providers: Preference::default(),
            gpu: GpuOptions::default(),
            precision: Precision::Fp32,
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
    provider: Provider,
    fallbacks: Vec<Fallback>,
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
            let env = env.clone();
            return Self::with_provider(env, location, options);
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
        Self::with_provider(env, location, options)
    }

    /// Registers the preferred providers in order on a bare session builder (no model) and keeps
    /// the first that registers: the same registration every session of this runtime makes, and
    /// the one `hsiedge doctor --provider` checks. Each provider skipped is printed on stderr and
    /// kept in [`Runtime::fallbacks`].
    fn with_provider(
        env: ort::environment::Environment,
        location: LibLocation,
        options: EngineOptions,
    ) -> Result<Self, EngineError> {
        let mut fallbacks: Vec<Fallback> = Vec::new();
        let order = options.providers.providers();
        for (i, &p) in order.iter().enumerate() {
            match try_register(&env, p, &options.gpu) {
                Ok(()) => {
                    return Ok(Self {
                        env,
                        location,
                        options,
                        provider: p,
                        fallbacks,
                    });
                }
                Err(reason) => match order.get(i + 1) {
                    Some(&next) => {
                        let fb = Fallback {
                            from: p,
                            to: next,
                            reason,
                        };
                        eprintln!("hsiedge: warning: {fb}");
                        fallbacks.push(fb);
                    }
                    None => {
                        return Err(EngineError::ProviderUnavailable {
                            provider: p,
                            reason,
                            earlier: fallbacks,
                        });
                    }
                },
            }
        }
        Err(EngineError::ProviderUnavailable {
            provider: Provider::Cpu,
            reason: "no execution provider was listed".into(),
            earlier: fallbacks,
        })
    }

    /// Builds the TensorRT engine of `path` (role `role`) for the profile in the options'
    /// `gpu.trt_profile`, and writes it as an EPContext model at `out` (the engine embedded), so a
    /// device starts from a prebuilt engine instead of building one at its first session.
    pub fn build_engine(
        &self,
        manifest: &Manifest,
        role: Role,
        path: &Path,
        out: &Path,
    ) -> Result<PathBuf, EngineError> {
        let file = self.model_file(manifest, role, path)?;
        if let Err(reason) = try_register(&self.env, Provider::Tensorrt, &self.options.gpu) {
            return Err(EngineError::ProviderUnavailable {
                provider: Provider::Tensorrt,
                reason,
                earlier: Vec::new(),
            });
        }
        let g = |message: String| EngineError::Graph {
            path: file.clone(),
            message,
        };
        let (buckets, input, sample) = trt_profile(manifest, role, &file, &self.options.gpu)?;
        let ep = tensorrt_options(&self.options.gpu, &buckets, &input, &sample)
            .into_iter()
            .chain([
                ("trt_dump_ep_context_model", "1".to_string()),
                ("trt_ep_context_file_path", out.display().to_string()),
                ("trt_ep_context_embed_mode", "1".to_string()),
            ])
            .fold(ort::ep::TensorRT::default(), |ep, (k, v)| {
                ep.with_arbitrary_config(k, v)
            })
            .build()
            .error_on_failure();
        Session::builder(&self.env)
            .map_err(|e| g(e.to_string()))?
            .with_execution_providers([ep])
            .map_err(|e| g(e.to_string()))?
            .commit_from_file(&file)
            .map_err(|e| g(e.to_string()))?;
        Ok(out.to_path_buf())
    }

    /// Whether `provider` registers with this runtime's library (what [`Runtime::new`] does for
    /// each provider it tries), with ONNX Runtime's reason when it does not.
    pub fn check_provider(&self, provider: Provider) -> Result<(), String> {
        try_register(&self.env, provider, &self.options.gpu)
    }

    /// Where the library came from.
    pub fn location(&self) -> &LibLocation {
        &self.location
    }

    /// The library's build string (version, commit).
    pub fn build_info(&self) -> String {
        ort::info().to_string()
    }

    /// The provider sessions use: the first of the preference that registered.
    pub fn provider(&self) -> Provider {
        self.provider
    }

    /// The providers skipped before [`Runtime::provider`], with why.
    pub fn fallbacks(&self) -> &[Fallback] {
        &self.fallbacks
    }

    /// The options the runtime was built with.
    pub fn options(&self) -> &EngineOptions {
        &self.options
    }

    /// The ONNX file of `role` at the configured precision: `path` itself for fp32, the
    /// manifest's fp16 twin of it for fp16.
    fn model_file(&self, manifest: &Manifest, role: Role, path: &Path) -> Result<PathBuf, EngineError> {
        if self.options.precision == Precision::Fp32 {
            return Ok(path.to_path_buf());
        }
        let (file, field) = match role {
            Role::Dense => (&manifest.files.dense_fp16, "dense_fp16"),
            _ => (&manifest.files.patch_fp16, "patch_fp16"),
        };
        file.as_ref()
            .map(|f| manifest.dir.join(f))
            .ok_or_else(|| EngineError::NoFp16 {
                manifest: manifest.path.clone(),
                field,
            })
    }

    /// Builds a session for `path` and checks it against `manifest` in `role`.
    pub fn graph(&self, manifest: &Manifest, role: Role, path: &Path) -> Result<Graph, EngineError> {
        let file = self.model_file(manifest, role, path)?;
        let path = file.as_path();
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
        let mut eps = Vec::new();
        if self.provider == Provider::Tensorrt {
            let (buckets, input, sample) = trt_profile(manifest, role, path, &self.options.gpu)?;
            eps.push(dispatch(self.provider, &self.options.gpu, Some((&buckets, &input, &sample))).error_on_failure());
        } else if self.provider != Provider::Cpu {
            eps.push(dispatch(self.provider, &self.options.gpu, None).error_on_failure());
        }
        eps.push(
            ort::ep::CPU::default()
                .with_arena_allocator(self.options.arena != Arena::Off)
                .build(),
        );
        b = b.with_execution_providers(eps).map_err(|e| g(e.to_string()))?;
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
        // Only arenas that exist are named: the CPU one unless `--arena off`, a GPU provider's always.
        let mut shrink: Vec<String> = Vec::new();
        if self.options.arena != Arena::Off {
            shrink.push("cpu:0".into());
        }
        if self.provider.on_gpu() {
            shrink.push(format!("gpu:{}", self.options.gpu.device_id));
        }
        let shrink = shrink.join(";");
        shrink_options
            .set("memory.enable_memory_arena_shrinkage", &shrink)
            .map_err(|e| g(e.to_string()))?;
        // A captured CUDA graph replays the buffer addresses of the run that captured it: only
        // the device path's bound runs (fixed buffers) may capture and replay it. A plain run
        // that captured first (the dense twin's halo check did) would have every bound run
        // replay that run's work on its buffers instead.
        let uncaptured = if self.options.gpu.cuda_graph && self.provider.on_gpu() {
            shrink_options
                .set(CUDA_GRAPH_ID, CUDA_GRAPH_SKIP)
                .map_err(|e| g(e.to_string()))?;
            let mut o = ort::session::RunOptions::new().map_err(|e| g(e.to_string()))?;
            o.set(CUDA_GRAPH_ID, CUDA_GRAPH_SKIP).map_err(|e| g(e.to_string()))?;
            Some(o)
        } else {
            None
        };
        let unsynced = match self.options.gpu.compute_stream {
            Some(_) if self.provider == Provider::Cuda && !self.options.gpu.cuda_graph => {
                let mut o = ort::session::RunOptions::new().map_err(|e| g(e.to_string()))?;
                o.disable_device_sync().map_err(|e| g(e.to_string()))?;
                Some(o)
            }
            _ => None,
        };
        let mut graph = Graph {
            session,
            unsynced,
            compute_stream: self
                .options
                .gpu
                .compute_stream
                .filter(|_| self.provider == Provider::Cuda),
            path: path.to_path_buf(),
            input,
            output,
            shrink_next: false,
            shrink_options,
            uncaptured,
            arena: self.options.arena,
            buckets: None,
            provider: self.provider,
            device: self
                .provider
                .on_gpu()
                .then_some((self.options.gpu.device_id, self.options.gpu.mem_limit)),
        };
        if role == Role::Dense {
            graph.check_halo(manifest)?;
        }
        Ok(graph)
    }
}

/// `provider` with `gpu`'s options, as `ort` registers it; `profile` is the TensorRT profile's
/// buckets, input name and per-sample shape (none when only checking that it registers).
fn dispatch(
    provider: Provider,
    gpu: &GpuOptions,
    profile: Option<(&Buckets, &str, &[usize])>,
) -> ort::ep::ExecutionProviderDispatch {
    match provider {
        Provider::Cpu => ort::ep::CPU::default().build(),
        Provider::Cuda => cuda_options(gpu)
            .into_iter()
            .fold(ort::ep::CUDA::default(), |ep, (k, v)| ep.with_arbitrary_config(k, v))
            .build(),
        Provider::Tensorrt => {
            let options = match profile {
                Some((b, input, sample)) => tensorrt_options(gpu, b, input, sample),
                None => tensorrt_options(gpu, &Buckets::up_to(1), "", &[]),
            };
            options
                .into_iter()
                .fold(ort::ep::TensorRT::default(), |ep, (k, v)| {
                    ep.with_arbitrary_config(k, v)
                })
                .build()
        }
    }
}

/// The TensorRT profile of `path` in `role`: the buckets up to the configured largest batch, the
/// graph's input name (read from the ONNX file) and one sample's shape.
fn trt_profile(
    manifest: &Manifest,
    role: Role,
    path: &Path,
    gpu: &GpuOptions,
) -> Result<(Buckets, String, Vec<usize>), EngineError> {
    let g = |message: String| EngineError::Graph {
        path: path.to_path_buf(),
        message,
    };
    let (max_batch, tile) = gpu.trt_profile.unwrap_or(match role {
        Role::Dense => (1, 64),
        _ => (32, 64),
    });
    let side = match role {
        Role::Dense => tile + 2 * manifest.halo,
        _ => manifest.patch,
    };
    let model = crate::graph::load_model(path).map_err(|e| g(e.to_string()))?;
    let graph = model.graph.ok_or_else(|| g("has no graph".into()))?;
    let weights: std::collections::HashSet<&str> = graph.initializer.iter().map(|t| t.name.as_str()).collect();
    let input = graph
        .input
        .iter()
        .map(|i| i.name.clone())
        .find(|n| !weights.contains(n.as_str()))
        .ok_or_else(|| g("has no input".into()))?;
    let shape = manifest.input.layout.shape(1, manifest.input.bands, side, side);
    Ok((Buckets::up_to(max_batch), input, shape[1..].to_vec()))
}

/// Registers `provider` on a bare session builder, returning ONNX Runtime's reason on failure.
fn try_register(env: &ort::environment::Environment, provider: Provider, gpu: &GpuOptions) -> Result<(), String> {
    let builder = Session::builder(env).map_err(|e| e.to_string())?;
    builder
        .with_execution_providers([dispatch(provider, gpu, None).error_on_failure()])
        .map(drop)
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_padded_to_its_bucket_gives_the_unpadded_outputs() {
        let manifest =
            Manifest::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("models/hybridsn_salinas_a/manifest.json"))
                .unwrap();
        let rt = match Runtime::new(EngineOptions {
            threads: 1,
            ..EngineOptions::default()
        }) {
            Ok(rt) => rt,
            Err(e @ EngineError::LibraryNotFound { .. }) => {
                eprintln!("skipped: {e}");
                return;
            }
            Err(e) => panic!("{e}"),
        };
        let mut g = rt.graph(&manifest, Role::Patch, &manifest.patch_path()).unwrap();
        let shape = manifest
            .input
            .layout
            .shape(3, manifest.input.bands, manifest.patch, manifest.patch);
        let data: Vec<f32> = (0..shape.iter().product::<usize>())
            .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
            .collect();
        let (want_shape, want) = g.run(&data, &shape).unwrap();
        g.use_buckets(Buckets::up_to(8));
        let (got_shape, got) = g.run(&data, &shape).unwrap();
        assert_eq!(got_shape, want_shape);
        assert_eq!(got_shape[0], 3);
        assert_eq!(got.len(), want.len());
        for (a, b) in got.iter().zip(&want) {
            assert!((a - b).abs() <= 1e-4 * b.abs().max(1.0), "{a} against {b}");
        }
    }
}
