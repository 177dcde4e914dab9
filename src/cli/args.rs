//! Flags several subcommands share: the engine, the memory budget, telemetry exports.

use std::path::PathBuf;

use anyhow::{Context, Result};

use hsiedge::engine::EngineOptions;

#[derive(clap::Args, Clone)]
pub struct EngineArgs {
    /// ONNX Runtime library (else ORT_DYLIB_PATH, beside the executable, system paths, Python onnxruntime).
    #[arg(long, value_name = "PATH")]
    pub ort_lib: Option<PathBuf>,
    /// Intra-op threads (0: one per core).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Let idle ONNX Runtime threads spin-wait (faster alone, slower beside the tiling thread).
    #[arg(long)]
    pub spin: bool,
    /// CPU memory arena: exact (one shared arena grown by what is asked, chunks reused run after
    /// run), pow2 (ONNX Runtime's default, grown by powers of two) or off (every run maps its
    /// blocks afresh: 7-10 % slower).
    #[arg(long, default_value = "exact", value_parser = clap::value_parser!(hsiedge::engine::Arena))]
    pub arena: hsiedge::engine::Arena,
    /// Turn on ONNX Runtime's memory pattern (one planned block per input shape; with the exact
    /// arena a steady run then holds 1.4-1.6x the memory).
    #[arg(long)]
    pub memory_pattern: bool,
    /// Nice increment of the tiling thread (0: none; use 0 where other processes keep every core
    /// busy). Default: 19 for a file, 0 for a stream (its tiling thread also reads the stream).
    #[arg(long, value_parser = clap::value_parser!(i32).range(0..=19))]
    pub producer_nice: Option<i32>,
    /// Execution providers in order of preference, e.g. `tensorrt,cuda,cpu`. A provider that
    /// cannot register is an error unless another is listed after it; every fallback is printed
    /// and recorded in summary.json and telemetry.
    #[arg(long, value_name = "LIST", default_value = "cpu", value_parser = clap::value_parser!(hsiedge::engine::Preference))]
    pub ep: hsiedge::engine::Preference,
    /// CUDA device ordinal (cuda, tensorrt).
    #[arg(long, default_value_t = 0)]
    pub device_id: u32,
    /// cuDNN convolution algorithm search (cuda): heuristic (bounded workspace), exhaustive
    /// (benchmarks each algorithm on a shape's first run) or default.
    #[arg(long, default_value = "heuristic", value_parser = clap::value_parser!(hsiedge::engine::ConvSearch))]
    pub cudnn_conv_algo_search: hsiedge::engine::ConvSearch,
    /// Bound of the CUDA provider's device arena, MiB (default: unbounded).
    #[arg(long, value_name = "MIB")]
    pub gpu_mem_limit_mib: Option<u64>,
    /// Capture the device path's batch as a CUDA graph and replay it (cuda, tensorrt; the host
    /// path runs without). The batch then stays at the planned one (the governor does not cut it).
    #[arg(long)]
    pub cuda_graph: bool,
    /// Model precision: fp32, or fp16 (the manifest's *_fp16 files).
    #[arg(long, default_value = "fp32", value_parser = clap::value_parser!(hsiedge::engine::Precision))]
    pub precision: hsiedge::engine::Precision,
    /// Where a CUDA session's batches are prepared: device (raw windows uploaded, decoded and
    /// normalised into bound device buffers, argmax on the device, only labels back), host
    /// (float32 batches built on the host), or auto (device where the run allows it: cuda, a
    /// classification model, int16/uint16/float32 samples; else host, with the reason printed).
    #[arg(long, default_value = "auto", value_parser = clap::value_parser!(hsiedge::engine::IoPath))]
    pub io: hsiedge::engine::IoPath,
    /// TensorRT: build fp16 kernels.
    #[arg(long)]
    pub trt_fp16: bool,
    /// TensorRT: build int8 kernels.
    #[arg(long)]
    pub trt_int8: bool,
    /// TensorRT: engine and timing cache folder (the state directory).
    #[arg(long, value_name = "DIR")]
    pub trt_cache_dir: Option<PathBuf>,
}

impl EngineArgs {
    pub fn options(&self) -> Result<EngineOptions> {
        let threads = match (self.threads, hsiedge::config::HSIEDGE_THREADS.get()) {
            (0, Some(v)) => v.trim().parse::<usize>().with_context(|| {
                format!(
                    "{} = `{v}` is not a thread count",
                    hsiedge::config::HSIEDGE_THREADS.name
                )
            })?,
            (n, _) => n,
        };
        Ok(EngineOptions {
            ort_lib: self.ort_lib.clone(),
            threads,
            providers: self.ep.clone(),
            gpu: hsiedge::engine::GpuOptions {
                device_id: self.device_id,
                mem_limit: self.gpu_mem_limit_mib.map(|m| m.saturating_mul(1 << 20)),
                conv_search: self.cudnn_conv_algo_search,
                cuda_graph: self.cuda_graph,
                trt_fp16: self.trt_fp16,
                trt_int8: self.trt_int8,
                trt_cache_dir: self.trt_cache_dir.clone(),
                trt_workspace: None,
                trt_profile: None,
                io: self.io,
                compute_stream: None,
            },
            precision: self.precision,
            spin: self.spin,
            arena: self.arena,
            memory_pattern: self.memory_pattern,
            producer_nice: self.producer_nice.unwrap_or(hsiedge::engine::DEFAULT_PRODUCER_NICE),
        })
    }

    /// [`EngineArgs::options`] for a streamed scene: the tiling thread at its normal priority
    /// unless `--producer-nice` says otherwise.
    pub fn stream_options(&self) -> Result<EngineOptions> {
        Ok(EngineOptions {
            producer_nice: self.producer_nice.unwrap_or(0),
            ..self.options()?
        })
    }
}

#[derive(clap::Args, Clone)]
pub struct BudgetArgs {
    /// Memory left to the rest of the system (MiB), off MemAvailable.
    #[arg(long, default_value_t = 512)]
    pub reserve_mib: u64,
    /// Share of the budget kept for allocator fragmentation.
    #[arg(long, default_value_t = 0.10)]
    pub frag_margin: f64,
    /// Largest batch `--batch auto` may choose.
    #[arg(long, default_value_t = 8192)]
    pub max_batch: u64,
    /// Keep the chosen batch for the whole run (no re-reading of the budget).
    #[arg(long)]
    pub no_adapt: bool,
    /// Folder of cached batch sweeps (`hsiedge bench sweep`); their plateau knee caps the batch
    /// (default: HSIEDGE_CACHE_DIR, else $XDG_CACHE_HOME/hsiedge, else ~/.cache/hsiedge).
    #[arg(long, value_name = "DIR")]
    pub sweep_cache: Option<PathBuf>,
    /// No knee: neither a cached sweep's nor the in-run sweep's (which times a few batch sizes
    /// before the run); the batch is then the largest that memory, --max-batch and the scene allow.
    #[arg(long, conflicts_with = "sweep_cache")]
    pub no_knee: bool,
}

impl BudgetArgs {
    pub fn settings(&self) -> hsiedge::job::BudgetSettings {
        hsiedge::job::BudgetSettings {
            reserve_bytes: self.reserve_mib.saturating_mul(1 << 20),
            frag_margin: self.frag_margin,
            max_units: self.max_batch,
            adapt: !self.no_adapt,
            sweep_cache: if self.no_knee {
                None
            } else {
                self.sweep_cache.clone().or_else(hsiedge::budget::knee::cache_dir)
            },
            sweep: !self.no_knee,
            ..Default::default()
        }
    }
}

#[derive(clap::Args, Clone)]
pub struct TelemetryArgs {
    /// Write telemetry to FILE while the run goes on: one JSON snapshot per line every second
    /// (pixels/s, batch latency quantiles, queue, memory, power, temperatures, energy per
    /// megapixel, batch and why) and a final one.
    #[arg(long, value_name = "FILE")]
    pub telemetry: Option<PathBuf>,
    /// Serve Prometheus metrics at http://ADDR/metrics while the run goes on; ADDR must be a
    /// loopback address, e.g. 127.0.0.1:9184 (port 0 picks a free one; the address is printed on
    /// stderr).
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<String>,
}

/// A number of seconds within what a timer holds: finite, from 0 to a year.
pub fn seconds(s: &str) -> std::result::Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && (0.0..=SECONDS_MAX).contains(&v) => Ok(v),
        _ => Err(format!("`{s}` is not a number of seconds from 0 to {SECONDS_MAX}")),
    }
}

/// Lines per second: 0 (as fast as the receiver takes them), or from a line in 1,000 s to 1e9.
pub fn rate(s: &str) -> std::result::Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v == 0.0 || (1e-3..=1e9).contains(&v) => Ok(v),
        _ => Err(format!("`{s}` is not 0 or a rate from 0.001 to 1e9 lines per second")),
    }
}

/// A year.
const SECONDS_MAX: f64 = 31_536_000.0;

#[cfg(test)]
mod tests {
    #[test]
    fn seconds_and_rates_refuse_what_a_timer_cannot_hold() {
        assert_eq!(super::seconds("2.5"), Ok(2.5));
        assert_eq!(super::seconds("0"), Ok(0.0));
        for bad in ["-1", "nan", "inf", "1e30", "x"] {
            assert!(super::seconds(bad).is_err(), "{bad}");
        }
        assert_eq!(super::rate("0"), Ok(0.0));
        assert_eq!(super::rate("400"), Ok(400.0));
        for bad in ["1e-300", "-5", "nan", "inf", "1e12"] {
            assert!(super::rate(bad).is_err(), "{bad}");
        }
    }
}
