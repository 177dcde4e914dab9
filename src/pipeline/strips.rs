//! Stitching a run strip by strip: each tile row's maps go to a [`RowSink`] as soon as every pixel
//! of the row is written, so a streamed scene holds only the rows still in flight.

use std::collections::VecDeque;

use super::{Batch, Maps, PipelineError, Stitcher, StripStart};
use crate::model::Manifest;
use crate::tile::TileGrid;

/// Where finished rows of maps go.
pub trait RowSink {
    /// Scene lines `y0 .. y0 + strip.lines` of the maps are final: every pixel written once.
    /// Strips come top to bottom, each starting where the last ended.
    fn put_strip(&mut self, y0: usize, strip: Maps) -> Result<(), PipelineError>;
}

/// The tile rows in flight, each stitched on its own; a row is checked and handed to the sink as
/// soon as its last pixel is written.
#[derive(Debug)]
pub struct Strips<'m> {
    manifest: &'m Manifest,
    grid: TileGrid,
    keep_scores: bool,
    /// Open strips, top first, with the pixels each still lacks.
    open: VecDeque<(Stitcher, usize)>,
    /// The tile row of `open[0]`.
    first_row: usize,
    /// Lines handed to the sink.
    done: usize,
    /// Per strip, when its rows' last inputs arrived.
    arrivals: VecDeque<Vec<std::time::Instant>>,
    /// Seconds from each row's last input line's arrival to its hand-over (streams only).
    latencies: Vec<f32>,
}

impl<'m> Strips<'m> {
    /// Strips of `grid` (its tile sizes and samples; its line count may be unknown).
    pub fn new(manifest: &'m Manifest, grid: TileGrid, keep_scores: bool) -> Self {
        Self {
            manifest,
            grid,
            keep_scores,
            open: VecDeque::new(),
            first_row: 0,
            done: 0,
            arrivals: VecDeque::new(),
            latencies: Vec::new(),
        }
    }

    /// Lines handed to the sink so far.
    pub fn lines_done(&self) -> usize {
        self.done
    }

    /// Seconds from each row's last input line's arrival to the row's hand-over to the sink, for
    /// the rows done so far (empty for a mapped scene).
    pub fn row_latencies(&self) -> &[f32] {
        &self.latencies
    }

    fn start(&mut self, s: &StripStart) {
        if self.open.is_empty() {
            self.first_row = s.row;
        }
        let st = Stitcher::strip(self.manifest, self.grid, s.y0, s.h, self.keep_scores);
        self.open.push_back((st, s.h * self.grid.samples));
        self.arrivals.push_back(s.inputs_arrived.clone());
    }

    fn at(&mut self, row: usize) -> Result<&mut (Stitcher, usize), PipelineError> {
        let first = self.first_row;
        let tile_h = self.grid.tile_h;
        // Outputs for a row never started: reported as the row's first pixel never written.
        row.checked_sub(first)
            .and_then(|i| self.open.get_mut(i))
            .ok_or(PipelineError::Coverage {
                line: row * tile_h,
                sample: 0,
                count: 0,
                row,
                col: 0,
            })
    }

    /// Stitches the engine result for samples `range` of `batch` and hands every strip it
    /// completes to `sink`.
    pub fn put_range(
        &mut self,
        batch: &Batch,
        range: std::ops::Range<usize>,
        out_shape: &[usize],
        out: &[f32],
        graph: &std::path::Path,
        sink: &mut dyn RowSink,
    ) -> Result<(), PipelineError> {
        if range.start == 0 {
            for s in &batch.strips {
                self.start(s);
            }
        }
        let k = self.manifest.classes();
        let shape_err = |expected: String| PipelineError::OutputShape {
            graph: graph.to_path_buf(),
            got: out_shape.to_vec(),
            input: batch.shape.clone(),
            expected,
        };
        let n = range.len();
        if !batch.tiles.is_empty() {
            let (th, tw) = (self.grid.tile_h, self.grid.tile_w);
            if out_shape != [n, k, th, tw] {
                return Err(shape_err(format!("{n} x {k} x {th} x {tw}")));
            }
            for (t, rect) in batch.tiles[range].iter().enumerate() {
                let (strip, left) = self.at(rect.row)?;
                for i in 0..rect.h {
                    strip.put_row(rect.y0 + i, rect.x0, rect.w, |c| {
                        let first = ((t * k + c) * th + i) * tw;
                        &out[first..first + tw]
                    });
                }
                *left = left.saturating_sub(rect.h * rect.w);
            }
        } else {
            if out.len() != n * k || out_shape.first() != Some(&n) {
                return Err(shape_err(format!("{n} x {k}")));
            }
            let tile_h = self.grid.tile_h;
            for (s, &(y, x)) in batch.pixels[range].iter().enumerate() {
                let (strip, left) = self.at(y / tile_h)?;
                strip.put(y, x, |c| out[s * k + c]);
                *left = left.saturating_sub(1);
            }
        }
        while self.open.front().is_some_and(|(_, left)| *left == 0) {
            if let Some((strip, _)) = self.open.pop_front() {
                self.first_row += 1;
                let maps = strip.finish()?;
                let now = std::time::Instant::now();
                for t in self.arrivals.pop_front().unwrap_or_default() {
                    self.latencies.push(now.duration_since(t).as_secs_f32());
                }
                let y0 = self.done;
                self.done += maps.lines;
                sink.put_strip(y0, maps)?;
            }
        }
        Ok(())
    }

    /// Fails unless every strip was completed and handed on.
    pub fn finish(mut self) -> Result<(), PipelineError> {
        match self.open.pop_front() {
            None => Ok(()),
            Some((strip, _)) => strip.finish().map(|_| ()).and(Err(PipelineError::Coverage {
                line: self.done,
                sample: 0,
                count: 0,
                row: self.first_row,
                col: 0,
            })),
        }
    }
}

/// A sink that assembles a whole scene's maps (a file classified in one piece).
#[derive(Debug)]
pub struct MapsSink {
    samples: usize,
    channels: usize,
    class_ids: Vec<u8>,
    confidence: Vec<f32>,
    /// Per channel, when kept.
    scores: Option<Vec<Vec<f32>>>,
    lines: usize,
    nonfinite: usize,
}

impl MapsSink {
    /// An empty map of `samples` per line and `channels` outputs, room made for `lines` lines.
    pub fn new(samples: usize, channels: usize, lines: usize, classify: bool, scores: bool) -> Self {
        let n = if classify { samples * lines } else { 0 };
        Self {
            samples,
            channels,
            class_ids: Vec::with_capacity(n),
            confidence: Vec::with_capacity(n),
            scores: scores.then(|| (0..channels).map(|_| Vec::with_capacity(samples * lines)).collect()),
            lines: 0,
            nonfinite: 0,
        }
    }

    /// The assembled maps.
    pub fn into_maps(self) -> Maps {
        Maps {
            lines: self.lines,
            samples: self.samples,
            channels: self.channels,
            class_ids: self.class_ids,
            confidence: self.confidence,
            scores: self.scores.map(|per| per.concat()),
            nonfinite_pixels: self.nonfinite,
        }
    }
}

impl RowSink for MapsSink {
    fn put_strip(&mut self, _y0: usize, strip: Maps) -> Result<(), PipelineError> {
        self.class_ids.extend_from_slice(&strip.class_ids);
        self.confidence.extend_from_slice(&strip.confidence);
        if let (Some(all), Some(s)) = (&mut self.scores, &strip.scores) {
            let n = strip.lines * strip.samples;
            for (c, channel) in all.iter_mut().enumerate() {
                channel.extend_from_slice(&s[c * n..(c + 1) * n]);
            }
        }
        self.lines += strip.lines;
        self.nonfinite += strip.nonfinite_pixels;
        Ok(())
    }
}
