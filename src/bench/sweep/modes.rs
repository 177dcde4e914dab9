//! `bench sweep --power-modes`: the sweep under each selected nvpmodel mode, with energy per pixel
//! and the best-energy batch of each, the original mode restored on every way out; or, with
//! `--dry-run`, the plan.

use std::path::PathBuf;

use crate::budget::knee;

use super::power::{self, PowerError};
use super::{Bench, BenchError, PowerOptions, SweepOptions, SweepOutput, SweepResult};

/// A sweep under each selected power mode.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PowerSweep {
    /// The nvpmodel program.
    pub nvpmodel: PathBuf,
    /// The mode in force before (and, restored, after) the sweep.
    pub original: crate::platform::PowerMode,
    /// Seconds waited after each switch.
    pub settle_s: f64,
    /// One sweep per mode, in the order run.
    pub modes: Vec<ModeSweep>,
    /// The original mode was put back (a failed restore is an error instead).
    pub restored: bool,
}

/// One power mode's sweep.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ModeSweep {
    /// The mode.
    pub mode: crate::platform::PowerMode,
    /// The sweep, with energy in each size's stats.
    pub sweep: SweepResult,
    /// The size with the fewest joules per pixel, and that figure.
    pub best_energy: Option<BestEnergy>,
}

/// The most energy-efficient size of a mode.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct BestEnergy {
    /// Units per batch.
    pub batch: u64,
    /// Joules per output pixel.
    pub joules_per_pixel: f64,
    /// Output pixels per joule.
    pub pixels_per_joule: f64,
}

/// What `--power-modes --dry-run` would do.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PowerPlan {
    /// The nvpmodel program.
    pub nvpmodel: PathBuf,
    /// The mode in force now.
    pub original: crate::platform::PowerMode,
    /// Modes to sweep, in order.
    pub modes: Vec<crate::platform::PowerMode>,
    /// Batch sizes per mode.
    pub batches: Vec<u64>,
    /// Seconds to wait after each switch.
    pub settle_s: f64,
    /// The commands, in order (the restore last).
    pub commands: Vec<String>,
}

/// Runs the sweep of `opts` under each mode `p` selects (or returns the plan of it).
pub(super) fn run(opts: &SweepOptions, p: &PowerOptions) -> Result<SweepOutput, BenchError> {
    let nv = crate::platform::read_nvpmodel(&p.platform_root);
    let conf = p
        .platform_root
        .join(crate::platform::jetson::NVPMODEL_CONF.trim_start_matches('/'));
    if nv.modes.is_empty() {
        return Err(PowerError::NoModes { conf }.into());
    }
    let selected = power::select(&p.modes, &nv.modes, &conf)?;
    let nvpmodel = power::Nvpmodel {
        program: p.nvpmodel.clone(),
    };
    let original = nvpmodel.query(&nv.modes)?;
    let mut batches = opts.batches.clone();
    batches.sort_unstable();
    batches.dedup();
    if p.dry_run {
        let prog = p.nvpmodel.display();
        let mut commands: Vec<String> = selected
            .iter()
            .map(|m| {
                format!(
                    "{prog} -m {}  # {}, wait {} s, sweep batches {batches:?}",
                    m.id,
                    m.name,
                    p.settle.as_secs_f64()
                )
            })
            .collect();
        commands.push(format!("{prog} -m {}  # restore {}", original.id, original.name));
        return Ok(SweepOutput::Plan(PowerPlan {
            nvpmodel: p.nvpmodel.clone(),
            original,
            modes: selected,
            batches,
            settle_s: p.settle.as_secs_f64(),
            commands,
        }));
    }
    // The session is built before any switch: a model that cannot load changes no mode.
    let (bench, mut graph) = Bench::new(opts)?;
    let mut fp16 = if opts.fp16 { Some(bench.fp16_graph()?) } else { None };
    let mut meter = power::EnergyMeter::discover(&p.platform_root, p.sample_interval);
    if meter.is_none() {
        eprintln!(
            "note: no power rails under {}: the sweeps have no energy figures",
            p.platform_root.display()
        );
    }
    let switch = power::ModeSwitch::new(nvpmodel, original.clone())?;
    let mut modes = Vec::new();
    for mode in &selected {
        switch.switch(mode)?;
        std::thread::sleep(p.settle);
        let key_mode = knee::power_mode(&p.platform_root).or_else(|| Some(format!("pmode:{:04}", mode.id)));
        let sweep = bench.sweep(opts, &mut graph, fp16.as_mut(), meter.as_mut(), key_mode)?;
        let best_energy = sweep
            .stats
            .iter()
            .filter_map(|s| s.energy.map(|e| (s.batch, e)))
            .filter(|(_, e)| e.joules_per_pixel > 0.0)
            .min_by(|a, b| a.1.joules_per_pixel.total_cmp(&b.1.joules_per_pixel))
            .map(|(batch, e)| BestEnergy {
                batch,
                joules_per_pixel: e.joules_per_pixel,
                pixels_per_joule: e.pixels_per_joule,
            });
        modes.push(ModeSweep {
            mode: mode.clone(),
            sweep,
            best_energy,
        });
    }
    switch.restore()?;
    drop(switch);
    Ok(SweepOutput::Power(PowerSweep {
        nvpmodel: p.nvpmodel.clone(),
        original,
        settle_s: p.settle.as_secs_f64(),
        modes,
        restored: true,
    }))
}
