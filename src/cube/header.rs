//! ENVI header (`.hdr`) parsing and formatting.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use super::CubeError;

/// Sample storage types of ENVI `data type` codes that hsiedge reads and writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DataType {
    /// Code 1: unsigned 8-bit.
    U8,
    /// Code 2: signed 16-bit.
    I16,
    /// Code 3: signed 32-bit.
    I32,
    /// Code 4: 32-bit float.
    F32,
    /// Code 5: 64-bit float.
    F64,
    /// Code 12: unsigned 16-bit.
    U16,
}

impl DataType {
    /// Maps an ENVI `data type` code; `None` for codes hsiedge does not support (complex, 64-bit ints).
    pub fn from_code(code: u32) -> Option<Self> {
        Some(match code {
            1 => Self::U8,
            2 => Self::I16,
            3 => Self::I32,
            4 => Self::F32,
            5 => Self::F64,
            12 => Self::U16,
            _ => return None,
        })
    }

    /// The ENVI code.
    pub fn code(self) -> u32 {
        match self {
            Self::U8 => 1,
            Self::I16 => 2,
            Self::I32 => 3,
            Self::F32 => 4,
            Self::F64 => 5,
            Self::U16 => 12,
        }
    }

    /// Bytes per sample.
    pub fn size(self) -> usize {
        match self {
            Self::U8 => 1,
            Self::I16 | Self::U16 => 2,
            Self::I32 | Self::F32 => 4,
            Self::F64 => 8,
        }
    }
}

/// Order in which samples, lines and bands are laid out in the data file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Interleave {
    /// Band sequential: band, line, sample.
    Bsq,
    /// Band interleaved by line: line, band, sample.
    Bil,
    /// Band interleaved by pixel: line, sample, band.
    Bip,
}

impl Interleave {
    fn parse(s: &str) -> Option<Self> {
        match s.to_ascii_lowercase().as_str() {
            "bsq" => Some(Self::Bsq),
            "bil" => Some(Self::Bil),
            "bip" => Some(Self::Bip),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Bsq => "bsq",
            Self::Bil => "bil",
            Self::Bip => "bip",
        }
    }
}

/// Byte order of multi-byte samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ByteOrder {
    /// `byte order = 0`.
    Little,
    /// `byte order = 1`.
    Big,
}

/// A parsed ENVI header.
///
/// Known fields are typed; every other key is kept verbatim in `extra` (in file order) so that
/// `map info`, `coordinate system string` and vendor keys pass through to written maps.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Header {
    /// Pixels per line.
    pub samples: usize,
    /// Lines in the cube.
    pub lines: usize,
    /// Spectral bands.
    pub bands: usize,
    /// Bytes to skip at the start of the data file.
    pub header_offset: usize,
    /// Sample storage type.
    pub data_type: DataType,
    /// Sample layout.
    pub interleave: Interleave,
    /// Byte order of samples.
    pub byte_order: ByteOrder,
    /// `file type`, e.g. "ENVI Standard" or "ENVI Classification".
    pub file_type: Option<String>,
    /// `description`.
    pub description: Option<String>,
    /// Band centre wavelengths.
    pub wavelength: Vec<f64>,
    /// `wavelength units`.
    pub wavelength_units: Option<String>,
    /// Band full widths at half maximum.
    pub fwhm: Vec<f64>,
    /// Band names.
    pub band_names: Vec<String>,
    /// `map info`, passed through unparsed.
    pub map_info: Option<String>,
    /// `coordinate system string`, passed through unparsed.
    pub coordinate_system: Option<String>,
    /// Number of classes of a classification file (including class 0).
    pub classes: Option<usize>,
    /// Class names of a classification file, index = class id.
    pub class_names: Vec<String>,
    /// Class colours of a classification file, index = class id.
    pub class_lookup: Vec<[u8; 3]>,
    /// Other keys, verbatim (lower-cased key, raw value).
    pub extra: Vec<(String, String)>,
}

/// The fields [`Header::parse`] interprets; each may appear once.
const KNOWN_KEYS: &[&str] = &[
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

impl Header {
    /// A header for a new file with the given geometry, every optional field empty.
    pub fn new(samples: usize, lines: usize, bands: usize, data_type: DataType, interleave: Interleave) -> Self {
        Self {
            samples,
            lines,
            bands,
            header_offset: 0,
            data_type,
            interleave,
            byte_order: ByteOrder::Little,
            file_type: Some("ENVI Standard".into()),
            description: None,
            wavelength: Vec::new(),
            wavelength_units: None,
            fwhm: Vec::new(),
            band_names: Vec::new(),
            map_info: None,
            coordinate_system: None,
            classes: None,
            class_names: Vec::new(),
            class_lookup: Vec::new(),
            extra: Vec::new(),
        }
    }

    /// Bytes of sample data the header describes (excluding the header offset).
    pub fn data_bytes(&self) -> Option<usize> {
        self.samples
            .checked_mul(self.lines)?
            .checked_mul(self.bands)?
            .checked_mul(self.data_type.size())
    }

    /// Parses header text; `path` only names the file in errors.
    pub fn parse(text: &str, path: &Path) -> Result<Self, CubeError> {
        let err = |field: &str, message: String| CubeError::Header {
            path: path.to_path_buf(),
            field: field.to_string(),
            message,
        };
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        let mut rest = text.trim_start();
        if !rest.starts_with("ENVI") {
            return Err(err("magic", "the first line is not `ENVI`".into()));
        }
        rest = &rest[4..];
        let pairs = split_pairs(rest).map_err(|(key, message)| err(&key, message))?;

        let mut samples = None;
        let mut lines = None;
        let mut bands = None;
        let mut data_type = None;
        let mut h = Header::new(0, 0, 0, DataType::U8, Interleave::Bsq);
        h.file_type = None;
        let mut interleave = None;
        let mut seen = std::collections::HashSet::new();
        for (key, value) in pairs {
            // A field given twice is ambiguous (which one the writer meant is unknown); other
            // keys are passed through as they come.
            if KNOWN_KEYS.contains(&key.as_str()) && !seen.insert(key.clone()) {
                return Err(err(&key, "given twice".into()));
            }
            let int = |v: &str| -> Result<usize, CubeError> {
                v.trim()
                    .parse::<usize>()
                    .map_err(|_| err(&key, format!("`{}` is not a non-negative integer", v.trim())))
            };
            match key.as_str() {
                "samples" => samples = Some(int(&value)?),
                "lines" => lines = Some(int(&value)?),
                "bands" => bands = Some(int(&value)?),
                "header offset" => h.header_offset = int(&value)?,
                "data type" => {
                    let code = int(&value)?;
                    data_type = Some(u32::try_from(code).ok().and_then(DataType::from_code).ok_or_else(|| {
                        err(
                            &key,
                            format!("unsupported data type {code} (supported: 1, 2, 3, 4, 5, 12)"),
                        )
                    })?);
                }
                "interleave" => {
                    interleave = Some(
                        Interleave::parse(value.trim())
                            .ok_or_else(|| err(&key, format!("`{}` is not bsq, bil or bip", value.trim())))?,
                    )
                }
                "byte order" => {
                    h.byte_order = match int(&value)? {
                        0 => ByteOrder::Little,
                        1 => ByteOrder::Big,
                        n => return Err(err(&key, format!("{n} is not 0 or 1"))),
                    }
                }
                "file type" => h.file_type = Some(value.trim().to_string()),
                "description" => h.description = Some(unbrace(&value).trim().to_string()),
                "wavelength" => h.wavelength = parse_floats(&value).map_err(|m| err(&key, m))?,
                "wavelength units" => h.wavelength_units = Some(value.trim().to_string()),
                "fwhm" => h.fwhm = parse_floats(&value).map_err(|m| err(&key, m))?,
                "band names" => h.band_names = parse_list(&value),
                "map info" => h.map_info = Some(value.trim().to_string()),
                "coordinate system string" => h.coordinate_system = Some(value.trim().to_string()),
                "classes" => h.classes = Some(int(&value)?),
                "class names" => h.class_names = parse_list(&value),
                "class lookup" => {
                    let v = parse_floats(&value).map_err(|m| err(&key, m))?;
                    if v.len() % 3 != 0 {
                        return Err(err(
                            &key,
                            format!("{} values is not a multiple of 3 (r, g, b)", v.len()),
                        ));
                    }
                    if let Some(i) = v.iter().position(|c| !(0.0..=255.0).contains(c) || c.fract() != 0.0) {
                        return Err(err(
                            &key,
                            format!("value {i} ({}) is not a whole number in 0..=255", v[i]),
                        ));
                    }
                    h.class_lookup = v
                        .chunks_exact(3)
                        .map(|c| [c[0] as u8, c[1] as u8, c[2] as u8])
                        .collect();
                }
                _ => h.extra.push((key, value.trim().to_string())),
            }
        }
        h.samples = samples.ok_or_else(|| err("samples", "missing".into()))?;
        h.lines = lines.ok_or_else(|| err("lines", "missing".into()))?;
        h.bands = bands.ok_or_else(|| err("bands", "missing".into()))?;
        h.data_type = data_type.ok_or_else(|| err("data type", "missing".into()))?;
        h.interleave = interleave.ok_or_else(|| err("interleave", "missing".into()))?;
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

    /// Reads and parses a header file.
    pub fn read(path: &Path) -> Result<Self, CubeError> {
        let text = std::fs::read_to_string(path).map_err(|source| CubeError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text, path)
    }

    /// Formats the header as ENVI text.
    pub fn to_text(&self) -> String {
        let mut s = String::from("ENVI\n");
        if let Some(d) = &self.description {
            let _ = writeln!(s, "description = {{{d}}}");
        }
        let _ = writeln!(s, "samples = {}", self.samples);
        let _ = writeln!(s, "lines = {}", self.lines);
        let _ = writeln!(s, "bands = {}", self.bands);
        let _ = writeln!(s, "header offset = {}", self.header_offset);
        let _ = writeln!(
            s,
            "file type = {}",
            self.file_type.as_deref().unwrap_or("ENVI Standard")
        );
        let _ = writeln!(s, "data type = {}", self.data_type.code());
        let _ = writeln!(s, "interleave = {}", self.interleave.name());
        let _ = writeln!(
            s,
            "byte order = {}",
            if self.byte_order == ByteOrder::Big { 1 } else { 0 }
        );
        if let Some(m) = &self.map_info {
            let _ = writeln!(s, "map info = {m}");
        }
        if let Some(c) = &self.coordinate_system {
            let _ = writeln!(s, "coordinate system string = {c}");
        }
        if let Some(n) = self.classes {
            let _ = writeln!(s, "classes = {n}");
        }
        if !self.class_lookup.is_empty() {
            let v: Vec<String> = self
                .class_lookup
                .iter()
                .flat_map(|c| c.iter().map(|x| x.to_string()))
                .collect();
            let _ = writeln!(s, "class lookup = {{{}}}", v.join(", "));
        }
        if !self.class_names.is_empty() {
            let _ = writeln!(s, "class names = {{{}}}", self.class_names.join(", "));
        }
        if !self.band_names.is_empty() {
            let _ = writeln!(s, "band names = {{{}}}", self.band_names.join(", "));
        }
        if !self.wavelength.is_empty() {
            let v: Vec<String> = self.wavelength.iter().map(|x| x.to_string()).collect();
            let _ = writeln!(s, "wavelength = {{{}}}", v.join(", "));
        }
        if let Some(u) = &self.wavelength_units {
            let _ = writeln!(s, "wavelength units = {u}");
        }
        if !self.fwhm.is_empty() {
            let v: Vec<String> = self.fwhm.iter().map(|x| x.to_string()).collect();
            let _ = writeln!(s, "fwhm = {{{}}}", v.join(", "));
        }
        for (k, v) in &self.extra {
            let _ = writeln!(s, "{k} = {v}");
        }
        s
    }
}

/// Splits `key = value` pairs; a `{` opens a value that runs to the matching `}` across lines.
fn split_pairs(text: &str) -> Result<Vec<(String, String)>, (String, String)> {
    let mut pairs = Vec::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let line = line.trim();
        if line.is_empty() || line.starts_with(';') {
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            return Err((line.to_string(), "expected `key = value`".into()));
        };
        let key = key
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
            .to_ascii_lowercase();
        let mut value = value.trim().to_string();
        if value.starts_with('{') {
            let mut depth = brace_depth(&value);
            while depth > 0 {
                let Some(next) = lines.next() else {
                    return Err((key, "`{` is never closed".into()));
                };
                value.push('\n');
                value.push_str(next.trim());
                depth = brace_depth(&value);
            }
        }
        pairs.push((key, value));
    }
    Ok(pairs)
}

fn brace_depth(s: &str) -> i64 {
    s.chars().fold(0, |d, c| match c {
        '{' => d + 1,
        '}' => d - 1,
        _ => d,
    })
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

/// Finds the data file of a header: the same stem with `.img`, `.dat`, `.raw`, `.bsq`, `.bil`, `.bip` or no extension.
pub fn data_path_for(header: &Path) -> Result<PathBuf, CubeError> {
    let candidates: Vec<PathBuf> = ["img", "dat", "raw", "bsq", "bil", "bip", "IMG", "DAT"]
        .iter()
        .map(|ext| header.with_extension(ext))
        .chain(std::iter::once(header.with_extension("")))
        .collect();
    candidates
        .iter()
        .find(|p| p.is_file())
        .cloned()
        .ok_or_else(|| CubeError::MissingData {
            header: header.to_path_buf(),
            tried: candidates,
        })
}

/// Finds the header of a path given as either the `.hdr` or the data file.
pub fn header_path_for(path: &Path) -> PathBuf {
    if path.extension().is_some_and(|e| e.eq_ignore_ascii_case("hdr")) {
        return path.to_path_buf();
    }
    let appended = PathBuf::from(format!("{}.hdr", path.display()));
    if appended.is_file() {
        return appended;
    }
    path.with_extension("hdr")
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "ENVI\ndescription = {A test\n  cube}\nSamples = 3\nLINES   = 2\nbands = 2\nheader offset = 0\n\
        data type = 12\ninterleave = BIL\nbyte order = 1\nwavelength = {400.5,\n 500}\nband names = {a, b}\n\
        map info = {UTM, 1, 1, 0, 0, 30, 30, 11, North, WGS-84}\nsensor type = AVIRIS\n";

    #[test]
    fn a_field_given_twice_or_a_lookup_colour_out_of_range_is_named() {
        let twice = SAMPLE.replace("bands = 2\n", "bands = 2\nSAMPLES = 4\n");
        let e = Header::parse(&twice, Path::new("t.hdr")).unwrap_err().to_string();
        assert!(
            e.contains("t.hdr") && e.contains("samples") && e.contains("twice"),
            "{e}"
        );
        for lookup in ["{0, 0, 0, 255, 300, 0}", "{0, 0, 0.5}", "{0, -1, 0}"] {
            let text = format!("{SAMPLE}class lookup = {lookup}\n");
            let e = Header::parse(&text, Path::new("t.hdr")).unwrap_err().to_string();
            assert!(e.contains("class lookup") && e.contains("0..=255"), "{e}");
        }
        let ok = format!("{SAMPLE}class lookup = {{0, 0, 0, 255, 128, 7}}\n");
        let h = Header::parse(&ok, Path::new("t.hdr")).unwrap();
        assert_eq!(h.class_lookup, vec![[0, 0, 0], [255, 128, 7]]);
    }

    #[test]
    fn parses_multiline_case_insensitive() {
        let h = Header::parse(SAMPLE, Path::new("t.hdr")).unwrap();
        assert_eq!((h.samples, h.lines, h.bands), (3, 2, 2));
        assert_eq!(h.data_type, DataType::U16);
        assert_eq!(h.interleave, Interleave::Bil);
        assert_eq!(h.byte_order, ByteOrder::Big);
        assert_eq!(h.wavelength, vec![400.5, 500.0]);
        assert_eq!(h.band_names, vec!["a", "b"]);
        assert_eq!(h.description.as_deref(), Some("A test\ncube"));
        assert!(h.map_info.as_deref().unwrap().contains("UTM"));
        assert_eq!(h.extra, vec![("sensor type".to_string(), "AVIRIS".to_string())]);
    }

    #[test]
    fn round_trips_through_text() {
        let mut h = Header::parse(SAMPLE, Path::new("t.hdr")).unwrap();
        h.classes = Some(2);
        h.class_names = vec!["Unclassified".into(), "Crop".into()];
        h.class_lookup = vec![[0, 0, 0], [10, 200, 30]];
        let again = Header::parse(&h.to_text(), Path::new("u.hdr")).unwrap();
        assert_eq!(again.class_lookup, h.class_lookup);
        assert_eq!(again.class_names, h.class_names);
        assert_eq!(again.map_info, h.map_info);
        assert_eq!(again.wavelength, h.wavelength);
    }

    fn field_of(text: &str) -> String {
        match Header::parse(text, Path::new("bad.hdr")) {
            Err(CubeError::Header { field, path, .. }) => {
                assert_eq!(path, Path::new("bad.hdr"));
                field
            }
            other => panic!("expected a header error, got {other:?}"),
        }
    }

    #[test]
    fn errors_name_the_field() {
        assert_eq!(field_of("NOPE\nsamples = 1"), "magic");
        assert_eq!(
            field_of("ENVI\nlines = 1\nbands = 1\ndata type = 1\ninterleave = bsq"),
            "samples"
        );
        assert_eq!(
            field_of("ENVI\nsamples = 1\nlines = 1\nbands = 1\ndata type = 6\ninterleave = bsq"),
            "data type"
        );
        assert_eq!(field_of("ENVI\nsamples = x\n"), "samples");
        assert_eq!(
            field_of("ENVI\nsamples = 1\nlines = 1\nbands = 1\ndata type = 1\ninterleave = bxq"),
            "interleave"
        );
        assert_eq!(
            field_of("ENVI\nsamples = 1\nlines = 1\nbands = 2\ndata type = 1\ninterleave = bsq\nwavelength = {1}"),
            "wavelength"
        );
        assert_eq!(field_of("ENVI\nband names = {a, b"), "band names");
        assert_eq!(
            field_of("ENVI\nsamples = 0\nlines = 1\nbands = 1\ndata type = 1\ninterleave = bsq"),
            "samples"
        );
    }
}
