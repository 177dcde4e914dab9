//! A fixed `--batch` against what the system can give, before anything is allocated: the run is
//! refused when even the least it will hold does not fit (an auto batch is planned instead).

use super::JobError;
use super::auto::{SceneGeometry, anon_bytes, extra_buffers, graph_prior};
use super::spec::BudgetSettings;
use crate::budget::{self, BudgetConfig, BudgetError, Unit};
use crate::engine::Graph;
use crate::model::{Manifest, Task};
use crate::pipeline::RunOptions;

/// Refuses `run.batch` where the graph's own tensors for it (a lower bound: the runtime's
/// workspaces come on top; on the host only), the batches queued beside it, the tile window and
/// the scene's maps already exceed the budget. A budget that cannot be read is a warning.
pub fn check(
    cube: &SceneGeometry,
    manifest: &Manifest,
    graph: &Graph,
    run: &RunOptions,
    settings: &BudgetSettings,
) -> Result<(), JobError> {
    let (unit, in_per_unit, _, prior) = graph_prior(cube, manifest, graph, run)?;
    // On a GPU provider the graph's tensors live in device memory, which the host budget does
    // not hold.
    let graph_bytes = match graph.device() {
        Some(_) => 0,
        None => prior.predict(run.batch as u64),
    };
    let need = least_bytes(cube, manifest, run, unit, in_per_unit, graph_bytes);
    let root = settings.root.as_path();
    let config = BudgetConfig {
        reserve_bytes: settings.reserve_bytes,
        own_bytes: anon_bytes(root),
        device: None,
    };
    let system = match budget::read_system_budget(root, &config) {
        Ok(s) => s,
        Err(e) => {
            // A fixed batch is the way to run where the budget cannot be read: said, not refused.
            eprintln!(
                "hsiedge: warning: --batch {}: the memory budget cannot be read ({}); the batch is not checked against it",
                run.batch,
                crate::engine::error_chain(&e)
            );
            return Ok(());
        }
    };
    if need > system.budget_bytes {
        return Err(BudgetError::FixedBatch {
            batch: run.batch as u64,
            unit,
            need_bytes: need,
            budget_bytes: system.budget_bytes,
            binding: system.binding.to_string(),
        }
        .into());
    }
    Ok(())
}

/// `graph_bytes` (the graph at the batch) plus the batch inputs queued beside the running one,
/// the tile window and the maps.
fn least_bytes(
    cube: &SceneGeometry,
    manifest: &Manifest,
    run: &RunOptions,
    unit: Unit,
    in_per_unit: usize,
    graph_bytes: u64,
) -> u64 {
    let grid = crate::tile::TileGrid::new(cube.lines, cube.samples, run.tile, manifest.halo);
    let pixels = (cube.lines as u64).saturating_mul(cube.samples as u64);
    let scene_units = match unit {
        Unit::Sample => pixels,
        Unit::Tile => grid.len() as u64,
    };
    let b = run.batch as u64;
    let queued = (in_per_unit as u64 * 4)
        .saturating_mul(b)
        .saturating_mul(extra_buffers(run.queue, scene_units, b));
    let window = (cube.bands * grid.window_h() * grid.window_w() * 4) as u64;
    let scores = run.keep_scores || manifest.task == Task::Abundance;
    let per_pixel = 6 + if scores { manifest.classes() as u64 * 4 } else { 0 };
    graph_bytes
        .saturating_add(queued)
        .saturating_add(window)
        .saturating_add(pixels.saturating_mul(per_pixel))
}
