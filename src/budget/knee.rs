//! The plateau knee of a batch sweep, and the cache that carries it from `hsiedge bench sweep` to
//! `--batch auto`.
//!
//! Per-unit time t(B) falls with the batch while parallelism is the bottleneck, then flattens once
//! bandwidth or memory is: the plateau, where the elasticity |d ln t / d ln B| (reported for every
//! step) drops below 0.05, or turns positive (a larger batch that is slower per unit is past the
//! plateau too). A larger batch buys no throughput there, only memory, so the batch is [`pick`]ed
//! as the smallest one within [`PLATEAU_TOLERANCE`] of the best measured per-unit time, and a
//! sweep may stop growing once [`plateau_confirmed`] says the sizes above the pick did not beat it
//! over three doublings. A sweep is valid only for the graph, mode, tile, execution provider,
//! thread count, ONNX Runtime build and machine (and Jetson power mode) it ran on, so the cache is
//! keyed by all of them.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The pick is the smallest batch whose per-unit time is within this share of the fastest
/// measured: a larger batch would buy less than this much throughput.
pub const PLATEAU_TOLERANCE: f64 = 0.05;

/// Sizes a plateau needs measured above the pick before a sweep may stop: with fewer, a flat start
/// (per-unit time at 1, 2 and 4 alike, then falling again at 8 and beyond) would look like a knee.
pub const CONFIRM_SIZES: usize = 3;

/// How far above the pick (as a multiple of it) the confirming sizes must reach.
pub const CONFIRM_SPAN: u64 = 8;

/// Errors reading or writing the sweep cache.
#[derive(Debug, thiserror::Error)]
pub enum KneeError {
    /// The cache file or folder could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A cache file is not a sweep record.
    #[error("{path}: not a sweep record: {message}")]
    Format {
        /// The file.
        path: PathBuf,
        /// The parse error.
        message: String,
    },
}

/// One batch size of a sweep.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SweepPoint {
    /// Units per batch (samples or tiles).
    pub batch: u64,
    /// Median seconds of one run at this batch: over single runs (`bench sweep`), or over
    /// repetitions of consecutive runs, each its mean (the in-run sweep, see
    /// [`super::plateau::point_from_runs`]).
    pub median_s: f64,
    /// `median_s / batch`.
    pub per_unit_s: f64,
    /// Every timed run.
    pub samples_s: Vec<f64>,
    /// d ln(t/unit) / d ln B from this point to the next (negative while a larger batch is
    /// faster per unit); `None` on the last point.
    pub elasticity: Option<f64>,
}

/// What a sweep is valid for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SweepKey {
    /// Model name (manifest).
    pub model: String,
    /// FNV-1a 64 of the ONNX file's bytes, hex.
    pub graph_hash: String,
    /// `patch` or `dense`.
    pub mode: String,
    /// Tile side (dense mode; the unit's size depends on it).
    pub tile: Option<usize>,
    /// Execution provider.
    pub provider: String,
    /// Intra-op threads as configured (0: one per core).
    pub threads: usize,
    /// ONNX Runtime build string.
    pub onnxruntime: String,
    /// CPU model name.
    pub cpu: String,
    /// Online CPUs.
    pub cpus: usize,
    /// Jetson model, when on one.
    pub jetson: Option<String>,
    /// nvpmodel power mode (`/var/lib/nvpmodel/status`), when readable.
    pub power_mode: Option<String>,
}

impl SweepKey {
    /// The cache file name: readable prefix, then a hash of every field.
    pub fn file_name(&self) -> String {
        let text = serde_json::to_string(self).unwrap_or_default();
        let name: String = self
            .model
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        format!("sweep-{name}-{}-{:016x}.json", self.mode, fnv1a(text.as_bytes()))
    }
}

/// A stored sweep.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SweepRecord {
    /// What it is valid for.
    pub key: SweepKey,
    /// When it ran (seconds since the Unix epoch).
    pub created_unix_s: u64,
    /// Timed runs per batch size.
    pub repeat: usize,
    /// The batch sizes measured, ascending.
    pub points: Vec<SweepPoint>,
    /// The plateau knee, `None` unless the sweep confirmed one ([`plateau_confirmed`]) or
    /// reached the memory wall (then the [`pick`] below it).
    pub knee: Option<u64>,
    /// Intra-op threads the runs used (the configured count, or one per core for 0).
    #[serde(default)]
    pub threads_used: usize,
    /// Why the sweep stopped where it did.
    pub stopped: String,
}

/// The median of `v` (upper median for even lengths, as `hsiedge bench` takes it); 0 when empty.
pub fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s.get(s.len() / 2).copied().unwrap_or(0.0)
}

/// FNV-1a, 64 bits: a stable content hash without a dependency (not for security).
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// ln(t_b / t_a) / ln(B_b / B_a) between two points (t per unit); negative infinity (steepest
/// gain, never a plateau) when the batches are equal or a time is not positive.
pub fn elasticity(a: &SweepPoint, b: &SweepPoint) -> f64 {
    let db = (b.batch as f64 / a.batch as f64).ln();
    if db == 0.0 || a.per_unit_s <= 0.0 || b.per_unit_s <= 0.0 {
        return f64::NEG_INFINITY;
    }
    (b.per_unit_s / a.per_unit_s).ln() / db
}

/// Fills every point's `elasticity` (to the next point).
pub fn fill_elasticities(points: &mut [SweepPoint]) {
    for i in 0..points.len() {
        points[i].elasticity = points.get(i + 1).map(|next| elasticity(&points[i], next));
    }
}

/// The batch a sweep's timings call for, and the measurement behind it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Pick {
    /// The smallest batch within [`PLATEAU_TOLERANCE`] of the best.
    pub batch: u64,
    /// Its median seconds per unit.
    pub per_unit_s: f64,
    /// The batch with the fastest median per-unit time.
    pub best_batch: u64,
    /// That time.
    pub best_per_unit_s: f64,
}

/// The smallest batch, among the points at most `cap` (B_safe), whose median per-unit time is
/// within [`PLATEAU_TOLERANCE`] of the fastest there; `None` when no point is at most `cap` or
/// none has a positive time.
///
/// Medians of several runs each, so a burst of contention during a few runs moves nothing; sizes
/// closer than the tolerance count as equal and the smaller is kept. Contention that lasts a whole
/// size's runs is the sweep's to catch, by timing the candidates again one after the other
/// ([`super::plateau`]).
pub fn pick(points: &[SweepPoint], cap: u64) -> Option<Pick> {
    let within = || {
        points
            .iter()
            .filter(move |p| p.batch <= cap && p.batch > 0 && p.per_unit_s > 0.0 && p.per_unit_s.is_finite())
    };
    let best = within().min_by(|a, b| a.per_unit_s.total_cmp(&b.per_unit_s).then(a.batch.cmp(&b.batch)))?;
    let limit = best.per_unit_s * (1.0 + PLATEAU_TOLERANCE);
    let chosen = within()
        .filter(|p| p.per_unit_s <= limit)
        .min_by_key(|p| p.batch)
        .unwrap_or(best);
    Some(Pick {
        batch: chosen.batch,
        per_unit_s: chosen.per_unit_s,
        best_batch: best.batch,
        best_per_unit_s: best.per_unit_s,
    })
}

/// Whether the sizes measured above `pick` confirm it: at least [`CONFIRM_SIZES`] of them,
/// reaching [`CONFIRM_SPAN`] times it. Then per-unit time stayed within [`PLATEAU_TOLERANCE`] of
/// the pick's over three doublings, and a sweep may stop growing.
pub fn plateau_confirmed(points: &[SweepPoint], pick: &Pick) -> bool {
    let above: Vec<u64> = points.iter().map(|p| p.batch).filter(|&b| b > pick.batch).collect();
    above.len() >= CONFIRM_SIZES && above.iter().any(|&b| b >= pick.batch.saturating_mul(CONFIRM_SPAN))
}

/// The plateau knee: the [`pick`] over every point, when the points confirm it
/// ([`plateau_confirmed`]); `None` while per-unit time may still fall past the largest size.
pub fn knee(points: &[SweepPoint]) -> Option<u64> {
    pick(points, u64::MAX)
        .filter(|p| plateau_confirmed(points, p))
        .map(|p| p.batch)
}

/// Where sweeps are cached: `HSIEDGE_CACHE_DIR`, else `$XDG_CACHE_HOME/hsiedge`, else
/// `$HOME/.cache/hsiedge`; `None` when none of them is set.
pub fn cache_dir() -> Option<PathBuf> {
    use crate::config::{HOME, HSIEDGE_CACHE_DIR, XDG_CACHE_HOME};
    HSIEDGE_CACHE_DIR
        .path()
        .or_else(|| XDG_CACHE_HOME.path().map(|p| p.join("hsiedge")))
        .or_else(|| HOME.path().map(|p| p.join(".cache").join("hsiedge")))
}

/// Writes `record` into `dir` atomically (temporary file, then rename) and returns its path.
pub fn store(dir: &Path, record: &SweepRecord) -> Result<PathBuf, KneeError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| KneeError::Io { path, source }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let path = dir.join(record.key.file_name());
    let text = serde_json::to_vec_pretty(record).map_err(|e| KneeError::Format {
        path: path.clone(),
        message: e.to_string(),
    })?;
    let mut tmp = tempfile::NamedTempFile::new_in(dir).map_err(io(dir))?;
    std::io::Write::write_all(&mut tmp, &text).map_err(io(&path))?;
    tmp.as_file().sync_all().map_err(io(&path))?;
    tmp.persist(&path).map_err(|e| KneeError::Io {
        path: path.clone(),
        source: e.error,
    })?;
    Ok(path)
}

/// The cached sweep for `key` in `dir`: `None` when there is none; an error when the file exists
/// but cannot be read, is not a record, or belongs to another key.
pub fn load(dir: &Path, key: &SweepKey) -> Result<Option<(SweepRecord, PathBuf)>, KneeError> {
    let path = dir.join(key.file_name());
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(KneeError::Io { path, source }),
    };
    let record: SweepRecord = serde_json::from_slice(&bytes).map_err(|e| KneeError::Format {
        path: path.clone(),
        message: e.to_string(),
    })?;
    if &record.key != key {
        return Err(KneeError::Format {
            path,
            message: "its key does not match this model and device (hash collision or hand edit)".into(),
        });
    }
    Ok(Some((record, path)))
}

/// CPU model name and online CPU count, from `root`'s `/proc/cpuinfo` (x86 `model name`, else
/// the device tree's model on ARM boards).
pub fn cpu_identity(root: &Path) -> (String, usize) {
    let info = std::fs::read_to_string(root.join("proc/cpuinfo")).unwrap_or_default();
    let field = |name: &str| {
        info.lines()
            .find(|l| l.split(':').next().is_some_and(|k| k.trim() == name))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
    };
    let cpus = info.lines().filter(|l| l.starts_with("processor")).count().max(1);
    let name = field("model name")
        .or_else(|| {
            std::fs::read_to_string(root.join("proc/device-tree/model"))
                .ok()
                .map(|m| m.trim_end_matches('\0').trim().to_string())
        })
        .or_else(|| field("CPU part").map(|p| format!("CPU part {p}")))
        .unwrap_or_else(|| "unknown".into());
    (name, cpus)
}

/// The nvpmodel power mode recorded under `root` (`var/lib/nvpmodel/status`, e.g. `pmode:0001`).
pub fn power_mode(root: &Path) -> Option<String> {
    crate::platform::jetson::nvpmodel_status(root)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A sweep of one run per size with the given per-unit times, elasticities filled.
    pub(crate) fn curve(times: &[(u64, f64)]) -> Vec<SweepPoint> {
        let mut v: Vec<SweepPoint> = times
            .iter()
            .map(|&(batch, per)| SweepPoint {
                batch,
                median_s: per * batch as f64,
                per_unit_s: per,
                samples_s: vec![per * batch as f64],
                elasticity: None,
            })
            .collect();
        fill_elasticities(&mut v);
        v
    }

    /// A point from per-unit times of its runs (the median is the upper median, as measured).
    fn point(batch: u64, per_unit: &[f64]) -> SweepPoint {
        let samples_s: Vec<f64> = per_unit.iter().map(|t| t * batch as f64).collect();
        let mut sorted = samples_s.clone();
        sorted.sort_by(f64::total_cmp);
        let median_s = sorted[sorted.len() / 2];
        SweepPoint {
            batch,
            median_s,
            per_unit_s: median_s / batch as f64,
            samples_s,
            elasticity: None,
        }
    }

    #[test]
    fn the_knee_is_the_first_flat_step_near_the_best() {
        // Halving per unit with every doubling (elasticity -1), then flat from 16.
        let v = curve(&[
            (1, 1.0),
            (2, 0.5),
            (4, 0.25),
            (8, 0.14),
            (16, 0.1),
            (32, 0.099),
            (64, 0.1),
            (128, 0.1),
        ]);
        assert!((v[0].elasticity.unwrap() + 1.0).abs() < 1e-9);
        assert_eq!(knee(&v), Some(16));
        assert_eq!(v.last().unwrap().elasticity, None);
        // Two sizes above the pick do not confirm it: the sweep must go on.
        assert_eq!(knee(&v[..7]), None);
    }

    #[test]
    fn a_flat_start_is_not_a_knee_until_three_doublings_confirm_it() {
        // Flat over 1, 2, 4: three points never make a knee (the bench used to cache 1 here).
        let v = curve(&[(1, 1.0), (2, 0.99), (4, 1.0)]);
        assert_eq!(pick(&v, u64::MAX).map(|p| p.batch), Some(1));
        assert_eq!(knee(&v), None);
        // ... and per-unit time falls again past them.
        let v = curve(&[
            (1, 1.0),
            (2, 0.99),
            (4, 1.0),
            (8, 0.5),
            (16, 0.25),
            (32, 0.249),
            (64, 0.25),
            (128, 0.251),
        ]);
        assert_eq!(knee(&v), Some(16));
    }

    #[test]
    fn a_curve_that_rises_from_the_start_has_its_knee_at_the_first_size() {
        let v = curve(&[(1, 1.0), (2, 1.1), (4, 1.09), (8, 1.2)]);
        assert!(v[0].elasticity.unwrap() > 0.0);
        assert_eq!(knee(&v), Some(1));
    }

    #[test]
    fn a_curve_still_falling_has_no_knee() {
        let v = curve(&[(1, 1.0), (2, 0.6), (4, 0.4), (8, 0.3)]);
        assert_eq!(knee(&v), None);
        assert_eq!(knee(&v[..1]), None);
    }

    #[test]
    fn pick_on_a_flat_curve_is_the_smallest_batch() {
        let v = curve(&[(1, 1.0), (2, 1.0), (4, 1.0), (8, 1.0), (16, 1.0)]);
        let p = pick(&v, u64::MAX).unwrap();
        assert_eq!((p.batch, p.best_batch), (1, 1));
    }

    #[test]
    fn pick_on_a_falling_then_flat_curve_is_the_first_batch_within_five_per_cent() {
        let v = curve(&[
            (1, 1.0),
            (2, 0.5),
            (4, 0.26),
            (8, 0.25),
            (16, 0.25),
            (32, 0.248),
            (64, 0.25),
        ]);
        let p = pick(&v, u64::MAX).unwrap();
        // 0.26 <= 1.05 * 0.248, 0.5 is not.
        assert_eq!((p.batch, p.best_batch), (4, 32));
        assert!((p.best_per_unit_s - 0.248).abs() < 1e-12 && (p.per_unit_s - 0.26).abs() < 1e-12);
        // Just over the tolerance: the next size.
        let v = curve(&[(1, 1.0), (2, 0.5), (4, 0.2605), (8, 0.25), (16, 0.248)]);
        assert_eq!(pick(&v, u64::MAX).unwrap().batch, 8);
    }

    #[test]
    fn pick_on_a_noisy_curve_goes_by_medians() {
        // The plateau starts at 16 (0.25 s/unit). Bursts of contention hit two of 16's five runs
        // and one of 64's, and two lucky runs of the huge batch were 10 % fast: medians ignore
        // both, so 16 is within 5 % of the best and is kept.
        let v = [
            point(1, &[1.0, 1.1, 1.0, 1.3, 1.0]),
            point(4, &[0.4, 0.45, 0.41, 0.6, 0.4]),
            point(16, &[0.25, 0.33, 0.251, 0.25, 0.32]),
            point(64, &[0.25, 0.26, 0.25, 0.249, 0.4]),
            point(4096, &[0.225, 0.245, 0.248, 0.25, 0.225]),
        ];
        let p = pick(&v, u64::MAX).unwrap();
        assert_eq!(p.batch, 16, "{p:?}");
        // A size whose runs are mostly slow (0.3, well over 5 %) is passed over for the next.
        let v = [
            point(8, &[0.24, 0.31, 0.3]),
            point(16, &[0.25, 0.26, 0.25]),
            point(32, &[0.25, 0.25, 0.25]),
        ];
        assert_eq!(pick(&v, u64::MAX).unwrap().batch, 16);
    }

    #[test]
    fn pick_on_a_curve_falling_to_the_wall_is_capped_by_b_safe() {
        let v = curve(&[(1, 1.0), (2, 0.6), (4, 0.4), (8, 0.3), (16, 0.2), (32, 0.1), (64, 0.05)]);
        // B_safe 40: 64 is never chosen nor the best, however fast.
        let p = pick(&v, 40).unwrap();
        assert_eq!((p.batch, p.best_batch), (32, 32));
        assert_eq!(pick(&v, u64::MAX).unwrap().batch, 64);
        assert_eq!(pick(&v, 0), None);
        assert_eq!(pick(&[], 10), None);
        // A size that did not run (time 0 or not finite) is never the best.
        let mut w = curve(&[(1, 1.0), (2, 0.5)]);
        w[1].per_unit_s = 0.0;
        assert_eq!(pick(&w, u64::MAX).unwrap().batch, 1);
    }

    fn key() -> SweepKey {
        SweepKey {
            model: "m/x".into(),
            graph_hash: format!("{:016x}", fnv1a(b"onnx")),
            mode: "dense".into(),
            tile: Some(64),
            provider: "CPUExecutionProvider".into(),
            threads: 2,
            onnxruntime: "1.31.1".into(),
            cpu: "cpu".into(),
            cpus: 2,
            jetson: None,
            power_mode: None,
        }
    }

    #[test]
    fn records_round_trip_and_other_keys_miss() {
        let dir = tempfile::tempdir().unwrap();
        let points = curve(&[(1, 1.0), (2, 0.5), (4, 0.49)]);
        let rec = SweepRecord {
            key: key(),
            created_unix_s: 1,
            repeat: 3,
            knee: knee(&points),
            threads_used: 2,
            points,
            stopped: "plateau".into(),
        };
        let path = store(dir.path(), &rec).unwrap();
        assert!(
            path.file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with("sweep-m_x-dense-")
        );
        let (back, p) = load(dir.path(), &rec.key).unwrap().unwrap();
        assert_eq!((back, p), (rec.clone(), path.clone()));
        let other = SweepKey { threads: 4, ..key() };
        assert!(load(dir.path(), &other).unwrap().is_none());
        std::fs::write(&path, b"{").unwrap();
        let e = load(dir.path(), &rec.key).unwrap_err().to_string();
        assert!(
            e.contains(path.to_str().unwrap()) && e.contains("not a sweep record"),
            "{e}"
        );
    }

    #[test]
    fn cpu_identity_reads_model_name_or_device_tree() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("proc/device-tree")).unwrap();
        std::fs::write(
            dir.path().join("proc/cpuinfo"),
            "processor\t: 0\nCPU part\t: 0xd42\nprocessor\t: 1\n",
        )
        .unwrap();
        std::fs::write(dir.path().join("proc/device-tree/model"), "NVIDIA Jetson Orin Nano\0").unwrap();
        assert_eq!(cpu_identity(dir.path()), ("NVIDIA Jetson Orin Nano".to_string(), 2));
        std::fs::write(dir.path().join("proc/cpuinfo"), "processor : 0\nmodel name : Xeon\n").unwrap();
        assert_eq!(cpu_identity(dir.path()).0, "Xeon");
        assert_eq!(power_mode(dir.path()), None);
        std::fs::create_dir_all(dir.path().join("var/lib/nvpmodel")).unwrap();
        std::fs::write(dir.path().join("var/lib/nvpmodel/status"), "pmode:0001\n").unwrap();
        assert_eq!(power_mode(dir.path()).as_deref(), Some("pmode:0001"));
    }
}
