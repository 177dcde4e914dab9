//! Scoring a class map against a reference label map.

use std::path::{Path, PathBuf};

use super::{JobError, LabelsError};
use crate::cube::Cube;
use crate::model::Task;
use crate::pipeline::Maps;

/// Agreement of a class map with a reference label map.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Accuracy {
    /// The label map.
    pub labels: PathBuf,
    /// Pixels with a non-zero label.
    pub labelled_pixels: usize,
    /// Of those, predicted correctly.
    pub correct: usize,
    /// Overall accuracy, `correct / labelled_pixels`.
    pub overall_accuracy: f64,
}

/// Compares `maps` with the ENVI label map at `path` over its labelled (non-zero) pixels.
pub fn accuracy(maps: &Maps, labels: &Cube) -> Accuracy {
    let path = labels.header_path();
    let labels = labels.read_all();
    let (mut n, mut ok) = (0usize, 0usize);
    for (truth, pred) in labels.iter().zip(&maps.class_ids) {
        if *truth > 0.0 {
            n += 1;
            if (*truth - f32::from(*pred)).abs() < 0.5 {
                ok += 1;
            }
        }
    }
    Accuracy {
        labels: path.to_path_buf(),
        labelled_pixels: n,
        correct: ok,
        overall_accuracy: if n == 0 { 0.0 } else { ok as f64 / n as f64 },
    }
}

/// Opens the label map at `path` for a classification of a `lines x samples` scene by a model of
/// `task`: one band, the scene's size.
pub fn open_labels(path: &Path, lines: usize, samples: usize, task: Task) -> Result<Cube, JobError> {
    let err = |field, message: String| LabelsError {
        path: path.to_path_buf(),
        field,
        message,
    };
    if task != Task::Classification {
        return Err(err(
            "--labels",
            format!("scores class maps, and this model's task is {task:?}"),
        )
        .into());
    }
    let cube = Cube::open(path)?;
    for w in cube.warnings() {
        eprintln!("hsiedge: warning: {w}");
    }
    if cube.bands() != 1 {
        return Err(err("bands", format!("a label map has 1 band, this one {}", cube.bands())).into());
    }
    if cube.lines() != lines || cube.samples() != samples {
        return Err(JobError::Labels {
            path: path.to_path_buf(),
            got_lines: cube.lines(),
            got_samples: cube.samples(),
            lines,
            samples,
        });
    }
    Ok(cube)
}
