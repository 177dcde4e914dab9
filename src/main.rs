//! The `hsiedge` command: thin glue over the library.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};

mod cli;

use cli::args::{BudgetArgs, EngineArgs, TelemetryArgs};
use cli::bench::BenchCommand;
use cli::output::{classify, inspect, print_report};
use hsiedge::job::{JobSpec, parse_batch, parse_mode};

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
        /// Write int16 samples (a sensor's digital numbers) instead of float32.
        #[arg(long)]
        int16: bool,
    },
    /// Replay a cube as a pushbroom sensor's line stream (docs/stream-protocol.md) to a receiver.
    SimulateSensor {
        /// The scene's ENVI header (or data file); BSQ cubes stream as BIL.
        #[arg(long)]
        scene: PathBuf,
        /// Lines per second (0: as fast as the receiver takes them).
        #[arg(long, value_name = "LINES_PER_S", value_parser = cli::args::rate)]
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
        #[arg(long, value_name = "S", default_value_t = 30.0, value_parser = cli::args::seconds)]
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
            int16,
        } => {
            let manifest = hsiedge::model::Manifest::load(&model)?;
            let opts = hsiedge::simulate::SimulateOptions {
                lines,
                samples,
                fields,
                seed,
                int16,
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
        Command::Bench { what } => cli::bench::run(what),
        Command::Serve { config } => Ok(hsiedge::daemon::serve(&config)?),
        Command::Subscribe {
            socket,
            out,
            count,
            connect_timeout_s,
        } => {
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
