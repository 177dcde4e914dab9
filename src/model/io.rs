//! A manifest against the tensor signature a session reports.

use std::path::Path;

use super::*;

/// A graph tensor's signature as a session reports it: name and dims (`None` = symbolic).
#[derive(Debug, Clone, PartialEq)]
pub struct TensorSig {
    /// Tensor name.
    pub name: String,
    /// Dimensions; `None` for a symbolic one.
    pub dims: Vec<Option<usize>>,
}

/// Which of the manifest's graphs a signature belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The per-patch model.
    Patch,
    /// The dense twin.
    Dense,
}

/// Checks a graph's single input and output against the manifest.
///
/// Patch graphs take `layout` with p x p windows and give `N x K` (or `N x K x 1 x 1`); dense graphs
/// take the same layout over any window and give `N x K x H x W`.
pub fn check_io(
    m: &Manifest,
    role: Role,
    onnx: &Path,
    input: &TensorSig,
    output: &TensorSig,
) -> Result<(), ModelError> {
    let mismatch = |t: &TensorSig, detail: String, field: &str, expected: String| ModelError::Mismatch {
        onnx: onnx.to_path_buf(),
        tensor: t.name.clone(),
        detail,
        manifest: m.path.clone(),
        field: field.into(),
        expected,
    };
    let layout = m.input.layout;
    if input.dims.len() != layout.rank() {
        return Err(mismatch(
            input,
            format!("has rank {} ({})", input.dims.len(), dims_text(&input.dims)),
            "input.layout",
            format!("{layout:?} needs rank {}", layout.rank()).to_lowercase(),
        ));
    }
    if let Some(n) = input.dims[0] {
        return Err(mismatch(
            input,
            format!("has its batch axis fixed at {n}"),
            &format!("files.{}", if role == Role::Patch { "patch" } else { "dense" }),
            "names a graph that hsiedge batches, so its axis 0 must be symbolic (export with a dynamic batch axis)"
                .into(),
        ));
    }
    if role == Role::Dense && layout != Layout::Nc {
        for axis in [layout.rank() - 2, layout.rank() - 1] {
            if let Some(d) = input.dims[axis] {
                return Err(mismatch(
                    input,
                    format!("has spatial axis {axis} fixed at {d}"),
                    "files.dense",
                    "names a fully convolutional twin, which takes windows of any size (symbolic H and W)".into(),
                ));
            }
        }
    }
    let band_axis = if layout == Layout::N1chw { 2 } else { 1 };
    if let Some(c) = input.dims[band_axis]
        && c != m.input.bands
    {
        return Err(mismatch(
            input,
            format!("has {c} bands on axis {band_axis}"),
            "input.bands",
            format!("says {}", m.input.bands),
        ));
    }
    if layout == Layout::N1chw && input.dims[1].is_some_and(|d| d != 1) {
        return Err(mismatch(
            input,
            "axis 1 is not 1".into(),
            "input.layout",
            "n1chw needs N x 1 x C x H x W".into(),
        ));
    }
    if role == Role::Patch && layout != Layout::Nc {
        for axis in [layout.rank() - 2, layout.rank() - 1] {
            if let Some(d) = input.dims[axis]
                && d != m.patch
            {
                return Err(mismatch(
                    input,
                    format!("has {d} on spatial axis {axis}"),
                    "patch",
                    format!("says {}", m.patch),
                ));
            }
        }
    }
    let k = m.classes();
    let ok_rank = match role {
        Role::Patch => {
            output.dims.len() == 2 || (output.dims.len() == 4 && output.dims[2..].iter().all(|d| d.unwrap_or(1) == 1))
        }
        Role::Dense => output.dims.len() == 4,
    };
    if !ok_rank {
        let want = if role == Role::Patch { "N x K" } else { "N x K x H x W" };
        return Err(mismatch(
            output,
            format!("has shape {}", dims_text(&output.dims)),
            "outputs",
            format!("needs {want}"),
        ));
    }
    if let Some(got) = output.dims[1]
        && got != k
    {
        return Err(mismatch(
            output,
            format!("has {got} channels"),
            "outputs",
            format!("lists {k}"),
        ));
    }
    Ok(())
}

fn dims_text(dims: &[Option<usize>]) -> String {
    dims.iter()
        .map(|d| d.map_or("?".to_string(), |v| v.to_string()))
        .collect::<Vec<_>>()
        .join(" x ")
}
