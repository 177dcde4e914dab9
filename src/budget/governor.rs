//! Adapting the batch while other processes take and give back memory.
//!
//! The pipeline asks [`Governor::should_check`] after every batch; it says yes every
//! `check_every` batches and at once when PSI `some avg10` crosses the threshold. On a check the
//! pipeline re-reads the budget (with its own current holding as
//! [`BudgetConfig::own_bytes`](super::BudgetConfig::own_bytes)) and calls
//! [`Governor::observe`]:
//!
//! * budget below what the current batch needs: shrink at once to the new `B_safe` (before the
//!   next run, so the run that would cross the wall never starts);
//! * budget healthy and no memory pressure: grow by `grow_factor` (at least +1), never above
//!   the new `B_safe` nor the starting batch, and only once `B_safe` is a twentieth of the batch
//!   (at least one unit) above it or back at the starting batch;
//! * not even one unit fits: set 1 and report [`Cause::Exhausted`] every check, so the caller
//!   can pause instead of running into the OOM killer.

use std::fmt;
use std::path::Path;

use serde::Serialize;

use super::BudgetError;
use super::choose::{ChooseConfig, safe_units};
use super::cost::CostModel;
use super::system::{BudgetConfig, Psi, read_system_budget};

/// How the governor adapts.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GovernorConfig {
    /// The batch formula's settings (fragmentation margin, caps).
    pub choose: ChooseConfig,
    /// Growth per healthy check, > 1 (1.25 = +25 %).
    pub grow_factor: f64,
    /// Batches between regular checks, at least 1.
    pub check_every: u64,
    /// PSI `some avg10` (percent) at or above which memory is under pressure: a crossing
    /// triggers a check, and growth waits while it lasts.
    pub psi_threshold: f64,
}

impl From<&ChooseConfig> for GovernorConfig {
    fn from(choose: &ChooseConfig) -> Self {
        Self {
            choose: choose.clone(),
            grow_factor: 1.25,
            check_every: 8,
            psi_threshold: 10.0,
        }
    }
}

impl Default for GovernorConfig {
    fn default() -> Self {
        Self::from(&ChooseConfig::default())
    }
}

/// Why the batch changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Cause {
    /// The budget fell below what the batch needs.
    BudgetFell,
    /// Not even one unit fits; the batch is 1 and the caller should pause.
    Exhausted,
    /// The budget recovered; the batch grows back.
    Recovered,
    /// The GPU's free memory (another process took some) capped the batch below the governor's.
    DeviceFell,
    /// The GPU's free memory came back; the device cap lifted.
    DeviceRecovered,
    /// The provider's device arena could not hold the first batch (the plan's device line
    /// under-counted it); the scene starts again at the next smaller bucket.
    DeviceOutOfMemory,
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::BudgetFell => "budget fell",
            Self::Exhausted => "budget exhausted",
            Self::Recovered => "budget recovered",
            Self::DeviceFell => "device memory fell",
            Self::DeviceRecovered => "device memory recovered",
            Self::DeviceOutOfMemory => "device arena out of memory",
        })
    }
}

/// One change of the batch.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Adjustment {
    /// The batch before.
    pub old: u64,
    /// The batch from the next run on.
    pub new: u64,
    /// Why.
    pub cause: Cause,
    /// The budget observed (after the reserve).
    pub budget_bytes: u64,
    /// The budget the old batch needed: `M(old) / (1 - r_frag)`.
    pub needed_bytes: u64,
    /// PSI `some avg10` at the check, when known.
    pub psi_some_avg10: Option<f64>,
}

impl fmt::Display for Adjustment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
        write!(
            f,
            "batch {} -> {} ({}): budget {:.0} MiB, batch {} needed {:.0} MiB",
            self.old,
            self.new,
            self.cause,
            mib(self.budget_bytes),
            self.old,
            mib(self.needed_bytes)
        )?;
        if let Some(p) = self.psi_some_avg10 {
            write!(f, ", PSI some avg10 {p:.2}%")?;
        }
        Ok(())
    }
}

/// Keeps the batch within the budget as it changes.
#[derive(Debug, Clone)]
pub struct Governor {
    cost: CostModel,
    cfg: GovernorConfig,
    ceiling: u64,
    current: u64,
    last_check: Option<u64>,
    last_psi: Option<f64>,
    history: Vec<Adjustment>,
}

impl Governor {
    /// Starts at `start_units` (normally the plan's `batch_safe`), which is also the ceiling
    /// growth never passes.
    pub fn new(cost: CostModel, start_units: u64, cfg: GovernorConfig) -> Result<Self, BudgetError> {
        cfg.choose.validate()?;
        if start_units == 0 {
            return Err(BudgetError::Config {
                field: "start_units",
                value: "0".into(),
                why: "the starting batch must be at least 1",
            });
        }
        if !(cfg.grow_factor > 1.0 && cfg.grow_factor.is_finite()) {
            return Err(BudgetError::Config {
                field: "grow_factor",
                value: cfg.grow_factor.to_string(),
                why: "must be a finite number above 1",
            });
        }
        if cfg.check_every == 0 {
            return Err(BudgetError::Config {
                field: "check_every",
                value: "0".into(),
                why: "must be at least 1",
            });
        }
        Ok(Self {
            cost,
            cfg,
            ceiling: start_units,
            current: start_units,
            last_check: None,
            last_psi: None,
            history: Vec::new(),
        })
    }

    /// The batch to run next.
    pub fn current(&self) -> u64 {
        self.current
    }

    /// The batch the governor started from and never grows past.
    pub fn ceiling(&self) -> u64 {
        self.ceiling
    }

    /// Every change so far.
    pub fn history(&self) -> &[Adjustment] {
        &self.history
    }

    /// Whether to re-read the budget after batch number `batch_index`: every `check_every`
    /// batches, or when `psi`'s `some avg10` has just risen to the threshold.
    pub fn should_check(&mut self, batch_index: u64, psi: Option<&Psi>) -> bool {
        let avg10 = psi.map(|p| p.some_avg10);
        let crossed = match avg10 {
            Some(v) => v >= self.cfg.psi_threshold && self.last_psi.is_none_or(|l| l < self.cfg.psi_threshold),
            None => false,
        };
        if avg10.is_some() {
            self.last_psi = avg10;
        }
        let due = self
            .last_check
            .is_none_or(|l| batch_index.saturating_sub(l) >= self.cfg.check_every);
        if due || crossed {
            self.last_check = Some(batch_index);
            true
        } else {
            false
        }
    }

    /// Takes a new budget (after the reserve, with the process's own holding added back) and
    /// returns the change it causes, if any. See the module docs for the rules.
    pub fn observe(&mut self, budget_bytes: u64, psi: Option<&Psi>) -> Option<Adjustment> {
        let avg10 = psi.map(|p| p.some_avg10);
        if avg10.is_some() {
            self.last_psi = avg10;
        }
        let pressured = avg10.is_some_and(|v| v >= self.cfg.psi_threshold);
        // validate() passed in new(), so this cannot fail; treat a failure as "nothing fits".
        let fits = safe_units(budget_bytes, &self.cost, &self.cfg.choose)
            .map(|c| c.units_safe)
            .unwrap_or(0);
        let fit = fits.min(self.ceiling);
        let keep = 1.0 - self.cfg.choose.frag_margin;
        let needed_bytes = (self.cost.predict(self.current) as f64 / keep).ceil() as u64;
        let old = self.current;
        let (new, cause) = if fit == 0 {
            (1, Cause::Exhausted)
        } else if fit < old {
            (fit, Cause::BudgetFell)
        } else if old < self.ceiling && !pressured {
            // A dead band: growth waits until a twentieth of the batch (at least one unit) more
            // fits, or the starting batch does, so a budget wavering by a unit does not cut and grow the batch in turn (each
            // new shape may cost an algorithm search or an engine build on a GPU).
            if fits < old.saturating_add((old / 20).max(1)).min(self.ceiling) {
                return None;
            }
            let grown = ((old as f64) * self.cfg.grow_factor).ceil() as u64;
            let new = grown.max(old + 1).min(fit);
            if new == old {
                return None;
            }
            (new, Cause::Recovered)
        } else {
            return None;
        };
        self.current = new;
        let adj = Adjustment {
            old,
            new,
            cause,
            budget_bytes,
            needed_bytes,
            psi_some_avg10: avg10,
        };
        self.history.push(adj.clone());
        Some(adj)
    }

    /// Reads the system under `root` with `cfg` and calls [`Governor::observe`].
    pub fn check(&mut self, root: &Path, cfg: &BudgetConfig) -> Result<Option<Adjustment>, BudgetError> {
        let b = read_system_budget(root, cfg)?;
        Ok(self.observe(b.budget_bytes, b.psi.as_ref()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::cost::Unit;

    const MIB: u64 = 1 << 20;

    fn gov() -> Governor {
        // M(B) = 100 MiB + 1 MiB * B, r_frag = 0 for round numbers.
        let cost = CostModel::new(Unit::Sample, 100 * MIB, MIB);
        let choose = ChooseConfig {
            frag_margin: 0.0,
            max_units: 10_000,
            ..ChooseConfig::default()
        };
        Governor::new(cost, 400, GovernorConfig::from(&choose)).unwrap()
    }

    fn psi(v: f64) -> Psi {
        Psi {
            some_avg10: v,
            some_avg60: 0.0,
            some_avg300: 0.0,
            some_total_us: 0,
            full_avg10: None,
        }
    }

    #[test]
    fn shrink_then_grow_back_slowly() {
        let mut g = gov();
        assert_eq!(g.observe(600 * MIB, None), None); // 500 would fit, but 400 is the ceiling
        let a = g.observe(300 * MIB, None).unwrap();
        assert_eq!((a.old, a.new, a.cause), (400, 200, Cause::BudgetFell));
        assert_eq!(a.needed_bytes, 500 * MIB);
        let mut seq = vec![g.current()];
        for _ in 0..6 {
            if let Some(a) = g.observe(1000 * MIB, None) {
                assert_eq!(a.cause, Cause::Recovered);
            }
            seq.push(g.current());
        }
        assert_eq!(seq, vec![200, 250, 313, 392, 400, 400, 400]);
        assert_eq!(g.history().len(), 5);
    }

    #[test]
    fn growth_bounded_by_budget_and_pressure() {
        let mut g = gov();
        g.observe(150 * MIB, None);
        assert_eq!(g.current(), 50);
        // Healthy but tight: 60 fits, +25 % would be 63.
        assert_eq!(g.observe(160 * MIB, None).map(|a| a.new), Some(60));
        // Pressure holds growth.
        assert_eq!(g.observe(1000 * MIB, Some(&psi(25.0))), None);
        assert_eq!(g.current(), 60);
        assert_eq!(g.observe(1000 * MIB, Some(&psi(1.0))).map(|a| a.new), Some(75));
    }

    #[test]
    fn a_budget_wavering_by_a_unit_cuts_the_batch_once_and_does_not_grow_it_back() {
        let mut g = gov();
        g.observe(450 * MIB, None);
        assert_eq!(g.current(), 350);
        let changes: Vec<u64> = [449, 450, 449, 450, 449, 450]
            .iter()
            .filter_map(|&b| g.observe(b * MIB, None).map(|a| a.new))
            .collect();
        assert_eq!(changes, [349]);
        // A real recovery still grows it.
        assert_eq!(g.observe(1000 * MIB, None).map(|a| a.new), Some(400));
    }

    #[test]
    fn exhausted_reports_every_check() {
        let mut g = gov();
        let a = g.observe(50 * MIB, None).unwrap();
        assert_eq!((a.new, a.cause), (1, Cause::Exhausted));
        let a = g.observe(50 * MIB, None).unwrap();
        assert_eq!((a.old, a.new, a.cause), (1, 1, Cause::Exhausted));
        assert_eq!(g.observe(102 * MIB, None).map(|a| a.new), Some(2));
    }

    #[test]
    fn check_cadence_and_psi_crossing() {
        let mut g = gov();
        assert!(g.should_check(0, None));
        assert!(!g.should_check(3, Some(&psi(2.0))));
        assert!(g.should_check(4, Some(&psi(12.0)))); // crossed upward
        assert!(!g.should_check(5, Some(&psi(15.0)))); // still above: no new crossing
        assert!(g.should_check(12, Some(&psi(15.0)))); // regular cadence
        assert!(!g.should_check(13, Some(&psi(3.0))));
        assert!(g.should_check(14, Some(&psi(11.0))));
    }

    #[test]
    fn rejects_bad_config() {
        let cost = CostModel::new(Unit::Sample, 1, 1);
        assert!(Governor::new(cost.clone(), 0, GovernorConfig::default()).is_err());
        let cfg = GovernorConfig {
            grow_factor: 1.0,
            ..GovernorConfig::default()
        };
        assert!(Governor::new(cost, 4, cfg).is_err());
    }
}
