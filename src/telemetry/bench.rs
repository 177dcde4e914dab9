//! `hsiedge bench telemetry`: what telemetry costs a classify run.
//!
//! Each repetition runs the same job twice, once plain and once with telemetry as `classify
//! --telemetry FILE --metrics ADDR` has it (recorder on the progress callback, the aggregator
//! thread sampling the board, JSON lines written to a file, the latest snapshot kept for an
//! idle metrics endpoint), in alternating order, timing infer + write. The ratio is the median
//! of the per-repetition ratios with their quartiles, so machine drift between repetitions
//! cancels. Board discovery (done once per process) is outside the timed region.
//!
//! On a shared machine the wall-clock ratio varies from one repetition to the next by far more
//! than telemetry costs, so the benchmark also counts telemetry's own CPU time: the aggregator
//! thread's (its thread CPU clock), the calling thread's for starting and stopping it (measured
//! around empty runs), and the recorder's per batch (measured over full rings). Their sum over
//! the plain run's wall time is the share of a run's time telemetry takes from the cores.

use std::path::PathBuf;
use std::time::Instant;

use crate::bench::{BenchError, median, quartiles};
use crate::job::{BatchChoice, Job, JobSpec, ModeChoice};
use crate::pipeline::Mode;

use super::{JsonLines, LatestSnapshot, RunInfo, Sampler, Sink, TelemetryConfig};

/// What to measure.
#[derive(Debug, Clone)]
pub struct TelemetryBenchOptions {
    /// The job (scene, model, engine); mode and batch are set per measurement.
    pub spec: JobSpec,
    /// Modes to measure, each with its batch.
    pub modes: Vec<(Mode, usize)>,
    /// Repetitions (pairs of runs) per mode.
    pub repeat: usize,
}

/// One mode's result.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TelemetryOverhead {
    /// Mode.
    pub mode: Mode,
    /// Batch.
    pub batch: usize,
    /// Pairs of runs.
    pub repeat: usize,
    /// Median seconds without telemetry.
    pub off_s: f64,
    /// Median seconds with telemetry.
    pub on_s: f64,
    /// Median of per-repetition `on / off`.
    pub on_over_off: f64,
    /// Its quartiles.
    pub on_over_off_quartiles: [f64; 2],
    /// Snapshots the telemetry runs emitted, in total.
    pub snapshots: u64,
    /// Batches per run.
    pub batches: u64,
    /// Median CPU seconds of the aggregator thread per run.
    pub aggregator_cpu_s: f64,
    /// Telemetry's CPU seconds per run (aggregator + starting and stopping it + the recorder on
    /// every batch) over the median plain run's wall seconds.
    pub cpu_over_off: f64,
    /// Every sample without telemetry.
    pub off_samples_s: Vec<f64>,
    /// Every sample with telemetry.
    pub on_samples_s: Vec<f64>,
}

/// Result of `bench telemetry`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TelemetryBench {
    /// Scene header.
    pub scene: PathBuf,
    /// Model manifest.
    pub model: PathBuf,
    /// Intra-op threads.
    pub threads: usize,
    /// Per mode.
    pub modes: Vec<TelemetryOverhead>,
    /// Median wall seconds of telemetry around a run that does nothing (thread start and stop,
    /// the first and final samples, the final snapshot written): its fixed latency per run,
    /// scheduling waits included.
    pub empty_run_s: f64,
    /// Quartiles of those seconds.
    pub empty_run_quartiles_s: [f64; 2],
    /// Median CPU seconds of the calling thread around an empty run (allocating the ring,
    /// starting, stopping and joining the aggregator).
    pub start_stop_cpu_s: f64,
    /// Median CPU seconds of the aggregator thread in an empty run.
    pub empty_aggregator_cpu_s: f64,
    /// CPU seconds of one [`super::Recorder::record`] (median over full rings).
    pub record_s: f64,
}

/// Wall, calling-thread CPU and aggregator CPU seconds of telemetry around an empty body.
struct EmptyRuns {
    wall: Vec<f64>,
    caller_cpu: Vec<f64>,
    aggregator_cpu: Vec<f64>,
}

fn cpu_now() -> f64 {
    crate::ffi::thread_cpu_time().map_or(0.0, |d| d.as_secs_f64())
}

/// CPU seconds per record: rings filled on this thread, drained outside the clock.
fn record_cost() -> f64 {
    let mut ring = super::Ring::new();
    let (mut rec, mut drain) = ring.split();
    let done = crate::pipeline::BatchDone::default();
    let n = super::recorder::RING_SLOTS - 1;
    let per: Vec<f64> = (0..200)
        .map(|_| {
            let t = cpu_now();
            for _ in 0..n {
                rec.record(std::hint::black_box(&done));
            }
            let spent = cpu_now() - t;
            drain.drain(|_| {});
            spent / n as f64
        })
        .collect();
    median(&per)
}

/// Times telemetry around an empty body, `n` times.
fn empty_runs(sampler: &mut Sampler, jsonl: &std::path::Path, n: usize) -> Result<EmptyRuns, BenchError> {
    let mut out = EmptyRuns {
        wall: Vec::with_capacity(n),
        caller_cpu: Vec::with_capacity(n),
        aggregator_cpu: Vec::with_capacity(n),
    };
    for _ in 0..n {
        let (t, cpu) = (Instant::now(), cpu_now());
        let mut file = JsonLines::create(jsonl).map_err(|e| BenchError::Setting(e.to_string()))?;
        let mut latest = LatestSnapshot::new();
        let mut sinks: [&mut dyn Sink; 2] = [&mut file, &mut latest];
        let ((), outcome) = super::run(
            &TelemetryConfig::default(),
            sampler,
            RunInfo::default(),
            &mut sinks,
            |_| {},
        );
        let outcome = outcome.map_err(|e| BenchError::Setting(e.to_string()))?;
        out.caller_cpu.push(cpu_now() - cpu);
        out.wall.push(t.elapsed().as_secs_f64());
        out.aggregator_cpu.push(outcome.aggregator_cpu_s.unwrap_or(0.0));
    }
    Ok(out)
}

/// Runs the benchmark.
pub fn telemetry(opts: &TelemetryBenchOptions) -> Result<TelemetryBench, BenchError> {
    let tmp = tempfile::tempdir().map_err(BenchError::Temp)?;
    let mut sampler = Sampler::discover(std::path::Path::new("/"), true);
    let empty = empty_runs(&mut sampler, &tmp.path().join("empty.jsonl"), 101)?;
    let start_stop_cpu_s = median(&empty.caller_cpu);
    let record_s = record_cost();
    let mut modes = Vec::new();
    for &(mode, batch) in &opts.modes {
        let spec = JobSpec {
            mode: ModeChoice::Fixed(mode),
            batch: BatchChoice::Fixed(batch),
            out: tmp.path().join("out"),
            labels: None,
            ..opts.spec.clone()
        };
        let mut job = Job::resolve(spec)?;
        // One untimed run warms the session's arena and kernels.
        let (maps, stats) = job.infer(&mut |_| {})?;
        job.write(&maps, &stats)?;
        let pixels = (job.cube.lines() * job.cube.samples()) as u64;
        let (mut off, mut on) = (Vec::new(), Vec::new());
        let (mut snapshots, mut batches, mut aggregator_cpu) = (0, 0, Vec::new());
        let jsonl = tmp.path().join("telemetry.jsonl");
        for rep in 0..opts.repeat.max(1) {
            for telemetry_on in if rep % 2 == 0 { [false, true] } else { [true, false] } {
                let t = Instant::now();
                if telemetry_on {
                    let mut file = JsonLines::create(&jsonl).map_err(|e| BenchError::Setting(e.to_string()))?;
                    let mut latest = LatestSnapshot::new();
                    let mut sinks: [&mut dyn Sink; 2] = [&mut file, &mut latest];
                    let info = RunInfo {
                        batch: batch as u64,
                        batch_reason: "fixed".into(),
                        pixels_total: Some(pixels),
                        provider: job.runtime.provider().ort_name().into(),
                        provider_fallbacks: job.runtime.fallbacks().iter().map(ToString::to_string).collect(),
                    };
                    let (result, outcome) =
                        super::run(&TelemetryConfig::default(), &mut sampler, info, &mut sinks, |rec| {
                            let (maps, stats) = job.infer(&mut |d| rec.record(d))?;
                            rec.end();
                            job.write(&maps, &stats)
                        });
                    result?;
                    on.push(t.elapsed().as_secs_f64());
                    let outcome = outcome.map_err(|e| BenchError::Setting(e.to_string()))?;
                    snapshots += outcome.snapshots;
                    batches = outcome.last.batches;
                    aggregator_cpu.push(outcome.aggregator_cpu_s.unwrap_or(0.0));
                } else {
                    let (maps, stats) = job.infer(&mut |_| {})?;
                    job.write(&maps, &stats)?;
                    off.push(t.elapsed().as_secs_f64());
                }
            }
        }
        let ratios: Vec<f64> = on.iter().zip(&off).map(|(a, b)| a / b.max(1e-12)).collect();
        let cpu = median(&aggregator_cpu) + start_stop_cpu_s + batches as f64 * record_s;
        modes.push(TelemetryOverhead {
            batches,
            aggregator_cpu_s: median(&aggregator_cpu),
            cpu_over_off: cpu / median(&off).max(1e-12),
            mode,
            batch,
            repeat: opts.repeat.max(1),
            off_s: median(&off),
            on_s: median(&on),
            on_over_off: median(&ratios),
            on_over_off_quartiles: quartiles(&ratios),
            snapshots,
            off_samples_s: off,
            on_samples_s: on,
        });
    }
    Ok(TelemetryBench {
        empty_run_s: median(&empty.wall),
        empty_run_quartiles_s: quartiles(&empty.wall),
        start_stop_cpu_s,
        empty_aggregator_cpu_s: median(&empty.aggregator_cpu),
        record_s,
        scene: opts.spec.scene.clone(),
        model: opts.spec.manifest.clone(),
        threads: opts.spec.engine.threads,
        modes,
    })
}

impl std::fmt::Display for TelemetryBench {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "scene {}, model {}, threads {}",
            self.scene.display(),
            self.model.display(),
            self.threads
        )?;
        writeln!(
            f,
            "telemetry around an empty run: {:.1} us wall (quartiles {:.1}-{:.1} us), CPU {:.1} us \
             starting and stopping + {:.1} us aggregator; {:.1} ns per recorded batch",
            self.empty_run_s * 1e6,
            self.empty_run_quartiles_s[0] * 1e6,
            self.empty_run_quartiles_s[1] * 1e6,
            self.start_stop_cpu_s * 1e6,
            self.empty_aggregator_cpu_s * 1e6,
            self.record_s * 1e9
        )?;
        for m in &self.modes {
            writeln!(
                f,
                "{:?} batch {} ({} batches): off {:.4} s, on {:.4} s (medians of {}), on/off {:.4} (quartiles \
                 {:.4}-{:.4}), {} snapshots; telemetry CPU {:.1} us per run = {:.3} % of the plain run",
                m.mode,
                m.batch,
                m.batches,
                m.off_s,
                m.on_s,
                m.repeat,
                m.on_over_off,
                m.on_over_off_quartiles[0],
                m.on_over_off_quartiles[1],
                m.snapshots,
                (m.cpu_over_off * m.off_s) * 1e6,
                m.cpu_over_off * 100.0
            )?;
        }
        Ok(())
    }
}
