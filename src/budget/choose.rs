//! Choosing the batch: the safe-batch formula, and the wall search for discrete GPUs.
//!
//! `B_safe = floor((budget*(1 - r_frag) - M_fixed) / a)`, capped by `--max-batch` and by the
//! scene (no batch larger than its pixels, or its tiles in dense mode), then by the plateau knee
//! of a batch sweep (past the knee a larger batch buys no throughput, only memory). Dense mode
//! counts tiles instead of samples: same formula, per-tile cost. [`Limit`] names the cap that
//! bound.
//!
//! [`find_wall`] is the seeds' search (grow x1.5 until a run fails, then bisect). It runs the
//! model up to failure, so it is only for discrete GPUs (`--probe-wall`), where a failed
//! allocation is a clean error; on shared memory the OOM killer may take the process or a
//! neighbour instead, so there the formula is the only way.

use std::fmt;

use serde::Serialize;

use super::BudgetError;
use super::cost::{CostModel, Unit};

/// How the batch is chosen.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChooseConfig {
    /// `r_frag`: the share of the budget kept back for allocator fragmentation, in `[0, 1)`.
    pub frag_margin: f64,
    /// The largest batch ever run (units, `--max-batch`), at least 1.
    pub max_units: u64,
    /// The units the scene has (pixels, or tiles in dense mode), when planning for one.
    pub scene_units: Option<u64>,
    /// The plateau knee of a batch sweep (units), if one is known.
    pub knee: Option<u64>,
}

impl Default for ChooseConfig {
    fn default() -> Self {
        Self {
            frag_margin: 0.10,
            max_units: 8192,
            scene_units: None,
            knee: None,
        }
    }
}

impl ChooseConfig {
    /// Checks the ranges.
    pub fn validate(&self) -> Result<(), BudgetError> {
        if !(0.0..1.0).contains(&self.frag_margin) {
            return Err(BudgetError::Config {
                field: "frag_margin",
                value: self.frag_margin.to_string(),
                why: "must be in [0, 1)",
            });
        }
        if self.max_units == 0 {
            return Err(BudgetError::Config {
                field: "max_units",
                value: "0".into(),
                why: "must be at least 1",
            });
        }
        if self.scene_units == Some(0) {
            return Err(BudgetError::Config {
                field: "scene_units",
                value: "0".into(),
                why: "a scene has at least one unit",
            });
        }
        if self.knee == Some(0) {
            return Err(BudgetError::Config {
                field: "knee",
                value: "0".into(),
                why: "must be at least 1 when given",
            });
        }
        Ok(())
    }
}

/// What bounded the chosen batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Limit {
    /// The memory formula.
    Memory,
    /// `--max-batch`.
    MaxBatch,
    /// The scene's pixels (patch mode): a batch never holds more.
    Scene,
    /// The scene's tiles (dense mode).
    Tiles,
    /// The plateau knee of a batch sweep (in-run or cached).
    Knee,
    /// One tile row of a stream: a batch that spans into the next row would hold a finished row
    /// back until lines of the next one arrive.
    Strip,
    /// The largest batch a GPU provider runs ([`GPU_MAX_BATCH`]).
    GpuBatch,
}

/// The largest batch a GPU provider runs: on the CUDA provider cuDNN's first convolution of the
/// patch model fails at a batch of 65,536 and runs at 65,535 (a CUDA grid dimension's bound).
pub const GPU_MAX_BATCH: u64 = 65_535;

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Memory => "memory",
            Self::MaxBatch => "--max-batch",
            Self::Scene => "the scene's pixels",
            Self::Tiles => "the scene's tiles",
            Self::Knee => "the plateau knee",
            Self::Strip => "one tile row of the stream",
            Self::GpuBatch => "the largest batch a GPU provider runs",
        })
    }
}

/// A memory-bound batch after the caps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capped {
    /// The largest batch memory, `--max-batch` and the scene allow (B_safe before the knee).
    pub ceiling: u64,
    /// What bound `ceiling`.
    pub ceiling_limited_by: Limit,
    /// `ceiling`, lowered to the knee when one is given.
    pub units: u64,
    /// What bound `units`.
    pub limited_by: Limit,
}

/// [`cap`] on a GPU provider: `memory_units` first lowered to `gpu_units` (the largest batch the
/// provider runs), named [`Limit::GpuBatch`] where it, not memory, is what `--max-batch`, the
/// scene and the knee then leave standing. A tie with `--max-batch` or the scene names the GPU.
pub fn cap_gpu(memory_units: u64, gpu_units: u64, unit: Unit, cfg: &ChooseConfig) -> Capped {
    let mut c = cap(memory_units.min(gpu_units), unit, cfg);
    if gpu_units < memory_units {
        for l in [&mut c.limited_by, &mut c.ceiling_limited_by] {
            if *l == Limit::Memory {
                *l = Limit::GpuBatch;
            }
        }
    }
    c
}

/// Caps `memory_units` by `--max-batch`, then the scene, then the knee; each cap that lowers the
/// batch becomes its limit.
pub fn cap(memory_units: u64, unit: Unit, cfg: &ChooseConfig) -> Capped {
    let mut units = memory_units;
    let mut limited_by = Limit::Memory;
    if units > cfg.max_units {
        units = cfg.max_units;
        limited_by = Limit::MaxBatch;
    }
    if let Some(s) = cfg.scene_units
        && units > s
    {
        units = s;
        limited_by = match unit {
            Unit::Sample => Limit::Scene,
            Unit::Tile => Limit::Tiles,
        };
    }
    let (ceiling, ceiling_limited_by) = (units, limited_by);
    if let Some(k) = cfg.knee
        && units > k
    {
        units = k;
        limited_by = Limit::Knee;
    }
    Capped {
        ceiling,
        ceiling_limited_by,
        units,
        limited_by,
    }
}

/// The chosen batch and how it was reached.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Choice {
    /// Sample or tile.
    pub unit: Unit,
    /// The batch to run (0 when not even one unit fits).
    pub units_safe: u64,
    /// The memory formula's value before the caps.
    pub memory_units: u64,
    /// What bound `units_safe`.
    pub limited_by: Limit,
    /// The largest batch memory, `--max-batch` and the scene allow (B_safe before the knee).
    pub ceiling_units: u64,
    /// What bound `ceiling_units`.
    pub ceiling_limited_by: Limit,
    /// The budget the formula started from.
    pub budget_bytes: u64,
    /// `ceil(budget * r_frag)`.
    pub frag_margin_bytes: u64,
    /// `budget - frag_margin_bytes`.
    pub usable_bytes: u64,
    /// `M(units_safe)`.
    pub predicted_peak_bytes: u64,
}

/// Applies `B_safe = floor((budget*(1 - r_frag) - M_fixed) / a)` and the caps.
pub fn safe_units(budget_bytes: u64, cost: &CostModel, cfg: &ChooseConfig) -> Result<Choice, BudgetError> {
    cfg.validate()?;
    let frag_margin_bytes = ((budget_bytes as f64) * cfg.frag_margin).ceil() as u64;
    let usable_bytes = budget_bytes.saturating_sub(frag_margin_bytes);
    let memory_units = usable_bytes.saturating_sub(cost.fixed_bytes) / cost.per_unit_bytes.max(1);
    let c = cap(memory_units, cost.unit, cfg);
    Ok(Choice {
        unit: cost.unit,
        units_safe: c.units,
        memory_units,
        limited_by: c.limited_by,
        ceiling_units: c.ceiling,
        ceiling_limited_by: c.ceiling_limited_by,
        budget_bytes,
        frag_margin_bytes,
        usable_bytes,
        predicted_peak_bytes: cost.predict(c.units),
    })
}

/// The result of a wall search.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WallSearch {
    /// The largest batch that ran (0 when none did).
    pub largest_fit: u64,
    /// The smallest batch seen to fail; `None` when `max` itself ran.
    pub first_fail: Option<u64>,
    /// How many runs were made.
    pub probes: u32,
    /// Every probe, in order: `(batch, ran)`.
    pub history: Vec<(u64, bool)>,
}

/// Finds the memory wall by running: start at `start`, grow x1.5 (at least +1) while runs fit,
/// up to `max`; after the first failure bisect between the last fit and the first failure until
/// their gap is at most `max(1, tolerance * last_fit)`.
///
/// `fits(B)` must run one batch of `B` and return whether it completed (false on an allocation
/// error). With `tolerance = 0` the wall is exact; the seeds stop near 2 %. Only for discrete
/// GPUs or an explicit `--probe-wall`; never on shared memory (see the module docs).
pub fn find_wall<F>(start: u64, max: u64, tolerance: f64, mut fits: F) -> WallSearch
where
    F: FnMut(u64) -> bool,
{
    let max = max.max(1);
    let mut history = Vec::new();
    let mut probe = |b: u64, history: &mut Vec<(u64, bool)>| {
        let ok = fits(b);
        history.push((b, ok));
        ok
    };
    let mut lo = 0u64;
    let mut b = start.clamp(1, max);
    let mut hi = loop {
        if probe(b, &mut history) {
            lo = b;
            if b >= max {
                return WallSearch {
                    largest_fit: lo,
                    first_fail: None,
                    probes: history.len() as u32,
                    history,
                };
            }
            b = (b.saturating_mul(3) / 2).max(b + 1).min(max);
        } else {
            break b;
        }
    };
    let tol = if tolerance.is_finite() { tolerance.max(0.0) } else { 0.0 };
    while hi - lo > ((tol * lo as f64) as u64).max(1) {
        let mid = lo + (hi - lo) / 2;
        if probe(mid, &mut history) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    WallSearch {
        largest_fit: lo,
        first_fail: Some(hi),
        probes: history.len() as u32,
        history,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn a_gpu_provider_stops_at_its_largest_batch_and_says_so() {
        let cfg = |max_units, scene_units, knee| ChooseConfig {
            frag_margin: 0.1,
            max_units,
            scene_units,
            knee,
        };
        let c = cap_gpu(254_350, GPU_MAX_BATCH, Unit::Sample, &cfg(1 << 20, Some(1 << 20), None));
        assert_eq!((c.units, c.limited_by), (GPU_MAX_BATCH, Limit::GpuBatch));
        assert_eq!(c.ceiling_limited_by, Limit::GpuBatch);
        // Memory below the GPU's bound: memory binds, as on the CPU.
        let c = cap_gpu(28_154, GPU_MAX_BATCH, Unit::Sample, &cfg(1 << 20, None, None));
        assert_eq!((c.units, c.limited_by), (28_154, Limit::Memory));
        // --max-batch, the scene and the knee below it keep their names.
        let c = cap_gpu(254_350, GPU_MAX_BATCH, Unit::Sample, &cfg(8192, None, None));
        assert_eq!((c.units, c.limited_by), (8192, Limit::MaxBatch));
        let c = cap_gpu(254_350, GPU_MAX_BATCH, Unit::Tile, &cfg(1 << 20, Some(16), None));
        assert_eq!((c.units, c.limited_by), (16, Limit::Tiles));
        let c = cap_gpu(254_350, GPU_MAX_BATCH, Unit::Sample, &cfg(1 << 20, None, Some(128)));
        assert_eq!(
            (c.units, c.limited_by, c.ceiling_limited_by),
            (128, Limit::Knee, Limit::GpuBatch)
        );
        // A tie with --max-batch names the GPU; no GPU (u64::MAX) is the plain cap.
        let c = cap_gpu(254_350, GPU_MAX_BATCH, Unit::Sample, &cfg(GPU_MAX_BATCH, None, None));
        assert_eq!(c.limited_by, Limit::GpuBatch);
        assert_eq!(
            cap_gpu(500, u64::MAX, Unit::Sample, &cfg(8192, None, None)),
            cap(500, Unit::Sample, &cfg(8192, None, None))
        );
        assert_eq!(serde_json::to_string(&Limit::GpuBatch).unwrap(), "\"gpu_batch\"");
    }

    #[test]
    fn b_safe_formula() {
        let cost = CostModel::new(Unit::Sample, 200 * MIB, 6 * MIB);
        let cfg = ChooseConfig {
            frag_margin: 0.10,
            max_units: 100_000,
            ..ChooseConfig::default()
        };
        let c = safe_units(4096 * MIB, &cost, &cfg).unwrap();
        // (4096*0.9 - 200) / 6 = (3686.4 - 200) / 6 = 581.06 -> 581.
        assert_eq!(c.units_safe, 581);
        assert_eq!(c.limited_by, Limit::Memory);
        assert!(c.predicted_peak_bytes <= c.usable_bytes);
        assert!(cost.predict(c.units_safe + 1) > c.usable_bytes);
    }

    #[test]
    fn caps_and_zero() {
        let cost = CostModel::new(Unit::Tile, 100, 10);
        let mut cfg = ChooseConfig {
            frag_margin: 0.0,
            max_units: 50,
            ..ChooseConfig::default()
        };
        let c = safe_units(10_000, &cost, &cfg).unwrap();
        assert_eq!((c.units_safe, c.memory_units, c.limited_by), (50, 990, Limit::MaxBatch));
        cfg.knee = Some(32);
        let c = safe_units(10_000, &cost, &cfg).unwrap();
        assert_eq!((c.units_safe, c.limited_by, c.unit), (32, Limit::Knee, Unit::Tile));
        assert_eq!((c.ceiling_units, c.ceiling_limited_by), (50, Limit::MaxBatch));
        let c = safe_units(105, &cost, &cfg).unwrap();
        assert_eq!(c.units_safe, 0);
        cfg.frag_margin = 1.0;
        assert!(matches!(safe_units(1, &cost, &cfg), Err(BudgetError::Config { .. })));
    }

    #[test]
    fn each_cap_names_itself() {
        let cfg = |max_units, scene_units, knee| ChooseConfig {
            max_units,
            scene_units,
            knee,
            ..ChooseConfig::default()
        };
        let c = cap(7138, Unit::Sample, &cfg(8192, Some(7138), None));
        assert_eq!((c.units, c.limited_by), (7138, Limit::Memory), "a tie is the memory's");
        let c = cap(123_372, Unit::Sample, &cfg(8192, Some(7138), None));
        assert_eq!((c.units, c.limited_by), (7138, Limit::Scene));
        let c = cap(123_372, Unit::Tile, &cfg(8192, Some(4), None));
        assert_eq!((c.units, c.limited_by), (4, Limit::Tiles));
        let c = cap(123_372, Unit::Sample, &cfg(8192, Some(100_000), Some(32)));
        assert_eq!((c.ceiling, c.ceiling_limited_by), (8192, Limit::MaxBatch));
        assert_eq!((c.units, c.limited_by), (32, Limit::Knee));
        // A knee above the ceiling does not bind.
        let c = cap(20, Unit::Sample, &cfg(8192, None, Some(32)));
        assert_eq!((c.units, c.limited_by, c.ceiling), (20, Limit::Memory, 20));
        assert_eq!(Limit::MaxBatch.to_string(), "--max-batch");
        assert_eq!(serde_json::to_string(&Limit::MaxBatch).unwrap(), "\"max_batch\"");
    }

    #[test]
    fn wall_search_exact_probe_count() {
        // From 64: 64, 96, 144, 216, 324, 486, 729, 1093, 1639, 2458 run (10), 3687 fails (11),
        // then bisecting the gap of 1229 to 1 takes 10 more.
        let w = find_wall(64, 1 << 20, 0.0, |b| b <= 2995);
        assert_eq!(w.largest_fit, 2995);
        assert_eq!(w.first_fail, Some(2996));
        assert_eq!(w.probes, 21);
        assert_eq!(w.history[7], (1093, true));
        assert_eq!(w.history[10], (3687, false));
    }

    #[test]
    fn wall_search_tolerance_matches_seed_count() {
        // The baselines report HybridSN fp32 B_oom = 2995 in 16 probes: a 2 % stop reproduces it.
        let w = find_wall(64, 1 << 20, 0.02, |b| b <= 2995);
        assert_eq!((w.largest_fit, w.probes), (2995, 16));
        assert_eq!(w.first_fail, Some(3033));
    }

    #[test]
    fn wall_search_edges() {
        let w = find_wall(1, 1000, 0.0, |_| true);
        assert_eq!((w.largest_fit, w.first_fail, w.probes), (1000, None, 18));
        let w = find_wall(64, 1000, 0.0, |b| b <= 10);
        assert_eq!((w.largest_fit, w.first_fail, w.probes), (10, Some(11), 7));
        let w = find_wall(8, 1000, 0.0, |_| false);
        assert_eq!((w.largest_fit, w.first_fail), (0, Some(1)));
    }
}
