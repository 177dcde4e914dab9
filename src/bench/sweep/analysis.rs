//! What a sweep's timings say: per-size statistics (median, p5/p95, ms per unit, units per
//! second), the plateau, the memory line and the wall it predicts, and a regime verdict for each
//! part of the curve with the evidence behind it.
//!
//! Regimes are read from the elasticity e = d ln(t/unit) / d ln B of each step between
//! neighbouring sizes: e < -[`PLATEAU_ELASTICITY`] means a larger batch still amortises a fixed
//! per-run cost (launch overhead, idle cores: launch/parallelism bound); |e| below it is the
//! plateau (the cores are busy, more batch buys nothing); e above it means per-unit time grows
//! with the batch, which on a fixed graph is the working set outgrowing caches, bandwidth or
//! memory (memory bound). A rising step whose interquartile ranges overlap is within the
//! run-to-run spread and counts as plateau; a falling one keeps its verdict (its medians fell), and
//! the evidence says how many steps of each part overlap. Quartiles, not p5/p95: on a shared
//! machine one slow run in nine stretches p95 over almost any step.

use serde::Serialize;

use crate::budget::knee::SweepPoint;

/// |elasticity| below which a step is on the plateau (the 0.05).
pub const PLATEAU_ELASTICITY: f64 = 0.05;

/// The nearest-rank `q` quantile (0..=1) of `v`; 0 for an empty slice.
pub fn quantile(v: &[f64], q: f64) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    if s.is_empty() {
        return 0.0;
    }
    let rank = (q.clamp(0.0, 1.0) * s.len() as f64).ceil() as usize;
    s[rank.clamp(1, s.len()) - 1]
}

/// Statistics of one batch size.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PointStats {
    /// Units per batch.
    pub batch: u64,
    /// Untimed runs before the timed ones.
    pub warmups: usize,
    /// Timed runs.
    pub runs: usize,
    /// Median seconds of one run (the same as the record's point).
    pub median_s: f64,
    /// 5th percentile (nearest rank) of one run's seconds.
    pub p5_s: f64,
    /// 95th percentile (nearest rank) of one run's seconds.
    pub p95_s: f64,
    /// Median milliseconds per unit.
    pub ms_per_unit: f64,
    /// `[p5, p95]` milliseconds per unit.
    pub ms_per_unit_p5_p95: [f64; 2],
    /// `[p25, p75]` milliseconds per unit (the spread a step's verdict is judged against).
    pub ms_per_unit_p25_p75: [f64; 2],
    /// Units per second at the median.
    pub units_per_s: f64,
    /// The process's anonymous resident memory (`RssAnon`) right after this size's timed runs,
    /// its input still allocated; `None` where `/proc/self/status` has no such field.
    pub rss_bytes: Option<u64>,
    /// What the budget's cost model (graph prior times the workspace factor, plus the input)
    /// predicts this size adds to the process.
    pub model_bytes: u64,
    /// Energy of the timed runs, when the board has power rails (`--power-modes`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub energy: Option<super::power::Energy>,
}

impl PointStats {
    /// Statistics of `samples_s` (timed runs of `batch` units).
    pub fn new(batch: u64, warmups: usize, samples_s: &[f64]) -> Self {
        let median_s = super::super::median(samples_s);
        let (p5_s, p95_s) = (quantile(samples_s, 0.05), quantile(samples_s, 0.95));
        let per = |s: f64| s * 1e3 / batch.max(1) as f64;
        Self {
            batch,
            warmups,
            runs: samples_s.len(),
            median_s,
            p5_s,
            p95_s,
            ms_per_unit: per(median_s),
            ms_per_unit_p5_p95: [per(p5_s), per(p95_s)],
            ms_per_unit_p25_p75: [per(quantile(samples_s, 0.25)), per(quantile(samples_s, 0.75))],
            units_per_s: if median_s > 0.0 { batch as f64 / median_s } else { 0.0 },
            rss_bytes: None,
            model_bytes: 0,
            energy: None,
        }
    }
}

/// A range of batch sizes (inclusive).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct BatchRange {
    /// First size.
    pub from: u64,
    /// Last size.
    pub to: u64,
}

/// What limits throughput over a part of the curve.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Regime {
    /// Per-unit time falls with the batch: a fixed per-run cost is being amortised.
    LaunchParallelismBound,
    /// Per-unit time flat: the compute is saturated.
    Plateau,
    /// Per-unit time rises with the batch: the working set outgrows caches or memory.
    MemoryBound,
}

impl Regime {
    /// Of one step's elasticity.
    pub fn of(e: f64) -> Self {
        if e < -PLATEAU_ELASTICITY {
            Self::LaunchParallelismBound
        } else if e > PLATEAU_ELASTICITY {
            Self::MemoryBound
        } else {
            Self::Plateau
        }
    }

    /// Words for reports.
    pub fn words(self) -> &'static str {
        match self {
            Self::LaunchParallelismBound => "launch/parallelism bound",
            Self::Plateau => "plateau",
            Self::MemoryBound => "memory bound",
        }
    }
}

/// One part of the curve and why it got its verdict.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RegimePart {
    /// The sizes it spans.
    pub batches: BatchRange,
    /// The verdict.
    pub regime: Regime,
    /// The elasticities of its steps, in order.
    pub elasticities: Vec<f64>,
    /// The measurements behind the verdict, in words.
    pub evidence: String,
}

/// The memory line: resident memory against batch, fitted to the measured points, beside the
/// cost model's.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MemoryLine {
    /// Least-squares bytes per unit of the measured `RssAnon` (`None` with fewer than two
    /// distinct sizes measured).
    pub measured_bytes_per_unit: Option<f64>,
    /// Its intercept (bytes at batch 0).
    pub measured_intercept_bytes: Option<f64>,
    /// Bytes per unit the budget's cost model charges (graph prior times the workspace factor).
    pub model_bytes_per_unit: u64,
    /// The budget (bytes usable by this process, fragmentation margin taken) at the sweep's start.
    pub budget_bytes: u64,
    /// What binds the budget (e.g. `MemAvailable`, a cgroup limit).
    pub budget_binding: String,
    /// The wall the budget predicts: the largest batch the cost model fits in the budget beside
    /// what the process held before the sweep.
    pub predicted_wall: Option<u64>,
    /// The wall on the measured line: where it crosses the budget.
    pub measured_wall: Option<u64>,
}

impl MemoryLine {
    /// Fits the line to `(batch, rss)` points and places both walls against `budget_bytes`.
    pub fn fit(
        points: &[(u64, u64)],
        model_bytes_per_unit: u64,
        own_bytes: u64,
        budget_bytes: u64,
        budget_binding: String,
    ) -> Self {
        let n = points.len() as f64;
        let (mut sx, mut sy, mut sxx, mut sxy) = (0.0, 0.0, 0.0, 0.0);
        for &(b, m) in points {
            let (x, y) = (b as f64, m as f64);
            sx += x;
            sy += y;
            sxx += x * x;
            sxy += x * y;
        }
        let den = n * sxx - sx * sx;
        let (slope, intercept) = if points.len() >= 2 && den > 0.0 {
            let slope = (n * sxy - sx * sy) / den;
            (Some(slope), Some((sy - slope * sx) / n))
        } else {
            (None, None)
        };
        let predicted_wall =
            (model_bytes_per_unit > 0).then(|| budget_bytes.saturating_sub(own_bytes) / model_bytes_per_unit);
        let measured_wall = match (slope, intercept) {
            (Some(s), Some(c)) if s > 0.0 => Some(((budget_bytes as f64 - c) / s).max(0.0) as u64),
            _ => None,
        };
        Self {
            measured_bytes_per_unit: slope,
            measured_intercept_bytes: intercept,
            model_bytes_per_unit,
            budget_bytes,
            budget_binding,
            predicted_wall,
            measured_wall,
        }
    }
}

/// The longest run of neighbouring steps with |elasticity| < [`PLATEAU_ELASTICITY`] (the first
/// of equal length), as the sizes it spans; `None` when no step is that flat.
pub fn plateau(points: &[SweepPoint]) -> Option<BatchRange> {
    let mut best: Option<(usize, usize)> = None;
    let mut start: Option<usize> = None;
    for (i, p) in points.iter().enumerate() {
        let flat = p.elasticity.is_some_and(|e| e.abs() < PLATEAU_ELASTICITY);
        match (flat, start) {
            (true, None) => start = Some(i),
            (false, Some(s)) => {
                if best.is_none_or(|(a, b)| i - s > b - a) {
                    best = Some((s, i));
                }
                start = None;
            }
            _ => {}
        }
    }
    if let Some(s) = start {
        // A run of flat steps reaching the last step ends at the last point.
        let end = points.len() - 1;
        if best.is_none_or(|(a, b)| end - s > b - a) {
            best = Some((s, end));
        }
    }
    best.map(|(a, b)| BatchRange {
        from: points[a].batch,
        to: points[b].batch,
    })
}

/// The curve cut into parts of one regime each, with their evidence. `stats` are the same sizes
/// as `points`, in the same order.
pub fn regimes(points: &[SweepPoint], stats: &[PointStats], wall: Option<u64>) -> Vec<RegimePart> {
    let mut parts: Vec<(usize, usize, Regime)> = Vec::new();
    for (i, p) in points.iter().enumerate() {
        let Some(e) = p.elasticity else { continue };
        let mut r = Regime::of(e);
        // A rise inside the run-to-run spread is no evidence of a memory limit.
        if r == Regime::MemoryBound && ranges_overlap(stats.get(i), stats.get(i + 1)) {
            r = Regime::Plateau;
        }
        match parts.last_mut() {
            Some((_, end, last)) if *last == r && *end == i => *end = i + 1,
            _ => parts.push((i, i + 1, r)),
        }
    }
    parts
        .into_iter()
        .map(|(a, b, regime)| {
            let elasticities: Vec<f64> = points[a..b].iter().filter_map(|p| p.elasticity).collect();
            let (pa, pb) = (&points[a], &points[b]);
            let change = (pb.per_unit_s / pa.per_unit_s - 1.0) * 100.0;
            let mut evidence = format!(
                "per-unit time {:.4} -> {:.4} ms ({change:+.1} %) from batch {} to {}, elasticities {}",
                pa.per_unit_s * 1e3,
                pb.per_unit_s * 1e3,
                pa.batch,
                pb.batch,
                elasticities
                    .iter()
                    .map(|e| format!("{e:+.3}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            let overlaps = (a..b)
                .filter(|&i| ranges_overlap(stats.get(i), stats.get(i + 1)))
                .count();
            if overlaps > 0 {
                evidence.push_str(&format!(
                    "; {overlaps} of {} steps have overlapping interquartile ranges (within the noise)",
                    b - a
                ));
            }
            match regime {
                Regime::LaunchParallelismBound => {
                    evidence.push_str("; a fixed per-run cost is still being spread over more units")
                }
                Regime::Plateau => evidence.push_str("; the cores are saturated: a larger batch buys no throughput"),
                Regime::MemoryBound => {
                    let (ma, mb) = (
                        stats.get(a).and_then(|s| s.rss_bytes),
                        stats.get(b).and_then(|s| s.rss_bytes),
                    );
                    if let (Some(ma), Some(mb)) = (ma, mb) {
                        evidence.push_str(&format!(
                            "; resident memory {} -> {} MiB while per-unit time grows",
                            ma >> 20,
                            mb >> 20
                        ));
                    }
                    if let Some(w) = wall {
                        evidence.push_str(&format!(
                            "; batch {} is {:.0} % of the predicted wall {w}",
                            pb.batch,
                            pb.batch as f64 * 100.0 / w.max(1) as f64
                        ));
                    }
                }
            }
            RegimePart {
                batches: BatchRange {
                    from: pa.batch,
                    to: pb.batch,
                },
                regime,
                elasticities,
                evidence,
            }
        })
        .collect()
}

/// Whether two sizes' per-unit interquartile ranges overlap.
fn ranges_overlap(a: Option<&PointStats>, b: Option<&PointStats>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => {
            let ([a0, a1], [b0, b1]) = (a.ms_per_unit_p25_p75, b.ms_per_unit_p25_p75);
            a0 <= b1 && b0 <= a1
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::knee::tests::curve;

    fn stats(points: &[SweepPoint]) -> Vec<PointStats> {
        points
            .iter()
            .map(|p| PointStats::new(p.batch, 1, &p.samples_s))
            .collect()
    }

    #[test]
    fn quantiles_are_nearest_rank() {
        let v: Vec<f64> = (1..=20).map(f64::from).collect();
        assert_eq!(quantile(&v, 0.05), 1.0);
        assert_eq!(quantile(&v, 0.5), 10.0);
        assert_eq!(quantile(&v, 0.95), 19.0);
        assert_eq!(quantile(&[3.0], 0.95), 3.0);
        assert_eq!(quantile(&[], 0.5), 0.0);
    }

    #[test]
    fn point_stats_per_unit_and_throughput() {
        let s = PointStats::new(4, 2, &[0.4, 0.8, 0.6]);
        assert_eq!((s.median_s, s.p5_s, s.p95_s, s.runs, s.warmups), (0.6, 0.4, 0.8, 3, 2));
        assert!((s.ms_per_unit - 150.0).abs() < 1e-9);
        assert!((s.ms_per_unit_p5_p95[0] - 100.0).abs() < 1e-9 && (s.ms_per_unit_p5_p95[1] - 200.0).abs() < 1e-9);
        assert!((s.units_per_s - 4.0 / 0.6).abs() < 1e-9);
    }

    #[test]
    fn falling_flat_rising_curve_has_three_parts_and_the_flat_one_is_the_plateau() {
        let v = curve(&[
            (1, 1.0),
            (2, 0.5),
            (4, 0.3),
            (8, 0.3),
            (16, 0.305),
            (32, 0.3),
            (64, 0.4),
            (128, 0.6),
        ]);
        assert_eq!(plateau(&v), Some(BatchRange { from: 4, to: 32 }));
        let parts = regimes(&v, &stats(&v), Some(200));
        let got: Vec<(u64, u64, Regime)> = parts.iter().map(|p| (p.batches.from, p.batches.to, p.regime)).collect();
        assert_eq!(
            got,
            [
                (1, 4, Regime::LaunchParallelismBound),
                (4, 32, Regime::Plateau),
                (32, 128, Regime::MemoryBound)
            ]
        );
        assert_eq!(parts[1].elasticities.len(), 3);
        assert!(
            parts[2].evidence.contains("64 % of the predicted wall 200"),
            "{}",
            parts[2].evidence
        );
        assert!(parts[0].evidence.contains("-70.0 %"), "{}", parts[0].evidence);
    }

    #[test]
    fn no_flat_step_no_plateau_and_a_flat_tail_reaches_the_last_point() {
        assert_eq!(plateau(&curve(&[(1, 1.0), (2, 0.5), (4, 0.2)])), None);
        assert_eq!(plateau(&curve(&[(1, 1.0)])), None);
        let v = curve(&[(1, 1.0), (2, 0.5), (4, 0.5), (8, 0.5)]);
        assert_eq!(plateau(&v), Some(BatchRange { from: 2, to: 8 }));
    }

    #[test]
    fn a_rise_within_the_spread_is_plateau_not_memory_bound() {
        let mut v = curve(&[(1, 1.0), (2, 1.2), (4, 1.5)]);
        v[0].samples_s = vec![0.8, 1.0, 1.3];
        v[1].samples_s = vec![2.0, 2.4, 2.6];
        v[2].samples_s = vec![5.9, 6.0, 6.1];
        let parts = regimes(&v, &stats(&v), None);
        let got: Vec<(u64, u64, Regime)> = parts.iter().map(|p| (p.batches.from, p.batches.to, p.regime)).collect();
        assert_eq!(got, [(1, 2, Regime::Plateau), (2, 4, Regime::MemoryBound)]);
    }

    #[test]
    fn overlapping_ranges_are_named_in_the_evidence() {
        let mut v = curve(&[(1, 1.0), (2, 0.99)]);
        v[0].samples_s = vec![0.9, 1.0, 1.1];
        v[1].samples_s = vec![1.8, 1.98, 2.2];
        let parts = regimes(&v, &stats(&v), None);
        assert_eq!(parts[0].regime, Regime::Plateau);
        assert!(
            parts[0].evidence.contains("1 of 1 steps have overlapping"),
            "{}",
            parts[0].evidence
        );
    }

    #[test]
    fn memory_line_fits_and_places_both_walls() {
        let m = MemoryLine::fit(
            &[(1, 110 << 20), (2, 120 << 20), (4, 140 << 20)],
            20 << 20,
            100 << 20,
            1100 << 20,
            "MemAvailable".into(),
        );
        assert!((m.measured_bytes_per_unit.unwrap() - f64::from(10 << 20)).abs() < 1.0);
        assert!((m.measured_intercept_bytes.unwrap() - f64::from(100 << 20)).abs() < 1.0);
        assert_eq!(m.measured_wall, Some(100));
        assert_eq!(m.predicted_wall, Some(50));
        let one = MemoryLine::fit(&[(1, 5)], 0, 0, 10, String::new());
        assert_eq!(
            (one.measured_bytes_per_unit, one.predicted_wall, one.measured_wall),
            (None, None, None)
        );
    }
}
