//! The training plan: weights, gradients, optimiser state and activations per sample against the
//! budget, and the red line where a memory-safe batch cannot cover the classes.

use std::fmt;
use std::str::FromStr;

use serde::Serialize;

use super::BudgetError;
use super::choose::{ChooseConfig, Limit, safe_units};
use super::cost::{CostModel, CostSource, Unit};
use super::plan::human;
use super::system::SystemBudget;
use crate::graph::GraphCost;

/// The optimiser of a training run, which sets the state kept per parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Optimizer {
    /// Adam: two moments, 2x the parameters.
    Adam,
    /// SGD with momentum: one buffer, 1x the parameters.
    Sgd,
}

impl Optimizer {
    /// State bytes per parameter byte.
    pub fn state_multiple(self) -> u64 {
        match self {
            Self::Adam => 2,
            Self::Sgd => 1,
        }
    }
}

impl FromStr for Optimizer {
    type Err = BudgetError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "adam" => Ok(Self::Adam),
            "sgd" => Ok(Self::Sgd),
            _ => Err(BudgetError::Config {
                field: "optimizer",
                value: s.to_string(),
                why: "expected adam or sgd",
            }),
        }
    }
}

impl fmt::Display for Optimizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Adam => "adam",
            Self::Sgd => "sgd",
        })
    }
}

/// Expected number of distinct classes in a batch of `batch` samples drawn uniformly from
/// `classes` classes: `K (1 - (1 - 1/K)^B)`.
pub fn class_coverage(classes: u64, batch: u64) -> f64 {
    if classes == 0 {
        return 0.0;
    }
    let k = classes as f64;
    let b = i32::try_from(batch).unwrap_or(i32::MAX);
    k * (1.0 - (1.0 - 1.0 / k).powi(b))
}

/// The warning when a memory-safe batch cannot hold one sample of every class.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClassCoverageWarning {
    /// The memory-safe batch.
    pub batch: u64,
    /// The number of classes.
    pub classes: u64,
    /// `K (1 - (1 - 1/K)^B)`.
    pub expected_classes_covered: f64,
    /// The warning in words.
    pub message: String,
    /// What to do about it.
    pub remedies: Vec<String>,
}

/// The training memory plan (`--train --classes K --optimizer adam|sgd`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TrainingPlan {
    /// K.
    pub classes: u64,
    /// The optimiser.
    pub optimizer: Optimizer,
    /// Weights.
    pub parameter_bytes: u64,
    /// Gradients: one per parameter.
    pub gradient_bytes: u64,
    /// Optimiser state: 2x parameters for Adam, 1x for SGD with momentum.
    pub optimizer_state_bytes: u64,
    /// Runtime overhead counted in the fixed cost.
    pub runtime_overhead_bytes: u64,
    /// Parameters + gradients + state + overhead.
    pub fixed_bytes: u64,
    /// Activations kept for backward per sample: the sum of all activations, not the peak.
    pub retained_activation_bytes_per_sample: u64,
    /// The budget after the reserve.
    pub budget_bytes: u64,
    /// The source that binds.
    pub binding_source: String,
    /// `ceil(budget_bytes * r_frag)`.
    pub frag_margin_bytes: u64,
    /// The memory-safe training batch.
    pub batch_safe: u64,
    /// What bound it.
    pub limited_by: Limit,
    /// `M(batch_safe)`.
    pub predicted_peak_bytes: u64,
    /// Expected distinct classes per batch at `batch_safe`.
    pub expected_classes_per_batch: f64,
    /// Set when `batch_safe < classes`.
    pub class_coverage_warning: Option<ClassCoverageWarning>,
}

impl TrainingPlan {
    /// Builds the training plan from the graph's parameters and activations.
    pub fn build(
        system: &SystemBudget,
        graph: &GraphCost,
        classes: u64,
        optimizer: Optimizer,
        runtime_overhead_bytes: u64,
        cfg: &ChooseConfig,
    ) -> Result<TrainingPlan, BudgetError> {
        if classes == 0 {
            return Err(BudgetError::Config {
                field: "classes",
                value: "0".into(),
                why: "a classifier has at least one class",
            });
        }
        let p = graph.parameter_bytes;
        let gradient_bytes = p;
        let optimizer_state_bytes = p.saturating_mul(optimizer.state_multiple());
        let fixed_bytes = p
            .saturating_add(gradient_bytes)
            .saturating_add(optimizer_state_bytes)
            .saturating_add(runtime_overhead_bytes);
        let a = graph.activation_total_bytes;
        let cost = CostModel {
            source: CostSource::GraphPrior,
            ..CostModel::new(Unit::Sample, fixed_bytes, a)
        };
        let choice = safe_units(system.budget_bytes, &cost, cfg)?;
        if choice.units_safe == 0 {
            return Err(BudgetError::DoesNotFit {
                unit: Unit::Sample,
                budget_bytes: system.budget_bytes,
                usable_bytes: choice.usable_bytes,
                fixed_bytes,
                per_unit_bytes: cost.per_unit_bytes,
                binding: system.binding.name().to_string(),
            });
        }
        let b = choice.units_safe;
        let expected = class_coverage(classes, b);
        let class_coverage_warning = (b < classes).then(|| ClassCoverageWarning {
            batch: b,
            classes,
            expected_classes_covered: expected,
            message: format!(
                "the memory-safe batch {b} is smaller than the {classes} classes: no batch can hold every class (about {expected:.1} distinct classes per batch), so BatchNorm statistics and per-batch gradients are biased"
            ),
            remedies: vec![
                "use GroupNorm instead of BatchNorm (no batch statistics)".to_string(),
                format!(
                    "accumulate gradients over {} batches for an effective batch >= {classes}",
                    classes.div_ceil(b)
                ),
                "sample batches class-stratified so each class recurs regularly".to_string(),
                "use a smaller patch to cut activation memory per sample".to_string(),
            ],
        });
        Ok(TrainingPlan {
            classes,
            optimizer,
            parameter_bytes: p,
            gradient_bytes,
            optimizer_state_bytes,
            runtime_overhead_bytes,
            fixed_bytes,
            retained_activation_bytes_per_sample: a,
            budget_bytes: system.budget_bytes,
            binding_source: system.binding.name().to_string(),
            frag_margin_bytes: choice.frag_margin_bytes,
            batch_safe: b,
            limited_by: choice.limited_by,
            predicted_peak_bytes: choice.predicted_peak_bytes,
            expected_classes_per_batch: expected,
            class_coverage_warning,
        })
    }
}

impl fmt::Display for TrainingPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "training memory plan ({} classes, optimizer {})",
            self.classes, self.optimizer
        )?;
        writeln!(f, "  parameters       {}", human(self.parameter_bytes))?;
        writeln!(f, "  gradients        {}", human(self.gradient_bytes))?;
        writeln!(f, "  optimizer state  {}", human(self.optimizer_state_bytes))?;
        writeln!(f, "  runtime          {}", human(self.runtime_overhead_bytes))?;
        writeln!(
            f,
            "  activations      {} per sample (all retained for backward)",
            human(self.retained_activation_bytes_per_sample)
        )?;
        writeln!(
            f,
            "  budget           {} (binding: {}), fragmentation {}",
            human(self.budget_bytes),
            self.binding_source,
            human(self.frag_margin_bytes)
        )?;
        write!(
            f,
            "  batch_safe       {} (limited by {}), predicted peak {}, ~{:.1} classes per batch",
            self.batch_safe,
            self.limited_by,
            human(self.predicted_peak_bytes),
            self.expected_classes_per_batch
        )?;
        if let Some(w) = &self.class_coverage_warning {
            write!(f, "\n  WARNING: {}", w.message)?;
            for r in &w.remedies {
                write!(f, "\n    - {r}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::plan::fixtures::{MIB, graph, system};

    #[test]
    fn training_plan_and_red_line() {
        let g = graph();
        let t = TrainingPlan::build(
            &system(1024 * MIB),
            &g,
            16,
            Optimizer::Adam,
            64 * MIB,
            &ChooseConfig::default(),
        )
        .unwrap();
        assert_eq!(t.fixed_bytes, 20 * MIB * 4 + 64 * MIB);
        assert_eq!(t.optimizer_state_bytes, 40 * MIB);
        // (921.6 - 144) / 10 = 77.76 -> 77 >= 16: no warning.
        assert_eq!(t.batch_safe, 77);
        assert!(t.class_coverage_warning.is_none());
        let sgd = TrainingPlan::build(
            &system(1024 * MIB),
            &g,
            16,
            Optimizer::Sgd,
            64 * MIB,
            &ChooseConfig::default(),
        )
        .unwrap();
        assert_eq!(sgd.fixed_bytes, 20 * MIB * 3 + 64 * MIB);
        // 200 MiB budget: (180 - 144) / 10 = 3 < 16 classes.
        let small = TrainingPlan::build(
            &system(200 * MIB),
            &g,
            16,
            Optimizer::Adam,
            64 * MIB,
            &ChooseConfig::default(),
        )
        .unwrap();
        assert_eq!(small.batch_safe, 3);
        let w = small.class_coverage_warning.clone().unwrap();
        assert!((w.expected_classes_covered - 16.0 * (1.0 - (15.0f64 / 16.0).powi(3))).abs() < 1e-12);
        assert_eq!(w.remedies.len(), 4);
        assert!(small.to_string().contains("GroupNorm"));
        assert!(w.remedies[1].contains("6 batches"));
    }

    #[test]
    fn coverage_formula() {
        assert_eq!(class_coverage(1, 5), 1.0);
        assert!((class_coverage(2, 2) - 1.5).abs() < 1e-12);
        assert_eq!(class_coverage(0, 5), 0.0);
        assert!(class_coverage(16, 1000) > 15.999);
        assert_eq!("ADAM".parse::<Optimizer>().unwrap(), Optimizer::Adam);
        assert!("rmsprop".parse::<Optimizer>().is_err());
    }
}
