//! The in-run batch sweep behind `--batch auto`: which batch sizes to time, when to stop, and the
//! batch the timings call for.
//!
//! The sizes the memory calibration already ran come in as measured points; the sweep adds powers
//! of two from 1 upwards, each timed over several batches (medians), until the points confirm a
//! plateau ([`knee::plateau_confirmed`]), the largest size it may time is reached, or its time
//! budget is spent. It then times the pick again with its neighbours and the best, one after the
//! other, and those runs, close in time, decide: a burst of contention during one size's first
//! runs cannot decide alone (a pick that moves sends the sweep back to growing). The measuring itself is the caller's (a closure), so the
//! rule is tested on synthetic timing curves.

use serde::Serialize;

use super::knee::{self, Pick, SweepPoint};

/// A size's timed batches are split into this many repetitions of consecutive batches; each
/// repetition's time is its mean per batch (what throughput sees, the runs a busy machine preempted
/// included), and the size's time is the median of the repetitions.
pub const REPETITIONS: usize = 3;

/// Timed batches per size at least (after one untimed batch that lets the runtime settle on the
/// new shape): three per repetition.
pub const MIN_TIMED_BATCHES: usize = 3 * REPETITIONS;

/// Timed batches per size at most.
pub const MAX_TIMED_BATCHES: usize = 96;

/// Times the pick may be re-timed (with its neighbours and the best) before the sweep settles.
pub const RETIME_ROUNDS: usize = 2;

/// Below this many seconds of timed work, a cheap size gets more batches (up to
/// [`MAX_TIMED_BATCHES`]): each repetition should span a few scheduler time slices, so a batch
/// shorter than one is preempted about as often as in a real run.
pub const MIN_TIMED_S: f64 = 0.03;

/// What bounds a sweep.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct SweepLimits {
    /// The largest batch the sweep may time or pick (B_safe, and no more than the scene gives
    /// enough batches of to time).
    pub max_batch: u64,
    /// Seconds the sweep may spend timing sizes of its own (calibration's sizes are free); a
    /// size whose predicted cost would pass it is not started.
    pub budget_s: f64,
}

/// Why a sweep stopped growing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Stop {
    /// The sizes above the pick confirmed the plateau.
    Plateau,
    /// The largest size it may time was reached.
    Ceiling,
    /// Its time budget was spent.
    Time,
}

/// What a sweep measured and picked.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SweepOutcome {
    /// Every size timed (calibration's and the sweep's), ascending, with elasticities.
    pub points: Vec<SweepPoint>,
    /// The batch the timings call for ([`knee::pick`] capped at `limits.max_batch`).
    pub pick: Option<Pick>,
    /// Whether the sizes above the pick confirmed it ([`knee::plateau_confirmed`]).
    pub confirmed: bool,
    /// Why the sweep last stopped growing (the pick may have moved since: see `confirmed`).
    pub stopped: Stop,
    /// Seconds spent timing sizes of its own (its cost at start-up).
    pub sweep_s: f64,
    /// What bounded it.
    pub limits: SweepLimits,
}

/// A measured point from the seconds of each batch run at `batch`, the first (untimed, the
/// runtime settling on the shape) left out; `None` when no timed batch is left. The timed runs
/// are split into [`REPETITIONS`] groups of consecutive runs; `median_s` is the median of the
/// groups' mean seconds per run. A plain median of single runs would drop the runs a busy machine
/// preempted, which a long batch never escapes and a short one mostly does: it would favour short
/// batches that a real run, preemptions and all, does not find faster.
pub fn point_from_runs(batch: u64, runs_s: &[f64]) -> Option<SweepPoint> {
    let samples_s: Vec<f64> = runs_s.get(1..)?.to_vec();
    if samples_s.is_empty() || batch == 0 {
        return None;
    }
    let per = samples_s.len().div_ceil(REPETITIONS);
    let means: Vec<f64> = samples_s
        .chunks(per)
        .map(|c| c.iter().sum::<f64>() / c.len() as f64)
        .collect();
    let median_s = knee::median(&means);
    Some(SweepPoint {
        batch,
        median_s,
        per_unit_s: median_s / batch as f64,
        samples_s,
        elasticity: None,
    })
}

/// Batches to run at `batch` (one untimed first): [`MIN_TIMED_BATCHES`] timed, more for a cheap
/// size until about [`MIN_TIMED_S`] of timed work, at most [`MAX_TIMED_BATCHES`], given the
/// per-unit time `per_unit_s` last seen.
pub fn batches_for(batch: u64, per_unit_s: Option<f64>) -> usize {
    let timed = match per_unit_s {
        Some(t) if t > 0.0 => (MIN_TIMED_S / (t * batch.max(1) as f64)).ceil() as usize,
        _ => MIN_TIMED_BATCHES,
    };
    1 + timed.clamp(MIN_TIMED_BATCHES, MAX_TIMED_BATCHES)
}

/// Puts `p` into `points` (kept ascending by batch, elasticities refilled); a size already there
/// is replaced, so sizes timed one after the other are compared on runs close in time.
pub fn put(points: &mut Vec<SweepPoint>, p: SweepPoint) {
    match points.iter_mut().find(|q| q.batch == p.batch) {
        Some(q) => *q = p,
        None => {
            let at = points.partition_point(|q| q.batch < p.batch);
            points.insert(at, p);
        }
    }
    knee::fill_elasticities(points);
}

/// The sizes a sweep under `max_batch` may time: powers of two up to it, and `max_batch` itself.
pub fn sizes(max_batch: u64) -> Vec<u64> {
    let mut v: Vec<u64> = std::iter::successors(Some(1u64), |b| b.checked_mul(2))
        .take_while(|&b| b <= max_batch)
        .collect();
    if max_batch > 0 && v.last() != Some(&max_batch) {
        v.push(max_batch);
    }
    v
}

/// Runs the sweep. `seed` holds the sizes already timed (calibration's; sizes above
/// `limits.max_batch` are dropped). `measure(batch, batches)` runs `batches` batches of `batch`
/// and returns the point they make (see [`point_from_runs`]; `None` when too few ran) and the
/// seconds it took.
pub fn sweep<E>(
    seed: Vec<SweepPoint>,
    limits: SweepLimits,
    mut measure: impl FnMut(u64, usize) -> Result<(Option<SweepPoint>, f64), E>,
) -> Result<SweepOutcome, E> {
    let mut points: Vec<SweepPoint> = Vec::new();
    for p in seed.into_iter().filter(|p| p.batch <= limits.max_batch) {
        put(&mut points, p);
    }
    let mut spent = 0.0;
    let mut stopped;
    let last_per_unit = |points: &[SweepPoint], b: u64| {
        points
            .iter()
            .rfind(|p| p.batch <= b)
            .or(points.first())
            .map(|p| p.per_unit_s)
    };
    // What a measurement costs besides its runs (starting the producer, the first tile window,
    // the runtime settling on the shape), as last seen: a size is predicted to cost that plus its
    // runs at the per-unit time of the size below.
    let mut start_cost_s = 0.0f64;
    let mut time = |points: &mut Vec<SweepPoint>, b: u64, spent: &mut f64| -> Result<bool, E> {
        let n = batches_for(b, last_per_unit(points, b));
        let predicted = last_per_unit(points, b).map_or(0.0, |t| t * (b * n as u64) as f64) + start_cost_s;
        if *spent + predicted > limits.budget_s {
            return Ok(false);
        }
        let (p, s) = measure(b, n)?;
        *spent += s;
        if let Some(p) = p {
            start_cost_s = (s - p.median_s * n as f64).max(0.0);
            put(points, p);
        }
        Ok(true)
    };
    // Grow until the plateau is confirmed, then time the pick once more together with its
    // neighbours and the best, one after the other: these runs, close in time, replace the
    // earlier ones, so a pick that noise moved (a burst of contention during one size's runs)
    // moves back. A pick that moves sends the sweep back to growing (the sizes above it may not
    // confirm it yet), at most `RETIME_ROUNDS` times.
    let mut rounds = 0;
    loop {
        stopped = Stop::Ceiling;
        for b in sizes(limits.max_batch) {
            if !points.iter().any(|p| p.batch == b) && !time(&mut points, b, &mut spent)? {
                stopped = Stop::Time;
                break;
            }
            if knee::pick(&points, limits.max_batch).is_some_and(|pk| knee::plateau_confirmed(&points, &pk)) {
                stopped = Stop::Plateau;
                break;
            }
        }
        let Some(pk) = knee::pick(&points, limits.max_batch) else {
            break;
        };
        if rounds == RETIME_ROUNDS {
            break;
        }
        rounds += 1;
        let measured: Vec<u64> = points.iter().map(|p| p.batch).collect();
        let below = measured.iter().copied().filter(|&b| b < pk.batch).max();
        let above = measured.iter().copied().find(|&b| b > pk.batch);
        let mut again: Vec<u64> = [below, Some(pk.batch), above, Some(pk.best_batch)]
            .into_iter()
            .flatten()
            .collect();
        again.sort_unstable();
        again.dedup();
        if again.len() < 2 {
            // Nothing to compare the pick with: timing it again would decide nothing.
            break;
        }
        for b in again {
            if !time(&mut points, b, &mut spent)? {
                stopped = Stop::Time;
            }
        }
        if stopped == Stop::Time || knee::pick(&points, limits.max_batch).is_some_and(|p| p.batch == pk.batch) {
            break;
        }
    }
    let pick = knee::pick(&points, limits.max_batch);
    let confirmed = pick.is_some_and(|pk| knee::plateau_confirmed(&points, &pk));
    Ok(SweepOutcome {
        points,
        pick,
        confirmed,
        stopped,
        sweep_s: spent,
        limits,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A timing curve: per-unit seconds at each batch, and a per-run noise factor.
    fn measure_curve<'a>(
        per_unit: impl Fn(u64) -> f64 + 'a,
        mut noise: impl FnMut(u64, usize) -> f64 + 'a,
        log: &'a mut Vec<(u64, usize)>,
    ) -> impl FnMut(u64, usize) -> Result<(Option<SweepPoint>, f64), std::convert::Infallible> + 'a {
        move |b, n| {
            log.push((b, n));
            let runs: Vec<f64> = (0..n).map(|i| per_unit(b) * b as f64 * noise(b, i)).collect();
            let spent = runs.iter().sum();
            Ok((point_from_runs(b, &runs), spent))
        }
    }

    fn limits(max_batch: u64) -> SweepLimits {
        SweepLimits {
            max_batch,
            budget_s: f64::INFINITY,
        }
    }

    #[test]
    fn a_falling_then_flat_curve_stops_three_doublings_past_the_knee() {
        // Per-batch overhead 8 units' worth up to 16, flat from 32: the pick is 32, confirmed by
        // 64, 128 and 256.
        let mut log = Vec::new();
        let curve = |b: u64| if b >= 32 { 1.0 } else { 1.0 + 8.0 / b as f64 };
        let out = sweep(Vec::new(), limits(7138), measure_curve(curve, |_, _| 1.0, &mut log)).unwrap();
        let pk = out.pick.unwrap();
        assert_eq!(pk.batch, 32);
        assert!(out.confirmed);
        assert_eq!(out.stopped, Stop::Plateau);
        // 1..256 timed, then 16, 32 and 64 once more; never near the ceiling.
        let timed: Vec<u64> = log.iter().map(|&(b, _)| b).collect();
        assert_eq!(timed, [1, 2, 4, 8, 16, 32, 64, 128, 256, 16, 32, 64]);
        assert!(
            log.iter()
                .all(|&(_, n)| n > MIN_TIMED_BATCHES && n <= MAX_TIMED_BATCHES + 1)
        );
    }

    #[test]
    fn a_flat_curve_picks_one_but_only_after_three_doublings() {
        let mut log = Vec::new();
        let out = sweep(Vec::new(), limits(4096), measure_curve(|_| 1e-3, |_, _| 1.0, &mut log)).unwrap();
        assert_eq!(out.pick.unwrap().batch, 1);
        assert!(out.confirmed);
        assert_eq!(out.points.iter().map(|p| p.batch).collect::<Vec<_>>(), [1, 2, 4, 8]);
    }

    #[test]
    fn calibration_points_count_and_are_not_timed_again() {
        // Calibration timed 15, 61 and 185 (flat from 15); the sweep adds only the small sizes.
        let mut log = Vec::new();
        let curve = |b: u64| if b >= 8 { 1.0 } else { 2.0 };
        let seed = [15u64, 61, 185, 9000]
            .iter()
            .map(|&b| point_from_runs(b, &[curve(b) * b as f64; 20]).unwrap())
            .collect();
        let out = sweep(seed, limits(7138), measure_curve(curve, |_, _| 1.0, &mut log)).unwrap();
        assert_eq!(out.pick.unwrap().batch, 8);
        assert!(out.confirmed);
        let timed: Vec<u64> = log.iter().map(|&(b, _)| b).collect();
        assert_eq!(timed, [1, 2, 4, 8, 4, 8, 15], "15, 61 and 185 came from calibration");
        assert!(out.points.iter().all(|p| p.batch <= 7138), "9000 is above the ceiling");
    }

    #[test]
    fn a_curve_falling_to_the_wall_picks_the_ceiling() {
        let mut log = Vec::new();
        let out = sweep(
            Vec::new(),
            limits(100),
            measure_curve(|b| 1.0 / b as f64, |_, _| 1.0, &mut log),
        )
        .unwrap();
        assert_eq!(out.pick.unwrap().batch, 100);
        assert!(!out.confirmed);
        assert_eq!(out.stopped, Stop::Ceiling);
        assert_eq!(out.points.last().unwrap().batch, 100);
    }

    #[test]
    fn a_noisy_machine_never_makes_it_pick_a_huge_batch() {
        // True curve flat from 16. Every size's runs are hit by contention bursts (one run in
        // three is 60 % slower), and the first timing of 16 was hit harder still (every other
        // run): the re-timing brings 16 back.
        let mut log = Vec::new();
        let mut seen16 = 0;
        let noise = move |b: u64, i: usize| {
            if b == 16 && i == 0 {
                seen16 += 1;
            }
            let hard = b == 16 && seen16 == 1 && i % 2 == 1;
            if hard || i % 3 == 2 { 1.6 } else { 1.0 }
        };
        let curve = |b: u64| if b >= 16 { 1.0 } else { 1.0 + 16.0 / b as f64 };
        let out = sweep(Vec::new(), limits(7138), measure_curve(curve, noise, &mut log)).unwrap();
        let pk = out.pick.unwrap();
        assert!(pk.batch <= 32, "picked {} from {:?}", pk.batch, out.points);
        assert!(
            out.points.iter().all(|p| p.batch <= 256),
            "grew to {:?}",
            out.points.last()
        );
    }

    #[test]
    fn a_pick_that_moves_when_timed_again_sends_the_sweep_back_to_growing() {
        // Calibration ran during contention (every size 2x slow); the sweep's first run of 1 was
        // quiet (1.5, beating the slow 15), so 1 looked like a knee confirmed by 15, 61 and 185.
        // Timed again beside 1, 15 shows its real 1.0: the sweep goes back to 2, 4 and 8.
        let mut log = Vec::new();
        let curve = |b: u64| if b >= 8 { 1.0 } else { 1.5 };
        let seed = [15u64, 61, 185]
            .iter()
            .map(|&b| point_from_runs(b, &[2.0 * b as f64; 20]).unwrap())
            .collect();
        let out = sweep(seed, limits(7138), measure_curve(curve, |_, _| 1.0, &mut log)).unwrap();
        let timed: Vec<u64> = log.iter().map(|&(b, _)| b).collect();
        assert_eq!(timed[..3], [1, 1, 15]);
        assert!(timed[3..].starts_with(&[2, 4, 8]), "{timed:?}");
        assert_eq!(out.pick.unwrap().batch, 8, "{timed:?}");
    }

    #[test]
    fn preempted_runs_count_against_short_batches_as_in_a_real_run() {
        // A busy machine takes 3 s from this process for every 4 s of its work. Batch 1 (1 s of
        // work a run) loses them in every fourth run; batch 8 (8 s a run) loses 6 s in every run.
        // Both cost 1.75 s a unit, as a real run would find; a median of single runs would put
        // batch 1 at 1 s and make it look 43 % faster.
        let one: Vec<f64> = (0..13).map(|i| if i % 4 == 3 { 4.0 } else { 1.0 }).collect();
        let p1 = point_from_runs(1, &one).unwrap();
        let p8 = point_from_runs(8, &[14.0; 13]).unwrap();
        assert!((p1.per_unit_s - 1.75).abs() < 1e-12, "{p1:?}");
        assert!((p8.per_unit_s - 1.75).abs() < 1e-12, "{p8:?}");
    }

    #[test]
    fn the_time_budget_stops_growth_and_the_pick_comes_from_what_was_measured() {
        let mut log = Vec::new();
        let out = sweep(
            Vec::new(),
            SweepLimits {
                max_batch: 1 << 20,
                budget_s: 0.5,
            },
            measure_curve(|b| 1e-3 / b as f64 + 1e-4, |_, _| 1.0, &mut log),
        )
        .unwrap();
        assert_eq!(out.stopped, Stop::Time);
        assert!(out.sweep_s <= 0.5, "{}", out.sweep_s);
        let pk = out.pick.unwrap();
        assert!(out.points.iter().any(|p| p.batch == pk.batch));
    }

    #[test]
    fn helpers() {
        assert_eq!(sizes(7138).last(), Some(&7138));
        assert_eq!(sizes(8), [1, 2, 4, 8]);
        assert!(sizes(0).is_empty());
        assert_eq!(point_from_runs(4, &[9.0]), None, "the untimed run alone is no point");
        let p = point_from_runs(4, &[9.0, 1.0, 3.0, 2.0]).unwrap();
        assert_eq!((p.median_s, p.per_unit_s, p.samples_s.len()), (2.0, 0.5, 3));
        // Repetitions of 2: means 1.5, 2.5, 4.0 -> 2.5.
        let q = point_from_runs(1, &[9.0, 1.0, 2.0, 2.0, 3.0, 1.0, 7.0]).unwrap();
        assert_eq!(q.median_s, 2.5);
        assert_eq!(batches_for(1, None), 1 + MIN_TIMED_BATCHES);
        assert_eq!(batches_for(1, Some(1e-6)), 1 + MAX_TIMED_BATCHES);
        assert_eq!(batches_for(1, Some(1e-3)), 1 + 30);
        let mut v = vec![p];
        put(&mut v, point_from_runs(2, &[0.0, 1.0]).unwrap());
        put(&mut v, point_from_runs(4, &[0.0, 4.0, 5.0]).unwrap());
        assert_eq!(v.iter().map(|p| p.batch).collect::<Vec<_>>(), [2, 4]);
        assert_eq!(
            (v[1].samples_s.len(), v[1].median_s),
            (2, 5.0),
            "replaced, not appended"
        );
        assert!(v[0].elasticity.is_some() && v[1].elasticity.is_none());
    }
}
