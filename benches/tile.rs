//! `cargo bench --bench tile [-- SCENE.hdr MANIFEST.json]`: the tiler's window fill, against a
//! streaming decode of the same number of values, and its patch gather, against a one-piece copy
//! of as many batches, each baseline measured in the same run.
//!
//! Each repetition fills every dense input window of the scene (reflected halo, normalised) from
//! the mapped file, hot and then after the caches were flushed by writing 64 MiB elsewhere (as a
//! run finds them after the engine's arena), and decodes the whole scene line by line, the
//! baseline: the same decode with no halo, reflection or window strides. Medians over the
//! repetitions; the ratio is the fill's time per value over the baseline's.

use hsiedge::cube::Cube;
use hsiedge::model::Manifest;
use hsiedge::tile::{TileGrid, WindowShape, fill_window, gather_patch};
use std::path::PathBuf;
use std::time::Instant;

const REPEAT: usize = 201;
const TILE: usize = 64;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // `cargo bench` passes `--bench`; the scene and manifest are the other arguments.
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let scene = PathBuf::from(
        args.first()
            .map_or("../shared/data/salinas_a/salinas_a.hdr", |s| s.as_str()),
    );
    let model = PathBuf::from(
        args.get(1)
            .map_or("models/hybridsn_salinas_a/manifest.json", |s| s.as_str()),
    );
    if !scene.exists() {
        println!(
            "tile bench skipped: {} is absent (pass SCENE.hdr MANIFEST.json)",
            scene.display()
        );
        return Ok(());
    }
    let cube = Cube::open(&scene)?;
    let manifest = Manifest::load(&model)?;
    let grid = TileGrid::new(cube.lines(), cube.samples(), TILE, manifest.halo);
    let mean = &manifest.input.mean;
    let inv_std: Vec<f32> = manifest.input.std.iter().map(|s| 1.0 / s).collect();
    let windows: Vec<(Vec<usize>, Vec<usize>)> = (0..grid.rows)
        .flat_map(|r| (0..grid.cols).map(move |c| (r, c)))
        .map(|(r, c)| (grid.window_lines(r), grid.window_samples(c)))
        .collect();
    let per_window = cube.bands() * grid.window_h() * grid.window_w();
    let mut out: Vec<Vec<f32>> = windows.iter().map(|_| Vec::with_capacity(per_window)).collect();
    let mut line = vec![0f32; cube.bands() * cube.samples()];
    let mut flush = vec![0u8; 64 << 20];
    let fill_all = |out: &mut [Vec<f32>]| {
        for ((lines, cols), o) in windows.iter().zip(out.iter_mut()) {
            o.clear();
            fill_window(&cube, lines, cols, mean, &inv_std, o);
        }
    };
    let (mut hot, mut cold, mut stream) = (Vec::new(), Vec::new(), Vec::new());
    for rep in 0..REPEAT {
        let t = Instant::now();
        fill_all(&mut out);
        hot.push(t.elapsed().as_secs_f64());
        for b in flush.iter_mut().step_by(64) {
            *b = b.wrapping_add(rep as u8);
        }
        let t = Instant::now();
        fill_all(&mut out);
        cold.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        for y in 0..cube.lines() {
            cube.read_line(y, &mut line);
            std::hint::black_box(&line);
        }
        stream.push(t.elapsed().as_secs_f64());
    }
    std::hint::black_box((&out, &flush));
    // Patch mode: every pixel's p x p patch gathered from its (hot) window into batches of 32,
    // against copying the same number of values in one piece.
    let p = manifest.patch;
    let shape = WindowShape {
        bands: cube.bands(),
        h: grid.window_h(),
        w: grid.window_w(),
    };
    let per_patch = cube.bands() * p * p;
    let mut batch: Vec<f32> = vec![0.0; 32 * per_patch];
    let big: Vec<f32> = vec![1.0; 32 * per_patch];
    let (mut gather, mut copy) = (Vec::new(), Vec::new());
    let mut patches: usize = 0;
    for _ in 0..REPEAT.min(21) {
        let t = Instant::now();
        patches = 0;
        let mut k = 0;
        for (w, row_col) in out
            .iter()
            .zip((0..grid.rows).flat_map(|r| (0..grid.cols).map(move |c| (r, c))))
        {
            let rect = grid.rect(row_col.0, row_col.1);
            for i in 0..rect.h {
                for j in 0..rect.w {
                    if k == 32 {
                        std::hint::black_box(&batch);
                        k = 0;
                    }
                    gather_patch(w, shape, i, j, p, &mut batch[k * per_patch..(k + 1) * per_patch]);
                    k += 1;
                    patches += 1;
                }
            }
        }
        gather.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        for _ in 0..patches.div_ceil(32) {
            batch.copy_from_slice(&big);
            std::hint::black_box(&batch);
        }
        copy.push(t.elapsed().as_secs_f64());
    }
    let filled = (windows.len() * per_window) as f64;
    let streamed = (cube.lines() * cube.bands() * cube.samples()) as f64;
    let (hot, cold, stream) = (median(hot), median(cold), median(stream));
    println!(
        "{}: {} windows of {} x {} x {} ({} values), {REPEAT} repetitions, medians",
        scene.display(),
        windows.len(),
        cube.bands(),
        grid.window_h(),
        grid.window_w(),
        filled
    );
    println!(
        "window fill, hot:         {:8.3} ms  {:6.2} ns/value",
        hot * 1e3,
        hot / filled * 1e9
    );
    println!(
        "window fill, caches cold: {:8.3} ms  {:6.2} ns/value",
        cold * 1e3,
        cold / filled * 1e9
    );
    println!(
        "streaming decode (base):  {:8.3} ms  {:6.2} ns/value",
        stream * 1e3,
        stream / streamed * 1e9
    );
    println!(
        "fill / streaming decode, per value: hot {:.2}x, cold {:.2}x",
        (hot / filled) / (stream / streamed),
        (cold / filled) / (stream / streamed)
    );
    let (gather, copy) = (median(gather), median(copy));
    println!(
        "patch gather ({patches} patches of {p} x {p}, batches of 32): {:8.3} ms; one-piece copy of as many batches (base): {:8.3} ms; ratio {:.2}x",
        gather * 1e3,
        copy * 1e3,
        gather / copy
    );
    Ok(())
}
