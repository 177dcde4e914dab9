//! The host side of the device path, ahead of the device: a thread copies the raw windows of the
//! next batches into pinned buffers (one per unit, the units spread over worker threads) while the
//! device uploads, preprocesses and runs the current one.
//!
//! Buffers go round: free -> filled by the prefetch thread -> handed to the caller, who uploads
//! them and gives them back at once. A pinned buffer's own event (recorded by the upload) makes the
//! prefetch thread wait for an upload still in flight before it writes the buffer again, so giving
//! a buffer back before its upload finishes is safe.

use std::cell::{Cell, RefCell};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::time::Instant;

use cudarc::driver::PinnedHostSlice;

use super::{ResidentError, gather};
use crate::cube::{Cube, Interleave};
use crate::gpu::driver;
use crate::tile::{TileGrid, TileRect};

/// One batch's raw windows, in the batch's order.
pub struct Filled<B> {
    /// One buffer per unit; the batch's tiles fill the first ones.
    pub units: Vec<B>,
    /// Seconds the copy itself took (not the wait for the buffers' previous uploads).
    pub gather_s: f64,
}

/// Fills a batch's buffers with its tiles' windows; returns the copy's seconds.
type Fill<'a, B> = dyn Fn(&[TileRect], &mut [B]) -> Result<f64, ResidentError> + Send + Sync + 'a;

/// The caller's end: the next filled batch, and the way back for its buffers.
pub struct Prefetch<'a, B> {
    how: How<'a, B>,
}

enum How<'a, B> {
    /// A prefetch thread fills the batches ahead.
    Ahead {
        filled: Receiver<Result<Filled<B>, ResidentError>>,
        free: SyncSender<Vec<B>>,
    },
    /// The caller's thread fills each batch when it asks for it.
    Inline {
        sets: RefCell<Vec<Vec<B>>>,
        batches: &'a [&'a [TileRect]],
        next: Cell<usize>,
        fill: &'a Fill<'a, B>,
    },
}

impl<B> Prefetch<'_, B> {
    /// The next batch in order, waiting for it when the copy is behind.
    pub fn next(&self) -> Result<Filled<B>, ResidentError> {
        match &self.how {
            How::Ahead { filled, .. } => match filled.recv() {
                Ok(r) => r,
                Err(_) => Err(ResidentError::Prefetch),
            },
            How::Inline {
                sets,
                batches,
                next,
                fill,
            } => {
                let tiles = batches.get(next.get()).ok_or(ResidentError::Prefetch)?;
                let mut units = sets.borrow_mut().pop().ok_or(ResidentError::Prefetch)?;
                next.set(next.get() + 1);
                let gather_s = fill(tiles, &mut units)?;
                Ok(Filled { units, gather_s })
            }
        }
    }

    /// Gives a batch's buffers back for a later batch (their uploads may still be in flight).
    pub fn give_back(&self, units: Vec<B>) {
        match &self.how {
            // A closed channel means the prefetch thread has finished: the buffers are not needed.
            How::Ahead { free, .. } => {
                let _ = free.send(units);
            }
            How::Inline { sets, .. } => sets.borrow_mut().push(units),
        }
    }
}

/// Runs `body` with the raw windows of `batches` filled in order into `pool`'s buffer sets by
/// `fill` (each set holds one buffer per unit of the largest batch): by a prefetch thread ahead of
/// the caller, or, when `inline`, on the caller's thread as it asks (no driver call from another
/// thread while the caller's work runs, as CUDA graph capture needs). The sets come back into
/// `pool` when every batch was taken and given back; after an error the ones still out are
/// dropped (the caller allocates them again).
pub fn with_prefetch<B: Send, T>(
    batches: &[&[TileRect]],
    pool: &mut Vec<Vec<B>>,
    inline: bool,
    fill: &Fill<'_, B>,
    body: impl FnOnce(&Prefetch<'_, B>) -> Result<T, ResidentError>,
) -> Result<T, ResidentError> {
    let sets = std::mem::take(pool);
    if inline {
        let p = Prefetch {
            how: How::Inline {
                sets: RefCell::new(sets),
                batches,
                next: Cell::new(0),
                fill,
            },
        };
        let out = body(&p);
        if let How::Inline { sets, .. } = p.how {
            pool.extend(sets.into_inner());
        }
        return out;
    }
    let depth = sets.len().max(1);
    let (free_tx, free_rx) = sync_channel::<Vec<B>>(depth);
    for s in sets {
        // The channel holds `depth` sets: this never blocks.
        let _ = free_tx.send(s);
    }
    let (filled_tx, filled_rx) = sync_channel(depth);
    std::thread::scope(|scope| {
        let worker = scope.spawn(move || {
            for tiles in batches {
                let Ok(mut units) = free_rx.recv() else {
                    return free_rx;
                };
                let r = fill(tiles, &mut units).map(|gather_s| Filled { units, gather_s });
                let failed = r.is_err();
                if filled_tx.send(r).is_err() || failed {
                    return free_rx;
                }
            }
            free_rx
        });
        let p = Prefetch {
            how: How::Ahead {
                filled: filled_rx,
                free: free_tx,
            },
        };
        let out = body(&p);
        // Closing both channels ends a worker still waiting for a buffer or a taker.
        drop(p);
        if let Ok(free_rx) = worker.join() {
            pool.extend(free_rx.try_iter());
        }
        out
    })
}

/// Copies the raw windows of `tiles` into the first `tiles.len()` pinned buffers of `units`, split into
/// pieces of whole window lines (BIL and BIP windows are line-major; a BSQ window is one piece) so
/// that even a batch of one window keeps `threads` threads busy.
pub fn fill(
    cube: &Cube,
    grid: &TileGrid,
    tiles: &[TileRect],
    units: &mut [PinnedHostSlice<u8>],
    threads: usize,
) -> Result<f64, ResidentError> {
    let n = tiles.len().min(units.len());
    let outs = units[..n]
        .iter_mut()
        // Waits for each buffer's last upload before it is written again.
        .map(|u| u.as_mut_slice().map_err(driver("cuEventSynchronize")))
        .collect::<Result<Vec<_>, _>>()?;
    let t0 = Instant::now();
    fill_slices(cube, grid, &tiles[..n], outs, threads)?;
    Ok(t0.elapsed().as_secs_f64())
}

/// A window's scene lines and its column runs.
type Window = (Vec<usize>, Vec<(usize, usize)>);

/// A piece of a window's copy: the window, its first line, its line count, and the part of the
/// window's buffer those lines fill.
type Piece<'a> = (usize, usize, usize, &'a mut [u8]);

/// [`fill`] into plain slices, one per tile, each exactly its window's bytes.
pub fn fill_slices(
    cube: &Cube,
    grid: &TileGrid,
    tiles: &[TileRect],
    outs: Vec<&mut [u8]>,
    threads: usize,
) -> Result<(), ResidentError> {
    let n = tiles.len().min(outs.len());
    let threads = threads.max(1);
    let split = match cube.header().interleave {
        Interleave::Bsq => 1,
        Interleave::Bil | Interleave::Bip => threads.div_ceil(n.max(1)),
    };
    let windows: Vec<Window> = tiles[..n]
        .iter()
        .map(|t| (grid.window_lines(t.row), gather::runs(&grid.window_samples(t.col))))
        .collect();
    let mut pieces: Vec<Piece<'_>> = Vec::new();
    for (w, out) in outs.into_iter().take(n).enumerate() {
        let lines = windows[w].0.len().max(1);
        let line_bytes = out.len() / lines;
        let per = lines.div_ceil(split).max(1);
        for (k, piece) in out.chunks_mut((per * line_bytes).max(1)).enumerate() {
            let count = piece.len() / line_bytes.max(1);
            pieces.push((w, k * per, count, piece));
        }
    }
    let copy = |(w, first, count, piece): (usize, usize, usize, &mut [u8])| {
        let (lines, runs) = &windows[w];
        gather::raw_window(cube, &lines[first..first + count], runs, piece);
    };
    if threads == 1 || pieces.len() == 1 {
        pieces.into_iter().for_each(copy);
        return Ok(());
    }
    let mut groups: Vec<Vec<Piece<'_>>> = (0..threads.min(pieces.len())).map(|_| Vec::new()).collect();
    let g = groups.len();
    for (i, p) in pieces.into_iter().enumerate() {
        groups[i % g].push(p);
    }
    std::thread::scope(|s| {
        let jobs: Vec<_> = groups
            .into_iter()
            .map(|group| s.spawn(move || group.into_iter().for_each(copy)))
            .collect();
        jobs.into_iter()
            .map(|j| j.join().map_err(|_| ResidentError::Prefetch))
            .collect::<Result<Vec<()>, _>>()
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cube::{DataType, Header};

    fn tiles(n: usize) -> Vec<TileRect> {
        let grid = TileGrid::new(4, 4 * n, 4, 0);
        (0..n).map(|c| grid.rect(0, c)).collect()
    }

    #[test]
    fn batches_come_in_order_and_every_buffer_comes_back() {
        let all = tiles(7);
        let batches: Vec<&[TileRect]> = all.chunks(2).collect();
        let mut pool = vec![vec![usize::MAX; 2], vec![usize::MAX; 2]];
        let fill = |ts: &[TileRect], units: &mut [usize]| {
            for (t, u) in ts.iter().zip(units.iter_mut()) {
                *u = t.col;
            }
            Ok(0.0)
        };
        for inline in [false, true] {
            let seen = with_prefetch(&batches, &mut pool, inline, &fill, |p| {
                let mut seen = Vec::new();
                for b in &batches {
                    let f = p.next()?;
                    seen.extend_from_slice(&f.units[..b.len()]);
                    p.give_back(f.units);
                }
                Ok(seen)
            })
            .unwrap();
            assert_eq!(seen, (0..7).collect::<Vec<_>>(), "inline {inline}");
            assert_eq!(pool.len(), 2, "inline {inline}");
        }
    }

    #[test]
    fn an_error_on_either_side_ends_the_run_without_hanging() {
        let all = tiles(9);
        let batches: Vec<&[TileRect]> = all.chunks(1).collect();
        let fill = |ts: &[TileRect], _: &mut [u8]| {
            if ts[0].col == 3 {
                Err(ResidentError::Prefetch)
            } else {
                Ok(0.0)
            }
        };
        let ok = |_: &[TileRect], _: &mut [u8]| Ok(0.0);
        for inline in [false, true] {
            // The copy fails at the fourth batch: the caller gets its error after three batches.
            let mut pool = vec![vec![0u8; 1], vec![0u8; 1]];
            let mut taken = 0;
            let r: Result<(), _> = with_prefetch(&batches, &mut pool, inline, &fill, |p| {
                loop {
                    let f = p.next()?;
                    taken += 1;
                    p.give_back(f.units);
                }
            });
            assert!(matches!(r, Err(ResidentError::Prefetch)), "inline {inline}");
            assert_eq!(taken, 3, "inline {inline}");
            // The caller fails after one batch, the copy still ahead: the run ends, sets are lost
            // or returned but never more than there were.
            let mut pool = vec![vec![0u8; 1], vec![0u8; 1]];
            let r: Result<(), _> = with_prefetch(&batches, &mut pool, inline, &ok, |p| {
                let _ = p.next()?;
                Err(ResidentError::Prefetch)
            });
            assert!(r.is_err());
            assert!(pool.len() <= 2);
        }
    }

    #[test]
    fn windows_copied_in_pieces_on_threads_equal_whole_windows() {
        let dir = tempfile::tempdir().unwrap();
        let (s, l, b) = (23usize, 19usize, 5usize);
        for il in [Interleave::Bil, Interleave::Bip, Interleave::Bsq] {
            let h = Header::new(s, l, b, DataType::I16, il);
            let name = format!("{il:?}");
            let bytes: Vec<u8> = (0..s * l * b).flat_map(|v| (v as i16).to_le_bytes()).collect();
            std::fs::write(dir.path().join(format!("{name}.hdr")), h.to_text()).unwrap();
            std::fs::write(dir.path().join(format!("{name}.img")), bytes).unwrap();
            let cube = Cube::open(&dir.path().join(format!("{name}.hdr"))).unwrap();
            // Tiles of 8 with a halo of 3: windows reflect at every border.
            let grid = TileGrid::new(l, s, 8, 3);
            let tiles: Vec<TileRect> = (0..grid.rows)
                .flat_map(|r| (0..grid.cols).map(move |c| (r, c)))
                .map(|(r, c)| grid.rect(r, c))
                .collect();
            let wb = gather::window_bytes(&cube, grid.window_h(), grid.window_w());
            let want: Vec<Vec<u8>> = tiles
                .iter()
                .map(|t| {
                    let mut w = vec![0u8; wb];
                    let runs = gather::runs(&grid.window_samples(t.col));
                    gather::raw_window(&cube, &grid.window_lines(t.row), &runs, &mut w);
                    w
                })
                .collect();
            for threads in [1, 2, 3, 7, 40] {
                for batch in [1, 2, tiles.len()] {
                    for chunk in tiles.chunks(batch) {
                        let mut got = vec![vec![0xAAu8; wb]; chunk.len()];
                        let outs = got.iter_mut().map(|g| g.as_mut_slice()).collect();
                        fill_slices(&cube, &grid, chunk, outs, threads).unwrap();
                        for (g, t) in got.iter().zip(chunk) {
                            let i = t.row * grid.cols + t.col;
                            assert!(g == &want[i], "{il:?} threads {threads} batch {batch} tile {i}");
                        }
                    }
                }
            }
        }
    }
}
