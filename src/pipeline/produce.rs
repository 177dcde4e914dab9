//! The producer: scene lines read, normalised and tiled into ready batches.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use super::{Batch, BufferPool, LineRing, Mode, PipelineError, RunOptions, grid_for};
use crate::cube::Cube;
use crate::model::Manifest;
use crate::tile::{TileGrid, WindowShape, fill_window, gather_patch};

/// Where the producer reads tile windows from.
pub enum Input<'r, 's> {
    /// A mapped scene: each window decoded straight from the file.
    Mapped(&'r Cube),
    /// A line source: lines decoded into a ring as the tile rows need them.
    Lines(&'r mut LineRing<'s>),
}

/// A tile row whose first unit is in a batch: the stitcher makes the row's strip of maps then.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StripStart {
    /// Tile row.
    pub row: usize,
    /// First scene line.
    pub y0: usize,
    /// Lines of the strip (the tile height, less at the scene's end).
    pub h: usize,
    /// From a line source: for each of the strip's lines, when the last input line it reads
    /// (`halo` lines below it, or the scene's last) arrived. Empty for a mapped scene.
    pub inputs_arrived: Vec<Instant>,
}

/// Builds batches for `manifest` over `cube` and hands each to `sink`; stops early when `sink`
/// returns `false`. Runs on the calling thread.
pub fn produce(cube: &Cube, manifest: &Manifest, opts: &RunOptions, sink: impl FnMut(Batch) -> bool) {
    // A mapped scene has no source to fail.
    let _ = produce_with(
        Input::Mapped(cube),
        manifest,
        opts,
        &AtomicUsize::new(opts.batch),
        None,
        sink,
    );
}

/// [`produce`] from any [`Input`], with the batch size read from `target` as each batch starts,
/// so a governor on another thread can change it, and batch buffers taken from `pool` (see
/// [`BufferPool`]). Returns the scene's line count.
///
/// Tile rows are built in order. From a line source, each row waits for the lines its windows
/// read (or for the scene's end), the lines above the next row's windows are then released, and
/// the row's last batch goes out even when not full, so a row's maps never wait for lines of the
/// next one. Stops when `sink` returns `false` or the pool is closed.
pub fn produce_with(
    mut input: Input<'_, '_>,
    manifest: &Manifest,
    opts: &RunOptions,
    target: &AtomicUsize,
    pool: Option<&BufferPool>,
    mut sink: impl FnMut(Batch) -> bool,
) -> Result<usize, PipelineError> {
    let (mut grid, bands) = match &input {
        Input::Mapped(cube) => (grid_for(cube, manifest, opts), cube.bands()),
        Input::Lines(ring) => {
            let info = ring.source().info();
            let grid = match info.lines {
                Some(lines) => TileGrid::new(lines, info.samples, opts.tile, manifest.halo),
                None => TileGrid::streaming(info.samples, opts.tile, manifest.halo),
            };
            // A resumed scene keeps its first run's tile rows.
            let grid = ring.source().tile_rows().map_or(grid, |h| grid.with_tile_h(h));
            (grid, ring.bands())
        }
    };
    let announced = match &input {
        Input::Lines(ring) => ring.source().info().lines,
        Input::Mapped(_) => None,
    };
    let mean = &manifest.input.mean;
    let inv_std: Vec<f32> = manifest.input.std.iter().map(|s| 1.0 / s).collect();
    let layout = manifest.input.layout;
    let p = manifest.patch;
    let (wh, ww) = (grid.window_h(), grid.window_w());
    let shape = WindowShape { bands, h: wh, w: ww };
    let mut window: Vec<f32> = match opts.mode {
        Mode::Patch => Vec::with_capacity(bands * wh * ww),
        Mode::Dense => Vec::new(),
    };
    let per_unit = match opts.mode {
        Mode::Patch => bands * p * p,
        Mode::Dense => bands * wh * ww,
    };
    let cap_now = || target.load(Ordering::Relaxed).max(1);
    let mut cap = cap_now();
    // The next batch's buffer is taken only when its first unit is written, after the finished
    // batch has been handed over: by then the consumer has returned the buffer it ran before it
    // took the queued one, so the producer never waits on the pool with a finished batch in hand.
    // `false` when the pool has closed: the consumer is gone.
    let start = |b: &mut Batch, cap: &mut usize| -> bool {
        if b.data.capacity() == 0 {
            *cap = cap_now();
            let need = *cap * per_unit;
            b.data = match pool {
                Some(pool) => match pool.take(need) {
                    Some(v) => v,
                    None => return false,
                },
                None => Vec::with_capacity(need),
            };
            match opts.mode {
                // Patches are written in place: a buffer back from the engine is already this long,
                // so in a steady run no value of the batch is written twice (a new buffer, or the
                // one that held a partial last batch, is zeroed first, once).
                Mode::Patch => {
                    b.data.resize(need, 0.0);
                    b.pixels.reserve(*cap);
                }
                Mode::Dense => b.data.clear(),
            }
        }
        true
    };
    let mut batch = Batch::default();
    let finish = |b: &mut Batch| {
        let n = match opts.mode {
            Mode::Patch => b.pixels.len(),
            Mode::Dense => b.tiles.len(),
        };
        b.shape = match opts.mode {
            Mode::Patch => layout.shape(n, bands, p, p),
            Mode::Dense => layout.shape(n, bands, wh, ww),
        };
        // A last, partial batch of patches holds only the patches written.
        b.data.truncate(n * per_unit);
        std::mem::take(b)
    };
    let streamed = matches!(input, Input::Lines(_));
    let mut row = 0;
    loop {
        if let Input::Lines(ring) = &mut input {
            ring.fill_to(((row + 1) * grid.tile_h + grid.halo).min(grid.lines))
                .map_err(PipelineError::Source)?;
            if let Some(lines) = ring.ended()
                && grid.lines != lines
            {
                if let Some(announced) = announced {
                    return Err(PipelineError::LineCount {
                        scene: ring.source().info().id.clone(),
                        announced,
                        got: lines,
                    });
                }
                grid = grid.with_lines(lines);
            }
        }
        if row >= grid.rows {
            break;
        }
        let lines = grid.window_lines(row);
        let (y0, h) = (row * grid.tile_h, grid.rect(row, 0).h);
        let inputs_arrived = match &input {
            Input::Lines(ring) => (y0..y0 + h)
                .filter_map(|y| ring.arrived((y + grid.halo).min(grid.lines.saturating_sub(1))))
                .collect(),
            Input::Mapped(_) => Vec::new(),
        };
        let mut strip = Some(StripStart {
            row,
            y0,
            h,
            inputs_arrived,
        });
        for col in 0..grid.cols {
            let rect = grid.rect(row, col);
            let cols = grid.window_samples(col);
            let fill = |out: &mut Vec<f32>| match &input {
                // Appended straight to the batch: a window is megabytes, and a copy through a
                // scratch buffer (or zeroing first) would write it twice.
                Input::Mapped(cube) => fill_window(cube, &lines, &cols, mean, &inv_std, out),
                Input::Lines(ring) => {
                    let at = out.len();
                    out.resize(at + bands * wh * ww, 0.0);
                    ring.fill_window(&lines, &cols, &mut out[at..]);
                }
            };
            match opts.mode {
                Mode::Dense => {
                    if !start(&mut batch, &mut cap) {
                        return Ok(grid.lines);
                    }
                    batch.strips.extend(strip.take());
                    fill(&mut batch.data);
                    batch.tiles.push(rect);
                    if batch.tiles.len() >= cap && !sink(finish(&mut batch)) {
                        return Ok(grid.lines);
                    }
                }
                Mode::Patch => {
                    window.clear();
                    fill(&mut window);
                    for i in 0..rect.h {
                        for j in 0..rect.w {
                            if !start(&mut batch, &mut cap) {
                                return Ok(grid.lines);
                            }
                            batch.strips.extend(strip.take());
                            let at = batch.pixels.len() * per_unit;
                            gather_patch(&window, shape, i, j, p, &mut batch.data[at..at + per_unit]);
                            batch.pixels.push((rect.y0 + i, rect.x0 + j));
                            if batch.pixels.len() >= cap && !sink(finish(&mut batch)) {
                                return Ok(grid.lines);
                            }
                        }
                    }
                }
            }
        }
        if let Input::Lines(ring) = &mut input {
            ring.release_below(((row + 1) * grid.tile_h).saturating_sub(grid.halo));
        }
        if streamed && batch.units() > 0 && !sink(finish(&mut batch)) {
            return Ok(grid.lines);
        }
        row += 1;
    }
    if batch.units() > 0 {
        sink(finish(&mut batch));
    }
    Ok(grid.lines)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Manifest;
    use crate::pipeline::buffer_limit;

    fn manifest() -> Manifest {
        let v = |x: f32| serde_json::to_string(&vec![x; 2]).unwrap();
        let text = format!(
            r#"{{"name":"t","task":"classification","input":{{"bands":2,"layout":"nchw","mean":{},"std":{}}},
            "patch":3,"halo":1,"outputs":[{{"id":3,"name":"a"}},{{"id":9,"name":"b"}}],
            "files":{{"patch":"p.onnx","dense":"d.onnx"}},"output_kind":"logits"}}"#,
            v(0.0),
            v(1.0)
        );
        Manifest::parse(&text, std::path::Path::new("m.json")).unwrap()
    }

    #[test]
    fn batches_from_reused_buffers_equal_batches_from_fresh_ones() {
        use crate::cube::{DataType, Header, Interleave};
        let dir = tempfile::tempdir().unwrap();
        let (lines, samples, bands) = (5usize, 6usize, 2usize);
        let bytes: Vec<u8> = (0..lines * bands * samples)
            .flat_map(|i| ((i * 37 % 101) as i16).to_le_bytes())
            .collect();
        std::fs::write(dir.path().join("c.img"), bytes).unwrap();
        let hdr = dir.path().join("c.hdr");
        std::fs::write(
            &hdr,
            Header::new(samples, lines, bands, DataType::I16, Interleave::Bil).to_text(),
        )
        .unwrap();
        let cube = Cube::open(&hdr).unwrap();
        let m = manifest();
        for mode in [Mode::Patch, Mode::Dense] {
            let opts = RunOptions {
                mode,
                batch: 4,
                tile: 4,
                queue: 1,
                keep_scores: false,
                producer_nice: 0,
            };
            let collect = |pool: Option<&BufferPool>| {
                let mut got = Vec::new();
                let _ = produce_with(
                    Input::Mapped(&cube),
                    &m,
                    &opts,
                    &AtomicUsize::new(opts.batch),
                    pool,
                    |b| {
                        got.push((b.data.clone(), b.shape.clone(), b.pixels.clone(), b.tiles.clone()));
                        if let Some(pool) = pool {
                            pool.give(b.data);
                        }
                        true
                    },
                );
                got
            };
            let fresh = collect(None);
            // Buffers back from earlier batches hold stale values, some shorter than a batch.
            let pool = BufferPool::new(buffer_limit(&cube, &m, &opts));
            let need =
                opts.batch * bands * grid_for(&cube, &m, &opts).window_h() * grid_for(&cube, &m, &opts).window_w();
            pool.reopen(2);
            let (mut a, mut b) = (pool.take(need).unwrap(), pool.take(need).unwrap());
            a.resize(need, f32::NAN);
            b.resize(3, f32::NAN);
            pool.give(a);
            pool.give(b);
            for _ in 0..2 {
                let reused = collect(Some(&pool));
                assert_eq!(reused.len(), fresh.len(), "{mode:?}");
                for (a, b) in reused.iter().zip(&fresh) {
                    assert_eq!(
                        a.0.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        b.0.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        "{mode:?}"
                    );
                    assert_eq!((&a.1, &a.2, &a.3), (&b.1, &b.2, &b.3), "{mode:?}");
                }
            }
        }
    }
}
