//! Device memory in the plan: a GPU provider's session holds its arena, workspaces and batch
//! buffers on the device, outside the process's RSS. Calibration measures the device memory each
//! probe batch adds (its peak over what was in use before it), a straight line is fitted, and the
//! batch is capped where that line meets the device's budget: its free memory (or the provider's
//! `gpu_mem_limit`, the arena's bound) on a discrete GPU. On an integrated GPU (Jetson) device
//! memory is the host's, whose budget (the Tegra estimate) already binds: there the line is added
//! to the host's cost instead.

use serde::Serialize;

/// Where the device budget came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DeviceSource {
    /// The discrete GPU's free memory when the plan was made.
    DeviceFree,
    /// The CUDA provider's arena bound (`--gpu-mem-limit-mib`), below the free memory.
    GpuMemLimit,
    /// An integrated GPU: the host's budget, the device's cost added to the host's.
    Shared,
}

/// The device's part of a memory plan.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DevicePlan {
    /// Where the budget came from.
    pub source: DeviceSource,
    /// Device memory the run may add, bytes (0 on an integrated GPU: the host budget binds).
    pub budget_bytes: u64,
    /// `budget_bytes` less the fragmentation margin.
    pub usable_bytes: u64,
    /// Device memory in use before calibration (context, weights, other processes), bytes.
    pub used_before_bytes: u64,
    /// The fitted line: device bytes a run adds at batch 0 (workspaces, handles)...
    pub fixed_bytes: u64,
    /// ... and per unit (input, activations, output), at least the graph's own estimate.
    pub per_unit_bytes: u64,
    /// The slope the calibration samples gave, before the graph's floor.
    pub fitted_per_unit_bytes: u64,
    /// What calibration measured: (batch, device bytes added at its peak).
    pub samples: Vec<(u64, u64)>,
    /// The largest batch whose added device memory fits `usable_bytes` (`u64::MAX` when shared).
    pub units_safe: u64,
    /// Whether the device, not the host, bound the batch.
    pub binding: bool,
    /// The batch the plan chose.
    pub batch: u64,
    /// Device memory in use at the chosen batch's peak: `used_before + fixed + per_unit * batch`.
    pub predicted_peak_bytes: u64,
}

/// The least-squares line through `samples` (batch, bytes): (intercept, slope), neither below 0.
/// One sample, or samples at one batch, give a line through the origin.
pub fn fit(samples: &[(u64, u64)]) -> (u64, u64) {
    let n = samples.len() as f64;
    if samples.is_empty() {
        return (0, 0);
    }
    let mx = samples.iter().map(|s| s.0 as f64).sum::<f64>() / n;
    let my = samples.iter().map(|s| s.1 as f64).sum::<f64>() / n;
    let sxx: f64 = samples.iter().map(|s| (s.0 as f64 - mx).powi(2)).sum();
    if sxx == 0.0 {
        return (0, (my / mx.max(1.0)).ceil() as u64);
    }
    let sxy: f64 = samples.iter().map(|s| (s.0 as f64 - mx) * (s.1 as f64 - my)).sum();
    let slope = (sxy / sxx).max(0.0);
    let intercept = (my - slope * mx).max(0.0);
    (intercept.round() as u64, slope.round() as u64)
}

/// The largest batch `b` with `fixed + per_unit * b <= usable` (0 when not even the fixed part fits).
pub fn units_fitting(fixed: u64, per_unit: u64, usable: u64) -> u64 {
    match usable.checked_sub(fixed) {
        None => 0,
        Some(_) if per_unit == 0 => u64::MAX,
        Some(room) => room / per_unit,
    }
}

impl DevicePlan {
    /// The plan for a discrete GPU with `free` bytes free (and the arena bounded by `limit`, if
    /// given) after `used_before` were in use, from calibration `samples`, keeping `frag_margin`
    /// of the budget back.
    pub fn discrete(
        free: u64,
        limit: Option<u64>,
        used_before: u64,
        samples: Vec<(u64, u64)>,
        frag_margin: f64,
    ) -> Self {
        let (source, budget) = match limit {
            Some(l) if l < free => (DeviceSource::GpuMemLimit, l),
            _ => (DeviceSource::DeviceFree, free),
        };
        let usable = budget.saturating_sub((budget as f64 * frag_margin).ceil() as u64);
        let (fixed, per_unit) = fit(&samples);
        Self {
            source,
            budget_bytes: budget,
            usable_bytes: usable,
            used_before_bytes: used_before,
            fixed_bytes: fixed,
            per_unit_bytes: per_unit,
            fitted_per_unit_bytes: per_unit,
            samples,
            units_safe: units_fitting(fixed, per_unit, usable),
            binding: false,
            batch: 0,
            predicted_peak_bytes: used_before + fixed,
        }
    }

    /// The plan for an integrated GPU: the fitted line is added to the host's cost.
    pub fn shared(used_before: u64, samples: Vec<(u64, u64)>) -> Self {
        let (fixed, per_unit) = fit(&samples);
        Self {
            source: DeviceSource::Shared,
            budget_bytes: 0,
            usable_bytes: 0,
            used_before_bytes: used_before,
            fixed_bytes: fixed,
            per_unit_bytes: per_unit,
            fitted_per_unit_bytes: per_unit,
            samples,
            units_safe: u64::MAX,
            binding: false,
            batch: 0,
            predicted_peak_bytes: used_before + fixed,
        }
    }

    /// Raises the fitted per-unit cost to at least `floor` (what the graph itself says a unit
    /// holds): small calibration probes can sit inside memory the arena or the driver already
    /// rounded up, and a slope fitted there must not let a large batch through.
    pub fn at_least_per_unit(mut self, floor: u64) -> Self {
        if self.per_unit_bytes < floor {
            self.per_unit_bytes = floor;
            if self.source != DeviceSource::Shared {
                self.units_safe = units_fitting(self.fixed_bytes, floor, self.usable_bytes);
            }
        }
        self
    }

    /// Device bytes a run at `batch` adds.
    pub fn added_at(&self, batch: u64) -> u64 {
        self.fixed_bytes
            .saturating_add(self.per_unit_bytes.saturating_mul(batch))
    }

    /// The governor's device cap while a run goes on (another process taking device memory lowers
    /// it), at least 1. The run holds what its largest batch so far needed (`largest`: the arena
    /// keeps a larger batch's regions after a cut), so a cut is where the line meets the memory
    /// free now plus that, less `frag_margin`; a cut batch does not shrink its own room and cut
    /// again. Growth above `current` is only what the memory free now takes on its own, less the
    /// margin: regions the arena gave back are free memory already and are not counted twice.
    pub fn cap_now(&self, free: u64, current: u64, largest: u64, frag_margin: f64) -> u64 {
        let margin = |b: u64| b.saturating_sub((b as f64 * frag_margin).ceil() as u64);
        let room = free.saturating_add(self.added_at(largest.max(current)));
        let cap = units_fitting(self.fixed_bytes, self.per_unit_bytes, margin(room)).max(1);
        if cap <= current {
            return cap;
        }
        let grow = margin(free).checked_div(self.per_unit_bytes).unwrap_or(u64::MAX);
        cap.min(current.saturating_add(grow)).max(1)
    }

    /// Records the batch the plan chose, and whether the device bound it.
    pub fn chose(&mut self, batch: u64, binding: bool) {
        self.batch = batch;
        self.binding = binding;
        self.predicted_peak_bytes = self.used_before_bytes.saturating_add(self.added_at(batch));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_through_exact_samples_is_recovered() {
        let s = [(1, 100 + 30), (4, 100 + 120), (8, 100 + 240)];
        assert_eq!(fit(&s), (100, 30));
        // At one batch only: through the origin.
        assert_eq!(fit(&[(4, 400), (4, 400)]), (0, 100));
        assert_eq!(fit(&[]), (0, 0));
        // A falling line (noise) never gives a negative slope.
        assert_eq!(fit(&[(1, 500), (8, 400)]).1, 0);
    }

    #[test]
    fn the_device_caps_the_batch_where_its_line_meets_the_usable_budget() {
        // 10 GiB free, 10 % margin: 9 GiB usable; 1 GiB fixed, 256 MiB a unit -> 32 units.
        let g = 1u64 << 30;
        let samples = vec![(1, g + (256 << 20)), (4, g + (1024 << 20)), (8, g + (2048 << 20))];
        let mut p = DevicePlan::discrete(10 * g, None, 600 << 20, samples.clone(), 0.10);
        assert_eq!(p.source, DeviceSource::DeviceFree);
        assert_eq!(p.usable_bytes, 9 * g);
        assert_eq!((p.fixed_bytes, p.per_unit_bytes), (g, 256 << 20));
        assert_eq!(p.units_safe, 32);
        p.chose(32, true);
        assert_eq!(p.predicted_peak_bytes, (600 << 20) + 9 * g);
        // An 8 GiB arena bound below the free memory binds instead: 7.2 GiB usable -> 24 units.
        let l = DevicePlan::discrete(10 * g, Some(8 * g), 0, samples, 0.10);
        assert_eq!(l.source, DeviceSource::GpuMemLimit);
        assert_eq!(l.units_safe, ((8 * g - (8 * g / 10 + 1)) - g) / (256 << 20));
        assert!(l.added_at(l.units_safe) <= l.usable_bytes && l.added_at(l.units_safe + 1) > l.usable_bytes);
    }

    #[test]
    fn the_running_cap_falls_when_another_process_takes_device_memory() {
        let g = 1u64 << 30;
        let p = DevicePlan::discrete(10 * g, None, 0, vec![(1, g + g / 4), (8, g + 2 * g)], 0.0);
        // At batch 8 the run holds 3 GiB; 7 GiB free: 10 GiB room -> 36 units.
        assert_eq!(p.cap_now(7 * g, 8, 8, 0.0), 36);
        // Another process takes 6 GiB: 4 GiB room -> 12 units.
        assert_eq!(p.cap_now(g, 8, 8, 0.0), 12);
        // Nothing free beyond the run's own: its own batch still fits, never below 1.
        assert_eq!(p.cap_now(0, 8, 8, 0.0), 8);
        assert_eq!(p.cap_now(0, 0, 0, 0.5), 1);
    }

    #[test]
    fn a_cut_batch_does_not_cut_itself_again_and_grows_only_into_free_memory() {
        let g = 1u64 << 30;
        // 1 GiB fixed, 256 MiB a unit; a 10 % margin.
        let p = DevicePlan::discrete(10 * g, None, 0, vec![(1, g + g / 4), (8, g + 2 * g)], 0.0);
        // At 16 units the run holds 5 GiB; nothing else free: 4.5 GiB usable -> 14 units.
        let first = p.cap_now(0, 16, 16, 0.10);
        assert_eq!(first, 14);
        // Cut to 8 (a bucket), the arena still holding the 16-unit regions: the room is the same,
        // so 8 stays (not cut again and again down to 1), and nothing free lets it grow.
        assert_eq!(p.cap_now(0, 8, 16, 0.10), 8);
        // Growth from 8 needs free memory of its own: 1 GiB free (90 % usable) -> 3 more units.
        assert_eq!(p.cap_now(g, 8, 16, 0.10), 11);
    }

    #[test]
    fn a_flat_fit_is_raised_to_the_graphs_floor() {
        let g = 1u64 << 30;
        // Small probes inside memory already rounded up: a slope of 1 KiB a unit.
        let samples = vec![(8, g + (8 << 10)), (32, g + (32 << 10)), (128, g + (128 << 10))];
        let p = DevicePlan::discrete(10 * g, Some(8 * g), 0, samples, 0.0);
        assert_eq!(p.per_unit_bytes, 1 << 10);
        let raised = p.clone().at_least_per_unit(200 << 10);
        assert_eq!(
            (raised.per_unit_bytes, raised.fitted_per_unit_bytes),
            (200 << 10, 1 << 10)
        );
        assert_eq!(raised.units_safe, 7 * g / (200 << 10));
        // A fit above the floor stays.
        assert_eq!(p.clone().at_least_per_unit(512), p);
    }

    #[test]
    fn nothing_fits_below_the_fixed_part_and_a_free_unit_is_unbounded() {
        assert_eq!(units_fitting(10, 1, 5), 0);
        assert_eq!(units_fitting(10, 0, 50), u64::MAX);
        assert_eq!(units_fitting(10, 5, 50), 8);
    }
}
