//! Memory budget: what a batch costs, what the system can give, and the largest batch that fits.
//!
//! On a Jetson the CPU and the integrated GPU share one DRAM, and crossing the memory wall ends
//! in `cudaErrorMemoryAllocation` or the OOM killer. So the runtime never probes to failure on
//! shared memory; it predicts instead:
//!
//! 1. [`system`]: what the system can give now, as the minimum over several sources
//!    (`MemAvailable`, the cgroup headroom, the Tegra app-note estimate on an integrated GPU, the
//!    device's free memory on a discrete GPU), less a configured reserve. Every reader takes a
//!    root directory (`/` in production) so tests run on recorded trees.
//! 2. [`cost`]: what a batch costs, `M(B) = M_fixed + a*B`, first from the graph
//!    ([`crate::graph`]) and then calibrated from two or three small measured runs.
//! 3. [`choose`]: `B_safe = floor((budget*(1 - r_frag) - M_fixed) / a)`, capped by `--max-batch`,
//!    the scene and a plateau knee; and the wall search (grow x1.5, bisect) for discrete GPUs only.
//!    [`knee`] picks the knee from timings (the smallest batch within 5 % of the best), [`plateau`]
//!    drives the in-run sweep that times them.
//! 4. [`governor`]: re-reads the budget every few batches (or when PSI rises) and shrinks or
//!    slowly regrows the batch.
//! 5. [`plan`]: the serialisable [`Plan`] report; [`training`]: the [`TrainingPlan`].
//!
//! # Pipeline use
//!
//! ```no_run
//! use std::path::Path;
//! use hsiedge::budget::{self, BudgetConfig, ChooseConfig, CostModel, Governor, GovernorConfig, Unit};
//! use hsiedge::graph::{self, ShapeBindings};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let root = Path::new("/");
//! let cfg = BudgetConfig::default();
//! let system = budget::read_system_budget(root, &cfg)?;
//! let g = graph::analyse_file(Path::new("models/hybridsn/patch.onnx"), &ShapeBindings::default())?;
//! let prior = CostModel::from_graph(&g, Unit::Sample, budget::DEFAULT_RUNTIME_OVERHEAD_BYTES);
//! // Then, with the session loaded: let sizes = budget::calibration_batches(&prior, system.budget_bytes);
//! // let cal = budget::calibrate(Unit::Sample, &sizes, |b| run_and_measure(b))?; use cal.model.
//! let choose = ChooseConfig::default();
//! let plan = budget::Plan::build(&system, &prior, Some(&g), &choose)?;
//! println!("{plan}");
//! let mut gov = Governor::new(prior, system.budget_bytes, GovernorConfig::from(&choose))?;
//! for batch_index in 0u64.. {
//!     let b = gov.current();
//!     // ... run a batch of b samples ...
//!     if gov.should_check(batch_index, budget::read_psi(root)?.as_ref()) {
//!         let now = budget::read_system_budget(root, &cfg)?;
//!         if let Some(change) = gov.observe(now.budget_bytes, now.psi.as_ref()) {
//!             eprintln!("{change}");
//!         }
//!     }
//! #   break;
//! }
//! # Ok(()) }
//! ```
//!
//! # ONNX Runtime arena requirement
//!
//! The linear cost model holds only if the ORT CPU arena grows by what is requested: the caller
//! must set `arena_extend_strategy = kSameAsRequested` on the CPU (and CUDA) execution provider.
//! ORT's default (`kNextPowerOfTwo`) doubles the arena, which makes the peak a step function of
//! the batch and fits 2.7x-3.1x smaller batches under the same cap (see the project baselines).

use std::path::PathBuf;

pub mod choose;
pub mod cost;
pub mod device;
pub mod governor;
pub mod knee;
pub mod plan;
pub mod plateau;
pub mod system;
pub mod training;
pub mod wall;

pub use choose::{Choice, ChooseConfig, Limit, WallSearch, find_wall, safe_units};
pub use cost::{
    Calibration, CostModel, CostSource, DEFAULT_RUNTIME_OVERHEAD_BYTES, PeakMeter, PeakReading, Unit, calibrate,
    calibration_batches, fit_linear, read_process_hwm, read_process_rss, reset_cgroup_peak, reset_process_hwm,
};
pub use governor::{Adjustment, Cause, Governor, GovernorConfig};
pub use plan::{Plan, SourceReport};
pub use system::{
    BudgetConfig, BudgetSource, CgroupMemory, CgroupVersion, DEFAULT_RESERVE_BYTES, DeviceMemory, GpuKind, JetsonInfo,
    MemInfo, Psi, SourceKind, SystemBudget, detect_jetson, find_cgroup, read_meminfo, read_psi, read_system_budget,
    tegra_allocatable,
};
pub use training::{ClassCoverageWarning, Optimizer, TrainingPlan, class_coverage};

/// Errors of the budget module; each variant names the file, field or step that failed.
#[derive(Debug, thiserror::Error)]
pub enum BudgetError {
    /// A file could not be read or written.
    #[error("{op} {path}")]
    Io {
        /// `reading` or `writing`.
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A required field is absent from a file.
    #[error("{path}: field '{field}' is missing")]
    MissingField {
        /// The file.
        path: PathBuf,
        /// The field.
        field: String,
    },
    /// A field's value could not be parsed.
    #[error("{path}: field '{field}' has unparsable value '{value}'")]
    BadValue {
        /// The file.
        path: PathBuf,
        /// The field.
        field: String,
        /// The text found.
        value: String,
    },
    /// Calibration was asked with fewer than two distinct batch sizes.
    #[error("calibration needs at least two distinct batch sizes, got {got:?}")]
    TooFewSamples {
        /// The batch sizes given.
        got: Vec<u64>,
    },
    /// The measured run for one batch size failed.
    #[error("calibration run at batch {batch} failed")]
    Measure {
        /// The batch size.
        batch: u64,
        /// The caller's error.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The fitted per-unit cost is not positive, so the measurements do not follow `M_fixed + a*B`
    /// (typically an arena that was not set to `kSameAsRequested`, or a preallocated pool).
    #[error("calibration fit has per-unit cost {slope:.1} bytes <= 0 from samples {samples:?}")]
    DegenerateFit {
        /// The fitted slope.
        slope: f64,
        /// `(batch, peak bytes)` pairs measured.
        samples: Vec<(u64, u64)>,
    },
    /// A configuration value is out of range.
    #[error("invalid configuration: {field} = {value} ({why})")]
    Config {
        /// The setting.
        field: &'static str,
        /// Its value.
        value: String,
        /// The accepted range.
        why: &'static str,
    },
    /// A fixed batch whose least cost is over the budget.
    #[error(
        "--batch {batch}: at least {need_bytes} bytes by the model graph at {batch} {unit}s and the scene's maps, over the budget of {budget_bytes} bytes (binding source: {binding}); use a smaller --batch, or --batch auto"
    )]
    FixedBatch {
        /// The batch asked for.
        batch: u64,
        /// `sample` or `tile`.
        unit: Unit,
        /// The least the run holds.
        need_bytes: u64,
        /// Budget after the reserve.
        budget_bytes: u64,
        /// The source that bound the budget.
        binding: String,
    },
    /// Not even one unit fits in the budget.
    #[error(
        "not even one {unit} fits: usable {usable_bytes} bytes (budget {budget_bytes} less fragmentation margin) < fixed {fixed_bytes} + per-{unit} {per_unit_bytes} (binding source: {binding}){}", .unit.remedy()
    )]
    DoesNotFit {
        /// `sample` or `tile`.
        unit: Unit,
        /// Budget after the reserve.
        budget_bytes: u64,
        /// Budget after the fragmentation margin.
        usable_bytes: u64,
        /// `M_fixed`.
        fixed_bytes: u64,
        /// `a`.
        per_unit_bytes: u64,
        /// The source that bound the budget.
        binding: String,
    },
}

impl BudgetError {
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            op,
            path: path.into(),
            source,
        }
    }
}
