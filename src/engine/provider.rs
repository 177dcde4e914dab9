//! Execution providers: the ordered preference (`--ep tensorrt,cuda,cpu`), each provider's options
//! as ONNX Runtime's key/value pairs, and the fixed batch-size buckets that keep TensorRT engines and
//! CUDA graphs from seeing a new shape at run time.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use serde::Serialize;

/// An ONNX Runtime execution provider hsiedge can register.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Provider {
    /// ONNX Runtime's default CPU provider (MLAS).
    Cpu,
    /// The CUDA provider (`libonnxruntime_providers_cuda.so`: CUDA runtime, cuBLAS, cuDNN).
    Cuda,
    /// The TensorRT provider (`libonnxruntime_providers_tensorrt.so`: `libnvinfer.so.10`,
    /// `libnvonnxparser.so.10`, plus what CUDA needs).
    Tensorrt,
}

impl Provider {
    /// ONNX Runtime's name for the provider.
    pub fn ort_name(self) -> &'static str {
        match self {
            Self::Cpu => "CPUExecutionProvider",
            Self::Cuda => "CUDAExecutionProvider",
            Self::Tensorrt => "TensorrtExecutionProvider",
        }
    }

    /// The native libraries the provider loads beyond ONNX Runtime itself, named in its
    /// registration error so a missing one is obvious.
    pub fn needs(self) -> &'static str {
        match self {
            Self::Cpu => "nothing beyond libonnxruntime",
            Self::Cuda => {
                "libonnxruntime_providers_shared.so and libonnxruntime_providers_cuda.so beside \
                 libonnxruntime (an onnxruntime-gpu build), the CUDA runtime, cuBLAS and cuDNN 9 on the \
                 loader's path, and an NVIDIA driver"
            }
            Self::Tensorrt => {
                "libonnxruntime_providers_tensorrt.so beside libonnxruntime, TensorRT 10 \
                 (libnvinfer.so.10, libnvonnxparser.so.10) on the loader's path, and everything the CUDA \
                 provider needs"
            }
        }
    }

    /// Whether the provider allocates on a GPU (its memory is outside the process's RSS).
    pub fn on_gpu(self) -> bool {
        self != Self::Cpu
    }
}

impl fmt::Display for Provider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Cpu => "cpu",
            Self::Cuda => "cuda",
            Self::Tensorrt => "tensorrt",
        })
    }
}

impl FromStr for Provider {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "cpu" => Ok(Self::Cpu),
            "cuda" => Ok(Self::Cuda),
            "tensorrt" | "trt" => Ok(Self::Tensorrt),
            other => Err(format!(
                "`{other}` is not an execution provider (cpu, cuda or tensorrt)"
            )),
        }
    }
}

/// The providers to try, in order of preference. The first that registers is used; listing more
/// than one is what allows a fallback (`--ep cuda` fails when CUDA cannot register, `--ep cuda,cpu`
/// falls back to the CPU, printing and recording why).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Preference(Vec<Provider>);

impl Preference {
    /// One provider, no fallback.
    pub fn only(p: Provider) -> Self {
        Self(vec![p])
    }

    /// The providers in order.
    pub fn providers(&self) -> &[Provider] {
        &self.0
    }

    /// The most preferred provider.
    pub fn first(&self) -> Provider {
        self.0.first().copied().unwrap_or(Provider::Cpu)
    }
}

impl Default for Preference {
    fn default() -> Self {
        Self::only(Provider::Cpu)
    }
}

impl fmt::Display for Preference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<String> = self.0.iter().map(ToString::to_string).collect();
        f.write_str(&names.join(","))
    }
}

impl FromStr for Preference {
    type Err = String;

    /// `tensorrt,cuda,cpu`: at least one provider, none twice.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut out: Vec<Provider> = Vec::new();
        for part in s.split(',') {
            if part.trim().is_empty() {
                return Err(format!("`{s}` has an empty entry; expected e.g. `cuda,cpu`"));
            }
            let p: Provider = part.parse()?;
            if out.contains(&p) {
                return Err(format!("`{s}` names {p} twice"));
            }
            out.push(p);
        }
        Ok(Self(out))
    }
}

/// A provider that was asked for but did not register, and the one tried next.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Fallback {
    /// The provider that failed.
    pub from: Provider,
    /// The provider tried next.
    pub to: Provider,
    /// ONNX Runtime's reason.
    pub reason: String,
}

impl fmt::Display for Fallback {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "execution provider {} did not register ({}); falling back to {}",
            self.from, self.reason, self.to
        )
    }
}

/// cuDNN's convolution algorithm search (`cudnn_conv_algo_search`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ConvSearch {
    /// cuDNN's heuristic pick: no benchmarking, a bounded workspace (the default: on an integrated
    /// GPU the exhaustive search's trial workspaces come out of the same memory as everything else).
    #[default]
    Heuristic,
    /// Benchmark every algorithm on the first run of each shape (ONNX Runtime's own default).
    Exhaustive,
    /// The implicit-precomputed-GEMM algorithm, no search.
    Default,
}

impl ConvSearch {
    fn ort_value(self) -> &'static str {
        match self {
            Self::Heuristic => "HEURISTIC",
            Self::Exhaustive => "EXHAUSTIVE",
            Self::Default => "DEFAULT",
        }
    }
}

impl FromStr for ConvSearch {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "heuristic" => Ok(Self::Heuristic),
            "exhaustive" => Ok(Self::Exhaustive),
            "default" => Ok(Self::Default),
            other => Err(format!(
                "`{other}` is not a cuDNN search (heuristic, exhaustive or default)"
            )),
        }
    }
}

/// Where a GPU session's batches are prepared and reduced (`--io`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum IoPath {
    /// The device path where the run allows it (the CUDA provider, a classification model, a
    /// mapped scene of int16, uint16 or float32), else the host path with the reason printed.
    #[default]
    Auto,
    /// Batches built as float32 on the host and copied in by ONNX Runtime; outputs copied back whole.
    Host,
    /// Raw windows uploaded, preprocessed into bound device buffers, argmax on the device
    /// (`gpu::resident`); an error where the run does not allow it.
    Device,
}

impl FromStr for IoPath {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(Self::Auto),
            "host" => Ok(Self::Host),
            "device" => Ok(Self::Device),
            other => Err(format!("`{other}` is not an I/O path (auto, host or device)")),
        }
    }
}

/// Weights and activations of the graph run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// The manifest's `files.patch` / `files.dense`.
    #[default]
    Fp32,
    /// The manifest's `files.patch_fp16` / `files.dense_fp16` (float32 input and output, float16
    /// inside).
    Fp16,
}

impl FromStr for Precision {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "fp32" => Ok(Self::Fp32),
            "fp16" => Ok(Self::Fp16),
            other => Err(format!("`{other}` is not a precision (fp32 or fp16)")),
        }
    }
}

/// GPU settings shared by the CUDA and TensorRT providers.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GpuOptions {
    /// CUDA device ordinal.
    pub device_id: u32,
    /// Bound of the CUDA provider's arena (`gpu_mem_limit`), bytes; `None`: ONNX Runtime's
    /// default (unbounded). The budget sets it from the device's free memory.
    pub mem_limit: Option<u64>,
    /// cuDNN's convolution algorithm search.
    pub conv_search: ConvSearch,
    /// Capture the graph once per shape and replay it (`enable_cuda_graph`); needs fixed shapes
    /// (see [`Buckets`]) and every node on the GPU.
    pub cuda_graph: bool,
    /// TensorRT: build fp16 kernels.
    pub trt_fp16: bool,
    /// TensorRT: build int8 kernels (needs a calibration table beside the model).
    pub trt_int8: bool,
    /// TensorRT: engine and timing caches, EPContext models (the state directory).
    pub trt_cache_dir: Option<PathBuf>,
    /// TensorRT: builder workspace bound, bytes (`None`: TensorRT's default, 1 GiB).
    pub trt_workspace: Option<u64>,
    /// TensorRT: the largest batch and the tile side the optimisation profile covers (`None`:
    /// the defaults of `classify`, 32 patches or 1 tile of 64).
    pub trt_profile: Option<(usize, usize)>,
    /// Where batches are prepared and reduced on a CUDA session.
    pub io: IoPath,
    /// The stream the CUDA provider runs on instead of one of its own: the device path's
    /// kernels' stream, so a run is ordered after their preprocessing and before their argmax
    /// on the device, without the host waiting in between. Not a setting: the job sets it.
    pub compute_stream: Option<ComputeStream>,
}

/// A CUDA stream handle (`CUstream`). The job takes it from [`crate::gpu::compute_stream`], a
/// stream kept for the life of the process, so a session given it can never outlive it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ComputeStream(pub(crate) usize);

/// The CUDA provider's options as ONNX Runtime's keys and values.
pub fn cuda_options(o: &GpuOptions) -> Vec<(&'static str, String)> {
    let mut v = vec![
        ("device_id", o.device_id.to_string()),
        // Grow the arena by what a run asks, not by powers of two: the budget's cost model
        // predicts the live tensors, and a doubled arena would hold up to twice that.
        ("arena_extend_strategy", "kSameAsRequested".to_string()),
        ("cudnn_conv_algo_search", o.conv_search.ort_value().to_string()),
        ("cudnn_conv_use_max_workspace", "0".to_string()),
        ("enable_cuda_graph", if o.cuda_graph { "1" } else { "0" }.to_string()),
    ];
    if let Some(limit) = o.mem_limit {
        v.push(("gpu_mem_limit", limit.to_string()));
    }
    if let Some(ComputeStream(handle)) = o.compute_stream {
        v.push(("has_user_compute_stream", "1".to_string()));
        v.push(("user_compute_stream", handle.to_string()));
    }
    v
}

/// The TensorRT provider's options: fp16/int8, engine and timing caches in the state directory,
/// one optimisation profile whose min/opt/max batch are the smallest and largest bucket, and the
/// workspace bound. `input` is the graph's input name and `sample` its shape without the batch.
pub fn tensorrt_options(
    o: &GpuOptions,
    buckets: &Buckets,
    input: &str,
    sample: &[usize],
) -> Vec<(&'static str, String)> {
    let shape = |b: usize| {
        let mut dims = vec![b.to_string()];
        dims.extend(sample.iter().map(ToString::to_string));
        format!("{input}:{}", dims.join("x"))
    };
    let mut v = vec![
        ("device_id", o.device_id.to_string()),
        ("trt_fp16_enable", u8::from(o.trt_fp16).to_string()),
        ("trt_int8_enable", u8::from(o.trt_int8).to_string()),
        ("trt_profile_min_shapes", shape(buckets.smallest())),
        ("trt_profile_opt_shapes", shape(buckets.largest())),
        ("trt_profile_max_shapes", shape(buckets.largest())),
        ("trt_cuda_graph_enable", u8::from(o.cuda_graph).to_string()),
    ];
    if input.is_empty() {
        // Only checking that the provider registers: no graph, no profile.
        v.retain(|(k, _)| !k.starts_with("trt_profile"));
    }
    if let Some(dir) = &o.trt_cache_dir {
        let d = dir.display().to_string();
        v.push(("trt_engine_cache_enable", "1".into()));
        v.push(("trt_engine_cache_path", d.clone()));
        v.push(("trt_timing_cache_enable", "1".into()));
        v.push(("trt_timing_cache_path", d));
    }
    if let Some(w) = o.trt_workspace {
        v.push(("trt_max_workspace_size", w.to_string()));
    }
    v
}

/// The batch sizes a session runs at: powers of two up to the largest, plus the largest itself.
/// A batch of another size runs padded to the next bucket (its extra rows zeros, their outputs
/// dropped), so a GPU provider sees at most `log2(max) + 2` shapes, all inside the TensorRT
/// profile, and a CUDA graph can be captured once per bucket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Buckets(Vec<usize>);

impl Buckets {
    /// Buckets up to `max` (at least 1).
    pub fn up_to(max: usize) -> Self {
        let max = max.max(1);
        let mut v: Vec<usize> = std::iter::successors(Some(1usize), |b| b.checked_mul(2))
            .take_while(|&b| b < max)
            .collect();
        v.push(max);
        Self(v)
    }

    /// The sizes, ascending.
    pub fn sizes(&self) -> &[usize] {
        &self.0
    }

    /// The smallest bucket holding `n`, or `None` when `n` is above the largest.
    pub fn bucket_for(&self, n: usize) -> Option<usize> {
        self.0.iter().copied().find(|&b| b >= n)
    }

    /// The smallest bucket.
    pub fn smallest(&self) -> usize {
        self.0.first().copied().unwrap_or(1)
    }

    /// The largest bucket.
    pub fn largest(&self) -> usize {
        self.0.last().copied().unwrap_or(1)
    }

    /// The largest bucket at or below `n` (the smallest when `n` is below it): where a batch the
    /// governor cut to `n` runs when its buffers are bound at a bucket's size.
    pub fn at_most(&self, n: usize) -> usize {
        self.0
            .iter()
            .rev()
            .copied()
            .find(|&b| b <= n)
            .unwrap_or_else(|| self.smallest())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_preference_is_parsed_in_order_and_rejects_repeats_and_unknowns() {
        let p: Preference = "tensorrt,cuda,cpu".parse().unwrap();
        assert_eq!(p.providers(), &[Provider::Tensorrt, Provider::Cuda, Provider::Cpu]);
        assert_eq!(p.to_string(), "tensorrt,cuda,cpu");
        assert_eq!(p.first(), Provider::Tensorrt);
        assert!("cuda,cuda".parse::<Preference>().unwrap_err().contains("twice"));
        assert!("cuda,,cpu".parse::<Preference>().unwrap_err().contains("empty"));
        assert!("rocm".parse::<Preference>().unwrap_err().contains("`rocm`"));
        assert_eq!("TRT".parse::<Provider>(), Ok(Provider::Tensorrt));
    }

    #[test]
    fn cuda_options_carry_the_arena_strategy_search_and_limit() {
        let o = GpuOptions {
            device_id: 1,
            mem_limit: Some(8 << 30),
            ..GpuOptions::default()
        };
        let v = cuda_options(&o);
        let get = |k: &str| v.iter().find(|(key, _)| *key == k).map(|(_, v)| v.as_str());
        assert_eq!(get("device_id"), Some("1"));
        assert_eq!(get("arena_extend_strategy"), Some("kSameAsRequested"));
        assert_eq!(get("cudnn_conv_algo_search"), Some("HEURISTIC"));
        assert_eq!(get("gpu_mem_limit"), Some("8589934592"));
        assert_eq!(get("enable_cuda_graph"), Some("0"));
        let unbounded = cuda_options(&GpuOptions {
            conv_search: ConvSearch::Exhaustive,
            ..GpuOptions::default()
        });
        assert!(unbounded.iter().all(|(k, _)| *k != "gpu_mem_limit"));
        assert!(unbounded.iter().all(|(k, _)| !k.contains("compute_stream")));
        let on_stream = cuda_options(&GpuOptions {
            compute_stream: Some(ComputeStream(0x7f00_1234)),
            ..GpuOptions::default()
        });
        let get = |k: &str| on_stream.iter().find(|(key, _)| *key == k).map(|(_, v)| v.as_str());
        // ONNX Runtime parses the address as a decimal integer.
        assert_eq!(get("has_user_compute_stream"), Some("1"));
        assert_eq!(get("user_compute_stream"), Some("2130711092"));
        assert!(unbounded.contains(&("cudnn_conv_algo_search", "EXHAUSTIVE".into())));
    }

    #[test]
    fn tensorrt_profiles_span_the_buckets_and_caches_live_in_the_state_dir() {
        let o = GpuOptions {
            trt_fp16: true,
            trt_cache_dir: Some(PathBuf::from("/var/lib/hsiedge/trt")),
            trt_workspace: Some(256 << 20),
            ..GpuOptions::default()
        };
        let b = Buckets::up_to(48);
        let v = tensorrt_options(&o, &b, "x", &[1, 204, 11, 11]);
        let get = |k: &str| v.iter().find(|(key, _)| *key == k).map(|(_, v)| v.clone());
        assert_eq!(get("trt_profile_min_shapes").as_deref(), Some("x:1x1x204x11x11"));
        assert_eq!(get("trt_profile_opt_shapes").as_deref(), Some("x:48x1x204x11x11"));
        assert_eq!(get("trt_profile_max_shapes").as_deref(), Some("x:48x1x204x11x11"));
        assert_eq!(get("trt_fp16_enable").as_deref(), Some("1"));
        assert_eq!(get("trt_int8_enable").as_deref(), Some("0"));
        assert_eq!(get("trt_engine_cache_path").as_deref(), Some("/var/lib/hsiedge/trt"));
        assert_eq!(get("trt_timing_cache_enable").as_deref(), Some("1"));
        assert_eq!(get("trt_max_workspace_size").as_deref(), Some("268435456"));
        // Without a state directory no cache is asked for.
        let bare = tensorrt_options(&GpuOptions::default(), &b, "x", &[3]);
        assert!(bare.iter().all(|(k, _)| !k.contains("cache")));
    }

    #[test]
    fn buckets_are_powers_of_two_then_the_maximum_and_every_size_fits_one() {
        let b = Buckets::up_to(48);
        assert_eq!(b.sizes(), &[1, 2, 4, 8, 16, 32, 48]);
        assert_eq!(b.bucket_for(1), Some(1));
        assert_eq!(b.bucket_for(5), Some(8));
        assert_eq!(b.bucket_for(33), Some(48));
        assert_eq!(b.bucket_for(49), None);
        assert_eq!(Buckets::up_to(64).sizes(), &[1, 2, 4, 8, 16, 32, 64]);
        assert_eq!(Buckets::up_to(0).sizes(), &[1]);
        for n in 1..=48 {
            let got = b.bucket_for(n).unwrap();
            assert!(got >= n && b.sizes().contains(&got));
        }
        assert_eq!(b.at_most(47), 32);
        assert_eq!(b.at_most(48), 48);
        assert_eq!(b.at_most(1000), 48);
        assert_eq!(b.at_most(0), 1);
    }
}
