//! A streamed scene's maps written as its rows finish: class and confidence rows appended to the
//! open set as they come, the set committed whole when its segment closes.

use std::path::{Path, PathBuf};

use super::{MapError, MapShape, OutputDir, Staged, scores_name, stage_headers};
use crate::cube::{Header, encode_f32};
use crate::model::{Manifest, Task};
use crate::pipeline::{Maps, PipelineError, RowSink};

/// How a streamed scene is cut into output sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentOptions {
    /// Lines per segment; 0 writes the whole scene as one set in the scene's folder.
    pub segment_lines: usize,
    /// Keep every output channel (abundances are always kept).
    pub keep_scores: bool,
}

/// One committed segment.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SegmentRecord {
    /// Segment number, from 0.
    pub index: usize,
    /// Its first scene line.
    pub first_line: usize,
    /// Its lines.
    pub lines: usize,
    /// The folder holding its set.
    pub folder: PathBuf,
    /// The set's run id.
    pub run_id: String,
}

/// Told of each committed segment and whether it is the scene's last ([`SegmentWriter::on_commit`]).
pub type OnCommit<'m> = Box<dyn FnMut(&SegmentRecord, bool) + 'm>;

/// What a segment's `summary.json` says besides its maps.
#[derive(Debug, Clone, serde::Serialize)]
struct SegmentSummary<'a> {
    run_id: &'a str,
    scene_id: &'a str,
    model: &'a str,
    segment: usize,
    first_line: usize,
    lines: usize,
    samples: usize,
    nonfinite_pixels: usize,
    last: bool,
    #[serde(flatten)]
    extra: &'a serde_json::Value,
}

/// A [`RowSink`] writing a streamed scene into `root` (the scene's folder): one set there when
/// segments are off, else one set per segment in `root/seg-NNNNNN`.
///
/// A segment keeps in memory only what its quick-look and its band-sequential score file need
/// (class ids, or the scores when kept); class and confidence rows go to disk as they come.
pub struct SegmentWriter<'m> {
    root: PathBuf,
    manifest: &'m Manifest,
    scene: Header,
    scene_id: String,
    opts: SegmentOptions,
    open: Option<Segment>,
    done: Vec<SegmentRecord>,
    next_line: usize,
    /// Merged into each segment's summary (the source's statistics, timings).
    extra: serde_json::Value,
    /// Told of each segment once it is committed, and whether it is the scene's last.
    on_commit: Option<OnCommit<'m>>,
    /// Output lines still to drop before the first kept one (a resumed scene's halo rows).
    skip: usize,
    /// The scene line a resumed writer went on from (`None`: not resumed).
    resumed_at: Option<usize>,
}

struct Segment {
    staged: Staged,
    // Held for the set's lifetime: one writer per folder.
    _out: OutputDir,
    index: usize,
    first_line: usize,
    lines: usize,
    class_ids: Vec<u8>,
    scores: Option<Vec<Vec<f32>>>,
    nonfinite: usize,
}

impl std::fmt::Debug for SegmentWriter<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SegmentWriter")
            .field("root", &self.root)
            .field("scene_id", &self.scene_id)
            .field("next_line", &self.next_line)
            .field("segments", &self.done.len())
            .finish()
    }
}

impl<'m> SegmentWriter<'m> {
    /// A writer of scene `scene_id` (described by `scene`, whose `lines` is ignored) into `root`.
    pub fn new(root: &Path, manifest: &'m Manifest, scene: &Header, scene_id: &str, opts: SegmentOptions) -> Self {
        Self {
            root: root.to_path_buf(),
            manifest,
            scene: scene.clone(),
            scene_id: scene_id.to_string(),
            opts,
            open: None,
            done: Vec::new(),
            next_line: 0,
            extra: serde_json::Value::Object(Default::default()),
            on_commit: None,
            skip: 0,
            resumed_at: None,
        }
    }

    /// A writer that goes on with a scene an earlier run left after committing `done` (in order,
    /// each folder still holding its set): the next segment is `done.len()`, starting at the line
    /// after the last of `done`, and the first `skip` output lines handed over are dropped (the
    /// tile rows re-run only to read the halo above that line).
    pub fn resume(
        root: &Path,
        manifest: &'m Manifest,
        scene: &Header,
        scene_id: &str,
        opts: SegmentOptions,
        done: Vec<SegmentRecord>,
        skip: usize,
    ) -> Self {
        let next_line = done.last().map_or(0, |d| d.first_line + d.lines);
        Self {
            resumed_at: (!done.is_empty()).then_some(next_line),
            done,
            next_line,
            skip,
            ..Self::new(root, manifest, scene, scene_id, opts)
        }
    }

    /// Calls `f` with each segment once it is committed (and whether it is the scene's last),
    /// so a consumer can ship a long pass piece by piece.
    pub fn on_commit(&mut self, f: OnCommit<'m>) {
        self.on_commit = Some(f);
    }

    /// Fields merged into the summary of each segment committed from now on.
    pub fn set_extra(&mut self, extra: serde_json::Value) {
        self.extra = extra;
    }

    /// Segments committed so far.
    pub fn segments(&self) -> &[SegmentRecord] {
        &self.done
    }

    fn keeps_scores(&self) -> bool {
        self.opts.keep_scores || self.manifest.task != Task::Classification
    }

    fn open_segment(&mut self) -> Result<&mut Segment, MapError> {
        if self.open.is_none() {
            let index = self.done.len();
            let folder = if self.opts.segment_lines == 0 {
                self.root.clone()
            } else {
                self.root.join(format!("seg-{index:06}"))
            };
            let out = OutputDir::lock(&folder, super::Contention::Fail)?;
            let staged = Staged::new(&out)?;
            let k = self.manifest.classes();
            self.open = Some(Segment {
                staged,
                _out: out,
                index,
                first_line: self.next_line,
                lines: 0,
                class_ids: Vec::new(),
                scores: self.keeps_scores().then(|| vec![Vec::new(); k]),
                nonfinite: 0,
            });
        }
        self.open.as_mut().ok_or(MapError::NotAFolder {
            path: self.root.clone(),
        })
    }

    /// Appends lines `from .. from + n` of `strip` to the open segment.
    fn append(&mut self, strip: &Maps, from: usize, n: usize) -> Result<(), MapError> {
        let s = strip.samples;
        let classify = self.manifest.task == Task::Classification;
        let seg = self.open_segment()?;
        if classify {
            let ids = &strip.class_ids[from * s..(from + n) * s];
            seg.staged.append("class_map.img", ids)?;
            seg.staged.append(
                "confidence.img",
                &encode_f32(&strip.confidence[from * s..(from + n) * s]),
            )?;
            seg.class_ids.extend_from_slice(ids);
            // Counted per row: a strip's own count covers all its rows.
            seg.nonfinite += strip.confidence[from * s..(from + n) * s]
                .iter()
                .filter(|v| v.is_nan())
                .count();
        }
        if let (Some(all), Some(scores)) = (&mut seg.scores, &strip.scores) {
            let plane = strip.lines * s;
            for (c, channel) in all.iter_mut().enumerate() {
                let rows = &scores[c * plane + from * s..c * plane + (from + n) * s];
                if !classify {
                    // An abundance pixel is non-finite when any of its channels is; counted once.
                    if c == 0 {
                        seg.nonfinite += (0..n * s)
                            .filter(|&i| (0..strip.channels).any(|cc| !scores[cc * plane + from * s + i].is_finite()))
                            .count();
                    }
                }
                channel.extend_from_slice(rows);
            }
        }
        seg.lines += n;
        self.next_line += n;
        Ok(())
    }

    /// Commits the open segment (if it has lines), `last` when the scene has ended.
    fn close(&mut self, last: bool) -> Result<(), MapError> {
        let Some(mut seg) = self.open.take() else {
            return Ok(());
        };
        let k = self.manifest.classes();
        let s = self.scene.samples;
        let shape = MapShape {
            lines: seg.lines,
            samples: s,
            channels: k,
            scores: seg.scores.is_some(),
        };
        let mut scene = self.scene.clone();
        scene.map_info = scene.map_info.as_deref().map(|m| shift_map_info(m, seg.first_line));
        stage_headers(&mut seg.staged, shape, self.manifest, &scene)?;
        let classify = self.manifest.task == Task::Classification;
        if classify {
            seg.staged.add("class_map.img", &[])?;
            seg.staged.add("confidence.img", &[])?;
        }
        let scores = seg.scores.take().map(|per| per.concat());
        if let Some(all) = &scores {
            seg.staged
                .add(&format!("{}.img", scores_name(self.manifest)), &encode_f32(all))?;
        }
        let maps = Maps {
            lines: seg.lines,
            samples: s,
            channels: k,
            class_ids: std::mem::take(&mut seg.class_ids),
            confidence: Vec::new(),
            scores,
            nonfinite_pixels: seg.nonfinite,
        };
        let png = super::quicklook_png(&maps, self.manifest, seg.staged.run_id()).map_err(|message| MapError::Png {
            path: seg.staged.dir().join("quicklook.png"),
            message,
        })?;
        seg.staged.add("quicklook.png", &png)?;
        let run_id = seg.staged.run_id().to_string();
        let summary = SegmentSummary {
            run_id: &run_id,
            scene_id: &self.scene_id,
            model: &self.manifest.name,
            segment: seg.index,
            first_line: seg.first_line,
            lines: seg.lines,
            samples: s,
            nonfinite_pixels: seg.nonfinite,
            last,
            extra: &self.extra,
        };
        let json = serde_json::to_vec_pretty(&summary).map_err(|e| MapError::Io {
            path: seg.staged.dir().join("summary.json"),
            source: std::io::Error::other(e),
        })?;
        seg.staged.add("summary.json", &json)?;
        let folder = seg.staged.dir().to_path_buf();
        let retired = seg.staged.commit()?;
        drop(retired);
        let record = SegmentRecord {
            index: seg.index,
            first_line: seg.first_line,
            lines: seg.lines,
            folder,
            run_id,
        };
        if let Some(f) = self.on_commit.as_mut() {
            f(&record, last);
        }
        self.done.push(record);
        Ok(())
    }

    /// Commits what is left once the scene has ended and returns every segment written. A scene
    /// that ended with no line has no maps: that is an error, not an empty set.
    pub fn finish(mut self) -> Result<Vec<SegmentRecord>, MapError> {
        if self.next_line == 0 {
            return Err(MapError::Empty {
                scene: self.scene_id.clone(),
            });
        }
        // A resumed scene sent again shorter than its committed segments: none of them may be
        // marked last, and the scene is not the one that was cut off.
        if let Some(line) = self.resumed_at
            && self.next_line <= line
        {
            return Err(MapError::EndedBeforeResume {
                scene: self.scene_id.clone(),
                line,
            });
        }
        self.close(true)?;
        Ok(self.done)
    }
}

impl RowSink for SegmentWriter<'_> {
    fn put_strip(&mut self, _y0: usize, strip: Maps) -> Result<(), PipelineError> {
        let mut from = self.skip.min(strip.lines);
        self.skip -= from;
        while from < strip.lines {
            // A full segment is committed once a line after it arrives: only then is it known
            // not to be the scene's last (a scene of unannounced length may end right there).
            if self.opts.segment_lines > 0 && self.open.as_ref().is_some_and(|s| s.lines == self.opts.segment_lines) {
                self.close(false).map_err(|e| PipelineError::Sink(Box::new(e)))?;
            }
            let room = match self.opts.segment_lines {
                0 => usize::MAX,
                n => n - self.open.as_ref().map_or(0, |s| s.lines),
            };
            let n = room.min(strip.lines - from);
            self.append(&strip, from, n)
                .map_err(|e| PipelineError::Sink(Box::new(e)))?;
            from += n;
        }
        Ok(())
    }
}

/// `map info` of a segment starting at scene line `first_line`: the reference pixel's line
/// (its third field, 1-based) moved up by `first_line`, so each segment stays georeferenced.
/// Left as it is when it does not parse.
pub fn shift_map_info(map_info: &str, first_line: usize) -> String {
    let inner = map_info.trim().trim_start_matches('{').trim_end_matches('}');
    let mut fields: Vec<String> = inner.split(',').map(|f| f.trim().to_string()).collect();
    match fields.get(2).and_then(|f| f.parse::<f64>().ok()) {
        Some(y) if first_line > 0 => {
            fields[2] = format!("{}", y - first_line as f64);
            format!("{{{}}}", fields.join(", "))
        }
        _ => map_info.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_segment_s_reference_pixel_moves_with_its_first_line() {
        let m = "{UTM, 1.000, 1.000, 588000.0, 4140000.0, 3.7, 3.7, 10, North, WGS-84}";
        assert_eq!(
            shift_map_info(m, 100),
            "{UTM, 1.000, -99, 588000.0, 4140000.0, 3.7, 3.7, 10, North, WGS-84}"
        );
        assert_eq!(shift_map_info(m, 0), m);
        assert_eq!(shift_map_info("{odd}", 5), "{odd}");
    }
}
