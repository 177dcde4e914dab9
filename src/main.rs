//! The `hsiedge` command: thin glue over the library.

use std::io::IsTerminal;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};

use hsiedge::engine::EngineOptions;
use hsiedge::job::{Job, JobSpec, parse_batch, parse_mode};

#[derive(Parser)]
#[command(
    name = "hsiedge",
    version,
    about = "Hyperspectral cube inference for Jetson-class edge devices"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Args, Clone)]
struct EngineArgs {
    /// ONNX Runtime library (else ORT_DYLIB_PATH, beside the executable, system paths, Python onnxruntime).
    #[arg(long, value_name = "PATH")]
    ort_lib: Option<PathBuf>,
    /// Intra-op threads (0: one per core).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// Let idle ONNX Runtime threads spin-wait (faster alone, slower beside the tiling thread).
    #[arg(long)]
    spin: bool,
    /// CPU memory arena: exact (one shared arena grown by what is asked, chunks reused run after
    /// run), pow2 (ONNX Runtime's default, grown by powers of two) or off (every run maps its
    /// blocks afresh: 7-10 % slower).
    #[arg(long, default_value = "exact", value_parser = clap::value_parser!(hsiedge::engine::Arena))]
    arena: hsiedge::engine::Arena,
    /// Turn on ONNX Runtime's memory pattern (one planned block per input shape; with the exact
    /// arena a steady run then holds 1.4-1.6x the memory).
    #[arg(long)]
    memory_pattern: bool,
    /// Nice increment of the tiling thread (0: none; use 0 where other processes keep every core
    /// busy). Default: 19 for a file, 0 for a stream (its tiling thread also reads the stream).
    #[arg(long, value_parser = clap::value_parser!(i32).range(0..=19))]
    producer_nice: Option<i32>,
    /// Execution providers in order of preference, e.g. `tensorrt,cuda,cpu`. A provider that
    /// cannot register is an error unless another is listed after it; every fallback is printed
    /// and recorded in summary.json and telemetry.
    #[arg(long, value_name = "LIST", default_value = "cpu", value_parser = clap::value_parser!(hsiedge::engine::Preference))]
    ep: hsiedge::engine::Preference,
    /// CUDA device ordinal (cuda, tensorrt).
    #[arg(long, default_value_t = 0)]
    device_id: u32,
    /// cuDNN convolution algorithm search (cuda): heuristic (bounded workspace), exhaustive
    /// (benchmarks each algorithm on a shape's first run) or default.
    #[arg(long, default_value = "heuristic", value_parser = clap::value_parser!(hsiedge::engine::ConvSearch))]
    cudnn_conv_algo_search: hsiedge::engine::ConvSearch,
    /// Bound of the CUDA provider's device arena, MiB (default: unbounded).
    #[arg(long, value_name = "MIB")]
    gpu_mem_limit_mib: Option<u64>,
    /// Capture each batch shape as a CUDA graph and replay it (cuda, tensorrt).
    #[arg(long)]
    cuda_graph: bool,
    /// Model precision: fp32, or fp16 (the manifest's *_fp16 files).
    #[arg(long, default_value = "fp32", value_parser = clap::value_parser!(hsiedge::engine::Precision))]
    precision: hsiedge::engine::Precision,
    /// TensorRT: build fp16 kernels.
    #[arg(long)]
    trt_fp16: bool,
    /// TensorRT: build int8 kernels.
    #[arg(long)]
    trt_int8: bool,
    /// TensorRT: engine and timing cache folder (the state directory).
    #[arg(long, value_name = "DIR")]
    trt_cache_dir: Option<PathBuf>,
}

impl EngineArgs {
    fn options(&self) -> Result<EngineOptions> {
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
    fn stream_options(&self) -> Result<EngineOptions> {
        Ok(EngineOptions {
            producer_nice: self.producer_nice.unwrap_or(0),
            ..self.options()?
        })
    }
}

#[derive(clap::Args, Clone)]
struct BudgetArgs {
    /// Memory left to the rest of the system (MiB), off MemAvailable.
    #[arg(long, default_value_t = 512)]
    reserve_mib: u64,
    /// Share of the budget kept for allocator fragmentation.
    #[arg(long, default_value_t = 0.10)]
    frag_margin: f64,
    /// Largest batch `--batch auto` may choose.
    #[arg(long, default_value_t = 8192)]
    max_batch: u64,
    /// Keep the chosen batch for the whole run (no re-reading of the budget).
    #[arg(long)]
    no_adapt: bool,
    /// Folder of cached batch sweeps (`hsiedge bench sweep`); their plateau knee caps the batch
    /// (default: HSIEDGE_CACHE_DIR, else $XDG_CACHE_HOME/hsiedge, else ~/.cache/hsiedge).
    #[arg(long, value_name = "DIR")]
    sweep_cache: Option<PathBuf>,
    /// No knee: neither a cached sweep's nor the in-run sweep's (which times a few batch sizes
    /// before the run); the batch is then the largest that memory, --max-batch and the scene allow.
    #[arg(long, conflicts_with = "sweep_cache")]
    no_knee: bool,
}

impl BudgetArgs {
    fn settings(&self) -> hsiedge::job::BudgetSettings {
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
struct TelemetryArgs {
    /// Write telemetry to FILE while the run goes on: one JSON snapshot per line every second
    /// (pixels/s, batch latency quantiles, queue, memory, power, temperatures, energy per
    /// megapixel, batch and why) and a final one.
    #[arg(long, value_name = "FILE")]
    telemetry: Option<PathBuf>,
    /// Serve Prometheus metrics at http://ADDR/metrics while the run goes on; ADDR must be a
    /// loopback address, e.g. 127.0.0.1:9184 (port 0 picks a free one; the address is printed on
    /// stderr).
    #[arg(long, value_name = "ADDR")]
    metrics: Option<String>,
}

#[derive(Subcommand)]
enum Command {
    /// Classify (or unmix) a scene into maps.
    Classify {
        /// The scene's ENVI header (or data file).
        scene: PathBuf,
        /// Model manifest.
        #[arg(long)]
        model: PathBuf,
        /// Output folder.
        #[arg(long)]
        out: PathBuf,
        /// auto, dense or patch.
        #[arg(long, default_value = "auto")]
        mode: String,
        /// auto or patches (tiles in dense mode) per batch.
        #[arg(long, default_value = "auto")]
        batch: String,
        /// Tile side in output pixels.
        #[arg(long, default_value_t = hsiedge::job::DEFAULT_TILE)]
        tile: usize,
        /// Reference label map (ENVI) to report accuracy against.
        #[arg(long)]
        labels: Option<PathBuf>,
        /// Also write every output channel (scores.img).
        #[arg(long)]
        keep_scores: bool,
        /// Print the summary as JSON on stdout.
        #[arg(long)]
        json: bool,
        /// When another run is writing the output folder, wait for it (default: fail at once).
        #[arg(long)]
        wait: bool,
        #[command(flatten)]
        telemetry: TelemetryArgs,
        #[command(flatten)]
        engine: EngineArgs,
        #[command(flatten)]
        budget: BudgetArgs,
    },
    /// The memory plan: what a batch costs, what the system can give, the largest safe batch.
    Plan {
        /// Model manifest.
        #[arg(long)]
        model: PathBuf,
        /// A scene to plan for (its size adds the map and mapping costs); else one tile.
        #[arg(long)]
        scene: Option<PathBuf>,
        /// auto, dense or patch.
        #[arg(long, default_value = "auto")]
        mode: String,
        /// Tile side in output pixels.
        #[arg(long, default_value_t = hsiedge::job::DEFAULT_TILE)]
        tile: usize,
        /// Plan training instead of inference.
        #[arg(long)]
        train: bool,
        /// Classes a training batch should cover (with --train).
        #[arg(long)]
        classes: Option<u64>,
        /// Optimizer whose state training holds (with --train): adam or sgd.
        #[arg(long, default_value = "adam")]
        optimizer: String,
        /// Run the scene at batches from 1 to the ceiling (B_safe before the knee) and compare
        /// measured with predicted peaks.
        #[arg(long, requires = "scene")]
        verify: bool,
        /// Find the real wall: run the scene in fresh processes under a cgroup capped at the budget,
        /// growing the batch x1.5 until one is killed, then bisecting; report predicted against found.
        /// Needs root. Never done unasked: on shared memory a probe to failure is a risk to take knowingly.
        #[arg(long, requires = "scene")]
        probe_wall: bool,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        engine: EngineArgs,
        #[command(flatten)]
        budget: BudgetArgs,
    },
    /// Print an ENVI header or a model manifest.
    Inspect {
        /// A `.hdr` or `manifest.json`.
        file: PathBuf,
    },
    /// Write a synthetic scene drawn from a model's class statistics.
    Simulate {
        /// Model manifest.
        #[arg(long)]
        model: PathBuf,
        /// Output folder.
        #[arg(long)]
        out: PathBuf,
        /// Lines.
        #[arg(long, default_value_t = 128)]
        lines: usize,
        /// Samples per line.
        #[arg(long, default_value_t = 128)]
        samples: usize,
        /// Fields in the layout.
        #[arg(long, default_value_t = 24)]
        fields: usize,
        /// Random seed.
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// Replay a cube as a pushbroom sensor's line stream (docs/stream-protocol.md) to a receiver.
    SimulateSensor {
        /// The scene's ENVI header (or data file); BSQ cubes stream as BIL.
        #[arg(long)]
        scene: PathBuf,
        /// Lines per second (0: as fast as the receiver takes them).
        #[arg(long, value_name = "LINES_PER_S")]
        rate: f64,
        /// The receiver: tcp:HOST:PORT, unix:PATH or HOST:PORT.
        #[arg(long, value_name = "ADDR")]
        connect: String,
        /// Scene id (default: the header's file stem; with --repeat N, ID-1 to ID-N).
        #[arg(long, value_name = "ID")]
        scene_id: Option<String>,
        /// Model name the scene message carries.
        #[arg(long, value_name = "NAME")]
        model: Option<String>,
        /// Line numbers never sent, comma-separated (fault injection).
        #[arg(long, value_delimiter = ',', value_name = "LINES")]
        drop: Vec<u64>,
        /// Line numbers sent twice (fault injection).
        #[arg(long, value_delimiter = ',', value_name = "LINES")]
        duplicate: Vec<u64>,
        /// Line numbers sent after their successor (fault injection).
        #[arg(long, value_delimiter = ',', value_name = "LINES")]
        swap: Vec<u64>,
        /// Send the scene this many times on the connection.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
        repeat: u32,
        /// Seconds to wait, after the last line, for the receiver to close the connection (its
        /// confirmation that every scene was taken).
        #[arg(long, default_value_t = 10, value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(1..))]
        close_wait: u64,
    },
    /// Serve scenes streamed by sensors until stopped (SIGTERM/SIGINT drain, SIGHUP reloads);
    /// the configuration's keys are documented in systemd/hsiedge.toml.
    Serve {
        /// The configuration file (TOML).
        #[arg(long, value_name = "FILE", default_value = "/etc/hsiedge/hsiedge.toml")]
        config: PathBuf,
    },
    /// Receive delivered segments from a daemon's CBOR subscriber socket (docs/delivery.md):
    /// write each into OUT/<node>/<scene>/seg-NNNNNN/, acknowledge it, print one JSON line.
    Subscribe {
        /// The daemon's `delivery.subscriber_tcp` (IP:PORT) or `delivery.subscriber_unix` (path).
        #[arg(long, value_name = "ADDR|PATH")]
        socket: String,
        /// Where received segments are written.
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
        /// Stop after this many distinct segments (default: until the daemon closes).
        #[arg(long, value_name = "N")]
        count: Option<u64>,
        /// Seconds to keep trying to connect.
        #[arg(long, value_name = "S", default_value_t = 30.0)]
        connect_timeout_s: f64,
    },
    /// Benchmarks (medians, with ratios against baselines measured in the same run).
    Bench {
        #[command(subcommand)]
        what: BenchCommand,
    },
    /// Check that this deployment can run (exit 0 only when it can).
    Doctor {
        #[command(flatten)]
        args: hsiedge::doctor::DoctorArgs,
    },
    /// List the environment variables hsiedge reads.
    Env,
    /// Builds a model's TensorRT engine for a fixed profile (batch buckets up to --batch, the
    /// tile's window) and writes it as an EPContext model, so a device starts from a prebuilt
    /// engine. Needs the TensorRT provider (`hsiedge doctor --provider tensorrt`).
    BuildEngine {
        /// Model manifest.
        #[arg(long)]
        model: PathBuf,
        /// patch or dense.
        #[arg(long, default_value = "patch")]
        mode: String,
        /// Largest batch the profile covers (patches, or tiles in dense mode).
        #[arg(long, default_value_t = hsiedge::job::DEFAULT_PATCH_BATCH)]
        batch: usize,
        /// Tile side in output pixels (dense mode).
        #[arg(long, default_value_t = hsiedge::job::DEFAULT_TILE)]
        tile: usize,
        /// The EPContext model to write.
        #[arg(long)]
        out: PathBuf,
        #[command(flatten)]
        engine: EngineArgs,
    },
    /// The GPU: what the device reports, and its kernels checked against the CPU reference.
    Gpu {
        #[command(subcommand)]
        command: GpuCommand,
    },
}

#[derive(Subcommand)]
enum GpuCommand {
    /// Name, compute capability, SMs, memory, integrated or discrete (nothing when no CUDA driver).
    Probe {
        /// CUDA device ordinal.
        #[arg(long, default_value_t = 0)]
        device: usize,
    },
    /// Runs every kernel on fresh random inputs into poisoned outputs against the CPU reference
    /// (argmax exact, normalisation within 1e-6 relative); prints a JSON report, exit 1 on a mismatch.
    Check {
        /// CUDA device ordinal.
        #[arg(long, default_value_t = 0)]
        device: usize,
        /// Seed of the random inputs (default: from the clock).
        #[arg(long)]
        seed: Option<u64>,
    },
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Patch vs dense mode end to end, against pure inference and a Python onnxruntime loop.
    Classify {
        /// The scene's ENVI header.
        scene: PathBuf,
        /// Model manifest.
        #[arg(long)]
        model: PathBuf,
        /// Patches per batch in patch mode.
        #[arg(long, default_value_t = hsiedge::job::DEFAULT_PATCH_BATCH)]
        batch: usize,
        /// Tiles per batch in dense mode.
        #[arg(long, default_value_t = hsiedge::job::DEFAULT_DENSE_BATCH)]
        dense_batch: usize,
        /// Tile side.
        #[arg(long, default_value_t = hsiedge::job::DEFAULT_TILE)]
        tile: usize,
        /// Repetitions per measurement.
        #[arg(long, default_value_t = 5)]
        repeat: usize,
        /// Repetitions of dense mode (default: --repeat, and at least 51: dense runs take
        /// milliseconds, so more of them cost little and steady the median).
        #[arg(long)]
        dense_repeat: Option<usize>,
        /// Python interpreter for the onnxruntime baseline loop (default: HSIEDGE_PYTHON, else python3).
        #[arg(long)]
        python: Option<String>,
        /// Skip the Python baseline.
        #[arg(long)]
        no_python: bool,
        /// The baseline script.
        #[arg(long, default_value = "benches/ort_patch_loop.py")]
        script: PathBuf,
        /// Time only this mode: dense or patch (patch mode takes minutes on a large scene).
        #[arg(long)]
        only: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        engine: EngineArgs,
    },
    /// `--batch auto` against fixed batches (powers of two up to B_safe): throughput, peak memory,
    /// start-up; fresh processes, interleaved repetitions, medians.
    Auto {
        /// The scene's ENVI header.
        scene: PathBuf,
        /// Model manifest.
        #[arg(long)]
        model: PathBuf,
        /// dense, patch, or auto (dense when the model has a dense twin).
        #[arg(long, default_value = "auto")]
        mode: String,
        /// Tile side.
        #[arg(long, default_value_t = hsiedge::job::DEFAULT_TILE)]
        tile: usize,
        /// Repetitions of every batch.
        #[arg(long, default_value_t = 5)]
        repeat: usize,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        engine: EngineArgs,
    },
    /// What telemetry costs classify: each repetition runs the job with and without telemetry
    /// (alternating which goes first); the ratio is the median of per-repetition ratios with
    /// quartiles.
    Telemetry {
        /// The scene's ENVI header.
        scene: PathBuf,
        /// Model manifest.
        #[arg(long)]
        model: PathBuf,
        /// dense, patch or both (dense only when the model has a dense twin).
        #[arg(long, default_value = "both")]
        mode: String,
        /// Patches per batch in patch mode.
        #[arg(long, default_value_t = hsiedge::job::DEFAULT_PATCH_BATCH)]
        batch: usize,
        /// Tiles per batch in dense mode.
        #[arg(long, default_value_t = hsiedge::job::DEFAULT_DENSE_BATCH)]
        dense_batch: usize,
        /// Tile side.
        #[arg(long, default_value_t = hsiedge::job::DEFAULT_TILE)]
        tile: usize,
        /// Pairs of runs per mode.
        #[arg(long, default_value_t = 21)]
        repeat: usize,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        engine: EngineArgs,
    },
    /// A long pushbroom stream through the daemon's path (wire protocol over a Unix socket, ring,
    /// tiler, engine, strip-by-strip map writing) against pure inference of the same batches; with
    /// --rate, each output row's latency from its last input line.
    Stream {
        /// The scene whose lines are replayed, cycled to --lines.
        scene: PathBuf,
        /// Model manifest.
        #[arg(long)]
        model: PathBuf,
        /// auto, dense or patch.
        #[arg(long, default_value = "auto")]
        mode: String,
        /// Units per batch (default: the mode's).
        #[arg(long)]
        batch: Option<usize>,
        /// Tile side (tile rows are this many lines).
        #[arg(long, default_value_t = hsiedge::job::DEFAULT_TILE)]
        tile: usize,
        /// Lines in the stream.
        #[arg(long, default_value_t = 4096)]
        lines: usize,
        /// Lines per second (0: as fast as the receiver takes them).
        #[arg(long, default_value_t = 0.0)]
        rate: f64,
        /// Repetitions (after one untimed warm-up).
        #[arg(long, default_value_t = 5)]
        repeat: usize,
        /// Lines per output segment (0: one set).
        #[arg(long, default_value_t = 0)]
        segment_lines: usize,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        engine: EngineArgs,
    },
    /// Per-unit inference time against batch size, its elasticity and the plateau knee; the
    /// result is cached so `--batch auto` stops at the knee on this model and device.
    Sweep {
        /// Model manifest.
        #[arg(long)]
        model: PathBuf,
        /// dense (unit: tile) or patch (unit: sample); dense when the model has a dense twin.
        #[arg(long, default_value = "auto")]
        mode: String,
        /// Tile side (dense mode).
        #[arg(long, default_value_t = hsiedge::job::DEFAULT_TILE)]
        tile: usize,
        /// Batch sizes, comma-separated (default: powers of two up to 4096 samples or 128 tiles).
        #[arg(long, value_delimiter = ',')]
        batches: Vec<u64>,
        /// Timed runs per size.
        #[arg(long, default_value_t = 5)]
        repeat: usize,
        /// Untimed runs per size before the timed ones.
        #[arg(long, default_value_t = 1)]
        warmups: usize,
        /// Stop after a size whose run takes longer than this (seconds).
        #[arg(long, default_value_t = 10.0)]
        max_run_s: f64,
        /// Also time the manifest's fp16 graph over the same sizes and report fp16/fp32.
        #[arg(long)]
        fp16: bool,
        /// Sweep under nvpmodel power modes: `all` or ids (e.g. `0,2`), from /etc/nvpmodel.conf;
        /// energy per pixel from the module's total rail; the original mode is restored on exit,
        /// on error and on Ctrl-C.
        #[arg(long, value_name = "all|ID,ID")]
        power_modes: Option<String>,
        /// Root of the board's /etc, /sys and /var for --power-modes (recorded trees in tests).
        #[arg(long, value_name = "DIR", default_value = "/", requires = "power_modes")]
        platform_root: PathBuf,
        /// The nvpmodel program for --power-modes.
        #[arg(long, value_name = "PROG", default_value = "nvpmodel", requires = "power_modes")]
        nvpmodel: PathBuf,
        /// Seconds to wait after a mode switch for clocks to settle.
        #[arg(long, default_value_t = 5.0, requires = "power_modes")]
        settle_s: f64,
        /// Print the power-mode plan; switch and run nothing.
        #[arg(long, requires = "power_modes")]
        dry_run: bool,
        /// Draw the sweep into this SVG file.
        #[arg(long, value_name = "FILE.svg")]
        plot: Option<PathBuf>,
        /// Folder to cache the result in (default as for `classify --sweep-cache`).
        #[arg(long, value_name = "DIR")]
        cache: Option<PathBuf>,
        /// Do not cache the result.
        #[arg(long, conflicts_with = "cache")]
        no_cache: bool,
        /// Memory left to the rest of the system (MiB), off MemAvailable.
        #[arg(long, default_value_t = 512)]
        reserve_mib: u64,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        engine: EngineArgs,
    },
}

fn main() -> std::process::ExitCode {
    hsiedge::ffi::pin_allocator_thresholds();
    let cli = Cli::parse();
    // The daemon writes to sockets whose peers may vanish: it keeps SIGPIPE ignored (a write then
    // fails with EPIPE); every other command dies quietly on a closed pipe, as a CLI tool should.
    if !matches!(cli.command, Command::Serve { .. }) {
        hsiedge::ffi::default_sigpipe();
    }
    if let Command::Doctor { args } = &cli.command {
        return std::process::ExitCode::from(u8::try_from(hsiedge::doctor::main(args)).unwrap_or(1));
    }
    match run(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("hsiedge: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Classify {
            scene,
            model,
            out,
            mode,
            batch,
            tile,
            labels,
            keep_scores,
            json,
            wait,
            telemetry,
            engine,
            budget,
        } => {
            let spec = JobSpec {
                scene,
                manifest: model,
                out,
                contention: if wait {
                    hsiedge::map::Contention::Wait
                } else {
                    hsiedge::map::Contention::Fail
                },
                mode: parse_mode(&mode)?,
                batch: parse_batch(&batch)?,
                tile,
                engine: engine.options()?,
                labels,
                keep_scores,
                budget: budget.settings(),
            };
            classify(spec, json, &telemetry)
        }
        Command::Plan {
            model,
            scene,
            mode,
            tile,
            train,
            classes,
            optimizer,
            verify,
            probe_wall,
            json,
            engine,
            budget,
        } => {
            let req = hsiedge::job::PlanRequest {
                verify,
                probe_wall,
                manifest: model,
                scene,
                mode: parse_mode(&mode)?,
                tile,
                engine: engine.options()?,
                budget: budget.settings(),
                train: if train {
                    let classes = classes.context("--train needs --classes K (the classes a batch should cover)")?;
                    let optimizer: hsiedge::budget::Optimizer = optimizer
                        .parse()
                        .map_err(|e| anyhow::anyhow!("--optimizer `{optimizer}`: {e}"))?;
                    Some((classes, optimizer))
                } else {
                    None
                },
            };
            let report = hsiedge::job::plan(&req)?;
            print_report(&report, json)
        }
        Command::Inspect { file } => inspect(&file),
        Command::Simulate {
            model,
            out,
            lines,
            samples,
            fields,
            seed,
        } => {
            let manifest = hsiedge::model::Manifest::load(&model)?;
            let opts = hsiedge::simulate::SimulateOptions {
                lines,
                samples,
                fields,
                seed,
            };
            let s = hsiedge::simulate::simulate(&manifest, &opts, &out)?;
            println!("SYNTHETIC scene {} (labels {})", s.scene.display(), s.labels.display());
            Ok(())
        }
        Command::SimulateSensor {
            scene,
            rate,
            connect,
            scene_id,
            model,
            drop,
            duplicate,
            swap,
            repeat,
            close_wait,
        } => {
            let opts = hsiedge::source::sensor::SensorOptions {
                scene,
                rate,
                addr: connect.parse()?,
                scene_id,
                model,
                faults: hsiedge::source::stream::Faults {
                    drop: drop.into_iter().collect(),
                    duplicate: duplicate.into_iter().collect(),
                    swap: swap.into_iter().collect(),
                },
                repeat,
                close_wait: std::time::Duration::from_secs(close_wait),
            };
            let report = hsiedge::source::sensor::simulate_sensor(&opts)?;
            eprintln!("{report}");
            if !report.confirmed {
                eprintln!(
                    "hsiedge: warning: {} did not close the connection within {close_wait} s of the last scene: \
                     delivery is not confirmed",
                    report.addr
                );
            }
            Ok(())
        }
        Command::Bench {
            what:
                BenchCommand::Classify {
                    scene,
                    model,
                    batch,
                    dense_batch,
                    tile,
                    repeat,
                    dense_repeat,
                    python,
                    no_python,
                    script,
                    only,
                    json,
                    engine,
                },
        } => {
            let only = match only.as_deref().map(parse_mode).transpose()? {
                Some(hsiedge::job::ModeChoice::Fixed(m)) => Some(m),
                Some(hsiedge::job::ModeChoice::Auto) | None => None,
            };
            let opts = hsiedge::bench::ClassifyBenchOptions {
                spec: JobSpec {
                    scene,
                    manifest: model,
                    out: PathBuf::new(),
                    contention: hsiedge::map::Contention::Fail,
                    mode: hsiedge::job::ModeChoice::Auto,
                    batch: hsiedge::job::BatchChoice::Auto,
                    tile,
                    engine: engine.options()?,
                    labels: None,
                    keep_scores: false,
                    budget: Default::default(),
                },
                patch_batch: batch,
                dense_batch,
                repeat: repeat.max(1),
                dense_repeat,
                python: (!no_python).then(|| python.unwrap_or_else(hsiedge::config::python)),
                script,
                only,
            };
            let r = hsiedge::bench::classify(&opts)?;
            print_report(&r, json)
        }
        Command::Bench {
            what:
                BenchCommand::Telemetry {
                    scene,
                    model,
                    mode,
                    batch,
                    dense_batch,
                    tile,
                    repeat,
                    json,
                    engine,
                },
        } => {
            let has_dense = hsiedge::model::Manifest::load(&model)?.files.dense.is_some();
            let (dense, patch) = (
                (hsiedge::pipeline::Mode::Dense, dense_batch),
                (hsiedge::pipeline::Mode::Patch, batch),
            );
            let modes = match mode.as_str() {
                "both" if has_dense => vec![dense, patch],
                "both" | "patch" => vec![patch],
                "dense" if has_dense => vec![dense],
                "dense" => anyhow::bail!("--mode dense: the model {} has no dense twin", model.display()),
                other => anyhow::bail!("--mode `{other}`: expected dense, patch or both"),
            };
            let opts = hsiedge::telemetry::bench::TelemetryBenchOptions {
                spec: JobSpec {
                    scene,
                    manifest: model,
                    out: PathBuf::new(),
                    contention: hsiedge::map::Contention::Fail,
                    mode: hsiedge::job::ModeChoice::Auto,
                    batch: hsiedge::job::BatchChoice::Auto,
                    tile,
                    engine: engine.options()?,
                    labels: None,
                    keep_scores: false,
                    budget: Default::default(),
                },
                modes,
                repeat,
            };
            let r = hsiedge::telemetry::bench::telemetry(&opts)?;
            print_report(&r, json)
        }
        Command::Bench {
            what:
                BenchCommand::Auto {
                    scene,
                    model,
                    mode,
                    tile,
                    repeat,
                    json,
                    engine,
                },
        } => {
            let opts = hsiedge::bench::auto::AutoBenchOptions {
                scene,
                manifest: model,
                mode: parse_mode(&mode)?,
                tile,
                engine: engine.options()?,
                repeat,
            };
            let r = hsiedge::bench::auto::auto(&opts)?;
            print_report(&r, json)
        }
        Command::Bench {
            what:
                BenchCommand::Stream {
                    scene,
                    model,
                    mode,
                    batch,
                    tile,
                    lines,
                    rate,
                    repeat,
                    segment_lines,
                    json,
                    engine,
                },
        } => {
            let opts = hsiedge::bench::stream::StreamBenchOptions {
                scene,
                session: hsiedge::bench::stream::session(
                    model,
                    parse_mode(&mode)?,
                    batch,
                    tile,
                    engine.stream_options()?,
                ),
                lines,
                rate,
                repeat,
                segment_lines,
            };
            let r = hsiedge::bench::stream::stream(&opts)?;
            print_report(&r, json)
        }
        Command::Bench {
            what:
                BenchCommand::Sweep {
                    model,
                    mode,
                    tile,
                    batches,
                    repeat,
                    warmups,
                    max_run_s,
                    fp16,
                    power_modes,
                    platform_root,
                    nvpmodel,
                    settle_s,
                    dry_run,
                    plot,
                    cache,
                    no_cache,
                    reserve_mib,
                    json,
                    engine,
                },
        } => {
            if !(settle_s.is_finite() && settle_s >= 0.0) {
                anyhow::bail!("--settle-s {settle_s}: needs a non-negative number of seconds");
            }
            let mode = match hsiedge::job::parse_mode(&mode)? {
                hsiedge::job::ModeChoice::Fixed(m) => m,
                hsiedge::job::ModeChoice::Auto => {
                    let m = hsiedge::model::Manifest::load(&model)?;
                    if m.files.dense.is_some() {
                        hsiedge::pipeline::Mode::Dense
                    } else {
                        hsiedge::pipeline::Mode::Patch
                    }
                }
            };
            let opts = hsiedge::bench::sweep::SweepOptions {
                manifest: model,
                mode,
                tile,
                batches: if batches.is_empty() {
                    hsiedge::bench::sweep::default_batches(mode, tile)
                } else {
                    batches
                },
                repeat,
                warmups,
                fp16,
                power: power_modes.map(|modes| hsiedge::bench::sweep::PowerOptions {
                    modes,
                    platform_root,
                    nvpmodel,
                    settle: std::time::Duration::from_secs_f64(settle_s),
                    sample_interval: std::time::Duration::from_millis(20),
                    dry_run,
                }),
                engine: engine.options()?,
                reserve_bytes: reserve_mib.saturating_mul(1 << 20),
                frag_margin: 0.10,
                root: PathBuf::from("/"),
                max_run_s,
                cache_dir: if no_cache {
                    None
                } else {
                    cache.or_else(hsiedge::budget::knee::cache_dir)
                },
            };
            let r = hsiedge::bench::sweep::sweep(&opts)?;
            if let Some(path) = &plot {
                hsiedge::bench::sweep::plot::write(&r, path)?;
            }
            print_report(&r, json)
        }
        Command::Serve { config } => Ok(hsiedge::daemon::serve(&config)?),
        Command::Subscribe {
            socket,
            out,
            count,
            connect_timeout_s,
        } => {
            if !connect_timeout_s.is_finite() || connect_timeout_s < 0.0 {
                anyhow::bail!("--connect-timeout-s {connect_timeout_s} is not a number of seconds >= 0");
            }
            let opts = hsiedge::delivery::subscribe::SubscribeOptions {
                socket,
                out,
                count,
                connect_timeout: std::time::Duration::from_secs_f64(connect_timeout_s),
            };
            let mut stdout = std::io::stdout().lock();
            hsiedge::delivery::subscribe::subscribe(&opts, &mut |r| {
                use std::io::Write;
                let _ = writeln!(stdout, "{}", serde_json::to_string(r).unwrap_or_default());
                let _ = stdout.flush();
            })?;
            Ok(())
        }
        Command::Doctor { .. } => Ok(()),
        Command::Gpu {
            command: GpuCommand::Probe { device },
        } => {
            match hsiedge::gpu::probe(device)? {
                Some(d) => println!("{}", serde_json::to_string_pretty(&d)?),
                None => println!("no CUDA device {device} (no driver library, or fewer devices)"),
            }
            Ok(())
        }
        Command::Gpu {
            command: GpuCommand::Check { device, seed },
        } => {
            let seed = seed.unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(1, |d| d.as_nanos() as u64)
            });
            let report = hsiedge::gpu::check::run(device, seed)?;
            println!("{}", serde_json::to_string_pretty(&report)?);
            if report.pass {
                Ok(())
            } else {
                anyhow::bail!("a GPU kernel disagrees with the CPU reference (seed {seed})")
            }
        }
        Command::BuildEngine {
            model,
            mode,
            batch,
            tile,
            out,
            engine,
        } => {
            let manifest = hsiedge::model::Manifest::load(&model)?;
            let mut options = engine.options()?;
            options.gpu.trt_profile = Some((batch, tile));
            let runtime = hsiedge::engine::Runtime::new(options)?;
            let (role, path) = match mode.as_str() {
                "patch" => (hsiedge::model::Role::Patch, manifest.patch_path()),
                "dense" => (
                    hsiedge::model::Role::Dense,
                    manifest
                        .dense_path()
                        .with_context(|| format!("{}: no dense twin (files.dense)", model.display()))?,
                ),
                other => anyhow::bail!("--mode `{other}`: expected patch or dense"),
            };
            let written = runtime.build_engine(&manifest, role, &path, &out)?;
            println!("EPContext model written to {}", written.display());
            Ok(())
        }
        Command::Env => {
            for v in hsiedge::config::ALL {
                println!("{:<16} default: {}\n{:<16} {}", v.name, v.default, "", v.meaning);
            }
            println!("\nread only by the test suite and CI:");
            for v in hsiedge::config::TEST_ONLY {
                println!("{:<16} default: {}\n{:<16} {}", v.name, v.default, "", v.meaning);
            }
            Ok(())
        }
    }
}

/// Prints a report as pretty JSON or as its text form.
fn print_report<T: serde::Serialize + std::fmt::Display>(report: &T, json: bool) -> Result<()> {
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(report).context("serialising the report")?
        );
    } else {
        println!("{report}");
    }
    Ok(())
}

// The job's error is returned as built (it names what failed); it is not on a hot path.
#[allow(clippy::result_large_err)]
fn classify(spec: JobSpec, json: bool, telemetry: &TelemetryArgs) -> Result<()> {
    use hsiedge::telemetry::{self as tm, JsonLines, LatestSnapshot, MetricsServer, Sink};
    // Both are opened before the model loads, so a bad path or address fails at once.
    let listener = telemetry.metrics.as_deref().map(tm::http::bind_local).transpose()?;
    let mut jsonl = telemetry.telemetry.as_deref().map(JsonLines::create).transpose()?;
    let mut job = Job::resolve(spec)?;
    let total = job.cube.lines() * job.cube.samples();
    let bar = if std::io::stderr().is_terminal() && !json {
        let b = indicatif::ProgressBar::new(total as u64);
        b.set_style(
            indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} px {per_sec} eta {eta}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        Some(b)
    } else {
        None
    };
    let mut latest = LatestSnapshot::new();
    let server = match listener {
        Some(l) => {
            let server = MetricsServer::start(l, latest.clone())?;
            eprintln!("hsiedge: metrics on http://{}/metrics", server.addr());
            Some(server)
        }
        None => None,
    };
    let summary = if jsonl.is_some() || server.is_some() {
        let mut sampler = tm::Sampler::discover(std::path::Path::new("/"), true);
        let info = tm::RunInfo {
            batch: job.run.batch as u64,
            batch_reason: match &job.plan {
                Some(auto) => format!("auto: {}", auto.plan.limited_by),
                None => "fixed".into(),
            },
            pixels_total: Some(total as u64),
            provider: job.runtime.provider().ort_name().into(),
            provider_fallbacks: job.runtime.fallbacks().iter().map(ToString::to_string).collect(),
        };
        let mut sinks: Vec<&mut dyn Sink> = Vec::new();
        if let Some(f) = jsonl.as_mut() {
            sinks.push(f);
        }
        if server.is_some() {
            sinks.push(&mut latest);
        }
        let (result, outcome) = tm::run(&tm::TelemetryConfig::default(), &mut sampler, info, &mut sinks, |rec| {
            infer_and_write(&mut job, bar.as_ref(), Some(rec))
        });
        let outcome = outcome?;
        for n in &outcome.notices {
            eprintln!("hsiedge: telemetry: {n}");
        }
        for e in &outcome.sink_errors {
            eprintln!("hsiedge: warning: telemetry stopped writing to {e}");
        }
        result?
    } else {
        infer_and_write(&mut job, bar.as_ref(), None)?
    };
    if let Some(server) = server {
        server.stop();
    }
    if summary.nonfinite_pixels > 0 {
        eprintln!(
            "warning: {} pixels got a NaN or infinite model output (a non-finite value in {} or a \
             model overflow); they are class 0 (unclassified) with NaN confidence",
            summary.nonfinite_pixels,
            summary.scene.display()
        );
    }
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&summary).context("serialising the summary")?
        );
    } else {
        println!(
            "{} pixels in {:.3} s ({:.0} px/s), mode {:?}, batch {}, model {}",
            summary.pixels, summary.elapsed_s, summary.pixels_per_s, summary.mode, summary.batch, summary.model
        );
        if let Some(a) = &summary.accuracy {
            println!(
                "overall accuracy {:.2} % ({} of {} labelled pixels)",
                a.overall_accuracy * 100.0,
                a.correct,
                a.labelled_pixels
            );
        }
        println!("maps in {}", job.spec.out.display());
    }
    Ok(())
}

/// Runs the job and writes its maps, showing progress on `bar` and recording each batch on
/// `rec`; telemetry's final snapshot is taken while the maps are written.
#[allow(clippy::result_large_err)]
fn infer_and_write(
    job: &mut Job,
    bar: Option<&indicatif::ProgressBar>,
    mut rec: Option<&mut hsiedge::telemetry::Recorder<'_>>,
) -> Result<hsiedge::job::Summary, hsiedge::job::JobError> {
    let (maps, stats) = job.infer(&mut |done| {
        if let Some(b) = bar {
            b.set_position(done.pixels_done as u64);
        }
        if let Some(r) = rec.as_deref_mut() {
            r.record(done);
        }
    })?;
    if let Some(r) = rec {
        r.end();
    }
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    job.write(&maps, &stats)
}

fn inspect(file: &std::path::Path) -> Result<()> {
    let is_json = file.extension().is_some_and(|e| e.eq_ignore_ascii_case("json"));
    if is_json {
        let m = hsiedge::model::Manifest::load(file)?;
        println!(
            "{}",
            serde_json::to_string_pretty(&m).context("serialising the manifest")?
        );
    } else {
        let (h, warnings) = hsiedge::cube::Header::read_with_warnings(&hsiedge::cube::header_path_for(file))?;
        for w in warnings {
            eprintln!("hsiedge: warning: {w}");
        }
        println!(
            "{}",
            serde_json::to_string_pretty(&h).context("serialising the header")?
        );
    }
    Ok(())
}
