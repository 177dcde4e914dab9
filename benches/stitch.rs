//! `cargo bench --bench stitch [-- MANIFEST.json]`: stitching dense outputs row by row
//! ([`Stitcher::put_row`], what a run does) against pixel by pixel ([`Stitcher::put`], the
//! baseline), measured in the same run on Salinas-A's grid: 4 tiles of 42 x 43, the model's
//! classes, logits drawn at random.

use hsiedge::model::Manifest;
use hsiedge::pipeline::Stitcher;
use hsiedge::tile::TileGrid;
use rand::{Rng, SeedableRng};
use std::path::PathBuf;
use std::time::Instant;

const REPEAT: usize = 501;
const LINES: usize = 83;
const SAMPLES: usize = 86;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let model = PathBuf::from(
        args.first()
            .map_or("models/hybridsn_salinas_a/manifest.json", |s| s.as_str()),
    );
    let manifest = Manifest::load(&model)?;
    let grid = TileGrid::new(LINES, SAMPLES, 64, manifest.halo);
    let (k, th, tw) = (manifest.classes(), grid.tile_h, grid.tile_w);
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let out: Vec<f32> = (0..grid.len() * k * th * tw)
        .map(|_| rng.random_range(-20.0..20.0))
        .collect();
    let tiles: Vec<_> = (0..grid.rows)
        .flat_map(|r| (0..grid.cols).map(move |c| (r, c)))
        .map(|(r, c)| grid.rect(r, c))
        .collect();
    let (mut rows, mut pixels) = (Vec::new(), Vec::new());
    let mut agree = true;
    for _ in 0..REPEAT {
        let t = Instant::now();
        let mut a = Stitcher::new(&manifest, grid, false);
        for (n, rect) in tiles.iter().enumerate() {
            for i in 0..rect.h {
                a.put_row(rect.y0 + i, rect.x0, rect.w, |c| {
                    let first = ((n * k + c) * th + i) * tw;
                    &out[first..first + tw]
                });
            }
        }
        let a = a.finish()?;
        rows.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        let mut b = Stitcher::new(&manifest, grid, false);
        for (n, rect) in tiles.iter().enumerate() {
            for i in 0..rect.h {
                for j in 0..rect.w {
                    b.put(rect.y0 + i, rect.x0 + j, |c| out[((n * k + c) * th + i) * tw + j]);
                }
            }
        }
        let b = b.finish()?;
        pixels.push(t.elapsed().as_secs_f64());
        agree &= a.class_ids == b.class_ids && a.confidence == b.confidence;
    }
    let (rows, pixels) = (median(rows), median(pixels));
    println!(
        "{} pixels, {k} classes, {} tiles of {th} x {tw}, {REPEAT} repetitions, medians (maps identical: {agree})",
        LINES * SAMPLES,
        tiles.len()
    );
    println!("row by row:              {:8.3} ms", rows * 1e3);
    println!("pixel by pixel (base):   {:8.3} ms", pixels * 1e3);
    println!("row / pixel:             {:8.3}x", rows / pixels);
    Ok(())
}
