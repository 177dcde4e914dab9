//! `hsiedge bench ...`: the benchmark subcommands' flags and their glue.

use std::path::PathBuf;

use anyhow::Result;
use clap::Subcommand;

use super::args::EngineArgs;
use super::output::print_report;
use hsiedge::job::{JobSpec, parse_mode};

#[derive(Subcommand)]
pub enum BenchCommand {
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
        #[arg(long, default_value_t = 0.0, value_parser = super::args::rate)]
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
        #[arg(long, default_value_t = 10.0, value_parser = super::args::seconds)]
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
        #[arg(long, default_value_t = 5.0, requires = "power_modes", value_parser = super::args::seconds)]
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

/// Runs one benchmark subcommand.
pub fn run(what: BenchCommand) -> Result<()> {
    match what {
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
        BenchCommand::Auto {
            scene,
            model,
            mode,
            tile,
            repeat,
            json,
            engine,
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
        } => {
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
    }
}
