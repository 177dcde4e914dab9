//! Model manifests (`models/<name>/manifest.json`, format in `models/MANIFEST.md`) and their
//! validation against the ONNX graphs they describe.
//!
//! Parsing and validation ([`Manifest::parse`]) touch no files; [`Manifest::load`] adds the read and
//! resolves the ONNX paths; [`check_io`] compares a manifest with the tensor signature a session reports.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Errors from manifests and their ONNX files.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The manifest could not be read.
    #[error("{path}")]
    Io {
        /// The manifest.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The manifest is not valid JSON for the schema.
    #[error("{path}: not a valid manifest")]
    Json {
        /// The manifest.
        path: PathBuf,
        /// The JSON error (names line and column).
        source: serde_json::Error,
    },
    /// A field holds a value the runtime cannot use.
    #[error("{path}: field `{field}`: {message}")]
    Field {
        /// The manifest.
        path: PathBuf,
        /// The field, as a JSON path.
        field: String,
        /// What is wrong.
        message: String,
    },
    /// An ONNX file the manifest names is missing.
    #[error("{manifest}: field `files.{role}` names {path}, which does not exist")]
    MissingOnnx {
        /// The manifest.
        manifest: PathBuf,
        /// Which file (`patch`, `dense`, ...).
        role: String,
        /// The resolved path.
        path: PathBuf,
    },
    /// The ONNX graph does not match the manifest.
    #[error("{onnx}: tensor `{tensor}` {detail}, but {manifest} field `{field}` {expected}")]
    Mismatch {
        /// The ONNX file.
        onnx: PathBuf,
        /// The graph tensor.
        tensor: String,
        /// What the graph says.
        detail: String,
        /// The manifest.
        manifest: PathBuf,
        /// The manifest field.
        field: String,
        /// What the manifest implies.
        expected: String,
    },
}

/// What a model predicts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Task {
    /// One class per pixel.
    Classification,
    /// Endmember fractions per pixel.
    Abundance,
}

/// Patch input layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Layout {
    /// `N x 1 x C x p x p` (3-D convolution input).
    N1chw,
    /// `N x C x p x p`.
    Nchw,
    /// `N x C` (per-pixel spectral model).
    Nc,
}

impl Layout {
    /// Tensor rank of the patch input.
    pub fn rank(self) -> usize {
        match self {
            Self::N1chw => 5,
            Self::Nchw => 4,
            Self::Nc => 2,
        }
    }

    /// Input shape for `n` samples of `c` bands over an `h x w` window.
    pub fn shape(self, n: usize, c: usize, h: usize, w: usize) -> Vec<usize> {
        match self {
            Self::N1chw => vec![n, 1, c, h, w],
            Self::Nchw => vec![n, c, h, w],
            Self::Nc => vec![n, c],
        }
    }
}

/// Whether outputs are raw scores or already normalised.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OutputKind {
    /// Unnormalised scores; the runtime applies softmax for confidence.
    Logits,
    /// Non-negative values summing to one.
    Probabilities,
}

/// Input description.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Input {
    /// Raw cube bands the graph expects.
    pub bands: usize,
    /// Patch tensor layout.
    pub layout: Layout,
    /// Per-band mean, raw units.
    pub mean: Vec<f32>,
    /// Per-band standard deviation, raw units, > 0.
    pub std: Vec<f32>,
}

/// One output channel.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutputClass {
    /// Class id written to maps (1..=255); unused for abundance.
    #[serde(default)]
    pub id: u32,
    /// Class or endmember name.
    pub name: String,
    /// Display colour.
    #[serde(default)]
    pub color: Option<[u8; 3]>,
}

/// ONNX files, relative to the manifest's folder.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Files {
    /// The patch model.
    pub patch: PathBuf,
    /// The fully convolutional twin.
    #[serde(default)]
    pub dense: Option<PathBuf>,
    /// fp16 patch variant.
    #[serde(default)]
    pub patch_fp16: Option<PathBuf>,
    /// fp16 dense variant.
    #[serde(default)]
    pub dense_fp16: Option<PathBuf>,
}

/// Spectral statistics of one output class, raw units.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClassStats {
    /// Class id (matches `outputs[k].id`).
    #[serde(default)]
    pub id: u32,
    /// Mean spectrum.
    pub mean: Vec<f32>,
    /// Residual per-band standard deviation.
    pub std: Vec<f32>,
    /// Low-rank covariance factors, each a full spectrum.
    #[serde(default)]
    pub basis: Vec<Vec<f32>>,
}

/// A model manifest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// Model name.
    pub name: String,
    /// Manifest version string.
    #[serde(default)]
    pub version: Option<String>,
    /// What the model predicts.
    pub task: Task,
    /// Human description.
    #[serde(default)]
    pub description: Option<String>,
    /// Input description.
    pub input: Input,
    /// Patch side p (odd).
    pub patch: usize,
    /// Halo r = (p - 1) / 2.
    pub halo: usize,
    /// Output channels in graph order.
    pub outputs: Vec<OutputClass>,
    /// ONNX files.
    pub files: Files,
    /// Whether outputs are logits or probabilities.
    pub output_kind: OutputKind,
    /// Per-class statistics for simulation.
    #[serde(default)]
    pub class_stats: Vec<ClassStats>,
    /// Free-form provenance.
    #[serde(default)]
    pub provenance: serde_json::Value,
    /// Metrics file name or inline metrics.
    #[serde(default)]
    pub metrics: serde_json::Value,
    /// Folder the manifest was loaded from; relative `files` resolve against it.
    #[serde(skip)]
    pub dir: PathBuf,
    /// The manifest's own path.
    #[serde(skip)]
    pub path: PathBuf,
}

impl Manifest {
    /// Parses and validates manifest text; `path` names the file in errors and anchors `files`.
    pub fn parse(text: &str, path: &Path) -> Result<Self, ModelError> {
        let mut m: Manifest = serde_json::from_str(text).map_err(|source| ModelError::Json {
            path: path.to_path_buf(),
            source,
        })?;
        m.path = path.to_path_buf();
        m.dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
        m.validate()?;
        Ok(m)
    }

    /// Reads, parses and validates a manifest, and checks that its ONNX files exist.
    pub fn load(path: &Path) -> Result<Self, ModelError> {
        let text = std::fs::read_to_string(path).map_err(|source| ModelError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let m = Self::parse(&text, path)?;
        for (role, file) in m.file_roles() {
            let full = m.dir.join(file);
            if !full.is_file() {
                return Err(ModelError::MissingOnnx {
                    manifest: m.path.clone(),
                    role: role.into(),
                    path: full,
                });
            }
        }
        Ok(m)
    }

    fn file_roles(&self) -> Vec<(&'static str, &PathBuf)> {
        let f = &self.files;
        let mut v = vec![("patch", &f.patch)];
        for (role, p) in [
            ("dense", &f.dense),
            ("patch_fp16", &f.patch_fp16),
            ("dense_fp16", &f.dense_fp16),
        ] {
            if let Some(p) = p {
                v.push((role, p));
            }
        }
        v
    }

    fn field_err(&self, field: &str, message: impl Into<String>) -> ModelError {
        ModelError::Field {
            path: self.path.clone(),
            field: field.into(),
            message: message.into(),
        }
    }

    fn validate(&self) -> Result<(), ModelError> {
        let c = self.input.bands;
        if c == 0 {
            return Err(self.field_err("input.bands", "must be at least 1"));
        }
        for (field, v) in [("input.mean", &self.input.mean), ("input.std", &self.input.std)] {
            if v.len() != c {
                return Err(self.field_err(field, format!("{} values for {c} bands", v.len())));
            }
            if let Some(i) = v.iter().position(|x| !x.is_finite()) {
                return Err(self.field_err(&format!("{field}[{i}]"), "not a finite number"));
            }
        }
        if let Some(i) = self.input.std.iter().position(|s| *s <= 0.0) {
            return Err(self.field_err(&format!("input.std[{i}]"), "must be > 0"));
        }
        if self.patch.is_multiple_of(2) {
            return Err(self.field_err("patch", format!("{} is not an odd size", self.patch)));
        }
        if self.patch > MAX_PATCH {
            return Err(self.field_err(
                "patch",
                format!("{} is above the largest supported, {MAX_PATCH}", self.patch),
            ));
        }
        if self.halo.checked_mul(2).and_then(|h| h.checked_add(1)) != Some(self.patch) {
            return Err(self.field_err(
                "halo",
                format!(
                    "{} does not equal (patch - 1) / 2 = {}",
                    self.halo,
                    (self.patch - 1) / 2
                ),
            ));
        }
        if self.input.layout == Layout::Nc && self.patch != 1 {
            return Err(self.field_err("input.layout", "\"nc\" is a per-pixel layout and needs patch = 1"));
        }
        if self.outputs.is_empty() {
            return Err(self.field_err("outputs", "no output channels"));
        }
        for (k, o) in self.outputs.iter().enumerate() {
            // The names are written into ENVI header lists, which braces and line breaks would end.
            if o.name.trim().is_empty() || o.name.chars().any(|ch| ch == '{' || ch == '}' || ch.is_control()) {
                return Err(self.field_err(
                    &format!("outputs[{k}].name"),
                    format!("{:?} is empty or holds a brace or a control character", o.name),
                ));
            }
        }
        if self.task == Task::Classification {
            let mut seen = std::collections::HashSet::new();
            for (k, o) in self.outputs.iter().enumerate() {
                if o.id == 0 || o.id > 255 {
                    return Err(self.field_err(
                        &format!("outputs[{k}].id"),
                        format!("{} is outside 1..=255 (0 means unclassified)", o.id),
                    ));
                }
                if !seen.insert(o.id) {
                    return Err(self.field_err(&format!("outputs[{k}].id"), format!("id {} repeats", o.id)));
                }
            }
        }
        if self.task == Task::Abundance && self.output_kind != OutputKind::Probabilities {
            return Err(self.field_err("output_kind", "abundance models must output probabilities"));
        }
        for (k, s) in self.class_stats.iter().enumerate() {
            for (field, v) in [("mean", &s.mean), ("std", &s.std)] {
                if v.len() != c {
                    return Err(self.field_err(
                        &format!("class_stats[{k}].{field}"),
                        format!("{} values for {c} bands", v.len()),
                    ));
                }
            }
            if let Some(j) = s.basis.iter().position(|b| b.len() != c) {
                return Err(self.field_err(
                    &format!("class_stats[{k}].basis[{j}]"),
                    format!("{} values for {c} bands", s.basis[j].len()),
                ));
            }
        }
        Ok(())
    }

    /// Output channels K.
    pub fn classes(&self) -> usize {
        self.outputs.len()
    }

    /// Absolute path of the patch model.
    pub fn patch_path(&self) -> PathBuf {
        self.dir.join(&self.files.patch)
    }

    /// Absolute path of the dense twin, when the manifest has one.
    pub fn dense_path(&self) -> Option<PathBuf> {
        self.files.dense.as_ref().map(|p| self.dir.join(p))
    }

    /// The colour of output `k`: the manifest's, else a fixed distinct palette.
    pub fn color(&self, k: usize) -> [u8; 3] {
        self.outputs
            .get(k)
            .and_then(|o| o.color)
            .unwrap_or(PALETTE[k % PALETTE.len()])
    }
}

/// The largest patch side a manifest may give (a patch of 255 x 255 pixels of a few hundred bands
/// is already tens of megabytes per sample).
pub const MAX_PATCH: usize = 255;

const PALETTE: [[u8; 3]; 12] = [
    [230, 25, 75],
    [60, 180, 75],
    [255, 225, 25],
    [0, 130, 200],
    [245, 130, 48],
    [145, 30, 180],
    [70, 240, 240],
    [240, 50, 230],
    [210, 245, 60],
    [250, 190, 212],
    [0, 128, 128],
    [170, 110, 40],
];

mod io;
pub use io::{Role, TensorSig, check_io};

#[cfg(test)]
mod tests;
