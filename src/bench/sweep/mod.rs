//! `hsiedge bench sweep`: per-unit inference time against batch size, its elasticity, and the
//! plateau knee, cached for `--batch auto` (see [`crate::budget::knee`]); what the curve says
//! ([`analysis`]: p5/p95, plateau, memory line, predicted wall, regime verdicts), fp32 against the
//! manifest's fp16 graph, sweeps under each nvpmodel power mode with energy per pixel ([`power`]),
//! and an SVG of it all ([`plot`]).
//!
//! Inputs are synthetic standard-normal tensors of the graph's shape (what normalised scene data
//! looks like to the engine); only `session.run` is timed, after `warmups` untimed runs per size
//! that let ONNX Runtime plan the new shape. Before each size the graph prior (times the workspace
//! factor the calibration measured) is checked against the memory budget, so a sweep stops short
//! of the wall instead of crossing it.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use rand::SeedableRng;
use rand_distr::{Distribution, StandardNormal};

use crate::budget::knee::{self, SweepPoint, SweepRecord};
use crate::budget::{self, BudgetConfig, CostModel, Unit};
use crate::engine::{EngineOptions, Runtime};
use crate::graph::{self, ShapeBindings};
use crate::job::{self, JobError, PRIOR_WORKSPACE_FACTOR};
use crate::model::{Manifest, Role};
use crate::pipeline::Mode;
use crate::tile::TileGrid;

use super::{BenchError, median};

pub mod analysis;
mod modes;
pub mod plot;
pub mod power;
mod report;

pub use analysis::{BatchRange, MemoryLine, PointStats, Regime, RegimePart};
pub use modes::{BestEnergy, ModeSweep, PowerPlan, PowerSweep};
pub use power::{Energy, PowerError};

/// Settings of a sweep.
#[derive(Debug, Clone)]
pub struct SweepOptions {
    /// Model manifest.
    pub manifest: PathBuf,
    /// Patch (unit: sample) or dense (unit: tile).
    pub mode: Mode,
    /// Tile side (dense mode).
    pub tile: usize,
    /// Batch sizes to try, ascending; the sweep may stop earlier.
    pub batches: Vec<u64>,
    /// Timed runs per size.
    pub repeat: usize,
    /// Untimed runs per size before the timed ones (at least one).
    pub warmups: usize,
    /// Also sweep the manifest's fp16 graph over the same sizes and report the ratio.
    pub fp16: bool,
    /// Sweep under these nvpmodel power modes (`None`: as the board is).
    pub power: Option<PowerOptions>,
    /// How sessions are built.
    pub engine: EngineOptions,
    /// Memory left to the rest of the system.
    pub reserve_bytes: u64,
    /// Share of the budget kept for fragmentation.
    pub frag_margin: f64,
    /// Root of `/proc` and `/sys` (tests pass recorded trees).
    pub root: PathBuf,
    /// Stop after a size whose single run takes longer than this.
    pub max_run_s: f64,
    /// Where to store the record (`None`: do not store).
    pub cache_dir: Option<PathBuf>,
}

/// `--power-modes` and what goes with it.
#[derive(Debug, Clone)]
pub struct PowerOptions {
    /// `all`, or mode ids separated by commas.
    pub modes: String,
    /// Root of the board's `/etc`, `/sys` and `/var` (`/`; tests pass recorded trees).
    pub platform_root: PathBuf,
    /// The nvpmodel program (or a stand-in).
    pub nvpmodel: PathBuf,
    /// Wait after a switch before the first run, for clocks to settle.
    pub settle: Duration,
    /// Between power samples inside a timed window.
    pub sample_interval: Duration,
    /// Print the plan; switch nothing and run nothing.
    pub dry_run: bool,
}

/// The default batch sizes: powers of two up to 4096 samples (patch), or dense tiles of side
/// `tile` up to as many output pixels as 128 tiles of 64 x 64 (at least 4 tiles).
pub fn default_batches(mode: Mode, tile: usize) -> Vec<u64> {
    let top = match mode {
        Mode::Patch => 12,
        Mode::Dense => {
            let pixels = 128 * 64 * 64;
            let per_tile = tile.max(1).saturating_mul(tile.max(1));
            (pixels / per_tile).max(4).ilog2()
        }
    };
    (0..=top).map(|k| 1u64 << k).collect()
}

/// The memory line's budget name on a discrete GPU: device memory (total less the fragmentation
/// margin) against the device memory in use at each size's peak.
pub const DEVICE_BUDGET: &str = "device_total";

/// One model's sweep: the cached record, the statistics of each size and what they say.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SweepResult {
    /// The record (key, points, knee).
    #[serde(flatten)]
    pub record: SweepRecord,
    /// The cache file written, if any.
    pub cache_file: Option<PathBuf>,
    /// Per size, in the record's order: median, p5/p95, ms per unit, units/s, memory (and energy
    /// under `--power-modes`).
    pub stats: Vec<PointStats>,
    /// Output pixels one unit stands for (1 for a sample, tile side squared for a tile).
    pub pixels_per_unit: u64,
    /// Plateau, memory line, walls and regimes.
    pub analysis: Analysis,
    /// fp32 against fp16 (`--fp16`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub precision: Option<Precision>,
}

/// What the curve says.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Analysis {
    /// The longest run of steps with |elasticity| < 0.05.
    pub plateau: Option<BatchRange>,
    /// Resident memory against batch, measured and as the budget models it, and the walls.
    pub memory: MemoryLine,
    /// The curve cut into parts of one regime each, with evidence.
    pub regimes: Vec<RegimePart>,
}

/// The manifest's fp16 graph timed over the sizes the fp32 sweep measured.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Precision {
    /// The fp16 graph.
    pub fp16_file: PathBuf,
    /// Its statistics per size.
    pub fp16: Vec<PointStats>,
    /// Per size: fp16 median per-unit time over fp32's (below 1: fp16 is faster).
    pub ratio_fp16_over_fp32: Vec<(u64, f64)>,
    /// The median of those ratios.
    pub median_ratio: f64,
}

/// What `hsiedge bench sweep` prints: one sweep, one per power mode, or the plan of the latter.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(untagged)]
pub enum SweepOutput {
    /// As the board is.
    Plain(Box<SweepResult>),
    /// `--power-modes`.
    Power(PowerSweep),
    /// `--power-modes --dry-run`.
    Plan(PowerPlan),
}

/// A model's graph set up for timing.
struct Bench {
    manifest: Manifest,
    runtime: Runtime,
    role: Role,
    path: PathBuf,
    per_unit: usize,
    window: (usize, usize),
    pixels_per_unit: u64,
    prior_per_unit: u64,
}

/// What timing a list of sizes measured.
struct Measured {
    points: Vec<SweepPoint>,
    stats: Vec<PointStats>,
    stopped: String,
    at_wall: bool,
    own_bytes: u64,
    budget: (u64, String),
}

impl Bench {
    fn new(opts: &SweepOptions) -> Result<(Self, crate::engine::Graph), BenchError> {
        let manifest = Manifest::load(&opts.manifest).map_err(JobError::from)?;
        let runtime = Runtime::new(opts.engine.clone()).map_err(JobError::from)?;
        let (role, path) = match opts.mode {
            Mode::Patch => (Role::Patch, manifest.patch_path()),
            Mode::Dense => (
                Role::Dense,
                manifest.dense_path().ok_or_else(|| {
                    BenchError::Setting(format!(
                        "{}: dense mode needs `files.dense`, which this manifest does not have",
                        manifest.path.display()
                    ))
                })?,
            ),
        };
        let graph = runtime.graph(&manifest, role, &path).map_err(JobError::from)?;
        let bands = manifest.input.bands;
        let p = manifest.patch;
        let grid = TileGrid::new(opts.tile, opts.tile, opts.tile, manifest.halo);
        let (unit, per_unit, bindings, window, pixels_per_unit) = match opts.mode {
            Mode::Patch => (Unit::Sample, bands * p * p, ShapeBindings::default(), (p, p), 1),
            Mode::Dense => {
                let model = graph::load_model(&path).map_err(JobError::from)?;
                let b = ShapeBindings::dense_tile(&model, grid.tile_h as u64, grid.tile_w as u64, manifest.halo as u64);
                (
                    Unit::Tile,
                    bands * grid.window_h() * grid.window_w(),
                    b,
                    (grid.window_h(), grid.window_w()),
                    (grid.tile_h * grid.tile_w) as u64,
                )
            }
        };
        let gcost = graph::analyse_file(&path, &bindings).map_err(JobError::from)?;
        let prior = CostModel::from_graph(&gcost, unit, budget::DEFAULT_RUNTIME_OVERHEAD_BYTES);
        let prior_per_unit = prior
            .per_unit_bytes
            .saturating_mul(PRIOR_WORKSPACE_FACTOR)
            .saturating_add(per_unit as u64 * 4);
        Ok((
            Self {
                manifest,
                runtime,
                role,
                path,
                per_unit,
                window,
                pixels_per_unit,
                prior_per_unit,
            },
            graph,
        ))
    }

    /// The fp16 twin of the graph being swept, from the manifest.
    fn fp16_graph(&self) -> Result<(PathBuf, crate::engine::Graph), BenchError> {
        let f = &self.manifest.files;
        let rel = match self.role {
            Role::Dense => f.dense_fp16.as_ref(),
            _ => f.patch_fp16.as_ref(),
        }
        .ok_or_else(|| {
            BenchError::Setting(format!(
                "{}: --fp16 needs `files.{}_fp16`, which this manifest does not have",
                self.manifest.path.display(),
                if self.role == Role::Dense { "dense" } else { "patch" }
            ))
        })?;
        let path = self.manifest.dir.join(rel);
        let g = self
            .runtime
            .graph(&self.manifest, self.role, &path)
            .map_err(JobError::from)?;
        Ok((path, g))
    }

    /// Times `sizes` in order. With `stop`, ends at the memory wall, at a confirmed knee or
    /// after a run longer than `max_run_s`; without, only at the memory wall.
    fn measure(
        &self,
        opts: &SweepOptions,
        graph: &mut crate::engine::Graph,
        sizes: &[u64],
        stop: bool,
        mut meter: Option<&mut power::EnergyMeter>,
    ) -> Result<Measured, BenchError> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed);
        let mut points: Vec<SweepPoint> = Vec::new();
        let mut stats: Vec<PointStats> = Vec::new();
        let mut stopped = "largest batch size asked for".to_string();
        let mut at_wall = false;
        // On a discrete GPU the memory line is the device's: its memory in use at each size's
        // peak, against the device's memory less the fragmentation margin.
        let gpu = graph
            .device()
            .and_then(|(d, _)| crate::gpu::probe(d as usize).ok().flatten())
            .filter(|d| !d.integrated);
        let own_bytes = match &gpu {
            Some(d) => d.total_bytes.saturating_sub(d.free_bytes),
            None => job::anon_bytes(&opts.root),
        };
        let mut budget_at_start: Option<(u64, String)> = gpu.as_ref().map(|d| {
            let usable = (d.total_bytes as f64 * (1.0 - opts.frag_margin)) as u64;
            (usable, DEVICE_BUDGET.to_string())
        });
        for &b in sizes {
            let own = job::anon_bytes(&opts.root);
            let system = budget::read_system_budget(
                &opts.root,
                &BudgetConfig {
                    reserve_bytes: opts.reserve_bytes,
                    own_bytes: own,
                    device: None,
                },
            )
            .map_err(JobError::from)?;
            let usable = (system.budget_bytes as f64 * (1.0 - opts.frag_margin)) as u64;
            budget_at_start.get_or_insert_with(|| (usable, system.binding.name().to_string()));
            if graph.device().is_some() && b > budget::choose::GPU_MAX_BATCH {
                stopped = format!(
                    "the largest batch a GPU provider runs: {} (batch {b} asked)",
                    budget::choose::GPU_MAX_BATCH
                );
                break;
            }
            let need = own.saturating_add(b.saturating_mul(self.prior_per_unit));
            if need > usable {
                stopped = format!(
                    "memory: batch {b} needs about {} MiB by the graph prior, the budget ({}) allows {} MiB",
                    need >> 20,
                    system.binding.name(),
                    usable >> 20
                );
                at_wall = true;
                break;
            }
            let n = usize::try_from(b).map_err(|_| BenchError::Setting(format!("batch {b} is too large")))?;
            let data: Vec<f32> = (0..n * self.per_unit)
                .map(|_| StandardNormal.sample(&mut rng))
                .collect();
            let bands = self.manifest.input.bands;
            let shape = self.manifest.input.layout.shape(n, bands, self.window.0, self.window.1);
            let run = |graph: &mut crate::engine::Graph| -> Result<f64, BenchError> {
                let t = Instant::now();
                graph.run(&data, &shape).map_err(JobError::from)?;
                Ok(t.elapsed().as_secs_f64())
            };
            let device = match &gpu {
                Some(d) => crate::gpu::memory::PeakSampler::start(d.ordinal).ok().flatten(),
                None => None,
            };
            for _ in 0..opts.warmups.max(1) {
                run(graph)?;
            }
            let timed = |graph: &mut crate::engine::Graph| -> Result<Vec<f64>, BenchError> {
                let mut samples = Vec::with_capacity(opts.repeat);
                for _ in 0..opts.repeat {
                    samples.push(run(graph)?);
                }
                Ok(samples)
            };
            let pixels = b
                .saturating_mul(self.pixels_per_unit)
                .saturating_mul(opts.repeat as u64);
            let (samples, energy) = match meter.as_deref_mut() {
                Some(m) => {
                    let (s, e) = m.window(pixels, || timed(graph));
                    (s?, e)
                }
                None => (timed(graph)?, None),
            };
            let rss = match device {
                Some(d) => d.stop(),
                None => job::anon_bytes(&opts.root),
            };
            drop(data);
            // The arena keeps what this size needed; give it back so the next size is judged on its own.
            graph.shrink_arena_after_next_run();
            let m = median(&samples);
            let mut st = PointStats::new(b, opts.warmups.max(1), &samples);
            st.rss_bytes = (rss > 0).then_some(rss);
            st.model_bytes = b.saturating_mul(self.prior_per_unit);
            st.energy = energy;
            stats.push(st);
            points.push(SweepPoint {
                batch: b,
                median_s: m,
                per_unit_s: m / b as f64,
                samples_s: samples,
                elasticity: None,
            });
            knee::fill_elasticities(&mut points);
            if !stop {
                continue;
            }
            if let Some(k) = knee::knee(&points) {
                let above: Vec<u64> = points.iter().map(|q| q.batch).filter(|&q| q > k).collect();
                stopped = format!(
                    "plateau: knee at {k}, confirmed by {} larger sizes up to {}",
                    above.len(),
                    above.last().copied().unwrap_or(k)
                );
                break;
            }
            if m > opts.max_run_s {
                stopped = format!("time: one run at batch {b} took {m:.2} s (limit {} s)", opts.max_run_s);
                break;
            }
        }
        if points.is_empty() {
            return Err(BenchError::Setting(format!("no batch size could run: {stopped}")));
        }
        Ok(Measured {
            points,
            stats,
            stopped,
            at_wall,
            own_bytes,
            budget: budget_at_start.unwrap_or_default(),
        })
    }

    /// One sweep: timings, record (cached), analysis, and the fp16 comparison when asked.
    fn sweep(
        &self,
        opts: &SweepOptions,
        graph: &mut crate::engine::Graph,
        fp16: Option<&mut (PathBuf, crate::engine::Graph)>,
        meter: Option<&mut power::EnergyMeter>,
        power_mode: Option<String>,
    ) -> Result<SweepResult, BenchError> {
        let mut key = job::sweep_key(
            &self.manifest,
            &self.path,
            opts.mode,
            opts.tile,
            &opts.engine,
            &self.runtime,
            &opts.root,
        )?;
        if power_mode.is_some() {
            key.power_mode = power_mode;
        }
        let mut sizes = opts.batches.clone();
        sizes.sort_unstable();
        sizes.dedup();
        let m = self.measure(opts, graph, &sizes, true, meter)?;
        let mut stopped = m.stopped;
        // At the memory wall the pick below it is the knee (B_safe caps it); elsewhere only a
        // confirmed plateau is one.
        let knee = if m.at_wall {
            knee::pick(&m.points, u64::MAX).map(|p| p.batch)
        } else {
            knee::knee(&m.points)
        };
        if knee.is_none() {
            stopped.push_str("; no knee: per-unit time may still fall past the largest size");
        }
        let memory = MemoryLine::fit(
            &m.stats
                .iter()
                .filter_map(|s| s.rss_bytes.map(|r| (s.batch, r)))
                .collect::<Vec<_>>(),
            self.prior_per_unit,
            m.own_bytes,
            m.budget.0,
            m.budget.1.clone(),
        );
        let analysis = Analysis {
            plateau: analysis::plateau(&m.points),
            regimes: analysis::regimes(&m.points, &m.stats, memory.predicted_wall),
            memory,
        };
        let record = SweepRecord {
            key,
            created_unix_s: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            repeat: opts.repeat,
            knee,
            threads_used: threads_used(opts.engine.threads),
            points: m.points,
            stopped,
        };
        let cache_file = match &opts.cache_dir {
            Some(dir) => Some(knee::store(dir, &record).map_err(BenchError::Cache)?),
            None => None,
        };
        let precision = match fp16 {
            Some((file, g16)) => {
                let sizes: Vec<u64> = record.points.iter().map(|p| p.batch).collect();
                let h = self.measure(opts, g16, &sizes, false, None)?;
                let ratios: Vec<(u64, f64)> = h
                    .points
                    .iter()
                    .zip(&record.points)
                    .map(|(a, b)| (a.batch, a.per_unit_s / b.per_unit_s))
                    .collect();
                let r: Vec<f64> = ratios.iter().map(|x| x.1).collect();
                Some(Precision {
                    fp16_file: file.clone(),
                    fp16: h.stats,
                    median_ratio: median(&r),
                    ratio_fp16_over_fp32: ratios,
                })
            }
            None => None,
        };
        Ok(SweepResult {
            record,
            cache_file,
            stats: m.stats,
            pixels_per_unit: self.pixels_per_unit,
            analysis,
            precision,
        })
    }
}

/// Runs a sweep: as the board is, or under each power mode of `opts.power` (or prints that plan).
pub fn sweep(opts: &SweepOptions) -> Result<SweepOutput, BenchError> {
    if opts.batches.is_empty() || opts.batches.contains(&0) || opts.repeat == 0 {
        return Err(BenchError::Setting(
            "--batches needs positive sizes and --repeat at least 1".into(),
        ));
    }
    let Some(p) = &opts.power else {
        let (bench, mut graph) = Bench::new(opts)?;
        let mut fp16 = if opts.fp16 { Some(bench.fp16_graph()?) } else { None };
        let r = bench.sweep(opts, &mut graph, fp16.as_mut(), None, None)?;
        return Ok(SweepOutput::Plain(Box::new(r)));
    };
    modes::run(opts, p)
}

/// Intra-op threads ONNX Runtime runs with: `configured`, or one per core for 0.
pub fn threads_used(configured: usize) -> usize {
    if configured > 0 {
        configured
    } else {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_dense_sizes_cover_the_same_pixels_whatever_the_tile() {
        assert_eq!(default_batches(Mode::Dense, 64).last(), Some(&128));
        assert_eq!(default_batches(Mode::Dense, 128).last(), Some(&32));
        assert_eq!(default_batches(Mode::Dense, 4096).last(), Some(&4));
        assert_eq!(default_batches(Mode::Patch, 128).last(), Some(&4096));
    }
}
