//! A job as given: `--mode`, `--batch` and the budget settings, parsed and validated without I/O.

use std::path::PathBuf;

use super::JobError;
use crate::budget;
use crate::engine::EngineOptions;
use crate::map::Contention;
use crate::pipeline::Mode;

/// `--mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModeChoice {
    /// Dense when the model has a dense twin, else patch.
    Auto,
    /// Force one mode.
    Fixed(Mode),
}

/// `--batch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchChoice {
    /// Chosen by the runtime.
    Auto,
    /// Exactly this many.
    Fixed(usize),
}

/// A job as given by the user, validated but not yet touching any file.
#[derive(Debug, Clone, PartialEq)]
pub struct JobSpec {
    /// The scene's header or data file.
    pub scene: PathBuf,
    /// The model manifest.
    pub manifest: PathBuf,
    /// Output folder.
    pub out: PathBuf,
    /// What to do when another process is writing `out`.
    pub contention: Contention,
    /// Execution mode.
    pub mode: ModeChoice,
    /// Batch size.
    pub batch: BatchChoice,
    /// Tile side.
    pub tile: usize,
    /// Engine settings.
    pub engine: EngineOptions,
    /// Optional reference label map for accuracy.
    pub labels: Option<PathBuf>,
    /// Keep every output channel in `scores.img`.
    pub keep_scores: bool,
    /// How `--batch auto` is bounded.
    pub budget: BudgetSettings,
}

/// Settings of the memory budget behind `--batch auto`.
#[derive(Debug, Clone, PartialEq)]
pub struct BudgetSettings {
    /// Root of `/proc` and `/sys` (`/` except in tests).
    pub root: PathBuf,
    /// Bytes left to the rest of the system.
    pub reserve_bytes: u64,
    /// Share of the budget kept for allocator fragmentation.
    pub frag_margin: f64,
    /// Largest batch ever chosen (units).
    pub max_units: u64,
    /// Batches between budget re-reads while running.
    pub check_every: u64,
    /// Adapt the batch while running.
    pub adapt: bool,
    /// Folder of cached batch sweeps whose plateau knee caps the batch (`None`: no cap).
    pub sweep_cache: Option<PathBuf>,
    /// Without a cached knee, time a few batch sizes before the run and stop at the plateau.
    pub sweep: bool,
}

impl BudgetSettings {
    /// Checks the ranges (no I/O), naming the command-line flag of a value out of range.
    pub fn validate(&self) -> Result<(), JobError> {
        let bad = |name: &'static str, value: String, message: &str| {
            Err(JobError::Setting {
                name,
                value,
                message: message.into(),
            })
        };
        if !(0.0..1.0).contains(&self.frag_margin) {
            return bad(
                "--frag-margin",
                self.frag_margin.to_string(),
                "expected a share in [0, 1)",
            );
        }
        if self.max_units == 0 {
            return bad("--max-batch", "0".into(), "expected a whole number >= 1");
        }
        if self.check_every == 0 {
            return bad("check_every", "0".into(), "expected a whole number >= 1");
        }
        Ok(())
    }
}

impl Default for BudgetSettings {
    fn default() -> Self {
        Self {
            root: PathBuf::from("/"),
            reserve_bytes: budget::DEFAULT_RESERVE_BYTES,
            frag_margin: 0.10,
            max_units: 8192,
            check_every: 1,
            adapt: true,
            sweep_cache: None,
            sweep: true,
        }
    }
}

/// Parses `auto|dense|patch`.
pub fn parse_mode(s: &str) -> Result<ModeChoice, JobError> {
    match s {
        "auto" => Ok(ModeChoice::Auto),
        "dense" => Ok(ModeChoice::Fixed(Mode::Dense)),
        "patch" => Ok(ModeChoice::Fixed(Mode::Patch)),
        _ => Err(JobError::Setting {
            name: "--mode",
            value: s.into(),
            message: "expected auto, dense or patch".into(),
        }),
    }
}

/// Parses `auto|N` with N >= 1.
pub fn parse_batch(s: &str) -> Result<BatchChoice, JobError> {
    if s == "auto" {
        return Ok(BatchChoice::Auto);
    }
    match s.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(BatchChoice::Fixed(n)),
        _ => Err(JobError::Setting {
            name: "--batch",
            value: s.into(),
            message: "expected auto or a whole number >= 1".into(),
        }),
    }
}

impl JobSpec {
    /// Validates settings that need no I/O.
    pub fn validate(&self) -> Result<(), JobError> {
        if self.tile == 0 {
            return Err(JobError::Setting {
                name: "--tile",
                value: "0".into(),
                message: "expected a tile side >= 1".into(),
            });
        }
        self.budget.validate()
    }
}
