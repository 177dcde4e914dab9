//! An ENVI file as a line source: the scene's lines read from the mapped file in order.

use std::path::Path;

use super::{LineSource, LineStatus, SceneInfo, SourceError, SourceStats};
use crate::cube::{Cube, CubeError, Interleave};

/// The lines of a mapped ENVI cube, top to bottom. Its scene id is the header's file stem.
#[derive(Debug)]
pub struct FileSource {
    cube: Cube,
    info: SceneInfo,
    next: usize,
}

impl FileSource {
    /// Opens the cube at `path` (header or data file) as scene `id` (its file stem when `None`).
    pub fn open(path: &Path, id: Option<&str>) -> Result<Self, OpenError> {
        let cube = Cube::open(path)?;
        Ok(Self::new(cube, id)?)
    }

    /// The lines of `cube` as scene `id` (the header's file stem when `None`).
    pub fn new(cube: Cube, id: Option<&str>) -> Result<Self, SourceError> {
        let h = cube.header();
        let id = match id {
            Some(id) => id.to_string(),
            None => cube
                .header_path()
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default(),
        };
        let info = SceneInfo {
            id,
            samples: h.samples,
            bands: h.bands,
            data_type: h.data_type,
            interleave: match h.interleave {
                Interleave::Bip => Interleave::Bip,
                Interleave::Bil | Interleave::Bsq => Interleave::Bil,
            },
            byte_order: h.byte_order,
            lines: Some(h.lines),
            model: None,
            header: h.clone(),
            origin: cube.header_path().to_path_buf(),
        };
        info.validate()?;
        Ok(Self { cube, info, next: 0 })
    }

    /// The mapped cube.
    pub fn cube(&self) -> &Cube {
        &self.cube
    }
}

impl LineSource for FileSource {
    fn info(&self) -> &SceneInfo {
        &self.info
    }

    fn next_line(&mut self, line: &mut [u8]) -> Result<Option<LineStatus>, SourceError> {
        if self.next >= self.cube.lines() {
            return Ok(None);
        }
        if line.len() != self.info.line_bytes() {
            return Err(SourceError::Protocol {
                what: self.info.origin.display().to_string(),
                message: format!("a line buffer of {} bytes, not {}", line.len(), self.info.line_bytes()),
            });
        }
        self.cube.raw_line(self.next, line);
        self.next += 1;
        Ok(Some(LineStatus::Received))
    }

    fn stats(&self) -> SourceStats {
        SourceStats {
            lines: self.next as u64,
            ..SourceStats::default()
        }
    }
}

/// Why a file could not be opened as a source.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The cube itself.
    #[error(transparent)]
    Cube(#[from] CubeError),
    /// The scene it describes.
    #[error(transparent)]
    Source(#[from] SourceError),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cube::{ByteOrder, DataType, Header};

    #[test]
    fn lines_of_every_interleave_come_out_as_a_sensor_sends_them() {
        let dir = tempfile::tempdir().unwrap();
        let (lines, samples, bands) = (3usize, 4usize, 2usize);
        // Value of (line, band, sample) as int16.
        let v = |l: usize, b: usize, s: usize| (100 * l + 10 * b + s) as i16;
        for il in [Interleave::Bil, Interleave::Bsq, Interleave::Bip] {
            let mut bytes = Vec::new();
            let mut push = |l, b, s| bytes.extend(v(l, b, s).to_be_bytes());
            match il {
                Interleave::Bil => {
                    (0..lines).for_each(|l| (0..bands).for_each(|b| (0..samples).for_each(|s| push(l, b, s))))
                }
                Interleave::Bsq => {
                    (0..bands).for_each(|b| (0..lines).for_each(|l| (0..samples).for_each(|s| push(l, b, s))))
                }
                Interleave::Bip => {
                    (0..lines).for_each(|l| (0..samples).for_each(|s| (0..bands).for_each(|b| push(l, b, s))))
                }
            }
            let mut h = Header::new(samples, lines, bands, DataType::I16, il);
            h.byte_order = ByteOrder::Big;
            let hdr = dir.path().join(format!("c_{il:?}.hdr"));
            std::fs::write(&hdr, h.to_text()).unwrap();
            std::fs::write(hdr.with_extension("img"), &bytes).unwrap();
            let mut src = FileSource::open(&hdr, None).unwrap();
            assert_eq!(src.info().id, format!("c_{il:?}"));
            let mut line = vec![0u8; src.info().line_bytes()];
            for l in 0..lines {
                assert_eq!(src.next_line(&mut line).unwrap(), Some(LineStatus::Received));
                let got: Vec<i16> = line.chunks_exact(2).map(|c| i16::from_be_bytes([c[0], c[1]])).collect();
                let want: Vec<i16> = match src.info().interleave {
                    Interleave::Bip => (0..samples).flat_map(|s| (0..bands).map(move |b| v(l, b, s))).collect(),
                    _ => (0..bands).flat_map(|b| (0..samples).map(move |s| v(l, b, s))).collect(),
                };
                assert_eq!(got, want, "{il:?} line {l}");
            }
            assert_eq!(src.next_line(&mut line).unwrap(), None);
            assert_eq!(src.next_line(&mut line).unwrap(), None);
            assert_eq!(src.stats().lines, lines as u64);
        }
    }
}
