//! Synthetic scenes drawn from a model manifest's per-class spectral statistics, for demos and tests
//! on machines without real data. Every file written says SYNTHETIC in its description.
//!
//! The field layout is a Voronoi partition of the scene into fields, each given one class so that all
//! classes appear; each pixel is `mean + sum_j z_j basis_j + std * e` with `z`, `e` standard normal.

use std::path::{Path, PathBuf};

use rand::{Rng, SeedableRng};
use rand_distr::StandardNormal;

use crate::cube::{DataType, Header, Interleave, encode_f32};
use crate::map::{MapError, Staged};
use crate::model::{Manifest, Task};

/// Errors from simulation.
#[derive(Debug, thiserror::Error)]
pub enum SimulateError {
    /// The manifest carries no statistics to draw from.
    #[error("{manifest}: field `class_stats` is empty or does not cover every output; cannot simulate")]
    NoStats {
        /// The manifest.
        manifest: PathBuf,
    },
    /// Only classification models have a class layout to draw.
    #[error("{manifest}: simulation needs a classification model (task is abundance)")]
    NotClassification {
        /// The manifest.
        manifest: PathBuf,
    },
    /// A size is zero, or the cube too large to draw.
    #[error("invalid scene size {lines} x {samples}: {why}")]
    Size {
        /// Lines asked for.
        lines: usize,
        /// Samples asked for.
        samples: usize,
        /// What is wrong with it.
        why: String,
    },
    /// Writing failed.
    #[error(transparent)]
    Write(#[from] MapError),
}

/// What to simulate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimulateOptions {
    /// Scene lines.
    pub lines: usize,
    /// Scene samples.
    pub samples: usize,
    /// Number of fields in the layout.
    pub fields: usize,
    /// Random seed.
    pub seed: u64,
    /// Sample type of the cube: float32, or int16 as a sensor's digital numbers (rounded,
    /// saturated at the type's range).
    pub int16: bool,
}

/// The most values (pixels x bands) a simulated cube has: 16 GiB of float32.
pub const SIMULATE_MAX_VALUES: usize = 1 << 32;

/// Paths of a simulated scene.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SimulatedScene {
    /// The cube's header.
    pub scene: PathBuf,
    /// The label map's header.
    pub labels: PathBuf,
}

/// Writes `scene.hdr/.img` (float32 or int16, BIL) and `labels.hdr/.img` (ENVI classification) into `dir`.
pub fn simulate(manifest: &Manifest, opts: &SimulateOptions, dir: &Path) -> Result<SimulatedScene, SimulateError> {
    if manifest.task != Task::Classification {
        return Err(SimulateError::NotClassification {
            manifest: manifest.path.clone(),
        });
    }
    let stats: Option<Vec<_>> = manifest
        .outputs
        .iter()
        .map(|o| manifest.class_stats.iter().find(|s| s.id == o.id))
        .collect();
    let stats = match stats {
        Some(s) if !s.is_empty() => s,
        _ => {
            return Err(SimulateError::NoStats {
                manifest: manifest.path.clone(),
            });
        }
    };
    let (lines, samples) = (opts.lines, opts.samples);
    let bands = manifest.input.bands;
    let size = |why: String| SimulateError::Size { lines, samples, why };
    if lines == 0 || samples == 0 {
        return Err(size("needs at least one line and one sample".into()));
    }
    // The cube is drawn in memory as float32.
    match lines.checked_mul(samples).and_then(|p| p.checked_mul(bands)) {
        Some(values) if values <= SIMULATE_MAX_VALUES => {}
        _ => {
            return Err(size(format!(
                "{bands} bands make more than {SIMULATE_MAX_VALUES} values, the most it draws"
            )));
        }
    }
    let k = stats.len();
    let mut rng = rand::rngs::StdRng::seed_from_u64(opts.seed);
    let fields = opts.fields.max(k);
    let seeds: Vec<(f64, f64, usize)> = (0..fields)
        .map(|f| {
            (
                rng.random_range(0.0..lines as f64),
                rng.random_range(0.0..samples as f64),
                f % k,
            )
        })
        .collect();
    let mut labels = vec![0u8; lines * samples];
    let mut cube = vec![0f32; lines * bands * samples];
    let mut z = Vec::new();
    for y in 0..lines {
        for x in 0..samples {
            let (fy, fx) = (y as f64, x as f64);
            let class = seeds
                .iter()
                .min_by(|a, b| {
                    let da = (a.0 - fy).powi(2) + (a.1 - fx).powi(2);
                    let db = (b.0 - fy).powi(2) + (b.1 - fx).powi(2);
                    da.total_cmp(&db)
                })
                .map_or(0, |s| s.2);
            let st = stats[class];
            labels[y * samples + x] = u8::try_from(st.id).unwrap_or(0);
            z.clear();
            z.extend((0..st.basis.len()).map(|_| rng.sample::<f32, _>(StandardNormal)));
            for b in 0..bands {
                let e: f32 = rng.sample(StandardNormal);
                let mut v = st.mean[b] + st.std[b] * e;
                for (zj, basis) in z.iter().zip(&st.basis) {
                    v += zj * basis[b];
                }
                cube[(y * bands + b) * samples + x] = v;
            }
        }
    }
    let out = crate::map::OutputDir::lock(dir, crate::map::Contention::Fail)?;
    let mut staged = Staged::new(&out)?;
    let dt = if opts.int16 { DataType::I16 } else { DataType::F32 };
    let mut h = Header::new(samples, lines, bands, dt, Interleave::Bil);
    h.description = Some(format!(
        "SYNTHETIC scene drawn by hsiedge simulate from the class statistics of model {} (seed {})",
        manifest.name, opts.seed
    ));
    let bytes = if opts.int16 {
        // `as` rounds towards zero and saturates; round first to keep the nearest number.
        cube.iter().flat_map(|v| (v.round() as i16).to_le_bytes()).collect()
    } else {
        encode_f32(&cube)
    };
    staged.add("scene.img", &bytes)?;
    let scene = staged.add("scene.hdr", h.to_text().as_bytes())?;
    let maps = crate::pipeline::Maps {
        lines,
        samples,
        channels: k,
        class_ids: labels,
        confidence: Vec::new(),
        scores: None,
        nonfinite_pixels: 0,
    };
    let mut lh = crate::map::class_header(samples, lines, manifest, &h);
    lh.description = Some(format!(
        "SYNTHETIC ground truth of the simulated scene (model {})",
        manifest.name
    ));
    staged.add("labels.img", &maps.class_ids)?;
    let labels = staged.add("labels.hdr", lh.to_text().as_bytes())?;
    drop(staged.commit()?);
    Ok(SimulatedScene { scene, labels })
}
