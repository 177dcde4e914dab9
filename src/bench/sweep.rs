//! `hsiedge bench sweep`: per-unit inference time against batch size, its elasticity, and the
//! plateau knee, cached for `--batch auto` (see [`crate::budget::knee`]).
//!
//! Inputs are synthetic standard-normal tensors of the graph's shape (what normalised scene data
//! looks like to the engine); only `session.run` is timed, after one untimed run per size that lets
//! ONNX Runtime plan the new shape. Before each size the graph prior (times the workspace factor
//! the calibration measured) is checked against the memory budget, so a sweep stops short of the
//! wall instead of crossing it.

use std::path::PathBuf;
use std::time::Instant;

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

/// What a sweep found, and where it was cached.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SweepResult {
    /// The record (key, points, knee).
    #[serde(flatten)]
    pub record: SweepRecord,
    /// The cache file written, if any.
    pub cache_file: Option<PathBuf>,
}

/// Runs a sweep.
pub fn sweep(opts: &SweepOptions) -> Result<SweepResult, BenchError> {
    if opts.batches.is_empty() || opts.batches.contains(&0) || opts.repeat == 0 {
        return Err(BenchError::Setting(
            "--batches needs positive sizes and --repeat at least 1".into(),
        ));
    }
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
    let mut graph = runtime.graph(&manifest, role, &path).map_err(JobError::from)?;
    let bands = manifest.input.bands;
    let (p, halo) = (manifest.patch, manifest.halo);
    let grid = TileGrid::new(opts.tile, opts.tile, opts.tile, halo);
    let (unit, per_unit, bindings) = match opts.mode {
        Mode::Patch => (Unit::Sample, bands * p * p, ShapeBindings::default()),
        Mode::Dense => {
            let model = graph::load_model(&path).map_err(JobError::from)?;
            let b = ShapeBindings::dense_tile(&model, grid.tile_h as u64, grid.tile_w as u64, halo as u64);
            (Unit::Tile, bands * grid.window_h() * grid.window_w(), b)
        }
    };
    let gcost = graph::analyse_file(&path, &bindings).map_err(JobError::from)?;
    let prior = CostModel::from_graph(&gcost, unit, budget::DEFAULT_RUNTIME_OVERHEAD_BYTES);
    let prior_per_unit = prior
        .per_unit_bytes
        .saturating_mul(PRIOR_WORKSPACE_FACTOR)
        .saturating_add(per_unit as u64 * 4);
    let key = job::sweep_key(
        &manifest,
        &path,
        opts.mode,
        opts.tile,
        &opts.engine,
        &runtime,
        &opts.root,
    )?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed);
    let mut points: Vec<SweepPoint> = Vec::new();
    let mut stopped = "largest batch size asked for".to_string();
    let mut at_wall = false;
    let mut sizes = opts.batches.clone();
    sizes.sort_unstable();
    sizes.dedup();
    for &b in &sizes {
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
        let need = own.saturating_add(b.saturating_mul(prior_per_unit));
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
        let data: Vec<f32> = (0..n * per_unit).map(|_| StandardNormal.sample(&mut rng)).collect();
        let shape = match opts.mode {
            Mode::Patch => manifest.input.layout.shape(n, bands, p, p),
            Mode::Dense => manifest.input.layout.shape(n, bands, grid.window_h(), grid.window_w()),
        };
        let run = |graph: &mut crate::engine::Graph| -> Result<f64, BenchError> {
            let t = Instant::now();
            graph.run(&data, &shape).map_err(JobError::from)?;
            Ok(t.elapsed().as_secs_f64())
        };
        run(&mut graph)?;
        let mut samples = Vec::with_capacity(opts.repeat);
        for _ in 0..opts.repeat {
            samples.push(run(&mut graph)?);
        }
        drop(data);
        // The arena keeps what this size needed; give it back so the next size is judged on its own.
        graph.shrink_arena_after_next_run();
        let m = median(&samples);
        points.push(SweepPoint {
            batch: b,
            median_s: m,
            per_unit_s: m / b as f64,
            samples_s: samples,
            elasticity: None,
        });
        knee::fill_elasticities(&mut points);
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
    // At the memory wall the pick below it is the knee (B_safe caps it); elsewhere only a
    // confirmed plateau is one.
    let knee = if at_wall {
        knee::pick(&points, u64::MAX).map(|p| p.batch)
    } else {
        knee::knee(&points)
    };
    if knee.is_none() {
        stopped.push_str("; no knee: per-unit time may still fall past the largest size");
    }
    let record = SweepRecord {
        key,
        created_unix_s: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        repeat: opts.repeat,
        knee,
        threads_used: threads_used(opts.engine.threads),
        points,
        stopped,
    };
    let cache_file = match &opts.cache_dir {
        Some(dir) => Some(knee::store(dir, &record).map_err(BenchError::Cache)?),
        None => None,
    };
    Ok(SweepResult { record, cache_file })
}

/// Intra-op threads ONNX Runtime runs with: `configured`, or one per core for 0.
pub fn threads_used(configured: usize) -> usize {
    if configured > 0 {
        configured
    } else {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    }
}

impl std::fmt::Display for SweepResult {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let r = &self.record;
        let unit = if r.key.mode == "dense" { "tile" } else { "sample" };
        writeln!(
            f,
            "model {} ({} mode{}), {} threads{}, {} repeats, {}",
            r.key.model,
            r.key.mode,
            r.key.tile.map(|t| format!(", tile {t}")).unwrap_or_default(),
            r.threads_used,
            if r.key.threads == 0 { " (one per core)" } else { "" },
            r.repeat,
            r.key.cpu
        )?;
        writeln!(
            f,
            "{:>7} {:>12} {:>14} {:>11}",
            "batch",
            "median s",
            format!("s/{unit}"),
            "elasticity"
        )?;
        for p in &r.points {
            writeln!(
                f,
                "{:>7} {:>12.5} {:>14.3e} {:>11}",
                p.batch,
                p.median_s,
                p.per_unit_s,
                p.elasticity.map(|e| format!("{e:.3}")).unwrap_or_else(|| "-".into())
            )?;
        }
        match r.knee {
            Some(k) => writeln!(
                f,
                "knee: {k} {unit}s (the smallest batch within {:.0} % of the best per-{unit} time)",
                knee::PLATEAU_TOLERANCE * 100.0
            )?,
            None => writeln!(
                f,
                "knee: none (a plateau needs {} sizes above the pick, up to {}x it)",
                knee::CONFIRM_SIZES,
                knee::CONFIRM_SPAN
            )?,
        }
        write!(f, "stopped: {}", r.stopped)?;
        if let Some(p) = &self.cache_file {
            write!(f, "\ncached: {}", p.display())?;
        }
        Ok(())
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
