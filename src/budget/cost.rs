//! What a batch costs: `M(B) = M_fixed + a*B`, from the graph and from calibration runs.
//!
//! The graph prior ([`CostModel::from_graph`]) takes `M_fixed` = parameter bytes plus a runtime
//! overhead, and `a` = the peak of live activation bytes per unit. It ignores what the runtime
//! adds (workspaces, arena rounding, copies), so [`calibrate`] replaces it with a least-squares
//! fit over two or three small measured runs.
//!
//! The measurement primitives here read peaks without ONNX: [`reset_process_hwm`] /
//! [`read_process_hwm`] (`/proc/self/clear_refs` and `VmHWM`) and [`reset_cgroup_peak`]. The
//! engine plugs its session into the `calibrate` closure.
//!
//! Arena requirement: the linear model holds only if ONNX Runtime's arena grows by what is
//! requested, so the caller must configure `arena_extend_strategy = kSameAsRequested`
//! (the default power-of-two growth makes the peak a step function of the batch).
//!
//! GPU note: `VmHWM` counts host pages only. CUDA allocations on a Jetson go through nvmap and
//! are not in the process RSS; a GPU calibration closure must add the device-side peak (for
//! example the growth of `NvMapMemUsed`, or the ORT CUDA arena's statistics).

use std::fmt;
use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::BudgetError;
use super::system::{CgroupMemory, CgroupVersion};
use crate::graph::GraphCost;

/// Fixed bytes the runtime holds besides the weights (ORT session, thread pools, allocator
/// metadata) in the graph prior. A rough figure: calibration replaces it.
pub const DEFAULT_RUNTIME_OVERHEAD_BYTES: u64 = 64 << 20;

/// The unit a batch counts: samples (patch mode) or tiles (dense mode).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Unit {
    /// One pixel's patch.
    Sample,
    /// One dense tile (with halo).
    Tile,
}

impl fmt::Display for Unit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Sample => "sample",
            Self::Tile => "tile",
        })
    }
}

impl Unit {
    /// What to change when not even one unit fits, besides the budget.
    pub fn remedy(self) -> &'static str {
        match self {
            Self::Sample => "",
            Self::Tile => "; a smaller --tile needs less per tile",
        }
    }
}

/// Where a cost model came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CostSource {
    /// From the ONNX graph alone.
    GraphPrior,
    /// Fitted to measured runs.
    Calibrated,
    /// Given by the caller (e.g. a cached calibration).
    Given,
}

/// `M(B) = fixed_bytes + per_unit_bytes * B`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CostModel {
    /// What one unit of the batch is.
    pub unit: Unit,
    /// `M_fixed`: weights plus runtime overhead.
    pub fixed_bytes: u64,
    /// `a`: bytes per unit; at least 1.
    pub per_unit_bytes: u64,
    /// Where the numbers came from.
    pub source: CostSource,
    /// Root-mean-square residual of the calibration fit, in bytes (calibrated models only).
    pub fit_rms_residual_bytes: Option<f64>,
}

impl CostModel {
    /// A model with given coefficients (`per_unit_bytes` is raised to 1 so division is safe).
    pub fn new(unit: Unit, fixed_bytes: u64, per_unit_bytes: u64) -> Self {
        Self {
            unit,
            fixed_bytes,
            per_unit_bytes: per_unit_bytes.max(1),
            source: CostSource::Given,
            fit_rms_residual_bytes: None,
        }
    }

    /// The graph prior: `M_fixed = parameter_bytes + runtime_overhead_bytes`,
    /// `a = activation_peak_bytes` (per sample, or per tile when the graph was sized with the
    /// tile's H/W bound).
    pub fn from_graph(g: &GraphCost, unit: Unit, runtime_overhead_bytes: u64) -> Self {
        Self {
            source: CostSource::GraphPrior,
            ..Self::new(
                unit,
                g.parameter_bytes.saturating_add(runtime_overhead_bytes),
                g.activation_peak_bytes,
            )
        }
    }

    /// Predicted peak bytes for `units` units (saturating).
    pub fn predict(&self, units: u64) -> u64 {
        self.fixed_bytes
            .saturating_add(self.per_unit_bytes.saturating_mul(units))
    }
}

/// A least-squares fit of measured peaks.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Calibration {
    /// `(batch, measured peak bytes)` in the order run.
    pub samples: Vec<(u64, u64)>,
    /// The fitted intercept (may be negative with noisy data; the model clamps it at 0).
    pub intercept: f64,
    /// The fitted slope, bytes per unit.
    pub slope: f64,
    /// `measured - fitted` per sample, bytes.
    pub residuals: Vec<f64>,
    /// Root-mean-square residual, bytes.
    pub rms_residual_bytes: f64,
    /// Largest absolute residual, bytes.
    pub max_abs_residual_bytes: f64,
    /// The resulting model (intercept and slope rounded up).
    pub model: CostModel,
}

/// Fits `y = intercept + slope * x` by ordinary least squares; returns `(intercept, slope)`.
///
/// Needs at least two distinct `x`.
pub fn fit_linear(samples: &[(u64, u64)]) -> Result<(f64, f64), BudgetError> {
    let n = samples.len() as f64;
    let mx = samples.iter().map(|s| s.0 as f64).sum::<f64>() / n;
    let my = samples.iter().map(|s| s.1 as f64).sum::<f64>() / n;
    let sxx: f64 = samples.iter().map(|s| (s.0 as f64 - mx).powi(2)).sum();
    if samples.len() < 2 || sxx <= 0.0 {
        return Err(BudgetError::TooFewSamples {
            got: samples.iter().map(|s| s.0).collect(),
        });
    }
    let sxy: f64 = samples.iter().map(|s| (s.0 as f64 - mx) * (s.1 as f64 - my)).sum();
    let slope = sxy / sxx;
    Ok((my - slope * mx, slope))
}

/// Runs `run(B)` for each batch size and fits `M(B) = M_fixed + a*B` to the peaks it returns.
///
/// `run` must execute one batch of `B` units and return the peak bytes of that run alone (reset
/// the high-water mark first, e.g. with [`PeakMeter`]). Use two or three small sizes (say 1, 8,
/// 32): each must fit, since on shared memory the runtime never probes near the wall. The
/// session must use `arena_extend_strategy = kSameAsRequested`.
///
/// Errors: fewer than two distinct sizes, a failed run (with its batch), or a slope <= 0.
pub fn calibrate<F, E>(unit: Unit, batches: &[u64], mut run: F) -> Result<Calibration, BudgetError>
where
    F: FnMut(u64) -> Result<u64, E>,
    E: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut distinct = batches.to_vec();
    distinct.sort_unstable();
    distinct.dedup();
    if distinct.len() < 2 {
        return Err(BudgetError::TooFewSamples { got: batches.to_vec() });
    }
    let mut samples = Vec::with_capacity(batches.len());
    for &b in batches {
        let peak = run(b).map_err(|e| BudgetError::Measure {
            batch: b,
            source: e.into(),
        })?;
        samples.push((b, peak));
    }
    let (intercept, slope) = fit_linear(&samples)?;
    if slope <= 0.0 || !slope.is_finite() {
        return Err(BudgetError::DegenerateFit { slope, samples });
    }
    let residuals: Vec<f64> = samples
        .iter()
        .map(|&(x, y)| y as f64 - (intercept + slope * x as f64))
        .collect();
    let rms = (residuals.iter().map(|r| r * r).sum::<f64>() / residuals.len() as f64).sqrt();
    let max_abs = residuals.iter().fold(0.0f64, |m, r| m.max(r.abs()));
    // Round up: a byte too many is harmless, a byte too few adds up over a large batch.
    let model = CostModel {
        unit,
        fixed_bytes: ceil_bytes(intercept.max(0.0)),
        per_unit_bytes: ceil_bytes(slope).max(1),
        source: CostSource::Calibrated,
        fit_rms_residual_bytes: Some(rms),
    };
    Ok(Calibration {
        samples,
        intercept,
        slope,
        residuals,
        rms_residual_bytes: rms,
        max_abs_residual_bytes: max_abs,
        model,
    })
}

/// Batch sizes for [`calibrate`] that are safe to run on shared memory: from `1, 4, 16, 32`,
/// those whose prior cost, doubled (the prior misses runtime workspaces), stays within
/// `budget_bytes`. Fewer than two sizes means calibration cannot run safely: keep the prior.
pub fn calibration_batches(prior: &CostModel, budget_bytes: u64) -> Vec<u64> {
    [1u64, 4, 16, 32]
        .into_iter()
        .filter(|&b| prior.predict(b).saturating_mul(2) <= budget_bytes)
        .collect()
}

/// Rounds up, except that a value within floating-point noise of an integer is that integer.
fn ceil_bytes(x: f64) -> u64 {
    let r = x.round();
    if (x - r).abs() <= 1e-6 * x.abs().max(1.0) {
        r as u64
    } else {
        x.ceil() as u64
    }
}

fn status_field(root: &Path, field: &str) -> Result<u64, BudgetError> {
    let path = root.join("proc/self/status");
    let text = fs::read_to_string(&path).map_err(|e| BudgetError::io("reading", &path, e))?;
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .ok_or_else(|| BudgetError::MissingField {
            path: path.clone(),
            field: field.to_string(),
        })?;
    let num = line.trim().trim_end_matches("kB").trim();
    num.parse::<u64>()
        .map(|kb| kb.saturating_mul(1024))
        .map_err(|_| BudgetError::BadValue {
            path,
            field: field.to_string(),
            value: line.trim().to_string(),
        })
}

/// The process's resident high-water mark, `VmHWM` of `root/proc/self/status`, in bytes.
pub fn read_process_hwm(root: &Path) -> Result<u64, BudgetError> {
    status_field(root, "VmHWM")
}

/// The process's resident set, `VmRSS` of `root/proc/self/status`, in bytes.
pub fn read_process_rss(root: &Path) -> Result<u64, BudgetError> {
    status_field(root, "VmRSS")
}

/// Resets `VmHWM` to the current RSS by writing `5` to `root/proc/self/clear_refs`
/// (Linux >= 4.0; a process may always write its own).
pub fn reset_process_hwm(root: &Path) -> Result<(), BudgetError> {
    let path = root.join("proc/self/clear_refs");
    fs::write(&path, "5").map_err(|e| BudgetError::io("writing", path, e))
}

/// Resets the cgroup high-water mark where the kernel allows it: v1 by writing `0` to
/// `memory.max_usage_in_bytes`. Returns `Ok(false)` where it cannot be reset: v2 (`memory.peak`
/// resets only per open file descriptor, on new kernels) or a read-only / not-permitted file.
pub fn reset_cgroup_peak(cg: &CgroupMemory) -> Result<bool, BudgetError> {
    if cg.version == CgroupVersion::V2 {
        return Ok(false);
    }
    let path = cg.peak_file();
    match fs::write(&path, "0") {
        Ok(()) => Ok(true),
        Err(e)
            if matches!(
                e.kind(),
                ErrorKind::PermissionDenied | ErrorKind::ReadOnlyFilesystem | ErrorKind::NotFound
            ) =>
        {
            Ok(false)
        }
        Err(e) => Err(BudgetError::io("writing", path, e)),
    }
}

/// Measures the peak of one run: reset before, read after.
#[derive(Debug, Clone)]
pub struct PeakMeter {
    root: PathBuf,
    cgroup: Option<CgroupMemory>,
    cgroup_resettable: bool,
}

/// What a [`PeakMeter`] read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PeakReading {
    /// `VmHWM` since the last reset, bytes.
    pub process_hwm_bytes: u64,
    /// The cgroup's peak since the last reset, when it could be reset (it includes other
    /// processes of the cgroup).
    pub cgroup_peak_bytes: Option<u64>,
}

impl PeakMeter {
    /// A meter for the process under `root`, with its cgroup if one was found.
    pub fn new(root: &Path, cgroup: Option<CgroupMemory>) -> Self {
        Self {
            root: root.to_path_buf(),
            cgroup,
            cgroup_resettable: false,
        }
    }

    /// Resets the process high-water mark (required) and the cgroup's (where writable).
    pub fn reset(&mut self) -> Result<(), BudgetError> {
        reset_process_hwm(&self.root)?;
        self.cgroup_resettable = match &self.cgroup {
            Some(cg) => reset_cgroup_peak(cg)?,
            None => false,
        };
        Ok(())
    }

    /// Reads the peaks since [`PeakMeter::reset`].
    pub fn read(&self) -> Result<PeakReading, BudgetError> {
        let cgroup_peak_bytes = match (&self.cgroup, self.cgroup_resettable) {
            (Some(cg), true) => {
                let path = cg.peak_file();
                let text = fs::read_to_string(&path).map_err(|e| BudgetError::io("reading", &path, e))?;
                Some(text.trim().parse::<u64>().map_err(|_| BudgetError::BadValue {
                    path: path.clone(),
                    field: "peak".into(),
                    value: text.trim().to_string(),
                })?)
            }
            _ => None,
        };
        Ok(PeakReading {
            process_hwm_bytes: read_process_hwm(&self.root)?,
            cgroup_peak_bytes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_line_fits_with_zero_residual() {
        let cal = calibrate(Unit::Sample, &[1, 8, 32], |b| {
            Ok::<u64, std::io::Error>(100_000_000 + 6_000_000 * b)
        })
        .unwrap();
        assert_eq!(cal.model.fixed_bytes, 100_000_000);
        assert_eq!(cal.model.per_unit_bytes, 6_000_000);
        assert!(cal.rms_residual_bytes < 1.0);
        assert_eq!(cal.model.source, CostSource::Calibrated);
        assert_eq!(cal.model.predict(10), 160_000_000);
    }

    #[test]
    fn noisy_fit_keeps_residuals() {
        let data = [(1u64, 110u64), (2, 118), (4, 142)];
        let (c, a) = fit_linear(&data).unwrap();
        // By hand: mean x 7/3, mean y 370/3, sxx 42/9, sxy 456/9 -> a = 456/42.
        assert!((a - 456.0 / 42.0).abs() < 1e-9, "{a}");
        assert!((c - (370.0 / 3.0 - a * 7.0 / 3.0)).abs() < 1e-9);
        let cal = calibrate(Unit::Tile, &[1, 2, 4], |b| {
            data.iter().find(|d| d.0 == b).map(|d| d.1).ok_or("no sample")
        })
        .unwrap();
        assert_eq!(cal.residuals.len(), 3);
        let sum: f64 = cal.residuals.iter().sum();
        assert!(sum.abs() < 1e-9); // OLS residuals sum to zero
        assert!(cal.max_abs_residual_bytes > 0.0);
        assert_eq!(cal.model.per_unit_bytes, 11);
    }

    #[test]
    fn calibration_errors() {
        assert!(matches!(
            calibrate(Unit::Sample, &[4, 4], |_| Ok::<u64, std::io::Error>(1)),
            Err(BudgetError::TooFewSamples { .. })
        ));
        assert!(matches!(
            calibrate(Unit::Sample, &[1, 2], |b| Ok::<u64, std::io::Error>(100 - b)),
            Err(BudgetError::DegenerateFit { .. })
        ));
        let err = calibrate(Unit::Sample, &[1, 2], |b| {
            if b == 2 { Err("session failed") } else { Ok(5) }
        })
        .unwrap_err();
        assert!(matches!(err, BudgetError::Measure { batch: 2, .. }));
    }

    #[test]
    fn calibration_sizes_stay_far_from_the_wall() {
        let prior = CostModel::new(Unit::Sample, 100, 10);
        assert_eq!(calibration_batches(&prior, 10_000), vec![1, 4, 16, 32]);
        assert_eq!(calibration_batches(&prior, 2 * 260), vec![1, 4, 16]);
        assert_eq!(calibration_batches(&prior, 2 * 110), vec![1]);
    }

    #[test]
    fn graph_prior() {
        let g = GraphCost {
            parameter_bytes: 1000,
            parameter_tensors: 2,
            activation_peak_bytes: 300,
            peak_node: None,
            activation_total_bytes: 900,
            input_bytes: 10,
            output_bytes: 1,
            node_count: 3,
            unsized_tensors: vec![],
        };
        let m = CostModel::from_graph(&g, Unit::Sample, 24);
        assert_eq!((m.fixed_bytes, m.per_unit_bytes), (1024, 300));
        assert_eq!(m.source, CostSource::GraphPrior);
    }

    #[test]
    fn process_hwm_reset_on_live_proc() {
        let root = Path::new("/");
        if !root.join("proc/self/clear_refs").exists() {
            eprintln!("skipped: no /proc/self/clear_refs");
            return;
        }
        let mut meter = PeakMeter::new(root, None);
        let big = vec![1u8; 96 << 20];
        let touched: u64 = big.iter().step_by(4096).map(|&b| u64::from(b)).sum();
        assert!(touched > 0);
        let before = read_process_hwm(root).unwrap();
        drop(big);
        meter.reset().unwrap();
        let after = meter.read().unwrap();
        assert!(
            after.process_hwm_bytes + (48 << 20) < before,
            "hwm {} after reset vs {} before",
            after.process_hwm_bytes,
            before
        );
        assert!(read_process_rss(root).unwrap() > 0);
    }

    #[test]
    fn cgroup_v1_peak_reset_on_tree() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("memory.max_usage_in_bytes");
        fs::write(&f, "12345\n").unwrap();
        let cg = CgroupMemory {
            version: CgroupVersion::V1,
            cgroup_path: "/x".into(),
            dir: d.path().to_path_buf(),
            limit_bytes: None,
            usage_bytes: 0,
            peak_bytes: Some(12345),
            inactive_file_bytes: 0,
        };
        assert!(reset_cgroup_peak(&cg).unwrap());
        assert_eq!(fs::read_to_string(&f).unwrap(), "0");
        let v2 = CgroupMemory {
            version: CgroupVersion::V2,
            ..cg
        };
        assert!(!reset_cgroup_peak(&v2).unwrap());
    }
}
