//! ENVI header (`.hdr`) parsing and formatting.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::Path;

use super::fields::{Draft, KNOWN_KEYS, TEXT_KEYS, field_error, shorten};
use super::{CubeError, files, lex};

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
    pub(super) fn parse(s: &str) -> Option<Self> {
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
    ///
    /// Text that is already UTF-8 gives no warnings: see [`Header::parse_bytes`].
    pub fn parse(text: &str, path: &Path) -> Result<Self, CubeError> {
        Self::parse_bytes(text.as_bytes(), path).map(|(h, _)| h)
    }

    /// Parses a header file's bytes, returning the header and warnings about what was tolerated;
    /// `path` only names the file in errors and warnings.
    ///
    /// Lines may end in LF, CRLF or CR alone. A line holding bytes that are not UTF-8 is read
    /// lossily (U+FFFD in their place) with a warning naming the line when its field is free text
    /// (`description`, names, units, `map info`, keys hsiedge passes through); in a field hsiedge
    /// interprets (a number, a list of numbers, `interleave`) it is an error naming the field. A
    /// field given twice is accepted when both values read the same, else an error naming both.
    pub fn parse_bytes(bytes: &[u8], path: &Path) -> Result<(Self, Vec<String>), CubeError> {
        let pairs = lex::pairs(bytes).map_err(|e| field_error(path, &e.field, e.message))?;
        let mut warnings = Vec::new();
        let mut draft = Draft::default();
        // Known fields met so far: their raw value and line.
        let mut seen: HashMap<String, (String, usize)> = HashMap::new();
        for pair in pairs {
            let key = pair.key.as_str();
            let known = KNOWN_KEYS.contains(&key);
            if let Some(&(line, column, byte)) = pair.not_utf8.first() {
                if known && !TEXT_KEYS.contains(&key) {
                    return Err(field_error(
                        path,
                        key,
                        format!(
                            "line {line}: byte 0x{byte:02X} at column {column} is not UTF-8 \
                             (only free-text fields are read past such bytes)"
                        ),
                    ));
                }
                let lines: Vec<String> = pair.not_utf8.iter().map(|l| l.0.to_string()).collect();
                warnings.push(format!(
                    "{}: {} {}: `{key}` holds bytes that are not UTF-8 (the first: 0x{byte:02X} at \
                     column {column}); read with U+FFFD in their place",
                    path.display(),
                    if lines.len() == 1 { "line" } else { "lines" },
                    lines.join(", "),
                ));
            }
            if known {
                // A repeat that reads the same is harmless (writers that append fields repeat
                // them); one that differs is ambiguous, since which the writer meant is unknown.
                if let Some((first, first_line)) = seen.get(key) {
                    let mut again = draft.clone();
                    again.apply(&pair.key, &pair.value, path)?;
                    if again != draft {
                        return Err(field_error(
                            path,
                            key,
                            format!(
                                "given twice with different values: `{}` (line {first_line}) and `{}` (line {})",
                                shorten(first),
                                shorten(&pair.value),
                                pair.line
                            ),
                        ));
                    }
                    continue;
                }
                seen.insert(pair.key.clone(), (pair.value.clone(), pair.line));
            }
            draft.apply(&pair.key, &pair.value, path)?;
        }
        draft.finish(path).map(|h| (h, warnings))
    }

    /// Reads and parses a header file, dropping warnings (see [`Header::read_with_warnings`]).
    pub fn read(path: &Path) -> Result<Self, CubeError> {
        Self::read_with_warnings(path).map(|(h, _)| h)
    }

    /// Reads and parses a header file, returning the warnings of [`Header::parse_bytes`] with it.
    ///
    /// A path that is a FIFO, a device or a directory is refused as such before it is opened (a
    /// FIFO would block the read).
    pub fn read_with_warnings(path: &Path) -> Result<(Self, Vec<String>), CubeError> {
        let (mut file, len) = files::open_regular(path, "header file")?;
        let mut bytes = Vec::with_capacity(usize::try_from(len).unwrap_or(0).min(1 << 20));
        std::io::Read::read_to_end(&mut file, &mut bytes).map_err(|source| CubeError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse_bytes(&bytes, path)
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
            e.contains(
                "t.hdr: header field `samples`: given twice with different values: `3` (line 4) and `4` (line 7)"
            ),
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
    fn a_field_repeated_with_the_same_value_is_accepted() {
        // The same value as the header reads it: spacing, case and number spelling aside.
        let again = format!(
            "{SAMPLE}samples = 3\ninterleave = bil\nwavelength = {{400.50, 5e2}}\nband names = {{a,b}}\n\
             description = {{A test\ncube}}\n"
        );
        let (h, warnings) = Header::parse_bytes(again.as_bytes(), Path::new("t.hdr")).unwrap();
        assert_eq!(h, Header::parse(SAMPLE, Path::new("t.hdr")).unwrap());
        assert!(warnings.is_empty(), "{warnings:?}");
        // A long list that differs is quoted cut short, both values with their lines.
        let many = |x: f64| {
            (0..40)
                .map(|i| format!("{}", i as f64 + x))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let text = format!(
            "ENVI\nsamples = 1\nlines = 1\nbands = 40\ndata type = 1\ninterleave = bsq\n\
             fwhm = {{{}}}\nfwhm = {{{}}}\n",
            many(0.0),
            many(0.5)
        );
        let e = Header::parse(&text, Path::new("t.hdr")).unwrap_err().to_string();
        assert!(
            e.contains("`fwhm`: given twice with different values: `{0, 1, 2,"),
            "{e}"
        );
        assert!(
            e.contains("...` (line 7) and `{0.5, 1.5,") && e.contains("...` (line 8)"),
            "{e}"
        );
        // Keys hsiedge does not interpret pass through as often as they come.
        let h = Header::parse(&format!("{SAMPLE}sensor type = AVIRIS-NG\n"), Path::new("t.hdr")).unwrap();
        assert_eq!(h.extra.len(), 2);
    }

    #[test]
    fn latin1_free_text_is_read_lossily_with_a_warning_naming_file_and_line() {
        let bytes = b"ENVI\r\ndescription = {Caf\xE9 cr\xE8me}\r\nsamples = 3\r\nlines = 2\r\nbands = 2\r\n\
            data type = 12\r\ninterleave = bil\r\nsensor = Fran\xE7ais\r\nband names = {a,\r\n b\xB2}\r\n";
        let (h, w) = Header::parse_bytes(bytes, Path::new("dir/t.hdr")).unwrap();
        assert_eq!(h.description.as_deref(), Some("Caf\u{FFFD} cr\u{FFFD}me"));
        assert_eq!(h.extra, vec![("sensor".to_string(), "Fran\u{FFFD}ais".to_string())]);
        assert_eq!(h.band_names, vec!["a", "b\u{FFFD}"]);
        assert_eq!((h.samples, h.lines, h.bands), (3, 2, 2));
        assert_eq!(w.len(), 3, "{w:?}");
        assert_eq!(
            w[0],
            "dir/t.hdr: line 2: `description` holds bytes that are not UTF-8 (the first: 0xE9 at \
             column 19); read with U+FFFD in their place"
        );
        assert!(w[1].starts_with("dir/t.hdr: line 8: `sensor`"), "{w:?}");
        assert!(
            w[2].starts_with("dir/t.hdr: line 10: `band names`") && w[2].contains("0xB2"),
            "{w:?}"
        );
    }

    #[test]
    fn a_byte_that_is_not_utf8_in_an_interpreted_field_is_an_error_naming_it() {
        let base = "ENVI\nsamples = 3\nlines = 2\nbands = 2\ndata type = 12\ninterleave = bil\nwavelength = {1, 2}\n";
        let cases: [(&str, &[u8], usize); 4] = [
            ("samples", b"samples = 3\xB9\n", 7),
            ("interleave", b"interleave = b\xEDl\n", 7),
            ("wavelength", b"wavelength = {400.5,\n 500\xB5}\n", 8),
            ("data type", b"data type = \xA012\n", 7),
        ];
        for (field, line, at) in cases {
            let mut bytes: Vec<u8> = base
                .lines()
                .filter(|l| !l.starts_with(field))
                .flat_map(|l| format!("{l}\n").into_bytes())
                .collect();
            bytes.extend_from_slice(line);
            match Header::parse_bytes(&bytes, Path::new("bad.hdr")) {
                Err(CubeError::Header { field: f, message, .. }) => {
                    assert_eq!(f, field);
                    assert!(
                        message.starts_with(&format!("line {at}: byte 0x")) && message.contains("is not UTF-8"),
                        "{message}"
                    );
                }
                other => panic!("{field}: expected a header error, got {other:?}"),
            }
        }
    }

    #[test]
    fn cr_only_and_crlf_headers_read_as_lf_ones() {
        let lf = Header::parse(SAMPLE, Path::new("t.hdr")).unwrap();
        for ending in ["\r", "\r\n"] {
            let h = Header::parse(&SAMPLE.replace('\n', ending), Path::new("t.hdr")).unwrap();
            assert_eq!(h, lf, "{ending:?}");
        }
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
