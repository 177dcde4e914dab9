//! The aggregator's arithmetic: the latency window, its quantiles, and energy from power samples.

use heapless::HistoryBuf;

use super::snapshot::Quantiles;

/// Batch latencies kept per window; past this many batches in one window the oldest give way.
pub const WINDOW: usize = 4096;

/// The engine seconds of the batches finished in the current window: a fixed ring that keeps the
/// newest [`WINDOW`] values.
pub struct LatencyWindow {
    ring: HistoryBuf<f64, WINDOW>,
    sorted: Vec<f64>,
}

impl Default for LatencyWindow {
    fn default() -> Self {
        Self::new()
    }
}

impl LatencyWindow {
    /// An empty window.
    pub fn new() -> Self {
        Self {
            ring: HistoryBuf::new(),
            sorted: Vec::with_capacity(WINDOW),
        }
    }

    /// Adds one batch's latency, overwriting the oldest when full.
    pub fn push(&mut self, seconds: f64) {
        self.ring.write(seconds);
    }

    /// Values held.
    pub fn len(&self) -> usize {
        self.ring.len()
    }

    /// True when no batch finished in the window.
    pub fn is_empty(&self) -> bool {
        self.ring.is_empty()
    }

    /// The values held, oldest first.
    pub fn values(&self) -> impl Iterator<Item = f64> + '_ {
        self.ring.oldest_ordered().copied()
    }

    /// The quantiles of the window, then empties it; `None` when it was empty.
    pub fn take_quantiles(&mut self) -> Option<Quantiles> {
        self.sorted.clear();
        self.sorted.extend(self.ring.oldest_ordered().copied());
        self.ring.clear();
        quantiles(&mut self.sorted)
    }
}

/// Nearest-rank quantiles of `v` (sorted in place); `None` when empty.
pub fn quantiles(v: &mut [f64]) -> Option<Quantiles> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let at = |q: f64| {
        // Nearest rank: the smallest value with at least q of the values at or below it.
        let rank = (q * v.len() as f64).ceil().max(1.0) as usize;
        v[rank.min(v.len()) - 1]
    };
    Some(Quantiles {
        count: v.len() as u64,
        p50: at(0.50),
        p95: at(0.95),
        p99: at(0.99),
        max: v[v.len() - 1],
    })
}

/// Energy from a power trace: the trapezoid rule between consecutive samples.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EnergyMeter {
    last: Option<(f64, f64)>,
    joules: f64,
}

impl EnergyMeter {
    /// Adds a power sample of `watts` at `t_s` seconds (times must not go backwards; a sample at
    /// an earlier time than the last is ignored).
    pub fn add(&mut self, t_s: f64, watts: f64) {
        match self.last {
            Some((t0, _)) if t_s < t0 => return,
            Some((t0, w0)) => self.joules += 0.5 * (w0 + watts) * (t_s - t0),
            None => {}
        }
        self.last = Some((t_s, watts));
    }

    /// Joules since the first sample.
    pub fn joules(&self) -> f64 {
        self.joules
    }

    /// True once a sample has been added.
    pub fn started(&self) -> bool {
        self.last.is_some()
    }
}

/// Joules per megapixel: `joules / (pixels / 1e6)`, `None` without pixels.
pub fn joules_per_megapixel(joules: f64, pixels: u64) -> Option<f64> {
    (pixels > 0).then(|| joules / (pixels as f64 / 1e6))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_nearest_rank() {
        let mut v: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        let q = quantiles(&mut v);
        assert_eq!(
            q,
            Some(Quantiles {
                count: 100,
                p50: 50.0,
                p95: 95.0,
                p99: 99.0,
                max: 100.0
            })
        );
        let mut one = [0.25];
        assert_eq!(
            quantiles(&mut one).map(|q| (q.p50, q.p99, q.max)),
            Some((0.25, 0.25, 0.25))
        );
        assert_eq!(quantiles(&mut []), None);
        // Ten values: p95 and p99 are the largest, the median the fifth.
        let mut ten: Vec<f64> = (1..=10).map(f64::from).collect();
        assert_eq!(
            quantiles(&mut ten).map(|q| (q.p50, q.p95, q.p99)),
            Some((5.0, 10.0, 10.0))
        );
    }

    #[test]
    fn window_keeps_the_newest_and_empties_on_take() {
        let mut w = LatencyWindow::new();
        for i in 0..(WINDOW + 10) {
            w.push(i as f64);
        }
        assert_eq!(w.len(), WINDOW);
        // The ten oldest were overwritten.
        assert_eq!(w.values().next(), Some(10.0));
        assert_eq!(w.values().last(), Some((WINDOW + 9) as f64));
        let q = w.take_quantiles();
        assert_eq!(q.map(|q| (q.count, q.max)), Some((WINDOW as u64, (WINDOW + 9) as f64)));
        assert!(w.is_empty());
        assert_eq!(w.take_quantiles(), None);
    }

    #[test]
    fn energy_of_a_synthetic_trace() {
        // 5 W for 2 s, a linear ramp to 15 W over 1 s, 15 W for 1 s: 10 + 10 + 15 = 35 J.
        let mut e = EnergyMeter::default();
        assert!(!e.started());
        for (t, w) in [
            (0.0, 5.0),
            (1.0, 5.0),
            (2.0, 5.0),
            (3.0, 15.0),
            (3.5, 15.0),
            (4.0, 15.0),
        ] {
            e.add(t, w);
        }
        assert!((e.joules() - 35.0).abs() < 1e-12, "{}", e.joules());
        // A sample from the past is ignored.
        e.add(1.0, 1000.0);
        assert!((e.joules() - 35.0).abs() < 1e-12);
        // Uneven sampling of a sine-free ramp is exact under the trapezoid rule:
        // P(t) = 2t over [0, 3] gives 9 J.
        let mut ramp = EnergyMeter::default();
        for t in [0.0, 0.1, 0.7, 1.9, 2.2, 3.0] {
            ramp.add(t, 2.0 * t);
        }
        assert!((ramp.joules() - 9.0).abs() < 1e-9, "{}", ramp.joules());
        assert_eq!(joules_per_megapixel(35.0, 7_000_000), Some(5.0));
        assert_eq!(joules_per_megapixel(35.0, 0), None);
    }
}
