//! `hsiedge bench telemetry`: what telemetry costs a classify run.
//!
//! Each repetition runs the same job twice, once plain and once with telemetry as `classify
//! --telemetry FILE --metrics ADDR` has it (recorder on the progress callback, the aggregator
//! thread sampling the board, JSON lines written to a file, the latest snapshot kept for an
//! idle metrics endpoint), in alternating order, timing infer + write. The ratio is the median
//! of the per-repetition ratios with their quartiles, so machine drift between repetitions
//! cancels. Board discovery (done once per process) is outside the timed region.

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
}

/// Runs the benchmark.
pub fn telemetry(opts: &TelemetryBenchOptions) -> Result<TelemetryBench, BenchError> {
    let tmp = tempfile::tempdir().map_err(BenchError::Temp)?;
    let mut sampler = Sampler::discover(std::path::Path::new("/"), true);
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
        let mut snapshots = 0;
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
                    };
                    let (result, outcome) =
                        super::run(&TelemetryConfig::default(), &mut sampler, info, &mut sinks, |rec| {
                            job.infer(&mut |d| rec.record(d))
                        });
                    let (maps, stats) = result?;
                    job.write(&maps, &stats)?;
                    snapshots += outcome.map_err(|e| BenchError::Setting(e.to_string()))?.snapshots;
                    on.push(t.elapsed().as_secs_f64());
                } else {
                    let (maps, stats) = job.infer(&mut |_| {})?;
                    job.write(&maps, &stats)?;
                    off.push(t.elapsed().as_secs_f64());
                }
            }
        }
        let ratios: Vec<f64> = on.iter().zip(&off).map(|(a, b)| a / b.max(1e-12)).collect();
        modes.push(TelemetryOverhead {
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
        for m in &self.modes {
            writeln!(
                f,
                "{:?} batch {}: off {:.4} s, on {:.4} s (medians of {}), on/off {:.4} (quartiles {:.4}-{:.4}), {} snapshots",
                m.mode,
                m.batch,
                m.off_s,
                m.on_s,
                m.repeat,
                m.on_over_off,
                m.on_over_off_quartiles[0],
                m.on_over_off_quartiles[1],
                m.snapshots
            )?;
        }
        Ok(())
    }
}
