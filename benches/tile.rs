//! `cargo bench --bench tile [-- SCENE.hdr MANIFEST.json]`: the tiler's window fill, against a
//! streaming decode of the same number of values measured in the same run.
//!
//! Each repetition fills every dense input window of the scene (reflected halo, normalised) from
//! the mapped file, hot and then after the caches were flushed by writing 64 MiB elsewhere (as a
//! run finds them after the engine's arena), and decodes the whole scene line by line, the
//! baseline: the same decode with no halo, reflection or window strides. Medians over the
//! repetitions; the ratio is the fill's time per value over the baseline's.

use hsiedge::cube::Cube;
use hsiedge::model::Manifest;
use hsiedge::tile::{TileGrid, fill_window};
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
    Ok(())
}
