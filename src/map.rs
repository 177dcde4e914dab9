//! Writing result maps: ENVI classification and float32 files, a PNG quick-look with a legend, and a
//! JSON summary, all staged under temporary names and renamed into place only when every file of
//! the set is complete.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use crate::cube::{DataType, Header, Interleave, encode_f32};
use crate::model::{Manifest, Task};
use crate::pipeline::Maps;

/// Errors from writing maps.
#[derive(Debug, thiserror::Error)]
pub enum MapError {
    /// A file could not be written or renamed.
    #[error("{path}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The PNG encoder failed.
    #[error("{path}: PNG encoding failed: {message}")]
    Png {
        /// The file.
        path: PathBuf,
        /// The encoder's message.
        message: String,
    },
}

/// Files written into one folder atomically: each is staged as a hidden temporary file and all are
/// renamed into place by [`Staged::commit`]; dropping without committing removes the temporaries.
///
/// Each file's sync to disk starts as soon as it is staged, on its own thread, so the syncs overlap
/// each other and whatever is staged after them. A file can be [reserved](Staged::reserve) before
/// its bytes exist: its temporary file (and the link to the file it replaces) is made then, so a
/// job reserves its maps while the run is in flight and, after the last batch, only writes them
/// (making a file on ext4 waits on the journal, which the first sync keeps busy). A file that
/// replaces one already in the folder first gets a hidden hard link to the old one: the rename
/// then only swaps a directory entry, and freeing the old file's blocks (a quarter of a
/// millisecond per file on ext4, longer than the rename) is left to [`Retired`], off the path of
/// the write. A crash can leave hidden
/// `.NAME.*.tmp` and `.NAME.*.replaced` files behind; they are never read and safe to delete.
#[derive(Debug)]
pub struct Staged {
    dir: PathBuf,
    files: Vec<Entry>,
}

#[derive(Debug)]
struct Entry {
    name: String,
    tmp: tempfile::NamedTempFile,
    path: PathBuf,
    /// `None` while reserved and not yet written.
    sync: Option<std::thread::JoinHandle<std::io::Result<()>>>,
    replaced: Option<PathBuf>,
}

impl Staged {
    /// Stages files for `dir`, creating it if needed.
    pub fn new(dir: &Path) -> Result<Self, MapError> {
        std::fs::create_dir_all(dir).map_err(|source| MapError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        Ok(Self {
            dir: dir.to_path_buf(),
            files: Vec::new(),
        })
    }

    /// The folder the files go to.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Stages `bytes` as `name` (into its reserved file, when [`Staged::reserve`] made one),
    /// starts its sync, and returns the final path.
    pub fn add(&mut self, name: &str, bytes: &[u8]) -> Result<PathBuf, MapError> {
        let at = match self.files.iter().position(|e| e.name == name && e.sync.is_none()) {
            Some(at) => at,
            None => {
                self.reserve(name)?;
                self.files.len() - 1
            }
        };
        let e = &mut self.files[at];
        let written = e
            .tmp
            .write_all(bytes)
            .and_then(|()| e.tmp.as_file().try_clone())
            .and_then(|file| {
                std::thread::Builder::new()
                    .name("hsiedge-sync".into())
                    .spawn(move || file.sync_all())
            });
        match written {
            Ok(sync) => {
                e.sync = Some(sync);
                Ok(e.path.clone())
            }
            Err(source) => {
                // Dropped, so nothing half written is ever committed or written into again.
                let e = self.files.remove(at);
                if let Some(link) = &e.replaced {
                    let _ = std::fs::remove_file(link);
                }
                Err(MapError::Io { path: e.path, source })
            }
        }
    }

    /// Makes the temporary file of `name` (empty) and returns the final path; [`Staged::add`]
    /// writes it later. [`Staged::commit`] fails while a reserved file has not been written.
    pub fn reserve(&mut self, name: &str) -> Result<PathBuf, MapError> {
        let path = self.dir.join(name);
        let tmp = tempfile::Builder::new()
            .prefix(&format!(".{name}."))
            .suffix(".tmp")
            .tempfile_in(&self.dir)
            .map_err(|source| MapError::Io {
                path: path.clone(),
                source,
            })?;
        let replaced = self.keep_replaced(name, &path);
        self.files.push(Entry {
            name: name.to_string(),
            tmp,
            path: path.clone(),
            sync: None,
            replaced,
        });
        Ok(path)
    }

    /// A hidden hard link to the file at `path`, when there is one to replace; `None` when there
    /// is not or the file system cannot link (the rename then frees the old file itself).
    fn keep_replaced(&self, name: &str, path: &Path) -> Option<PathBuf> {
        if !path.exists() {
            return None;
        }
        // Unique within the process, so a link still waiting for an earlier commit's unlinking
        // thread is never reused.
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let link = self.dir.join(format!(".{name}.{}-{n}.replaced", std::process::id()));
        // A link of the same name is a leftover of an earlier process with this id.
        let _ = std::fs::remove_file(&link);
        std::fs::hard_link(path, &link).ok().map(|()| link)
    }

    /// Waits for every staged file's sync, renames each into place in staging order, then syncs
    /// the folder. When a rename fails, those already made are undone (each old file restored from
    /// its hidden link, a new one removed) before the error returns. The files replaced are
    /// unlinked when the returned [`Retired`] is dropped or handed to
    /// [`Retired::remove_in_background`].
    pub fn commit(mut self) -> Result<Retired, MapError> {
        let mut retired = Retired { links: Vec::new() };
        let mut entries = Vec::with_capacity(self.files.len());
        let mut failed = None;
        for e in std::mem::take(&mut self.files) {
            retired.links.extend(e.replaced.clone());
            let synced = match e.sync.map(|s| s.join()) {
                Some(Ok(r)) => r,
                Some(Err(_)) => Err(std::io::Error::other("a file sync thread panicked")),
                None => Err(std::io::Error::other("reserved but never written")),
            };
            match synced {
                Ok(()) => entries.push((e.tmp, e.path, e.replaced)),
                Err(source) if failed.is_none() => failed = Some(MapError::Io { path: e.path, source }),
                Err(_) => {}
            }
        }
        if let Some(e) = failed {
            return Err(e);
        }
        let mut placed: Vec<(PathBuf, Option<PathBuf>)> = Vec::with_capacity(entries.len());
        for (tmp, path, replaced) in entries {
            if let Err(e) = tmp.persist(&path) {
                // Put the folder back as it was, so a failed commit never leaves a mixed set: each
                // file already renamed goes back to its old version (kept under its hidden link)
                // or, where it replaced nothing, is removed.
                for (done, old) in placed.iter().rev() {
                    let restored = match old {
                        Some(link) => std::fs::rename(link, done),
                        None => std::fs::remove_file(done),
                    };
                    if restored.is_err() {
                        // Not restorable (the folder itself failing): nothing of the new set stays
                        // under its final name, and the old file keeps its hidden link.
                        let _ = std::fs::remove_file(done);
                        retired.links.retain(|l| Some(l) != old.as_ref());
                    }
                }
                return Err(MapError::Io { path, source: e.error });
            }
            placed.push((path, replaced));
        }
        if let Ok(d) = std::fs::File::open(&self.dir) {
            let _ = d.sync_all();
        }
        Ok(retired)
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        // Not committed: the old files stay in place, so their extra links go.
        for e in &self.files {
            if let Some(link) = &e.replaced {
                let _ = std::fs::remove_file(link);
            }
        }
    }
}

/// The files a commit replaced, still linked under hidden names; dropping unlinks them.
#[derive(Debug)]
#[must_use = "dropping unlinks the replaced files on this thread; see `remove_in_background`"]
pub struct Retired {
    links: Vec<PathBuf>,
}

impl Retired {
    /// Unlinks the replaced files on a thread of their own; join the handle before the process
    /// exits, or the hidden links may stay behind. `None` when there is nothing to unlink.
    pub fn remove_in_background(mut self) -> Option<std::thread::JoinHandle<()>> {
        if self.links.is_empty() {
            return None;
        }
        let retired = Retired {
            links: std::mem::take(&mut self.links),
        };
        // When the thread cannot start, the closure and `retired` with it are dropped here, which
        // unlinks on this thread.
        std::thread::Builder::new()
            .name("hsiedge-unlink".into())
            .spawn(move || {
                // Freeing the old files' blocks is kernel work that would otherwise take its
                // share of the cores from the next run's intra-op threads.
                let _ = crate::ffi::idle_thread_policy();
                drop(retired)
            })
            .ok()
    }

    fn remove(&mut self) {
        for link in self.links.drain(..) {
            let _ = std::fs::remove_file(link);
        }
    }
}

impl Drop for Retired {
    fn drop(&mut self) {
        self.remove();
    }
}

/// Header fields of the input scene worth carrying into its maps.
fn georef(from: &Header, to: &mut Header) {
    to.map_info.clone_from(&from.map_info);
    to.coordinate_system.clone_from(&from.coordinate_system);
}

/// What the headers of a run's maps describe, known before the run starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MapShape {
    /// Scene lines.
    pub lines: usize,
    /// Scene samples.
    pub samples: usize,
    /// Output channels.
    pub channels: usize,
    /// Whether every channel is written (the abundance or score map).
    pub scores: bool,
}

impl MapShape {
    /// The shape of `maps`.
    pub fn of(maps: &Maps) -> Self {
        Self {
            lines: maps.lines,
            samples: maps.samples,
            channels: maps.channels,
            scores: maps.scores.is_some(),
        }
    }
}

/// The ENVI classification header of a `samples` x `lines` class map from `manifest` (class ids
/// index the name list).
pub fn class_header(samples: usize, lines: usize, manifest: &Manifest, scene: &Header) -> Header {
    let max_id = manifest.outputs.iter().map(|o| o.id).max().unwrap_or(0) as usize;
    let mut names: Vec<String> = (0..=max_id).map(|i| format!("unused_{i}")).collect();
    let mut colors = vec![[0u8, 0, 0]; max_id + 1];
    names[0] = "Unclassified".into();
    for (k, o) in manifest.outputs.iter().enumerate() {
        names[o.id as usize] = o.name.replace(',', ";");
        colors[o.id as usize] = manifest.color(k);
    }
    let mut h = Header::new(samples, lines, 1, DataType::U8, Interleave::Bsq);
    h.file_type = Some("ENVI Classification".into());
    h.description = Some(format!("hsiedge class map, model {}", manifest.name));
    h.classes = Some(max_id + 1);
    h.class_names = names;
    h.class_lookup = colors;
    h.band_names = vec!["class".into()];
    georef(scene, &mut h);
    h
}

/// Paths of a written map set.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Written {
    /// Class map (ENVI classification, `.img`; header beside it).
    pub class_map: Option<PathBuf>,
    /// Confidence map (ENVI float32).
    pub confidence_map: Option<PathBuf>,
    /// Abundance or score map (ENVI float32, one band per output).
    pub scores_map: Option<PathBuf>,
    /// PNG quick-look.
    pub quicklook: PathBuf,
}

fn scores_name(manifest: &Manifest) -> &'static str {
    if manifest.task == Task::Abundance {
        "abundance"
    } else {
        "scores"
    }
}

/// Stages the ENVI headers of a run's maps, which depend only on its shape: a job stages them
/// while the run is in flight, so only the data is left for after the last batch.
pub fn stage_headers(
    staged: &mut Staged,
    shape: MapShape,
    manifest: &Manifest,
    scene: &Header,
) -> Result<(), MapError> {
    if manifest.task == Task::Classification {
        let h = class_header(shape.samples, shape.lines, manifest, scene);
        staged.add("class_map.hdr", h.to_text().as_bytes())?;
        let mut h = Header::new(shape.samples, shape.lines, 1, DataType::F32, Interleave::Bsq);
        h.description = Some(format!("hsiedge confidence (softmax maximum), model {}", manifest.name));
        h.band_names = vec!["confidence".into()];
        georef(scene, &mut h);
        staged.add("confidence.hdr", h.to_text().as_bytes())?;
    }
    if shape.scores {
        let mut h = Header::new(
            shape.samples,
            shape.lines,
            shape.channels,
            DataType::F32,
            Interleave::Bsq,
        );
        let what = if manifest.task == Task::Abundance {
            "abundances"
        } else {
            "scores"
        };
        h.description = Some(format!("hsiedge {what}, model {}", manifest.name));
        h.band_names = manifest.outputs.iter().map(|o| o.name.replace(',', ";")).collect();
        georef(scene, &mut h);
        staged.add(&format!("{}.hdr", scores_name(manifest)), h.to_text().as_bytes())?;
    }
    Ok(())
}

/// Reserves the files [`stage_maps`] writes for maps of `shape`, in the order it writes them.
pub fn reserve_maps(staged: &mut Staged, shape: MapShape, manifest: &Manifest) -> Result<(), MapError> {
    if manifest.task == Task::Classification {
        staged.reserve("class_map.img")?;
        staged.reserve("confidence.img")?;
    }
    if shape.scores {
        staged.reserve(&format!("{}.img", scores_name(manifest)))?;
    }
    staged.reserve("quicklook.png")?;
    Ok(())
}

/// Stages the data of a run's maps (class and confidence maps for classification, the abundance
/// or score map when kept) and the quick-look; their headers come from [`stage_headers`].
pub fn stage_maps(staged: &mut Staged, maps: &Maps, manifest: &Manifest) -> Result<Written, MapError> {
    let mut w = Written::default();
    if manifest.task == Task::Classification {
        w.class_map = Some(staged.add("class_map.img", &maps.class_ids)?);
        w.confidence_map = Some(staged.add("confidence.img", &encode_f32(&maps.confidence))?);
    }
    if let Some(scores) = &maps.scores {
        w.scores_map = Some(staged.add(&format!("{}.img", scores_name(manifest)), &encode_f32(scores))?);
    }
    let png = quicklook_png(maps, manifest).map_err(|message| MapError::Png {
        path: staged.dir.join("quicklook.png"),
        message,
    })?;
    w.quicklook = staged.add("quicklook.png", &png)?;
    Ok(w)
}

/// Palette slots of a classification quick-look: background, ink, then one per class.
const WHITE: u8 = 0;
const BLACK: u8 = 1;

/// Renders the quick-look: the map scaled by an integer factor, and a legend of colours and names.
///
/// A class map is drawn as an indexed PNG (one byte a pixel, a third of the bytes to filter and
/// compress; written after the last batch, it is on the run's critical path); abundances, mixed
/// colours, as RGB.
pub fn quicklook_png(maps: &Maps, manifest: &Manifest) -> Result<Vec<u8>, String> {
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
        encode_png(&img, w, h, Some(palette))
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
        encode_png(img.as_flattened(), w, h, None)
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
fn encode_png(pixels: &[u8], w: usize, h: usize, palette: Option<Vec<u8>>) -> Result<Vec<u8>, String> {
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
    let mut writer = enc.write_header().map_err(|e| e.to_string())?;
    writer.write_image_data(pixels).map_err(|e| e.to_string())?;
    writer.finish().map_err(|e| e.to_string())?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Manifest;

    #[test]
    fn staged_files_appear_only_on_commit() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let mut s = Staged::new(&out).unwrap();
        let p = s.add("a.img", b"abc").unwrap();
        assert!(!p.exists());
        drop(s);
        assert_eq!(
            std::fs::read_dir(&out).unwrap().count(),
            0,
            "temporaries removed on drop"
        );
        let mut s = Staged::new(&out).unwrap();
        let p = s.add("a.img", b"abc").unwrap();
        drop(s.commit().unwrap());
        assert_eq!(std::fs::read(p).unwrap(), b"abc");
    }

    #[test]
    fn reserved_files_are_written_in_place_and_one_never_written_fails_the_commit() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let mut s = Staged::new(&out).unwrap();
        s.add("a.img", b"old a").unwrap();
        drop(s.commit().unwrap());
        let mut s = Staged::new(&out).unwrap();
        s.reserve("a.img").unwrap();
        s.reserve("b.img").unwrap();
        s.add("b.img", b"new b").unwrap();
        s.add("a.img", b"new a").unwrap();
        drop(s.commit().unwrap());
        assert_eq!(std::fs::read(out.join("a.img")).unwrap(), b"new a");
        assert_eq!(std::fs::read(out.join("b.img")).unwrap(), b"new b");
        let mut s = Staged::new(&out).unwrap();
        s.reserve("a.img").unwrap();
        s.reserve("c.img").unwrap();
        s.add("a.img", b"newer a").unwrap();
        let e = s.commit().unwrap_err();
        assert!(e.to_string().contains("c.img"), "{e}");
        assert!(format!("{:?}", e).contains("reserved but never written"), "{e:?}");
        assert_eq!(
            std::fs::read(out.join("a.img")).unwrap(),
            b"new a",
            "the old set stays whole"
        );
        assert_eq!(names(&out), ["a.img", "b.img"], "no temporaries or links left");
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn a_replaced_set_stays_whole_until_commit_and_leaves_nothing_hidden() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let mut s = Staged::new(&out).unwrap();
        s.add("a.img", b"old a").unwrap();
        s.add("b.img", b"old b").unwrap();
        drop(s.commit().unwrap());

        // Abandoned: the old set is untouched and its extra links are gone.
        let mut s = Staged::new(&out).unwrap();
        s.add("a.img", b"new a").unwrap();
        assert!(names(&out).iter().any(|n| n.ends_with(".replaced")));
        drop(s);
        assert_eq!(names(&out), ["a.img", "b.img"]);
        assert_eq!(std::fs::read(out.join("a.img")).unwrap(), b"old a");

        // Committed: every file is new, the old data stays readable through the hidden link
        // until the replaced files are retired, in the background, and nothing hidden is left.
        let mut s = Staged::new(&out).unwrap();
        s.add("a.img", b"new a").unwrap();
        s.add("b.img", b"new b").unwrap();
        s.add("c.img", b"new c").unwrap();
        let retired = s.commit().unwrap();
        assert_eq!(std::fs::read(out.join("a.img")).unwrap(), b"new a");
        assert_eq!(std::fs::read(out.join("b.img")).unwrap(), b"new b");
        let kept: Vec<String> = names(&out).into_iter().filter(|n| n.ends_with(".replaced")).collect();
        assert_eq!(kept.len(), 2, "{kept:?}");
        assert_eq!(std::fs::read(out.join(&kept[0])).unwrap(), b"old a");
        retired.remove_in_background().unwrap().join().unwrap();
        assert_eq!(names(&out), ["a.img", "b.img", "c.img"]);
    }

    #[test]
    fn a_commit_that_fails_midway_puts_the_old_set_back() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let mut s = Staged::new(&out).unwrap();
        s.add("a.img", b"old a").unwrap();
        drop(s.commit().unwrap());
        // A folder in the way of the third file makes its rename fail after two have landed.
        std::fs::create_dir_all(out.join("c.img/x")).unwrap();
        let mut s = Staged::new(&out).unwrap();
        s.add("a.img", b"new a").unwrap();
        s.add("b.img", b"new b").unwrap();
        s.add("c.img", b"new c").unwrap();
        let err = s.commit().unwrap_err();
        assert!(err.to_string().contains("c.img"), "{err}");
        assert_eq!(std::fs::read(out.join("a.img")).unwrap(), b"old a");
        assert_eq!(names(&out), ["a.img", "c.img"]);
    }

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
        let png = quicklook_png(&maps, &m).unwrap();
        let mut dec = png::Decoder::new(std::io::Cursor::new(png));
        dec.set_transformations(png::Transformations::EXPAND);
        let mut r = dec.read_info().unwrap();
        let mut buf = vec![0; r.output_buffer_size()];
        let info = r.next_frame(&mut buf).unwrap();
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
