//! The fields of an ENVI header: reading each known key's value into its typed field, and checking
//! the fields against each other once all are read.

use std::path::Path;

use super::CubeError;
use super::header::{ByteOrder, DataType, Header, Interleave};

/// The fields [`Header::parse`] reads into typed fields; each may be given again only with the same value.
pub(super) const KNOWN_KEYS: &[&str] = &[
    "samples",
    "lines",
    "bands",
    "header offset",
    "data type",
    "interleave",
    "byte order",
    "file type",
    "description",
    "wavelength",
    "wavelength units",
    "fwhm",
    "band names",
    "map info",
    "coordinate system string",
    "classes",
    "class names",
    "class lookup",
];

/// Fields that are free text: a byte that is not UTF-8 in them is read lossily, with a warning.
/// Every other known field is interpreted, and such a byte in it is an error.
pub(super) const TEXT_KEYS: &[&str] = &[
    "file type",
    "description",
    "wavelength units",
    "band names",
    "map info",
    "coordinate system string",
    "class names",
];

pub(super) fn field_error(path: &Path, field: &str, message: String) -> CubeError {
    CubeError::Header {
        path: path.to_path_buf(),
        field: field.to_string(),
        message,
    }
}

/// A value as an error message quotes it: on one line, long lists cut.
pub(super) fn shorten(v: &str) -> String {
    let v = v.split_whitespace().collect::<Vec<_>>().join(" ");
    match v.char_indices().nth(60) {
        Some((at, _)) => format!("{}...", &v[..at]),
        None => v,
    }
}

/// A header being parsed: the fields given so far.
#[derive(Clone, PartialEq)]
pub(super) struct Draft {
    samples: Option<usize>,
    lines: Option<usize>,
    bands: Option<usize>,
    data_type: Option<DataType>,
    interleave: Option<Interleave>,
    /// Every other field, already in place.
    h: Header,
}

impl Default for Draft {
    fn default() -> Self {
        let mut h = Header::new(0, 0, 0, DataType::U8, Interleave::Bsq);
        h.file_type = None;
        Self {
            samples: None,
            lines: None,
            bands: None,
            data_type: None,
            interleave: None,
            h,
        }
    }
}

impl Draft {
    /// Sets the field `key` from `value`; a key hsiedge does not interpret goes to `extra`.
    pub(super) fn apply(&mut self, key: &str, value: &str, path: &Path) -> Result<(), CubeError> {
        let err = |message: String| field_error(path, key, message);
        let int = |v: &str| -> Result<usize, CubeError> {
            v.trim()
                .parse::<usize>()
                .map_err(|_| err(format!("`{}` is not a non-negative integer", v.trim())))
        };
        let h = &mut self.h;
        match key {
            "samples" => self.samples = Some(int(value)?),
            "lines" => self.lines = Some(int(value)?),
            "bands" => self.bands = Some(int(value)?),
            "header offset" => h.header_offset = int(value)?,
            "data type" => {
                let code = int(value)?;
                self.data_type = Some(
                    u32::try_from(code)
                        .ok()
                        .and_then(DataType::from_code)
                        .ok_or_else(|| err(format!("unsupported data type {code} (supported: 1, 2, 3, 4, 5, 12)")))?,
                );
            }
            "interleave" => {
                self.interleave = Some(
                    Interleave::parse(value.trim())
                        .ok_or_else(|| err(format!("`{}` is not bsq, bil or bip", value.trim())))?,
                )
            }
            "byte order" => {
                h.byte_order = match int(value)? {
                    0 => ByteOrder::Little,
                    1 => ByteOrder::Big,
                    n => return Err(err(format!("{n} is not 0 or 1"))),
                }
            }
            "file type" => h.file_type = Some(value.trim().to_string()),
            "description" => h.description = Some(unbrace(value).trim().to_string()),
            "wavelength" => h.wavelength = parse_floats(value).map_err(err)?,
            "wavelength units" => h.wavelength_units = Some(value.trim().to_string()),
            "fwhm" => h.fwhm = parse_floats(value).map_err(err)?,
            "band names" => h.band_names = parse_list(value),
            "map info" => h.map_info = Some(value.trim().to_string()),
            "coordinate system string" => h.coordinate_system = Some(value.trim().to_string()),
            "classes" => h.classes = Some(int(value)?),
            "class names" => h.class_names = parse_list(value),
            "class lookup" => {
                let v = parse_floats(value).map_err(err)?;
                if v.len() % 3 != 0 {
                    return Err(err(format!("{} values is not a multiple of 3 (r, g, b)", v.len())));
                }
                if let Some(i) = v.iter().position(|c| !(0.0..=255.0).contains(c) || c.fract() != 0.0) {
                    return Err(err(format!("value {i} ({}) is not a whole number in 0..=255", v[i])));
                }
                h.class_lookup = v
                    .chunks_exact(3)
                    .map(|c| [c[0] as u8, c[1] as u8, c[2] as u8])
                    .collect();
            }
            _ => h.extra.push((key.to_string(), value.trim().to_string())),
        }
        Ok(())
    }

    /// The header, once every required field is present and the fields agree with each other.
    pub(super) fn finish(self, path: &Path) -> Result<Header, CubeError> {
        let err = |field: &str, message: String| field_error(path, field, message);
        let mut h = self.h;
        h.samples = self.samples.ok_or_else(|| err("samples", "missing".into()))?;
        h.lines = self.lines.ok_or_else(|| err("lines", "missing".into()))?;
        h.bands = self.bands.ok_or_else(|| err("bands", "missing".into()))?;
        h.data_type = self.data_type.ok_or_else(|| err("data type", "missing".into()))?;
        h.interleave = self.interleave.ok_or_else(|| err("interleave", "missing".into()))?;
        for (field, n) in [("samples", h.samples), ("lines", h.lines), ("bands", h.bands)] {
            if n == 0 {
                return Err(err(field, "must be at least 1".into()));
            }
        }
        if h.data_bytes().is_none() {
            return Err(err("samples", "samples x lines x bands overflows".into()));
        }
        for (field, len) in [
            ("wavelength", h.wavelength.len()),
            ("fwhm", h.fwhm.len()),
            ("band names", h.band_names.len()),
        ] {
            if len != 0 && len != h.bands {
                return Err(err(field, format!("{len} values for {} bands", h.bands)));
            }
        }
        if let Some(classes) = h.classes {
            if !h.class_names.is_empty() && h.class_names.len() != classes {
                return Err(err(
                    "class names",
                    format!("{} names for {classes} classes", h.class_names.len()),
                ));
            }
            if !h.class_lookup.is_empty() && h.class_lookup.len() != classes {
                return Err(err(
                    "class lookup",
                    format!("{} colours for {classes} classes", h.class_lookup.len()),
                ));
            }
        }
        Ok(h)
    }
}

fn unbrace(v: &str) -> &str {
    let v = v.trim();
    v.strip_prefix('{').and_then(|v| v.strip_suffix('}')).unwrap_or(v)
}

fn parse_list(v: &str) -> Vec<String> {
    unbrace(v)
        .split(',')
        .map(|s| s.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|s| !s.is_empty())
        .collect()
}

fn parse_floats(v: &str) -> Result<Vec<f64>, String> {
    parse_list(v)
        .into_iter()
        .map(|s| s.parse::<f64>().map_err(|_| format!("`{s}` is not a number")))
        .collect()
}
