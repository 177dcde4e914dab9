//! Writing result maps: ENVI classification and float32 files, a PNG quick-look with a legend, and a
//! JSON summary, all staged under temporary names and renamed into place only when every file of
//! the set is complete.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use crate::cube::{DataType, Header, Interleave, encode_f32};
use crate::model::{Manifest, Task};
use crate::pipeline::Maps;

/// Errors from writing maps.
#[derive(Debug, thiserror::Error)]
pub enum MapError {
    /// A file could not be written or renamed.
    #[error("{path}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The PNG encoder failed.
    #[error("{path}: PNG encoding failed: {message}")]
    Png {
        /// The file.
        path: PathBuf,
        /// The encoder's message.
        message: String,
    },
}

/// Files written into one folder atomically: each is staged as a hidden temporary file and all are
/// renamed into place by [`Staged::commit`]; dropping without committing removes the temporaries.
#[derive(Debug)]
pub struct Staged {
    dir: PathBuf,
    files: Vec<(tempfile::NamedTempFile, PathBuf)>,
}

impl Staged {
    /// Stages files for `dir`, creating it if needed.
    pub fn new(dir: &Path) -> Result<Self, MapError> {
        std::fs::create_dir_all(dir).map_err(|source| MapError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        Ok(Self {
            dir: dir.to_path_buf(),
            files: Vec::new(),
        })
    }

    /// Stages `bytes` as `name` and returns the final path.
    pub fn add(&mut self, name: &str, bytes: &[u8]) -> Result<PathBuf, MapError> {
        let path = self.dir.join(name);
        let io = |source| MapError::Io {
            path: path.clone(),
            source,
        };
        let mut tmp = tempfile::Builder::new()
            .prefix(&format!(".{name}."))
            .suffix(".tmp")
            .tempfile_in(&self.dir)
            .map_err(io)?;
        tmp.write_all(bytes).map_err(io)?;
        self.files.push((tmp, path.clone()));
        Ok(path)
    }

    /// Syncs every staged file to disk (concurrently: the cost is one sync's latency, not the sum),
    /// renames each into place in staging order, then syncs the folder.
    pub fn commit(self) -> Result<(), MapError> {
        std::thread::scope(|scope| {
            let syncs: Vec<_> = self
                .files
                .iter()
                .map(|(tmp, path)| {
                    scope.spawn(move || tmp.as_file().sync_all().map_err(|source| (path.clone(), source)))
                })
                .collect();
            syncs.into_iter().try_for_each(|h| match h.join() {
                Ok(result) => result.map_err(|(path, source)| MapError::Io { path, source }),
                Err(_) => Err(MapError::Io {
                    path: self.dir.clone(),
                    source: std::io::Error::other("a file sync thread panicked"),
                }),
            })
        })?;
        for (tmp, path) in self.files {
            tmp.persist(&path).map_err(|e| MapError::Io {
                path: path.clone(),
                source: e.error,
            })?;
        }
        if let Ok(d) = std::fs::File::open(&self.dir) {
            let _ = d.sync_all();
        }
        Ok(())
    }
}

/// Header fields of the input scene worth carrying into its maps.
fn georef(from: &Header, to: &mut Header) {
    to.map_info.clone_from(&from.map_info);
    to.coordinate_system.clone_from(&from.coordinate_system);
}

/// The ENVI classification header for `maps` from `manifest` (class ids index the name list).
pub fn class_header(maps: &Maps, manifest: &Manifest, scene: &Header) -> Header {
    let max_id = manifest.outputs.iter().map(|o| o.id).max().unwrap_or(0) as usize;
    let mut names: Vec<String> = (0..=max_id).map(|i| format!("unused_{i}")).collect();
    let mut colors = vec![[0u8, 0, 0]; max_id + 1];
    names[0] = "Unclassified".into();
    for (k, o) in manifest.outputs.iter().enumerate() {
        names[o.id as usize] = o.name.replace(',', ";");
        colors[o.id as usize] = manifest.color(k);
    }
    let mut h = Header::new(maps.samples, maps.lines, 1, DataType::U8, Interleave::Bsq);
    h.file_type = Some("ENVI Classification".into());
    h.description = Some(format!("hsiedge class map, model {}", manifest.name));
    h.classes = Some(max_id + 1);
    h.class_names = names;
    h.class_lookup = colors;
    h.band_names = vec!["class".into()];
    georef(scene, &mut h);
    h
}

/// Paths of a written map set.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Written {
    /// Class map (ENVI classification, `.img`; header beside it).
    pub class_map: Option<PathBuf>,
    /// Confidence map (ENVI float32).
    pub confidence_map: Option<PathBuf>,
    /// Abundance or score map (ENVI float32, one band per output).
    pub scores_map: Option<PathBuf>,
    /// PNG quick-look.
    pub quicklook: PathBuf,
}

/// Stages the maps of one run: class and confidence maps (classification) or abundances, plus the
/// quick-look.
pub fn stage_maps(staged: &mut Staged, maps: &Maps, manifest: &Manifest, scene: &Header) -> Result<Written, MapError> {
    let mut w = Written::default();
    if manifest.task == Task::Classification {
        w.class_map = Some(staged.add("class_map.img", &maps.class_ids)?);
        staged.add(
            "class_map.hdr",
            class_header(maps, manifest, scene).to_text().as_bytes(),
        )?;
        let mut h = Header::new(maps.samples, maps.lines, 1, DataType::F32, Interleave::Bsq);
        h.description = Some(format!("hsiedge confidence (softmax maximum), model {}", manifest.name));
        h.band_names = vec!["confidence".into()];
        georef(scene, &mut h);
        w.confidence_map = Some(staged.add("confidence.img", &encode_f32(&maps.confidence))?);
        staged.add("confidence.hdr", h.to_text().as_bytes())?;
    }
    if let Some(scores) = &maps.scores {
        let mut h = Header::new(maps.samples, maps.lines, maps.channels, DataType::F32, Interleave::Bsq);
        let what = if manifest.task == Task::Abundance {
            "abundances"
        } else {
            "scores"
        };
        h.description = Some(format!("hsiedge {what}, model {}", manifest.name));
        h.band_names = manifest.outputs.iter().map(|o| o.name.replace(',', ";")).collect();
        georef(scene, &mut h);
        let name = if manifest.task == Task::Abundance {
            "abundance"
        } else {
            "scores"
        };
        w.scores_map = Some(staged.add(&format!("{name}.img"), &encode_f32(scores))?);
        staged.add(&format!("{name}.hdr"), h.to_text().as_bytes())?;
    }
    let png = quicklook_png(maps, manifest).map_err(|message| MapError::Png {
        path: staged.dir.join("quicklook.png"),
        message,
    })?;
    w.quicklook = staged.add("quicklook.png", &png)?;
    Ok(w)
}

/// RGB pixels of the map: class colours, or the colour mix of the abundances.
fn map_rgb(maps: &Maps, manifest: &Manifest) -> Vec<[u8; 3]> {
    let n = maps.lines * maps.samples;
    if manifest.task == Task::Classification {
        let by_id: std::collections::HashMap<u8, [u8; 3]> = manifest
            .outputs
            .iter()
            .enumerate()
            .map(|(k, o)| (o.id as u8, manifest.color(k)))
            .collect();
        maps.class_ids
            .iter()
            .map(|id| by_id.get(id).copied().unwrap_or([0, 0, 0]))
            .collect()
    } else {
        let scores = maps.scores.as_deref().unwrap_or(&[]);
        (0..n)
            .map(|i| {
                let mut rgb = [0f32; 3];
                for k in 0..maps.channels {
                    let a = scores.get(k * n + i).copied().unwrap_or(0.0).clamp(0.0, 1.0);
                    for (c, v) in rgb.iter_mut().enumerate() {
                        *v += a * f32::from(manifest.color(k)[c]);
                    }
                }
                rgb.map(|v| v.clamp(0.0, 255.0) as u8)
            })
            .collect()
    }
}

/// Renders the quick-look: the map scaled by an integer factor, and a legend of colours and names.
pub fn quicklook_png(maps: &Maps, manifest: &Manifest) -> Result<Vec<u8>, String> {
    let rgb = map_rgb(maps, manifest);
    let scale = (256 / maps.lines.max(maps.samples)).clamp(1, 8);
    let (mw, mh) = (maps.samples * scale, maps.lines * scale);
    let names: Vec<String> = manifest
        .outputs
        .iter()
        .map(|o| {
            if manifest.task == Task::Classification {
                format!("{} {}", o.id, o.name)
            } else {
                o.name.clone()
            }
        })
        .collect();
    let text_w = names.iter().map(|n| n.chars().count()).max().unwrap_or(0) * 8;
    let legend_w = 8 + 12 + 6 + text_w + 8;
    let row_h = 14;
    let legend_h = 8 + names.len() * row_h + 8;
    let (w, h) = (mw + legend_w, mh.max(legend_h));
    let mut img = vec![255u8; w * h * 3];
    let mut set = |x: usize, y: usize, c: [u8; 3]| {
        if x < w && y < h {
            img[(y * w + x) * 3..(y * w + x) * 3 + 3].copy_from_slice(&c);
        }
    };
    for y in 0..mh {
        for x in 0..mw {
            set(x, y, rgb[(y / scale) * maps.samples + x / scale]);
        }
    }
    for (k, name) in names.iter().enumerate() {
        let (x0, y0) = (mw + 8, 8 + k * row_h);
        for dy in 0..12 {
            for dx in 0..12 {
                let edge = dx == 0 || dy == 0 || dx == 11 || dy == 11;
                set(x0 + dx, y0 + dy, if edge { [0, 0, 0] } else { manifest.color(k) });
            }
        }
        for (i, ch) in name.chars().enumerate() {
            let glyph = font8x8::legacy::BASIC_LEGACY
                .get(ch as usize)
                .copied()
                .unwrap_or([0; 8]);
            for (gy, bits) in glyph.iter().enumerate() {
                for gx in 0..8 {
                    if bits >> gx & 1 == 1 {
                        set(x0 + 18 + i * 8 + gx, y0 + 2 + gy, [0, 0, 0]);
                    }
                }
            }
        }
    }
    let mut out = Vec::new();
    let width = u32::try_from(w).map_err(|e| e.to_string())?;
    let height = u32::try_from(h).map_err(|e| e.to_string())?;
    let mut enc = png::Encoder::new(&mut out, width, height);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    // A quick-look is for eyes, and it is written after the last batch, on the run's critical path.
    enc.set_compression(png::Compression::Fast);
    let mut writer = enc.write_header().map_err(|e| e.to_string())?;
    writer.write_image_data(&img).map_err(|e| e.to_string())?;
    writer.finish().map_err(|e| e.to_string())?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staged_files_appear_only_on_commit() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let mut s = Staged::new(&out).unwrap();
        let p = s.add("a.img", b"abc").unwrap();
        assert!(!p.exists());
        drop(s);
        assert_eq!(
            std::fs::read_dir(&out).unwrap().count(),
            0,
            "temporaries removed on drop"
        );
        let mut s = Staged::new(&out).unwrap();
        let p = s.add("a.img", b"abc").unwrap();
        s.commit().unwrap();
        assert_eq!(std::fs::read(p).unwrap(), b"abc");
    }
}
