//! The inference plan report: why the batch is what it is, as JSON (serde) and as text (`Display`).
//! Training memory is [`super::training`].

use std::fmt;

use serde::Serialize;

use super::BudgetError;
use super::choose::{Choice, ChooseConfig, Limit, safe_units};
use super::cost::{CostModel, CostSource, Unit};
use super::system::{GpuKind, SystemBudget};
use crate::graph::GraphCost;

/// Formats bytes for people: `512 B`, `3.4 MiB`, `7.27 GiB`.
pub(super) fn human(b: u64) -> String {
    const K: f64 = 1024.0;
    let f = b as f64;
    if f < K {
        format!("{b} B")
    } else if f < K * K {
        format!("{:.1} KiB", f / K)
    } else if f < K * K * K {
        format!("{:.1} MiB", f / (K * K))
    } else {
        format!("{:.2} GiB", f / (K * K * K))
    }
}

/// One budget source in a report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SourceReport {
    /// `mem_available`, `cgroup`, `tegra_estimate` or `device_free`.
    pub name: String,
    /// Bytes it allows.
    pub bytes: u64,
    /// How it was computed.
    pub detail: String,
    /// Whether it is the minimum.
    pub binds: bool,
}

fn source_reports(system: &SystemBudget) -> Vec<SourceReport> {
    system
        .sources
        .iter()
        .map(|s| SourceReport {
            name: s.kind.name().to_string(),
            bytes: s.bytes,
            detail: s.detail.clone(),
            binds: s.kind == system.binding,
        })
        .collect()
}

/// The inference plan: the cost breakdown, the budget and the batch it allows.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Plan {
    /// `patch` (unit = sample) or `dense` (unit = tile).
    pub mode: String,
    /// Sample or tile.
    pub unit: Unit,
    /// Weight bytes (from the graph; 0 when no graph was given).
    pub parameter_bytes: u64,
    /// Peak live activation bytes per unit from the graph (the prior's `a`).
    pub activation_bytes_per_unit: Option<u64>,
    /// `M_fixed` of the cost model used.
    pub fixed_bytes: u64,
    /// `a` of the cost model used.
    pub per_unit_bytes: u64,
    /// Whether the model is the graph prior or calibrated.
    pub cost_source: CostSource,
    /// Calibration fit RMS residual, bytes.
    pub fit_rms_residual_bytes: Option<f64>,
    /// `r_frag`.
    pub frag_margin: f64,
    /// `ceil(budget_bytes * r_frag)`.
    pub frag_margin_bytes: u64,
    /// Every budget source.
    pub sources: Vec<SourceReport>,
    /// The source that binds (the minimum).
    pub binding_source: String,
    /// The binding source's bytes.
    pub available_bytes: u64,
    /// The reserve left to the rest of the system.
    pub reserve_bytes: u64,
    /// `available_bytes - reserve_bytes`.
    pub budget_bytes: u64,
    /// CPU only, integrated or discrete GPU.
    pub gpu: GpuKind,
    /// The Jetson model, when on one.
    pub device_model: Option<String>,
    /// The L4T release, when on a Jetson.
    pub l4t_release: Option<String>,
    /// The batch (units per run) that fits.
    pub batch_safe: u64,
    /// In dense mode, the same number counted as tiles.
    pub tiles_safe: Option<u64>,
    /// The memory formula's value before the caps.
    pub memory_limit_units: u64,
    /// What bound `batch_safe`: `memory`, `max_batch`, `scene`, `tiles` or `knee`.
    pub limited_by: Limit,
    /// The largest batch memory, `--max-batch` and the scene allow (B_safe before the knee).
    pub batch_ceiling: u64,
    /// What bound `batch_ceiling`.
    pub ceiling_limited_by: Limit,
    /// The configured maximum (`--max-batch`).
    pub max_units: u64,
    /// The plateau knee of a batch sweep, when one was given.
    pub knee: Option<u64>,
    /// `M(batch_safe)`.
    pub predicted_peak_bytes: u64,
    /// Things the reader should know (uncalibrated prior, unsized tensors, memory pressure).
    pub warnings: Vec<String>,
}

impl Plan {
    /// Builds the plan for `cost` within `system`'s budget. `graph` adds the parameter and
    /// activation breakdown and its warnings. Errors with [`BudgetError::DoesNotFit`] when not
    /// even one unit fits.
    pub fn build(
        system: &SystemBudget,
        cost: &CostModel,
        graph: Option<&GraphCost>,
        cfg: &ChooseConfig,
    ) -> Result<Plan, BudgetError> {
        let choice = safe_units(system.budget_bytes, cost, cfg)?;
        Self::from_choice(system, cost, graph, cfg, &choice)
    }

    /// [`Plan::build`] for a batch chosen by the caller (whose memory model is not the straight
    /// line of `cost`); `cost` is reported as the plan's cost model.
    pub fn from_choice(
        system: &SystemBudget,
        cost: &CostModel,
        graph: Option<&GraphCost>,
        cfg: &ChooseConfig,
        choice: &Choice,
    ) -> Result<Plan, BudgetError> {
        if choice.units_safe == 0 {
            return Err(BudgetError::DoesNotFit {
                unit: cost.unit,
                budget_bytes: system.budget_bytes,
                usable_bytes: choice.usable_bytes,
                fixed_bytes: cost.fixed_bytes,
                per_unit_bytes: cost.per_unit_bytes,
                binding: system.binding.name().to_string(),
            });
        }
        let mut warnings = Vec::new();
        if cost.source == CostSource::GraphPrior {
            warnings.push("cost is the graph prior, not calibrated: runtime workspaces are not counted".to_string());
        }
        if let Some(g) = graph
            && !g.unsized_tensors.is_empty()
        {
            warnings.push(format!(
                "{} activation tensors have no shape in the model (run ONNX shape inference); the activation estimate is a lower bound",
                g.unsized_tensors.len()
            ));
        }
        if let Some(p) = &system.psi
            && p.some_avg10 >= 10.0
        {
            warnings.push(format!(
                "memory pressure is high (PSI some avg10 {:.1}%): the budget may fall soon",
                p.some_avg10
            ));
        }
        let jetson = system.jetson.as_ref();
        Ok(Plan {
            mode: match cost.unit {
                Unit::Sample => "patch",
                Unit::Tile => "dense",
            }
            .to_string(),
            unit: cost.unit,
            parameter_bytes: graph.map_or(0, |g| g.parameter_bytes),
            activation_bytes_per_unit: graph.map(|g| g.activation_peak_bytes),
            fixed_bytes: cost.fixed_bytes,
            per_unit_bytes: cost.per_unit_bytes,
            cost_source: cost.source,
            fit_rms_residual_bytes: cost.fit_rms_residual_bytes,
            frag_margin: cfg.frag_margin,
            frag_margin_bytes: choice.frag_margin_bytes,
            sources: source_reports(system),
            binding_source: system.binding.name().to_string(),
            available_bytes: system.available_bytes,
            reserve_bytes: system.reserve_bytes,
            budget_bytes: system.budget_bytes,
            gpu: system.gpu,
            device_model: jetson.and_then(|j| j.model.clone()),
            l4t_release: jetson.and_then(|j| j.l4t_release.clone()),
            batch_safe: choice.units_safe,
            tiles_safe: (cost.unit == Unit::Tile).then_some(choice.units_safe),
            memory_limit_units: choice.memory_units,
            limited_by: choice.limited_by,
            batch_ceiling: choice.ceiling_units,
            ceiling_limited_by: choice.ceiling_limited_by,
            max_units: cfg.max_units,
            knee: cfg.knee,
            predicted_peak_bytes: choice.predicted_peak_bytes,
            warnings,
        })
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "memory plan ({} mode, unit = {})", self.mode, self.unit)?;
        if let Some(m) = &self.device_model {
            writeln!(
                f,
                "  device          {m}{}",
                self.l4t_release
                    .as_deref()
                    .map(|r| format!(" (L4T {r})"))
                    .unwrap_or_default()
            )?;
        }
        writeln!(f, "  budget sources:")?;
        for s in &self.sources {
            writeln!(
                f,
                "  {} {:<15} {:>10}  {}",
                if s.binds { "*" } else { " " },
                s.name,
                human(s.bytes),
                s.detail
            )?;
        }
        if self.budget_bytes < self.available_bytes {
            writeln!(
                f,
                "  budget          {} = {} ({}) - reserve {}",
                human(self.budget_bytes),
                human(self.available_bytes),
                self.binding_source,
                human(self.reserve_bytes)
            )?;
        } else {
            writeln!(
                f,
                "  budget          {} ({}: this workload's own share, no system reserve taken off)",
                human(self.budget_bytes),
                self.binding_source
            )?;
        }
        writeln!(
            f,
            "  fragmentation   {} ({:.0} %)",
            human(self.frag_margin_bytes),
            self.frag_margin * 100.0
        )?;
        // Without a graph there is no breakdown to show, only the cost model below.
        if let Some(a) = self.activation_bytes_per_unit {
            writeln!(f, "  parameters      {}", human(self.parameter_bytes))?;
            writeln!(f, "  activations     {} per {} (graph peak)", human(a), self.unit)?;
        }
        let source = match self.cost_source {
            CostSource::GraphPrior => "graph prior".to_string(),
            CostSource::Calibrated => format!(
                "calibrated, rms residual {}",
                human(self.fit_rms_residual_bytes.unwrap_or(0.0).max(0.0) as u64)
            ),
            CostSource::Given => "given".to_string(),
        };
        writeln!(
            f,
            "  cost            M(B) = {} + {} * B ({source})",
            human(self.fixed_bytes),
            human(self.per_unit_bytes)
        )?;
        if self.batch_ceiling > self.batch_safe {
            writeln!(
                f,
                "  batch_safe      {} {}s, limited by {} (below the ceiling {}, set by {}; memory allows {})",
                self.batch_safe,
                self.unit,
                self.limited_by,
                self.batch_ceiling,
                self.ceiling_limited_by,
                self.memory_limit_units
            )?;
        } else {
            writeln!(
                f,
                "  batch_safe      {} {}s, limited by {} (memory allows {})",
                self.batch_safe, self.unit, self.limited_by, self.memory_limit_units
            )?;
        }
        write!(f, "  predicted peak  {}", human(self.predicted_peak_bytes))?;
        for w in &self.warnings {
            write!(f, "\n  warning: {w}")?;
        }
        Ok(())
    }
}

/// A system budget and a graph cost for the plan tests (here and in `budget::training`).
#[cfg(test)]
pub(super) mod fixtures {
    use crate::budget::system::{BudgetSource, GpuKind, MemInfo, SourceKind, SystemBudget};
    use crate::graph::GraphCost;

    pub const MIB: u64 = 1 << 20;

    pub fn system(budget: u64) -> SystemBudget {
        SystemBudget {
            sources: vec![
                BudgetSource {
                    kind: SourceKind::MemAvailable,
                    bytes: budget + 2 * budget,
                    detail: "MemAvailable".into(),
                },
                BudgetSource {
                    kind: SourceKind::TegraEstimate,
                    bytes: budget + 512 * MIB,
                    detail: "tegra".into(),
                },
            ],
            binding: SourceKind::TegraEstimate,
            available_bytes: budget + 512 * MIB,
            reserve_bytes: 512 * MIB,
            budget_bytes: budget,
            meminfo: MemInfo {
                total_bytes: 8 << 30,
                free_bytes: 0,
                available_bytes: 0,
                swap_total_bytes: 0,
                swap_free_bytes: 0,
                nvmap_used_bytes: None,
            },
            cgroup: None,
            jetson: None,
            gpu: GpuKind::Integrated,
            psi: None,
        }
    }

    pub fn graph() -> GraphCost {
        GraphCost {
            parameter_bytes: 20 * MIB,
            parameter_tensors: 10,
            activation_peak_bytes: 2 * MIB,
            peak_node: Some("conv3".into()),
            activation_total_bytes: 10 * MIB,
            input_bytes: MIB,
            output_bytes: 64,
            node_count: 12,
            unsized_tensors: vec!["t1".into()],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::{MIB, graph, system};
    use super::*;

    #[test]
    fn plan_json_has_contract_fields() {
        let g = graph();
        let cost = CostModel::from_graph(&g, Unit::Tile, 64 * MIB);
        let plan = Plan::build(&system(1024 * MIB), &cost, Some(&g), &ChooseConfig::default()).unwrap();
        // (1024*0.9 - 84) / 2 = 418.8 -> 418.
        assert_eq!(plan.batch_safe, 418);
        assert_eq!(plan.tiles_safe, Some(418));
        let v = serde_json::to_value(&plan).unwrap();
        for k in [
            "batch_safe",
            "budget_bytes",
            "predicted_peak_bytes",
            "binding_source",
            "tiles_safe",
            "sources",
        ] {
            assert!(v.get(k).is_some(), "missing {k}");
        }
        assert_eq!(v["binding_source"], "tegra_estimate");
        assert_eq!(v["sources"][1]["binds"], true);
        assert_eq!(plan.warnings.len(), 2);
        let text = plan.to_string();
        assert!(text.contains("batch_safe      418 tiles"), "{text}");
        assert!(text.contains("* tegra_estimate"), "{text}");
    }

    #[test]
    fn plan_does_not_fit() {
        let cost = CostModel::new(Unit::Sample, 2048 * MIB, MIB);
        let err = Plan::build(&system(1024 * MIB), &cost, None, &ChooseConfig::default()).unwrap_err();
        assert!(err.to_string().contains("tegra_estimate"), "{err}");
    }
}
