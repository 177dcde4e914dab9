//! What can fail in finding ONNX Runtime, registering a provider and running a graph.

use std::path::PathBuf;

use super::{Fallback, ORT_VERSION, Provider};
use crate::model;

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
    /// A requested execution provider did not register and the preference lists nothing after it.
    #[error(
        "execution provider {provider} could not be registered: {reason}\n{provider} needs {}; \
         `hsiedge doctor --provider {provider}` checks the same registration. To fall back instead, \
         list another provider after it (e.g. --ep {provider},cpu); every fallback is printed and \
         recorded in summary.json",
        provider.needs()
    )]
    ProviderUnavailable {
        /// The provider.
        provider: Provider,
        /// ONNX Runtime's reason (for a missing library, the loader's message naming it).
        reason: String,
        /// Providers tried before it, and why each failed.
        earlier: Vec<Fallback>,
    },
    /// `--precision fp16` for a manifest without the fp16 file of the mode.
    #[error("{manifest}: --precision fp16 needs `files.{field}`, which this manifest does not have")]
    NoFp16 {
        /// The manifest.
        manifest: PathBuf,
        /// `patch_fp16` or `dense_fp16`.
        field: &'static str,
    },
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
pub(super) fn innermost_message(e: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut cause = e.source()?;
    while let Some(next) = cause.source() {
        cause = next;
    }
    Some(cause.to_string())
}

/// `e` and each of its causes, joined by `: ` (what the binary prints for an error).
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}
