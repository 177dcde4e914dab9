//! ENVI hyperspectral cubes: header parsing, zero-copy reading, and encoding of written maps.
//!
//! A [`Cube`] maps its data file read-only after checking the file's size against the header, and
//! decodes one line at a time into `f32` in band-major order (`bands x samples`), whatever the
//! file's interleave, data type and byte order. Headers and data files as other tools write them
//! (any line ending, Latin-1 free text, repeated fields, trailing data) are read, with warnings
//! ([`Cube::warnings`]) saying what was tolerated.

mod fields;
mod files;
mod header;
mod lex;

use std::path::{Path, PathBuf};

pub use files::{data_path_for, header_path_for};
pub use header::{ByteOrder, DataType, Header, Interleave};

/// Errors from reading or describing cubes.
#[derive(Debug, thiserror::Error)]
pub enum CubeError {
    /// The file could not be read.
    #[error("{path}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A header field is missing or malformed.
    #[error("{path}: header field `{field}`: {message}")]
    Header {
        /// The header file.
        path: PathBuf,
        /// The field (lower-case ENVI key).
        field: String,
        /// What is wrong with it.
        message: String,
    },
    /// No data file sits beside the header.
    #[error("{header}: no data file found (tried {})", display_paths(tried))]
    MissingData {
        /// The header file.
        header: PathBuf,
        /// The paths looked at.
        tried: Vec<PathBuf>,
    },
    /// A header or data file path is not a regular file (reading a FIFO would block).
    #[error("{path}: is {kind}, not a {role}")]
    NotAFile {
        /// The path.
        path: PathBuf,
        /// What it is, e.g. "a directory" or "a FIFO (named pipe)".
        kind: &'static str,
        /// What it was meant to be: "header file" or "data file".
        role: &'static str,
    },
    /// The data file is shorter than the header describes.
    #[error(
        "{path}: file is {actual} bytes but the header ({header}) describes {expected} bytes \
         (header offset + samples x lines x bands x bytes per sample)"
    )]
    Size {
        /// The data file.
        path: PathBuf,
        /// The header that describes it.
        header: PathBuf,
        /// Bytes the header implies.
        expected: u64,
        /// Bytes on disk.
        actual: u64,
    },
}

fn display_paths(paths: &[PathBuf]) -> String {
    paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Values tied to a cube's mapping ([`Cube::keep_while_mapped`]).
#[derive(Default)]
struct Kept(std::sync::Mutex<Vec<Box<dyn std::any::Any + Send + Sync>>>);

impl std::fmt::Debug for Kept {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.0.lock().map_or(0, |k| k.len());
        write!(f, "Kept({n})")
    }
}

/// A cube on disk, mapped read-only.
#[derive(Debug)]
pub struct Cube {
    header: Header,
    header_path: PathBuf,
    data_path: PathBuf,
    /// What must be released before the mapping is (declared before `map`, so dropped first).
    kept: Kept,
    map: crate::ffi::Mapping,
    warnings: Vec<String>,
}

/// ENVI fields that scale or mask the stored values, which a run does not apply.
const UNAPPLIED: [&str; 4] = [
    "data gain values",
    "data offset values",
    "reflectance scale factor",
    "data ignore value",
];

impl Cube {
    /// Opens a cube from its header or data file path.
    ///
    /// The data file's length must be at least `header offset` plus the bytes the header
    /// describes: a shorter file is an error before mapping, a longer one is read (as ENVI and
    /// GDAL do) with a warning. A header or data path that is a directory, FIFO or device is an
    /// error naming it as such, and is never opened. The file must not be truncated while the
    /// `Cube` is alive (see [`crate::ffi::map_readonly`]).
    pub fn open(path: &Path) -> Result<Self, CubeError> {
        let header_path = header_path_for(path);
        let (header, mut warnings) = Header::read_with_warnings(&header_path)?;
        let data_path = data_path_for(&header_path)?;
        let Some(expected) = header
            .data_bytes()
            .and_then(|n| n.checked_add(header.header_offset))
            .and_then(|n| u64::try_from(n).ok())
        else {
            return Err(CubeError::Header {
                path: header_path,
                field: "samples x lines x bands x data type size + header offset".into(),
                message: format!(
                    "{} x {} x {} x {} + {} does not fit in 64 bits",
                    header.samples,
                    header.lines,
                    header.bands,
                    header.data_type.size(),
                    header.header_offset
                ),
            });
        };
        let (file, actual) = files::open_regular(&data_path, "data file")?;
        if actual < expected {
            return Err(CubeError::Size {
                path: data_path,
                header: header_path,
                expected,
                actual,
            });
        }
        if actual > expected {
            warnings.push(format!(
                "{}: file is {actual} bytes but the header ({}) describes {expected} bytes; the {} \
                 bytes after them are ignored",
                data_path.display(),
                header_path.display(),
                actual - expected
            ));
        }
        // Fields that change what the stored numbers mean are kept in outputs but not applied:
        // the model sees the numbers as stored, as its normalisation was fitted on them.
        for (key, _) in header.extra.iter().filter(|(k, _)| UNAPPLIED.contains(&k.as_str())) {
            warnings.push(format!(
                "{}: field `{key}` is not applied; the model sees the values as stored",
                header_path.display()
            ));
        }
        let map = crate::ffi::map_readonly(&file).map_err(|source| CubeError::Io {
            path: data_path.clone(),
            source,
        })?;
        Ok(Self {
            header,
            header_path,
            data_path,
            kept: Kept::default(),
            map,
            warnings,
        })
    }

    /// What was tolerated in opening the cube (header lines that are not UTF-8, a data file longer
    /// than described), one sentence each naming the file; empty for a clean cube.
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// The parsed header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The header file's path.
    pub fn header_path(&self) -> &Path {
        &self.header_path
    }

    /// The data file's path.
    pub fn data_path(&self) -> &Path {
        &self.data_path
    }

    /// Lines in the cube.
    pub fn lines(&self) -> usize {
        self.header.lines
    }

    /// Pixels per line.
    pub fn samples(&self) -> usize {
        self.header.samples
    }

    /// Spectral bands.
    pub fn bands(&self) -> usize {
        self.header.bands
    }

    fn data(&self) -> &[u8] {
        &self.map[self.header.header_offset..]
    }

    /// The data file's samples as stored (after the header offset): the device-resident path
    /// copies a window's raw samples from here and decodes them on the GPU.
    pub fn data_bytes(&self) -> &[u8] {
        self.data()
    }

    /// The whole mapping, page-aligned at its start (the header bytes included): what a device
    /// registers to read the samples straight from the page cache.
    pub fn mapped_bytes(&self) -> &[u8] {
        &self.map[..]
    }

    /// Keeps `value` alive exactly as long as the mapping: it is dropped when the cube is, before
    /// the file is unmapped (a device's registration of the mapped pages).
    pub fn keep_while_mapped(&self, value: Box<dyn std::any::Any + Send + Sync>) {
        // The list stays whole if a holder panicked: a push cannot leave it half-written.
        let mut kept = self.kept.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        kept.push(value);
    }

    /// Whether something kept by [`Cube::keep_while_mapped`] satisfies `test`.
    pub fn kept_any<T: std::any::Any>(&self, test: impl Fn(&T) -> bool) -> bool {
        let kept = self.kept.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        kept.iter().any(|v| v.downcast_ref::<T>().is_some_and(&test))
    }

    /// Copies line `line`'s raw bytes into `out` as one line of the file's data type and byte
    /// order, band by band (BIL) for BIL and BSQ files, pixel by pixel (BIP) for BIP files: the
    /// line a pushbroom sensor would have sent. `line` must be below [`Cube::lines`] and `out`
    /// exactly `bands * samples * size` long (the caller's invariants, checked in debug builds).
    pub fn raw_line(&self, line: usize, out: &mut [u8]) {
        let h = &self.header;
        let (s, b, l) = (h.samples, h.bands, h.lines);
        let n = s * b * h.data_type.size();
        debug_assert!(line < l && out.len() == n);
        let data = self.data();
        match h.interleave {
            Interleave::Bil | Interleave::Bip => out.copy_from_slice(&data[line * n..(line + 1) * n]),
            Interleave::Bsq => {
                let row = s * h.data_type.size();
                for (band, o) in out.chunks_exact_mut(row).enumerate() {
                    let start = (band * l + line) * row;
                    o.copy_from_slice(&data[start..start + row]);
                }
            }
        }
    }

    /// Decodes line `line` into `out` as `bands x samples` (band-major) raw values.
    ///
    /// `line` must be below [`Cube::lines`] and `out` exactly `bands * samples` long; both are the
    /// caller's invariants (the tiler derives them from this header), checked with a debug assertion.
    pub fn read_line(&self, line: usize, out: &mut [f32]) {
        let h = &self.header;
        let (s, b, l) = (h.samples, h.bands, h.lines);
        debug_assert!(line < l && out.len() == s * b);
        let size = h.data_type.size();
        let data = self.data();
        match h.interleave {
            Interleave::Bil => {
                let start = line * b * s * size;
                decode(&data[start..start + b * s * size], h.data_type, h.byte_order, out);
            }
            Interleave::Bsq => {
                for band in 0..b {
                    let start = ((band * l + line) * s) * size;
                    decode(
                        &data[start..start + s * size],
                        h.data_type,
                        h.byte_order,
                        &mut out[band * s..(band + 1) * s],
                    );
                }
            }
            Interleave::Bip => {
                let start = line * s * b * size;
                let mut pix = vec![0f32; b];
                for sample in 0..s {
                    let at = start + sample * b * size;
                    decode(&data[at..at + b * size], h.data_type, h.byte_order, &mut pix);
                    for (band, v) in pix.iter().enumerate() {
                        out[band * s + sample] = *v;
                    }
                }
            }
        }
    }

    /// Appends to `out`, band by band and within a band line by line (`lines`, top to bottom), the
    /// samples `lo + at .. lo + at + len` of each run `(at, len)` in `runs`, each value `v` of band
    /// `b` as `(v - offset[b]) * scale[b]`.
    ///
    /// This is the tiler's read path: a window is built straight from the mapped file, decoding
    /// and normalising in one pass, so no decoded copy of the scene is kept. The data type and byte
    /// order are dispatched once per window, not per row: a window is ten thousand rows of a few
    /// dozen samples. The indices are the caller's invariants (derived from this header), checked
    /// with a debug assertion.
    pub fn append_runs(
        &self,
        lines: &[usize],
        lo: usize,
        runs: &[(usize, usize)],
        offset: &[f32],
        scale: &[f32],
        out: &mut Vec<f32>,
    ) {
        macro_rules! typed {
            ($t:ty) => {
                match self.header.byte_order {
                    ByteOrder::Little => self.append_runs_as::<$t, false>(lines, lo, runs, offset, scale, out),
                    ByteOrder::Big => self.append_runs_as::<$t, true>(lines, lo, runs, offset, scale, out),
                }
            };
        }
        match self.header.data_type {
            DataType::U8 => typed!(u8),
            DataType::I16 => typed!(i16),
            DataType::U16 => typed!(u16),
            DataType::I32 => typed!(i32),
            DataType::F32 => typed!(f32),
            DataType::F64 => typed!(f64),
        }
    }

    fn append_runs_as<T: Sample, const BIG: bool>(
        &self,
        lines: &[usize],
        lo: usize,
        runs: &[(usize, usize)],
        offset: &[f32],
        scale: &[f32],
        out: &mut Vec<f32>,
    ) {
        let h = &self.header;
        let (s, b, l) = (h.samples, h.bands, h.lines);
        debug_assert!(lines.iter().all(|&y| y < l) && runs.iter().all(|&(at, len)| lo + at + len <= s));
        let data = self.data();
        let width: usize = runs.iter().map(|r| r.1).sum();
        out.reserve(b * lines.len() * width);
        // File row of (line, band) is `line * per_line + band * per_band`: BIL and BSQ store each
        // band of a line contiguously, so a window row is decoded straight from the file.
        let (per_line, per_band) = match h.interleave {
            Interleave::Bil => (b, 1),
            Interleave::Bsq => (1, l),
            Interleave::Bip => {
                for band in 0..b {
                    let (m, k) = (offset[band], scale[band]);
                    for &y in lines {
                        for &(at, len) in runs {
                            out.extend((lo + at..lo + at + len).map(|x| {
                                let from = ((y * s + x) * b + band) * T::SIZE;
                                (T::decode::<BIG>(&data[from..from + T::SIZE]) - m) * k
                            }));
                        }
                    }
                }
                return;
            }
        };
        for band in 0..b {
            let (m, k) = (offset[band], scale[band]);
            for &y in lines {
                let src = ((y * per_line + band * per_band) * s + lo) * T::SIZE;
                for &(at, len) in runs {
                    let from = src + at * T::SIZE;
                    let bytes = &data[from..from + len * T::SIZE];
                    if len == 1 {
                        out.push((T::decode::<BIG>(bytes) - m) * k);
                    } else {
                        out.extend(bytes.chunks_exact(T::SIZE).map(|c| (T::decode::<BIG>(c) - m) * k));
                    }
                }
            }
        }
    }

    /// Reads the whole cube as `lines x bands x samples` raw values (BIL order).
    pub fn read_all(&self) -> Vec<f32> {
        let per_line = self.bands() * self.samples();
        let mut out = vec![0f32; per_line * self.lines()];
        for (line, chunk) in out.chunks_exact_mut(per_line).enumerate() {
            self.read_line(line, chunk);
        }
        out
    }
}

/// An ENVI sample type, decoded from its bytes as `f32`.
trait Sample {
    /// Bytes per sample.
    const SIZE: usize;
    /// The sample in `c` (exactly `SIZE` bytes), big-endian when `BIG`.
    fn decode<const BIG: bool>(c: &[u8]) -> f32;
}

macro_rules! sample {
    ($t:ty) => {
        impl Sample for $t {
            const SIZE: usize = std::mem::size_of::<$t>();
            #[inline(always)]
            fn decode<const BIG: bool>(c: &[u8]) -> f32 {
                let mut a = [0u8; std::mem::size_of::<$t>()];
                a.copy_from_slice(c);
                (if BIG {
                    <$t>::from_be_bytes(a)
                } else {
                    <$t>::from_le_bytes(a)
                }) as f32
            }
        }
    };
}

sample!(u8);
sample!(i16);
sample!(u16);
sample!(i32);
sample!(f32);
sample!(f64);

/// Decodes `out.len()` consecutive samples of `dt` from `bytes`.
pub fn decode(bytes: &[u8], dt: DataType, order: ByteOrder, out: &mut [f32]) {
    // `(v - 0) * 1` is `v` exactly in IEEE arithmetic.
    decode_scaled(bytes, dt, order, 0.0, 1.0, out);
}

/// Decodes `out.len()` consecutive samples of `dt` from `bytes`, each value `v` as
/// `(v - offset) * scale` (rounded as `f32` arithmetic: the same result as decoding first).
pub fn decode_scaled(bytes: &[u8], dt: DataType, order: ByteOrder, offset: f32, scale: f32, out: &mut [f32]) {
    macro_rules! typed {
        ($t:ty) => {
            match order {
                ByteOrder::Little => decode_scaled_as::<$t, false>(bytes, offset, scale, out),
                ByteOrder::Big => decode_scaled_as::<$t, true>(bytes, offset, scale, out),
            }
        };
    }
    match dt {
        DataType::U8 => typed!(u8),
        DataType::I16 => typed!(i16),
        DataType::U16 => typed!(u16),
        DataType::I32 => typed!(i32),
        DataType::F32 => typed!(f32),
        DataType::F64 => typed!(f64),
    }
}

/// [`decode_scaled`] for one sample type and byte order, decided once per call so the loop
/// vectorises.
fn decode_scaled_as<T: Sample, const BIG: bool>(bytes: &[u8], offset: f32, scale: f32, out: &mut [f32]) {
    for (o, c) in out.iter_mut().zip(bytes.chunks_exact(T::SIZE)) {
        *o = (T::decode::<BIG>(c) - offset) * scale;
    }
}

/// Encodes `f32` samples little-endian, as written maps store them.
pub fn encode_f32(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

#[cfg(test)]
mod tests;
