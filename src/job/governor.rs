//! The memory governor of a `--batch auto` run: between batches it re-reads the host budget and a
//! discrete GPU's free memory and cuts or restores the batch.

use super::*;

/// The governor looks at memory (PSI, then the budget when due) at most this often. Reading the
/// budget takes about 0.2 ms (`/proc/meminfo`, the cgroup, `/proc/self/status`): after every
/// batch, that is as much again as a small batch's inference.
pub const GOVERNOR_MIN_INTERVAL: std::time::Duration = std::time::Duration::from_millis(10);

/// The memory governor as a pipeline [`pipeline::Adapt`]: re-reads the budget every few batches
/// (at most every [`GOVERNOR_MIN_INTERVAL`]) and when memory pressure rises, and logs each change
/// with its cause on stderr.
pub(super) struct BudgetGovernor {
    governor: budget::Governor,
    root: PathBuf,
    reserve_bytes: u64,
    last_look: Option<std::time::Instant>,
    pub(super) changes: Vec<Adjustment>,
    /// A discrete GPU's part of the plan and a reader of its free memory now: the batch is also
    /// capped where the device's line meets what is free besides what this run holds.
    device: Option<(budget::device::DevicePlan, DeviceFree)>,
    /// The batch the device allows now (`u64::MAX` without a device).
    device_cap: u64,
    /// The largest batch run so far: what the provider's arena may still hold.
    largest: u64,
    frag_margin: f64,
}

/// Reads a device's free memory now, bytes (`None` when it cannot be read).
type DeviceFree = Box<dyn FnMut() -> Option<u64> + Send>;

impl BudgetGovernor {
    pub(super) fn new(
        auto: &AutoBatch,
        settings: &BudgetSettings,
        gpu_ordinal: Option<usize>,
    ) -> Result<Self, JobError> {
        let cost = CostModel {
            unit: auto.plan.unit,
            fixed_bytes: auto.plan.fixed_bytes,
            per_unit_bytes: auto.plan.per_unit_bytes,
            source: auto.plan.cost_source,
            fit_rms_residual_bytes: auto.plan.fit_rms_residual_bytes,
        };
        let cfg = budget::GovernorConfig {
            check_every: settings.check_every.max(1),
            ..budget::GovernorConfig::from(&ChooseConfig {
                frag_margin: settings.frag_margin,
                max_units: settings.max_units,
                ..ChooseConfig::default()
            })
        };
        Ok(Self {
            governor: budget::Governor::new(cost, auto.plan.batch_safe.max(1), cfg)?,
            root: settings.root.clone(),
            reserve_bytes: settings.reserve_bytes,
            last_look: None,
            changes: Vec::new(),
            device: auto
                .device
                .clone()
                .filter(|d| d.source != budget::device::DeviceSource::Shared)
                .zip(gpu_ordinal)
                .map(|(d, ordinal)| {
                    let read: DeviceFree =
                        Box::new(move || crate::gpu::probe(ordinal).ok().flatten().map(|i| i.free_bytes));
                    (d, read)
                }),
            device_cap: u64::MAX,
            largest: 0,
            frag_margin: settings.frag_margin,
        })
    }

    fn check(&mut self) -> Option<Adjustment> {
        let cfg = BudgetConfig {
            reserve_bytes: self.reserve_bytes,
            own_bytes: anon_bytes(&self.root),
            device: None,
        };
        match self.governor.check(&self.root, &cfg) {
            Ok(change) => change,
            Err(e) => {
                eprintln!("hsiedge: warning: memory budget re-read failed, batch kept: {e}");
                None
            }
        }
    }
    /// Re-reads the host budget and applies the governor's change, waiting while nothing fits.
    fn check_host(&mut self) {
        let mut change = self.check();
        // Nothing fits: wait for memory to come back rather than run into the wall, looking
        // again after 0.1 s, then less often up to every 2 s, for up to EXHAUSTED_WAIT.
        let started = std::time::Instant::now();
        let mut pause = std::time::Duration::from_millis(100);
        while change.as_ref().is_some_and(|c| c.cause == budget::Cause::Exhausted) {
            if started.elapsed() >= EXHAUSTED_WAIT {
                eprintln!(
                    "hsiedge: warning: no memory came back in {} s: going on at batch 1, whose buffers the run holds already",
                    EXHAUSTED_WAIT.as_secs()
                );
                break;
            }
            if let Some(c) = change.take() {
                eprintln!("hsiedge: {c}; waiting for memory");
                self.changes.push(c);
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(std::time::Duration::from_secs(2));
            change = self.check();
        }
        if let Some(c) = change {
            eprintln!("hsiedge: {c}");
            self.changes.push(c);
        }
    }
}

/// How long a run waits for memory to come back when not even one unit fits.
const EXHAUSTED_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

impl pipeline::Adapt for BudgetGovernor {
    fn after_batch(&mut self, batches_done: u64, current: usize) -> usize {
        if self.last_look.is_some_and(|t| t.elapsed() < GOVERNOR_MIN_INTERVAL) {
            return current;
        }
        self.last_look = Some(std::time::Instant::now());
        let psi = budget::read_psi(&self.root).ok().flatten();
        // The host budget is re-read when due (every few batches, or when pressure rises); the
        // device's free memory (a few driver calls) after every batch.
        if self.governor.should_check(batches_done, psi.as_ref()) {
            self.check_host();
        }
        if let Some((plan, read)) = self.device.as_mut()
            && let Some(free) = read()
        {
            self.largest = self.largest.max(current as u64);
            let cap = plan.cap_now(free, current as u64, self.largest, self.frag_margin);
            let host = self.governor.current();
            let (before, after) = (host.min(self.device_cap), host.min(cap));
            if before != after {
                let change = Adjustment {
                    old: before,
                    new: after,
                    cause: if after < before {
                        budget::Cause::DeviceFell
                    } else {
                        budget::Cause::DeviceRecovered
                    },
                    budget_bytes: free.saturating_add(plan.added_at(current as u64)),
                    needed_bytes: plan.added_at(before),
                    psi_some_avg10: None,
                };
                eprintln!("hsiedge: {change} ({} MiB free on the device)", free >> 20);
                self.changes.push(change);
            }
            self.device_cap = cap;
        }
        usize::try_from(self.governor.current().min(self.device_cap)).unwrap_or(current)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::Adapt;

    /// A governor whose host budget is never due and whose device reports `free` in turn.
    fn governed(free: Vec<u64>) -> BudgetGovernor {
        let g = 1u64 << 30;
        let cost = CostModel {
            unit: Unit::Tile,
            fixed_bytes: 0,
            per_unit_bytes: 1 << 20,
            source: budget::CostSource::Calibrated,
            fit_rms_residual_bytes: None,
        };
        let cfg = budget::GovernorConfig {
            check_every: u64::MAX,
            ..budget::GovernorConfig::default()
        };
        // 256 MiB a unit on the device, nothing fixed.
        let plan = budget::device::DevicePlan::discrete(8 * g, None, 0, vec![(1, 256 << 20), (4, 1024 << 20)], 0.0);
        let mut free = free.into_iter();
        BudgetGovernor {
            governor: budget::Governor::new(cost, 16, cfg).unwrap(),
            root: PathBuf::from("/nonexistent-root"),
            reserve_bytes: 0,
            last_look: None,
            changes: Vec::new(),
            device: Some((plan, Box::new(move || free.next()))),
            device_cap: u64::MAX,
            largest: 0,
            frag_margin: 0.0,
        }
    }

    #[test]
    fn another_process_taking_device_memory_cuts_the_batch_and_its_return_restores_it() {
        let g = 1u64 << 30;
        // Free: 8 GiB, then nothing besides what the run holds, then 8 GiB again.
        let mut gov = governed(vec![8 * g, 0, 8 * g]);
        let next = |gov: &mut BudgetGovernor, done: u64, current: usize| {
            std::thread::sleep(GOVERNOR_MIN_INTERVAL);
            gov.after_batch(done, current)
        };
        // The first look is due for the host budget too; with no readable budget it keeps 16.
        assert_eq!(next(&mut gov, 1, 16), 16);
        assert!(gov.changes.is_empty());
        // At 16 units the run holds 4 GiB; with nothing else free, 16 still fit exactly.
        assert_eq!(next(&mut gov, 2, 16), 16);
        assert!(gov.changes.is_empty());
        let mut gov = governed(vec![0, 8 * g]);
        // At 16 units with 2 GiB held (a smaller batch ran): 8 units fit.
        assert_eq!(next(&mut gov, 1, 8), 8);
        let c = &gov.changes[0];
        assert_eq!((c.old, c.new, c.cause), (16, 8, budget::Cause::DeviceFell));
        assert_eq!(next(&mut gov, 2, 8), 16);
        let c = &gov.changes[1];
        assert_eq!((c.old, c.new, c.cause), (8, 16, budget::Cause::DeviceRecovered));
    }
}
