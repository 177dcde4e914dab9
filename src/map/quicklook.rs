//! The PNG quick-look of a map set: the map scaled up, with a legend of colours and names.

use crate::model::{Manifest, Task};
use crate::pipeline::Maps;

/// Palette slots of a classification quick-look: background, ink, then one per class.
const WHITE: u8 = 0;
const BLACK: u8 = 1;

/// Renders the quick-look: the map scaled by an integer factor, and a legend of colours and names.
///
/// A class map is drawn as an indexed PNG (one byte a pixel, a third of the bytes to filter and
/// compress); abundances, mixed colours, as RGB.
///
/// `run_id` goes into a text chunk under [`super::RUN_ID_KEY`], as it goes into each header.
pub fn quicklook_png(maps: &Maps, manifest: &Manifest, run_id: &str) -> Result<Vec<u8>, String> {
    if let Some(mut s) = QuicklookStream::new(manifest, maps.lines, maps.samples, run_id)? {
        s.push(&maps.class_ids)?;
        return s.finish();
    }
    let names = names(manifest);
    let n = maps.lines * maps.samples;
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
    let swatches: Vec<[u8; 3]> = (0..manifest.outputs.len()).map(|i| manifest.color(i)).collect();
    let layout = Layout::new(maps.lines, maps.samples, &names);
    let legend = layout.legend(&names, &swatches, [255; 3], [0; 3]);
    let mut img = vec![[255u8; 3]; layout.w * layout.h];
    for (y, row) in img.chunks_exact_mut(layout.w).enumerate() {
        let line = (y < layout.mh).then(|| &rgb[(y / layout.scale) * maps.samples..][..maps.samples]);
        layout.row(y, line, &legend, [255; 3], row);
    }
    let mut out = Vec::new();
    let mut w = header(&mut out, layout.w, layout.h, None, run_id)?;
    w.write_image_data(img.as_flattened()).map_err(|e| e.to_string())?;
    w.finish().map_err(|e| e.to_string())?;
    Ok(out)
}

/// A classification quick-look (indexed colour) encoded as the class map's lines arrive, top to
/// bottom, so a run that writes its maps strip by strip is left only the last strip's part.
pub struct QuicklookStream {
    out: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
    writer: png::StreamWriter<'static, Shared>,
    layout: Layout,
    legend: Vec<u8>,
    /// Palette index of each class id.
    by_id: [u8; 256],
    samples: usize,
    /// Image rows written.
    y: usize,
    row: Vec<u8>,
}

impl std::fmt::Debug for QuicklookStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuicklookStream")
            .field("rows", &self.y)
            .finish_non_exhaustive()
    }
}

impl QuicklookStream {
    /// The quick-look of a `lines` x `samples` class map of `manifest`; `None` where it is not
    /// drawn in indexed colour (abundances, or more classes than a palette holds).
    pub fn new(manifest: &Manifest, lines: usize, samples: usize, run_id: &str) -> Result<Option<Self>, String> {
        let k = manifest.outputs.len();
        if manifest.task != Task::Classification || k + 2 > 256 {
            return Ok(None);
        }
        let names = names(manifest);
        let mut by_id = [BLACK; 256];
        for (i, o) in manifest.outputs.iter().enumerate() {
            if let Some(slot) = by_id.get_mut(o.id as usize) {
                *slot = (i + 2) as u8;
            }
        }
        let swatches: Vec<u8> = (0..k).map(|i| (i + 2) as u8).collect();
        let layout = Layout::new(lines, samples, &names);
        let legend = layout.legend(&names, &swatches, WHITE, BLACK);
        let mut palette = vec![255u8, 255, 255, 0, 0, 0];
        palette.extend((0..k).flat_map(|i| manifest.color(i)));
        let out = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let writer = header(Shared(out.clone()), layout.w, layout.h, Some(palette), run_id)?
            .into_stream_writer()
            .map_err(|e| e.to_string())?;
        Ok(Some(Self {
            out,
            writer,
            row: vec![WHITE; layout.w],
            layout,
            legend,
            by_id,
            samples,
            y: 0,
        }))
    }

    /// Draws and encodes the next whole lines of the class map (ids, row-major).
    pub fn push(&mut self, class_ids: &[u8]) -> Result<(), String> {
        let samples = self.samples.max(1);
        let mut line = vec![WHITE; self.samples];
        for ids in class_ids.chunks_exact(samples) {
            for (p, &id) in line.iter_mut().zip(ids) {
                *p = self.by_id[usize::from(id)];
            }
            for _ in 0..self.layout.scale {
                if self.y >= self.layout.mh {
                    return Err(format!(
                        "more than the map's {} lines",
                        self.layout.mh / self.layout.scale
                    ));
                }
                self.layout.row(self.y, Some(&line), &self.legend, WHITE, &mut self.row);
                std::io::Write::write_all(&mut self.writer, &self.row).map_err(|e| e.to_string())?;
                self.y += 1;
            }
        }
        Ok(())
    }

    /// Lines of the class map pushed so far.
    pub fn lines(&self) -> usize {
        self.y / self.layout.scale
    }

    /// Draws what is left below the map (the legend's end) and returns the PNG; every line of
    /// the map must have been pushed.
    pub fn finish(mut self) -> Result<Vec<u8>, String> {
        if self.y < self.layout.mh {
            return Err(format!(
                "{} of the map's {} lines were drawn",
                self.lines(),
                self.layout.mh / self.layout.scale
            ));
        }
        while self.y < self.layout.h {
            self.layout.row(self.y, None, &self.legend, WHITE, &mut self.row);
            std::io::Write::write_all(&mut self.writer, &self.row).map_err(|e| e.to_string())?;
            self.y += 1;
        }
        self.writer.finish().map_err(|e| e.to_string())?;
        // The PNG's end chunk is written as the inner writer is dropped, inside `finish`.
        let out = std::mem::take(&mut *self.out.lock().map_err(|_| "the PNG buffer was poisoned".to_string())?);
        Ok(out)
    }
}

/// A byte sink the PNG stream writer owns while the bytes stay reachable.
struct Shared(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Shared {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut v = self
            .0
            .lock()
            .map_err(|_| std::io::Error::other("the PNG buffer was poisoned"))?;
        v.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The legend's entries: "id name" for classes, the name for abundances.
fn names(manifest: &Manifest) -> Vec<String> {
    manifest
        .outputs
        .iter()
        .map(|o| {
            if manifest.task == Task::Classification {
                format!("{} {}", o.id, o.name)
            } else {
                o.name.clone()
            }
        })
        .collect()
}

/// Where the scaled map and the legend lie in the image.
#[derive(Debug, Clone, Copy)]
struct Layout {
    scale: usize,
    /// The scaled map's width and height.
    mw: usize,
    mh: usize,
    legend_w: usize,
    legend_h: usize,
    /// The image's width and height.
    w: usize,
    h: usize,
}

/// Height of a legend entry.
const ROW_H: usize = 14;

impl Layout {
    fn new(lines: usize, samples: usize, names: &[String]) -> Self {
        let scale = (256 / lines.max(samples).max(1)).clamp(1, 8);
        let (mw, mh) = (samples * scale, lines * scale);
        let text_w = names.iter().map(|n| n.chars().count()).max().unwrap_or(0) * 8;
        let legend_w = 8 + 12 + 6 + text_w + 8;
        let legend_h = 8 + names.len() * ROW_H + 8;
        Self {
            scale,
            mw,
            mh,
            legend_w,
            legend_h,
            w: mw + legend_w,
            h: mh.max(legend_h),
        }
    }

    /// The legend beside the map: a swatch with an `ink` edge and the name for each entry, on
    /// `background`.
    fn legend<P: Copy>(&self, names: &[String], swatches: &[P], background: P, ink: P) -> Vec<P> {
        let (w, h) = (self.legend_w, self.legend_h);
        let mut img = vec![background; w * h];
        let mut set = |x: usize, y: usize, c: P| {
            if x < w && y < h {
                img[y * w + x] = c;
            }
        };
        for (k, (name, &swatch)) in names.iter().zip(swatches).enumerate() {
            let (x0, y0) = (8, 8 + k * ROW_H);
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
        img
    }

    /// Image row `y`: `line` (the map line it shows, unscaled; none below the map) scaled, then
    /// the legend's row, on `background`.
    fn row<P: Copy>(&self, y: usize, line: Option<&[P]>, legend: &[P], background: P, out: &mut [P]) {
        let (map, rest) = out.split_at_mut(self.mw);
        match line {
            Some(line) => {
                for (x, &p) in line.iter().enumerate() {
                    map[x * self.scale..(x + 1) * self.scale].fill(p);
                }
            }
            None => map.fill(background),
        }
        match legend.get(y * self.legend_w..(y + 1) * self.legend_w) {
            Some(l) if y < self.legend_h => rest.copy_from_slice(l),
            _ => rest.fill(background),
        }
    }
}

/// A PNG encoder of 8-bit pixels writing into `out`, its header chunks done: indexed with
/// `palette` (RGB triples), RGB without.
fn header<W: std::io::Write>(
    out: W,
    w: usize,
    h: usize,
    palette: Option<Vec<u8>>,
    run_id: &str,
) -> Result<png::Writer<W>, String> {
    let width = u32::try_from(w).map_err(|e| e.to_string())?;
    let height = u32::try_from(h).map_err(|e| e.to_string())?;
    let mut enc = png::Encoder::new(out, width, height);
    match palette {
        Some(p) => {
            enc.set_color(png::ColorType::Indexed);
            enc.set_palette(p);
        }
        None => enc.set_color(png::ColorType::Rgb),
    }
    enc.set_depth(png::BitDepth::Eight);
    // A quick-look is for eyes, and its last rows are encoded on the run's critical path.
    enc.set_compression(png::Compression::Fast);
    enc.add_text_chunk(super::RUN_ID_KEY.into(), run_id.into())
        .map_err(|e| e.to_string())?;
    enc.write_header().map_err(|e| e.to_string())
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

    /// Class maps of `manifest()`'s two classes.
    fn class_maps(lines: usize, samples: usize, class_ids: &[u8]) -> Maps {
        Maps {
            lines,
            samples,
            channels: 2,
            class_ids: class_ids.to_vec(),
            confidence: vec![1.0; lines * samples],
            scores: None,
            nonfinite_pixels: 0,
        }
    }

    #[test]
    fn the_quicklook_shows_each_pixel_in_its_class_colour_and_a_legend() {
        let m = manifest();
        let (lines, samples) = (5, 7);
        let class_ids: Vec<u8> = (0..lines * samples).map(|i| [3, 9, 0][i % 3]).collect();
        let maps = class_maps(lines, samples, &class_ids);
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

    fn decoded(png: Vec<u8>) -> (Vec<u8>, u32, u32) {
        let mut dec = png::Decoder::new(std::io::Cursor::new(png));
        dec.set_transformations(png::Transformations::EXPAND);
        let mut r = dec.read_info().unwrap();
        let mut buf = vec![0; r.output_buffer_size()];
        let info = r.next_frame(&mut buf).unwrap();
        (buf, info.width, info.height)
    }

    #[test]
    fn a_quicklook_streamed_in_strips_is_the_whole_one_and_refuses_missing_or_extra_lines() {
        let m = manifest();
        // Taller than the legend and shorter, scaled 8 and 1.
        for (lines, samples) in [(5, 7), (300, 40)] {
            let class_ids: Vec<u8> = (0..lines * samples).map(|i| [3, 9, 0][(i / 7) % 3]).collect();
            let maps = class_maps(lines, samples, &class_ids);
            let whole = decoded(quicklook_png(&maps, &m, "r").unwrap());
            let mut s = QuicklookStream::new(&m, lines, samples, "r").unwrap().unwrap();
            for strip in class_ids.chunks(samples * 2) {
                s.push(strip).unwrap();
            }
            assert_eq!(s.lines(), lines);
            assert_eq!(decoded(s.finish().unwrap()), whole, "{lines} x {samples}");
            let mut short = QuicklookStream::new(&m, lines, samples, "r").unwrap().unwrap();
            short.push(&class_ids[..samples]).unwrap();
            assert!(short.finish().is_err());
            let mut long = QuicklookStream::new(&m, lines, samples, "r").unwrap().unwrap();
            assert!(
                long.push(&[class_ids.clone(), class_ids[..samples].to_vec()].concat())
                    .is_err()
            );
        }
    }
}
