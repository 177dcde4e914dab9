//! The device path's stitcher thread: writes each reduction's labels and confidence into the
//! maps while the next batch runs, and hands every tile row on as a strip once all its pixels
//! are in, so the maps' files are written during the run.

use std::sync::mpsc::{Receiver, SyncSender};

use crate::pipeline::Maps;
use crate::tile::{TileGrid, TileRect};

/// Finished tile rows: scene lines `y0 ..` as a strip of maps (class ids and confidence), top
/// to bottom, each starting where the last ended.
pub type StripSender = SyncSender<(usize, Maps)>;

/// The run's end of the stitcher thread.
pub(super) struct Stitcher {
    pub jobs: SyncSender<Stitch>,
    pub back: Receiver<(Vec<u32>, Vec<f32>)>,
}

/// One reduction's labels and confidence, and where they go.
pub(super) struct Stitch {
    pub cls: Vec<u32>,
    pub conf: Vec<f32>,
    pub place: Place,
}

/// Where a reduction's outputs go in the scene.
pub(super) enum Place {
    /// Dense: unit i is tile i's pixels, row-major in a tile of the grid's width.
    Tiles(Vec<TileRect>),
    /// Patch: unit i is pixel `first + i` of `tile`, row-major.
    Patches { tile: TileRect, first: usize, n: usize },
}

/// The maps the stitcher writes.
pub(super) struct Canvas<'a> {
    pub maps: &'a mut Maps,
    /// How many times each scene pixel was written (exactly once at the end).
    pub written: &'a mut [u8],
    pub ids: Vec<u8>,
    pub samples: usize,
    pub tile_w: usize,
    pub pixels_per_unit: usize,
    /// Pixels each tile row still lacks.
    pub row_left: Vec<usize>,
    pub tile_h: usize,
    /// Tile rows handed on as strips.
    pub rows_sent: usize,
    /// Where finished rows go (none: the maps are written after the run).
    pub strips: Option<StripSender>,
}

impl<'a> Canvas<'a> {
    /// A canvas over `maps` (of `grid`'s scene), counting into `written`.
    pub fn new(
        maps: &'a mut Maps,
        written: &'a mut [u8],
        ids: Vec<u8>,
        grid: &TileGrid,
        pixels_per_unit: usize,
        strips: Option<StripSender>,
    ) -> Self {
        let samples = maps.samples;
        Self {
            row_left: (0..grid.rows).map(|r| grid.rect(r, 0).h * samples).collect(),
            maps,
            written,
            ids,
            samples,
            tile_w: grid.tile_w,
            pixels_per_unit,
            tile_h: grid.tile_h,
            rows_sent: 0,
            strips,
        }
    }

    /// Applies every job `jobs` brings, handing each job's buffers back, until the run closes
    /// it. Every job sent is applied: the run's end may drop the buffers' way back while its
    /// last jobs are still queued here.
    pub fn stitch_all(mut self, jobs: Receiver<Stitch>, back: SyncSender<(Vec<u32>, Vec<f32>)>) {
        for job in jobs {
            self.apply(&job);
            let _ = back.send((job.cls, job.conf));
        }
    }

    pub fn apply(&mut self, job: &Stitch) {
        match &job.place {
            Place::Tiles(tiles) => {
                for (i, t) in tiles.iter().enumerate() {
                    for y in 0..t.h {
                        for x in 0..t.w {
                            let at = i * self.pixels_per_unit + y * self.tile_w + x;
                            self.put(job, (t.y0 + y) * self.samples + t.x0 + x, at);
                        }
                    }
                    self.count(t.row, t.h * t.w);
                }
            }
            Place::Patches { tile: t, first, n } => {
                for i in 0..*n {
                    let q = first + i;
                    self.put(job, (t.y0 + q / t.w) * self.samples + t.x0 + q % t.w, i);
                }
                self.count(t.row, *n);
            }
        }
        self.send_finished_rows();
    }

    /// Writes unit output `at` of `job` to scene pixel `scene`.
    fn put(&mut self, job: &Stitch, scene: usize, at: usize) {
        self.written[scene] = self.written[scene].saturating_add(1);
        match job.cls[at] {
            u32::MAX => {
                self.maps.class_ids[scene] = 0;
                self.maps.confidence[scene] = f32::NAN;
                self.maps.nonfinite_pixels += 1;
            }
            c => {
                self.maps.class_ids[scene] = self.ids.get(c as usize).copied().unwrap_or(0);
                self.maps.confidence[scene] = job.conf[at];
            }
        }
    }

    fn count(&mut self, row: usize, pixels: usize) {
        if let Some(left) = self.row_left.get_mut(row) {
            *left = left.saturating_sub(pixels);
        }
    }

    /// Hands on the finished tile rows that follow the last one sent. A receiver that has gone
    /// (the writer stopped on an error, which the job reports) only ends the strips.
    fn send_finished_rows(&mut self) {
        let Some(tx) = &self.strips else {
            return;
        };
        let mut stopped = false;
        while self.row_left.get(self.rows_sent) == Some(&0) {
            let y0 = self.rows_sent * self.tile_h;
            let y1 = (y0 + self.tile_h).min(self.maps.lines);
            let (a, b) = (y0 * self.samples, y1 * self.samples);
            let strip = Maps {
                lines: y1 - y0,
                samples: self.samples,
                channels: self.maps.channels,
                class_ids: self.maps.class_ids[a..b].to_vec(),
                confidence: self.maps.confidence[a..b].to_vec(),
                scores: None,
                nonfinite_pixels: 0,
            };
            self.rows_sent += 1;
            if tx.send((y0, strip)).is_err() {
                stopped = true;
                break;
            }
        }
        if stopped {
            self.strips = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn maps(lines: usize, samples: usize) -> Maps {
        Maps {
            lines,
            samples,
            channels: 3,
            class_ids: vec![0; lines * samples],
            confidence: vec![f32::NAN; lines * samples],
            scores: None,
            nonfinite_pixels: 0,
        }
    }

    #[test]
    fn the_stitcher_puts_dense_tiles_where_they_belong_and_sends_each_finished_row_once() {
        // A 5 x 7 scene in tiles of at most 4: 2 x 2 tiles of 3 x 4, the last row and column
        // short.
        let grid = TileGrid::new(5, 7, 4, 1);
        assert_eq!((grid.rows, grid.cols, grid.tile_h, grid.tile_w), (2, 2, 3, 4));
        let tiles: Vec<TileRect> = (0..grid.rows)
            .flat_map(|r| (0..grid.cols).map(move |c| (r, c)))
            .map(|(r, c)| grid.rect(r, c))
            .collect();
        let ppu = grid.tile_h * grid.tile_w;
        let mut m = maps(5, 7);
        let mut written = vec![0u8; 35];
        let (tx, rx) = std::sync::mpsc::sync_channel(8);
        let mut canvas = Canvas::new(&mut m, &mut written, vec![10, 20, 30], &grid, ppu, Some(tx));
        // Unit i's pixel (y, x) gets class (scene line + scene sample) % 3, confidence its
        // scene index; one pixel is not finite.
        let mut sent_after = Vec::new();
        for chunk in tiles.chunks(3) {
            let mut cls = vec![0u32; 3 * ppu];
            let mut conf = vec![0f32; 3 * ppu];
            for (i, t) in chunk.iter().enumerate() {
                for y in 0..t.h {
                    for x in 0..t.w {
                        let (sy, sx) = (t.y0 + y, t.x0 + x);
                        let at = i * ppu + y * grid.tile_w + x;
                        cls[at] = if (sy, sx) == (4, 6) {
                            u32::MAX
                        } else {
                            ((sy + sx) % 3) as u32
                        };
                        conf[at] = (sy * 7 + sx) as f32;
                    }
                }
            }
            canvas.apply(&Stitch {
                cls,
                conf,
                place: Place::Tiles(chunk.to_vec()),
            });
            sent_after.push(canvas.rows_sent);
        }
        drop(canvas);
        // Tiles 0-2 finish row 0 and half of row 1; tile 3 finishes row 1.
        assert_eq!(sent_after, [1, 2]);
        let strips: Vec<(usize, Maps)> = rx.try_iter().collect();
        assert_eq!(
            strips.iter().map(|(y0, s)| (*y0, s.lines)).collect::<Vec<_>>(),
            [(0, 3), (3, 2)]
        );
        assert!(written.iter().all(|&c| c == 1));
        for p in 0..35 {
            let (sy, sx) = (p / 7, p % 7);
            if p == 34 {
                assert_eq!((m.class_ids[p], m.confidence[p].is_nan()), (0, true));
            } else {
                assert_eq!(m.class_ids[p], [10, 20, 30][(sy + sx) % 3], "pixel {p}");
                assert_eq!(m.confidence[p], p as f32);
            }
        }
        assert_eq!(m.nonfinite_pixels, 1);
        // The strips are the final maps' lines.
        for (y0, s) in &strips {
            let (a, b) = (y0 * 7, (y0 + s.lines) * 7);
            assert_eq!(s.class_ids, m.class_ids[a..b]);
            assert_eq!(
                s.confidence.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                m.confidence[a..b].iter().map(|v| v.to_bits()).collect::<Vec<_>>()
            );
        }
    }

    #[test]
    fn the_stitcher_puts_patches_where_they_belong_and_sends_a_row_only_once_it_is_whole() {
        let grid = TileGrid::new(5, 7, 4, 1);
        let mut m = maps(5, 7);
        let mut written = vec![0u8; 35];
        let (tx, rx) = std::sync::mpsc::sync_channel(8);
        let mut canvas = Canvas::new(&mut m, &mut written, vec![10, 20, 30], &grid, 1, Some(tx));
        // Pixels 3.. of the tile at (0, 1), unit i is pixel first + i.
        let t = grid.rect(0, 1);
        let n = t.h * t.w - 3;
        canvas.apply(&Stitch {
            cls: vec![2; n],
            conf: (0..n).map(|i| i as f32).collect(),
            place: Place::Patches { tile: t, first: 3, n },
        });
        assert_eq!(canvas.rows_sent, 0);
        // The rest of row 0: tile (0, 0) whole, the first 3 pixels of (0, 1).
        let t0 = grid.rect(0, 0);
        let n0 = t0.h * t0.w;
        canvas.apply(&Stitch {
            cls: vec![0; n0],
            conf: vec![0.5; n0],
            place: Place::Patches {
                tile: t0,
                first: 0,
                n: n0,
            },
        });
        assert_eq!(canvas.rows_sent, 0);
        canvas.apply(&Stitch {
            cls: vec![1; 3],
            conf: vec![0.25; 3],
            place: Place::Patches {
                tile: t,
                first: 0,
                n: 3,
            },
        });
        assert_eq!(canvas.rows_sent, 1);
        drop(canvas);
        for i in 0..n {
            let q = 3 + i;
            let p = (t.y0 + q / t.w) * 7 + t.x0 + q % t.w;
            assert_eq!((written[p], m.class_ids[p], m.confidence[p]), (1, 30, i as f32));
        }
        assert_eq!(written.iter().map(|&c| usize::from(c)).sum::<usize>(), 3 * 7);
        assert_eq!(rx.try_iter().map(|(y0, s)| (y0, s.lines)).collect::<Vec<_>>(), [(0, 3)]);
    }

    #[test]
    fn every_job_sent_is_applied_after_the_way_back_is_closed() {
        let grid = TileGrid::new(4, 4, 2, 0);
        let mut m = maps(4, 4);
        let mut written = vec![0u8; 16];
        let canvas = Canvas::new(&mut m, &mut written, vec![10, 20, 30], &grid, 4, None);
        let (jobs, job_rx) = std::sync::mpsc::sync_channel::<Stitch>(4);
        let (back_tx, back) = std::sync::mpsc::sync_channel(1);
        for r in 0..grid.rows {
            for c in 0..grid.cols {
                jobs.send(Stitch {
                    cls: vec![1; 4],
                    conf: vec![0.5; 4],
                    place: Place::Tiles(vec![grid.rect(r, c)]),
                })
                .unwrap();
            }
        }
        // The run has ended: nothing takes buffers back any more.
        drop((jobs, back));
        canvas.stitch_all(job_rx, back_tx);
        assert!(written.iter().all(|&c| c == 1));
        assert!(m.class_ids.iter().all(|&c| c == 20));
    }
}
