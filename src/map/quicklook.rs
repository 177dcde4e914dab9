//! The PNG quick-look of a map set: the map scaled up, with a legend of colours and names.

use crate::model::{Manifest, Task};
use crate::pipeline::Maps;

/// Palette slots of a classification quick-look: background, ink, then one per class.
const WHITE: u8 = 0;
const BLACK: u8 = 1;

/// Renders the quick-look: the map scaled by an integer factor, and a legend of colours and names.
///
/// A class map is drawn as an indexed PNG (one byte a pixel, a third of the bytes to filter and
/// compress; written after the last batch, it is on the run's critical path); abundances, mixed
/// colours, as RGB.
///
/// `run_id` goes into a text chunk under [`super::RUN_ID_KEY`], as it goes into each header.
pub fn quicklook_png(maps: &Maps, manifest: &Manifest, run_id: &str) -> Result<Vec<u8>, String> {
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
    let n = maps.lines * maps.samples;
    let k = manifest.outputs.len();
    if manifest.task == Task::Classification && k + 2 <= 256 {
        let mut by_id = [BLACK; 256];
        for (i, o) in manifest.outputs.iter().enumerate() {
            if let Some(slot) = by_id.get_mut(o.id as usize) {
                *slot = (i + 2) as u8;
            }
        }
        let index: Vec<u8> = maps.class_ids.iter().map(|&id| by_id[usize::from(id)]).collect();
        let swatches: Vec<u8> = (0..k).map(|i| (i + 2) as u8).collect();
        let (img, w, h) = render(&index, maps, &names, &swatches, WHITE, BLACK);
        let mut palette = vec![255u8, 255, 255, 0, 0, 0];
        palette.extend((0..k).flat_map(|i| manifest.color(i)));
        encode_png(&img, w, h, Some(palette), run_id)
    } else {
        let rgb: Vec<[u8; 3]> = if manifest.task == Task::Classification {
            let by_id: std::collections::HashMap<u8, [u8; 3]> = manifest
                .outputs
                .iter()
                .enumerate()
                .map(|(i, o)| (o.id as u8, manifest.color(i)))
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
                    for c in 0..maps.channels {
                        let a = scores.get(c * n + i).copied().unwrap_or(0.0).clamp(0.0, 1.0);
                        for (j, v) in rgb.iter_mut().enumerate() {
                            *v += a * f32::from(manifest.color(c)[j]);
                        }
                    }
                    rgb.map(|v| v.clamp(0.0, 255.0) as u8)
                })
                .collect()
        };
        let swatches: Vec<[u8; 3]> = (0..k).map(|i| manifest.color(i)).collect();
        let (img, w, h) = render(&rgb, maps, &names, &swatches, [255; 3], [0; 3]);
        encode_png(img.as_flattened(), w, h, None, run_id)
    }
}

/// Draws `map` (`maps.lines` x `maps.samples` pixels) scaled up, with a legend of `swatches`
/// and `names` beside it, on a `background` canvas with `ink` for text and swatch edges.
fn render<P: Copy>(
    map: &[P],
    maps: &Maps,
    names: &[String],
    swatches: &[P],
    background: P,
    ink: P,
) -> (Vec<P>, usize, usize) {
    let scale = (256 / maps.lines.max(maps.samples).max(1)).clamp(1, 8);
    let (mw, mh) = (maps.samples * scale, maps.lines * scale);
    let text_w = names.iter().map(|n| n.chars().count()).max().unwrap_or(0) * 8;
    let legend_w = 8 + 12 + 6 + text_w + 8;
    let row_h = 14;
    let legend_h = 8 + names.len() * row_h + 8;
    let (w, h) = (mw + legend_w, mh.max(legend_h));
    let mut img = vec![background; w * h];
    // Each map row is scaled once and its copies are row copies.
    for (y, src) in map.chunks_exact(maps.samples.max(1)).enumerate().take(maps.lines) {
        let row = &mut img[y * scale * w..y * scale * w + mw];
        for (x, &p) in src.iter().enumerate() {
            row[x * scale..(x + 1) * scale].fill(p);
        }
        for dy in 1..scale {
            img.copy_within(y * scale * w..y * scale * w + mw, (y * scale + dy) * w);
        }
    }
    let mut set = |x: usize, y: usize, c: P| {
        if x < w && y < h {
            img[y * w + x] = c;
        }
    };
    for (k, (name, &swatch)) in names.iter().zip(swatches).enumerate() {
        let (x0, y0) = (mw + 8, 8 + k * row_h);
        for dy in 0..12 {
            for dx in 0..12 {
                let edge = dx == 0 || dy == 0 || dx == 11 || dy == 11;
                set(x0 + dx, y0 + dy, if edge { ink } else { swatch });
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
                        set(x0 + 18 + i * 8 + gx, y0 + 2 + gy, ink);
                    }
                }
            }
        }
    }
    (img, w, h)
}

/// Encodes 8-bit pixels: indexed with `palette` (RGB triples), RGB without.
fn encode_png(pixels: &[u8], w: usize, h: usize, palette: Option<Vec<u8>>, run_id: &str) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    let width = u32::try_from(w).map_err(|e| e.to_string())?;
    let height = u32::try_from(h).map_err(|e| e.to_string())?;
    let mut enc = png::Encoder::new(&mut out, width, height);
    match palette {
        Some(p) => {
            enc.set_color(png::ColorType::Indexed);
            enc.set_palette(p);
        }
        None => enc.set_color(png::ColorType::Rgb),
    }
    enc.set_depth(png::BitDepth::Eight);
    // A quick-look is for eyes, and it is written after the last batch, on the run's critical path.
    enc.set_compression(png::Compression::Fast);
    enc.add_text_chunk(super::RUN_ID_KEY.into(), run_id.into())
        .map_err(|e| e.to_string())?;
    let mut writer = enc.write_header().map_err(|e| e.to_string())?;
    writer.write_image_data(pixels).map_err(|e| e.to_string())?;
    writer.finish().map_err(|e| e.to_string())?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn manifest() -> Manifest {
        let text = r#"{"name":"t","task":"classification","input":{"bands":1,"layout":"nchw","mean":[0],"std":[1]},
            "patch":1,"halo":0,"outputs":[{"id":3,"name":"a","color":[10,20,30]},{"id":9,"name":"b","color":[200,100,50]}],
            "files":{"patch":"p.onnx"},"output_kind":"logits"}"#;
        Manifest::parse(text, Path::new("m.json")).unwrap()
    }

    #[test]
    fn the_quicklook_shows_each_pixel_in_its_class_colour_and_a_legend() {
        let m = manifest();
        let (lines, samples) = (5, 7);
        let class_ids: Vec<u8> = (0..lines * samples).map(|i| [3, 9, 0][i % 3]).collect();
        let maps = Maps {
            lines,
            samples,
            channels: 2,
            class_ids: class_ids.clone(),
            confidence: vec![1.0; lines * samples],
            scores: None,
            nonfinite_pixels: 0,
        };
        let png = quicklook_png(&maps, &m, "run-7").unwrap();
        let mut dec = png::Decoder::new(std::io::Cursor::new(png));
        dec.set_transformations(png::Transformations::EXPAND);
        let mut r = dec.read_info().unwrap();
        let mut buf = vec![0; r.output_buffer_size()];
        let info = r.next_frame(&mut buf).unwrap();
        let text = &r.info().uncompressed_latin1_text;
        assert!(
            text.iter()
                .any(|t| t.keyword == super::super::RUN_ID_KEY && t.text == "run-7"),
            "{text:?}"
        );
        assert_eq!(info.color_type, png::ColorType::Rgb);
        let (w, scale) = (info.width as usize, 8);
        let at = |x: usize, y: usize| -> [u8; 3] { buf[(y * w + x) * 3..(y * w + x) * 3 + 3].try_into().unwrap() };
        for y in 0..lines * scale {
            for x in 0..samples * scale {
                let want = match class_ids[(y / scale) * samples + x / scale] {
                    3 => [10, 20, 30],
                    9 => [200, 100, 50],
                    _ => [0, 0, 0],
                };
                assert_eq!(at(x, y), want, "pixel ({x}, {y})");
            }
        }
        // The legend's first swatch, beside the map: a black edge around the first class colour.
        let (x0, y0) = (samples * scale + 8, 8);
        assert_eq!(at(x0, y0), [0, 0, 0]);
        assert_eq!(at(x0 + 5, y0 + 5), [10, 20, 30]);
        assert_eq!(at(x0 + 5, y0 + 14 + 5), [200, 100, 50]);
        assert_eq!(at(w - 1, info.height as usize - 1), [255, 255, 255]);
    }
}
