//! Writing result maps: ENVI classification and float32 files, a PNG quick-look with a legend, and a
//! JSON summary, written as one set into a locked output folder and made current as a whole
//! (`set`: the layout, the switch, crash leftovers; `lock`: one writer per folder).

use std::path::PathBuf;

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
    /// Another process is writing the output folder.
    #[error("{dir}: output folder is in use by another hsiedge run ({}); wait for it with --wait, or choose another --out", holder(*.pid))]
    Busy {
        /// The folder.
        dir: PathBuf,
        /// The holder's pid, when it could be read.
        pid: Option<u32>,
    },
    /// The output path is there but not a folder.
    #[error("{path}: not a folder")]
    NotAFolder {
        /// The path.
        path: PathBuf,
    },
    /// A file the run writes beside its maps (`--telemetry`) would overwrite one of its inputs
    /// or one of the files the output set replaces.
    #[error("{flag} {path}: {clash}")]
    SideFileClash {
        /// The option naming the file.
        flag: &'static str,
        /// The file.
        path: PathBuf,
        /// What it would overwrite.
        clash: String,
    },
    /// Writing the outputs would replace one of the run's inputs.
    #[error("{output} would replace the input {input}: choose another --out")]
    WouldReplaceInput {
        /// The input file.
        input: PathBuf,
        /// The output in its way.
        output: PathBuf,
    },
    /// A scene ended before its first line: there are no maps to write.
    #[error("scene `{scene}` ended with no lines: nothing to write")]
    Empty {
        /// The scene id.
        scene: String,
    },
    /// A resumed scene ended at or before the line its committed segments reach.
    #[error(
        "scene `{scene}` ended at or before line {line}, where its segments committed before a restart reach: it is not the scene that was cut off"
    )]
    EndedBeforeResume {
        /// The scene id.
        scene: String,
        /// The first line not committed before.
        line: usize,
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

mod lock;
mod quicklook;
mod segment;
mod set;

pub use lock::{Contention, LOCK_NAME, OutputDir};
pub use quicklook::{QuicklookStream, quicklook_png};
pub use segment::{SegmentOptions, SegmentRecord, SegmentWriter, shift_map_info};
pub use set::{CURRENT, Retired, SET_PREFIX, Staged, check_inputs_spared, check_side_file};

/// Every file name a job's output set may hold.
pub const SET_NAMES: &[&str] = &[
    "class_map.hdr",
    "class_map.img",
    "confidence.hdr",
    "confidence.img",
    "abundance.hdr",
    "abundance.img",
    "scores.hdr",
    "scores.img",
    "quicklook.png",
    "summary.json",
];

/// The header field and PNG text key that carry a set's run id.
pub const RUN_ID_KEY: &str = "hsiedge run id";

fn holder(pid: Option<u32>) -> String {
    pid.map_or_else(|| "pid unknown".to_string(), |p| format!("pid {p}"))
}

/// Header fields of the input scene worth carrying into its maps.
fn georef(from: &Header, to: &mut Header) {
    to.map_info.clone_from(&from.map_info);
    to.coordinate_system.clone_from(&from.coordinate_system);
}

/// What the headers of a run's maps describe, known before the run starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MapShape {
    /// Scene lines.
    pub lines: usize,
    /// Scene samples.
    pub samples: usize,
    /// Output channels.
    pub channels: usize,
    /// Whether every channel is written (the abundance or score map).
    pub scores: bool,
}

impl MapShape {
    /// The shape of `maps`.
    pub fn of(maps: &Maps) -> Self {
        Self {
            lines: maps.lines,
            samples: maps.samples,
            channels: maps.channels,
            scores: maps.scores.is_some(),
        }
    }
}

/// The ENVI classification header of a `samples` x `lines` class map from `manifest` (class ids
/// index the name list).
pub fn class_header(samples: usize, lines: usize, manifest: &Manifest, scene: &Header) -> Header {
    let max_id = manifest.outputs.iter().map(|o| o.id).max().unwrap_or(0) as usize;
    let mut names: Vec<String> = (0..=max_id).map(|i| format!("unused_{i}")).collect();
    let mut colors = vec![[0u8, 0, 0]; max_id + 1];
    names[0] = "Unclassified".into();
    for (k, o) in manifest.outputs.iter().enumerate() {
        names[o.id as usize] = o.name.replace(',', ";");
        colors[o.id as usize] = manifest.color(k);
    }
    let mut h = Header::new(samples, lines, 1, DataType::U8, Interleave::Bsq);
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

pub(crate) fn scores_name(manifest: &Manifest) -> &'static str {
    if manifest.task == Task::Abundance {
        "abundance"
    } else {
        "scores"
    }
}

/// Stages the ENVI headers of a run's maps, which depend only on its shape: a job stages them
/// while the run is in flight, so only the data is left for after the last batch.
pub fn stage_headers(
    staged: &mut Staged,
    shape: MapShape,
    manifest: &Manifest,
    scene: &Header,
) -> Result<(), MapError> {
    if manifest.task == Task::Classification {
        let mut h = class_header(shape.samples, shape.lines, manifest, scene);
        stamp(staged, &mut h);
        staged.add("class_map.hdr", h.to_text().as_bytes())?;
        let mut h = Header::new(shape.samples, shape.lines, 1, DataType::F32, Interleave::Bsq);
        h.description = Some(format!("hsiedge confidence (softmax maximum), model {}", manifest.name));
        h.band_names = vec!["confidence".into()];
        georef(scene, &mut h);
        stamp(staged, &mut h);
        staged.add("confidence.hdr", h.to_text().as_bytes())?;
    }
    if shape.scores {
        let mut h = Header::new(
            shape.samples,
            shape.lines,
            shape.channels,
            DataType::F32,
            Interleave::Bsq,
        );
        let what = if manifest.task == Task::Abundance {
            "abundances"
        } else {
            "scores"
        };
        h.description = Some(format!("hsiedge {what}, model {}", manifest.name));
        h.band_names = manifest.outputs.iter().map(|o| o.name.replace(',', ";")).collect();
        georef(scene, &mut h);
        stamp(staged, &mut h);
        staged.add(&format!("{}.hdr", scores_name(manifest)), h.to_text().as_bytes())?;
    }
    Ok(())
}

/// Writes the set's run id into a header, so a reader can tell that every file came from one run.
fn stamp(staged: &Staged, h: &mut Header) {
    h.extra.push((RUN_ID_KEY.into(), staged.run_id().into()));
}

/// Reserves the files [`stage_maps`] writes for maps of `shape`, in the order it writes them.
pub fn reserve_maps(staged: &mut Staged, shape: MapShape, manifest: &Manifest) -> Result<(), MapError> {
    if manifest.task == Task::Classification {
        staged.reserve("class_map.img")?;
        staged.reserve("confidence.img")?;
    }
    if shape.scores {
        staged.reserve(&format!("{}.img", scores_name(manifest)))?;
    }
    staged.reserve("quicklook.png")?;
    Ok(())
}

/// Appends a strip of a classification run's maps, scene lines `y0 ..`, to the class and
/// confidence maps being staged, and starts syncing them; strips come top to bottom, and
/// [`stage_maps`] from the line after the last one finishes the files.
pub fn append_strip(staged: &mut Staged, y0: usize, done: usize, strip: &Maps) -> Result<(), MapError> {
    if y0 != done {
        return Err(MapError::Io {
            path: staged.dir().join("class_map.img"),
            source: std::io::Error::other(format!("a strip from line {y0} came after line {done}")),
        });
    }
    for (name, bytes) in [
        ("class_map.img", std::borrow::Cow::Borrowed(&strip.class_ids[..])),
        ("confidence.img", std::borrow::Cow::Owned(encode_f32(&strip.confidence))),
    ] {
        staged.append(name, &bytes)?;
        staged.sync_appended(name)?;
    }
    Ok(())
}

/// Stages the data of a run's maps (class and confidence maps for classification, the abundance
/// or score map when kept) and the quick-look; their headers come from [`stage_headers`].
/// The class and confidence maps' first `from_line` lines are already in their files
/// ([`append_strip`]), and in `quicklook` when it is given.
pub fn stage_maps(
    staged: &mut Staged,
    maps: &Maps,
    manifest: &Manifest,
    from_line: usize,
    quicklook: Option<QuicklookStream>,
) -> Result<Written, MapError> {
    let mut w = Written::default();
    let from = from_line.min(maps.lines) * maps.samples;
    let run_id = staged.run_id().to_string();
    // The quick-look is encoded on its own thread while the maps are written.
    std::thread::scope(|scope| -> Result<(), MapError> {
        let png = scope.spawn(|| match quicklook {
            Some(mut q) => {
                q.push(&maps.class_ids[q.lines().min(maps.lines) * maps.samples..])?;
                q.finish()
            }
            None => quicklook_png(maps, manifest, &run_id),
        });
        if manifest.task == Task::Classification {
            w.class_map = Some(staged.add("class_map.img", &maps.class_ids[from..])?);
            w.confidence_map = Some(staged.add("confidence.img", &encode_f32(&maps.confidence[from..]))?);
        }
        if let Some(scores) = &maps.scores {
            w.scores_map = Some(staged.add(&format!("{}.img", scores_name(manifest)), &encode_f32(scores))?);
        }
        let png = png
            .join()
            .unwrap_or_else(|_| Err("the quick-look encoder panicked".to_string()))
            .map_err(|message| MapError::Png {
                path: staged.dir().join("quicklook.png"),
                message,
            })?;
        w.quicklook = staged.add("quicklook.png", &png)?;
        Ok(())
    })?;
    Ok(w)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::map::lock::Contention;

    #[test]
    fn maps_written_as_strips_then_the_rest_are_the_maps_written_whole() {
        let manifest = Manifest::load(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("models/hybridsn_salinas_a/manifest.json"),
        )
        .unwrap();
        let (lines, samples) = (7, 5);
        let ids: Vec<u8> = manifest.outputs.iter().map(|o| o.id as u8).collect();
        let maps = Maps {
            lines,
            samples,
            channels: ids.len(),
            class_ids: (0..lines * samples).map(|i| ids[i % ids.len()]).collect(),
            confidence: (0..lines * samples).map(|i| i as f32 / 64.0).collect(),
            scores: None,
            nonfinite_pixels: 0,
        };
        let strip = |y0: usize, y1: usize| Maps {
            lines: y1 - y0,
            class_ids: maps.class_ids[y0 * samples..y1 * samples].to_vec(),
            confidence: maps.confidence[y0 * samples..y1 * samples].to_vec(),
            ..maps.clone()
        };
        let dir = tempfile::tempdir().unwrap();
        let written = |streamed: &[(usize, usize)]| {
            let out = OutputDir::lock(&dir.path().join(format!("out{}", streamed.len())), Contention::Fail).unwrap();
            let mut staged = Staged::new(&out).unwrap();
            reserve_maps(&mut staged, MapShape::of(&maps), &manifest).unwrap();
            let mut done = 0;
            for &(y0, y1) in streamed {
                append_strip(&mut staged, y0, done, &strip(y0, y1)).unwrap();
                done = y1;
            }
            // A strip that does not start where the last ended is refused.
            assert!(append_strip(&mut staged, done + 1, done, &strip(done, done + 1)).is_err());
            stage_maps(&mut staged, &maps, &manifest, done, None).unwrap();
            drop(staged.commit().unwrap());
            ["class_map.img", "confidence.img"].map(|n| std::fs::read(out.path().join(n)).unwrap())
        };
        let whole = written(&[]);
        assert_eq!(whole[0], maps.class_ids);
        assert_eq!(whole[1], encode_f32(&maps.confidence));
        assert_eq!(written(&[(0, 3), (3, 6)]), whole);
    }
}
