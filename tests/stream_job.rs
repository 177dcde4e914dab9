//! Streamed scenes through a model session: rows written as they finish, maps byte-identical to
//! `hsiedge classify` of the same file, whether the length is known up front or only at the end,
//! whole or in segments.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use hsiedge::engine::EngineOptions;
use hsiedge::job::{ModeChoice, ModelSession, SessionBatch, SessionSpec};
use hsiedge::map::SegmentOptions;
use hsiedge::pipeline::Mode;
use hsiedge::source::{FileSource, LineSource, LineStatus, SceneInfo, SourceError, SourceStats};

/// A source that hides the scene's length until it ends, as a pushbroom sensor does, and can
/// lose lines on the way.
struct Unannounced {
    inner: FileSource,
    info: SceneInfo,
    lose: Vec<usize>,
    at: usize,
    stats: SourceStats,
}

impl Unannounced {
    fn new(inner: FileSource, lose: &[usize]) -> Self {
        let info = SceneInfo {
            lines: None,
            ..inner.info().clone()
        };
        Self {
            inner,
            info,
            lose: lose.to_vec(),
            at: 0,
            stats: SourceStats::default(),
        }
    }
}

impl LineSource for Unannounced {
    fn info(&self) -> &SceneInfo {
        &self.info
    }

    fn next_line(&mut self, line: &mut [u8]) -> Result<Option<LineStatus>, SourceError> {
        let got = self.inner.next_line(line)?;
        let status = got.map(|s| {
            if self.lose.contains(&self.at) {
                self.stats.add_missing(self.at as u64);
                LineStatus::Missing
            } else {
                s
            }
        });
        if status.is_some() {
            self.at += 1;
            self.stats.lines += 1;
        }
        Ok(status)
    }

    fn stats(&self) -> SourceStats {
        self.stats.clone()
    }
}

fn session(model: &Path, mode: Mode, batch: usize) -> ModelSession {
    ModelSession::open(&SessionSpec {
        manifest: model.to_path_buf(),
        mode: ModeChoice::Fixed(mode),
        batch: SessionBatch::Fixed(batch),
        tile: 32,
        engine: EngineOptions {
            threads: 1,
            ..EngineOptions::default()
        },
        keep_scores: false,
    })
    .unwrap()
}

fn classify(scene: &Path, model: &Path, mode: &str, batch: &str, out: &Path) {
    ok(&[
        "classify",
        scene.to_str().unwrap(),
        "--model",
        model.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--mode",
        mode,
        "--batch",
        batch,
        "--tile",
        "32",
        "--threads",
        "1",
    ]);
}

fn read(p: PathBuf) -> Vec<u8> {
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

#[test]
fn a_streamed_scene_gives_the_maps_classify_gives_whole_or_in_segments() {
    let (Some(data), Some(model)) = (data(), common::model("hybridsn_salinas_a")) else {
        return;
    };
    let scene = data.join("salinas_a/salinas_a.hdr");
    let dir = tempfile::tempdir().unwrap();
    for (mode, batch, name) in [(Mode::Dense, 2, "dense"), (Mode::Patch, 64, "patch")] {
        if mode == Mode::Patch && emulator().is_some() {
            skip(
                "the streamed Salinas-A scene in patch mode: many minutes under an emulator; the native run covers it",
            );
            continue;
        }
        let want = dir.path().join(format!("classify-{name}"));
        classify(&scene, &model, name, &batch.to_string(), &want);
        let mut s = session(&model, mode, batch);

        // Length known up front (a file), one set.
        let whole = dir.path().join(format!("whole-{name}"));
        let mut src = FileSource::open(&scene, None).unwrap();
        let out = s
            .run_stream(
                &mut src,
                &whole,
                SegmentOptions {
                    segment_lines: 0,
                    keep_scores: false,
                },
                &mut |_| {},
            )
            .unwrap();
        assert_eq!(out.run.lines, 83);
        assert_eq!(out.segments.len(), 1);
        for f in ["class_map.img", "confidence.img"] {
            assert_eq!(read(whole.join(f)), read(want.join(f)), "{name}: {f} of a whole stream");
        }

        // Length unknown until the end, in segments of 20 lines: the segments, one after
        // another, are the scene's maps.
        let segs = dir.path().join(format!("segs-{name}"));
        let mut src = Unannounced::new(FileSource::open(&scene, None).unwrap(), &[]);
        let out = s
            .run_stream(
                &mut src,
                &segs,
                SegmentOptions {
                    segment_lines: 20,
                    keep_scores: false,
                },
                &mut |_| {},
            )
            .unwrap();
        assert_eq!(out.run.lines, 83);
        let latency = out.run.row_latency_s.expect("a stream measures row latency");
        assert_eq!(latency.rows, 83);
        assert!(latency.p50 <= latency.p99 && latency.p99 <= latency.max, "{latency:?}");
        let lines: Vec<usize> = out.segments.iter().map(|g| g.lines).collect();
        assert_eq!(lines, [20, 20, 20, 20, 3]);
        for f in ["class_map.img", "confidence.img"] {
            let joined: Vec<u8> = out.segments.iter().flat_map(|g| read(g.folder.join(f))).collect();
            assert_eq!(joined, read(want.join(f)), "{name}: {f} of the segments");
        }
        let last: serde_json::Value =
            serde_json::from_slice(&read(out.segments[4].folder.join("summary.json"))).unwrap();
        assert_eq!(last["first_line"], 80);
        assert_eq!(last["last"], true);
        assert_eq!(last["scene_id"], "salinas_a");
        let hdr = String::from_utf8(read(out.segments[1].folder.join("class_map.hdr"))).unwrap();
        assert!(hdr.contains("lines = 20"), "{hdr}");
    }
}

#[test]
fn a_lost_line_leaves_the_pixels_that_read_it_unclassified_and_counted() {
    let (Some(data), Some(model)) = (data(), common::model("hybridsn_salinas_a")) else {
        return;
    };
    let scene = data.join("salinas_a/salinas_a.hdr");
    let dir = tempfile::tempdir().unwrap();
    let mut s = session(&model, Mode::Dense, 2);
    let out_dir = dir.path().join("lost");
    let mut src = Unannounced::new(FileSource::open(&scene, None).unwrap(), &[40]);
    let out = s
        .run_stream(
            &mut src,
            &out_dir,
            SegmentOptions {
                segment_lines: 0,
                keep_scores: false,
            },
            &mut |_| {},
        )
        .unwrap();
    assert_eq!(out.source.missing, vec![[40, 40]]);
    let halo = s.manifest().halo;
    let ids = read(out_dir.join("class_map.img"));
    let samples = 86;
    for (y, row) in ids.chunks(samples).enumerate() {
        let reads_it = y.abs_diff(40) <= halo;
        assert_eq!(row.iter().all(|&c| c == 0), reads_it, "line {y}");
    }
    let summary: serde_json::Value = serde_json::from_slice(&read(out_dir.join("summary.json"))).unwrap();
    assert_eq!(summary["nonfinite_pixels"], (2 * halo + 1) * samples);
    assert_eq!(summary["source"]["missing"], serde_json::json!([[40, 40]]));
}

#[test]
fn a_scene_the_model_cannot_read_is_refused_before_any_file() {
    let Some(model) = common::model("hybridsn_salinas_a") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let scene = write_cube(dir.path(), "few_bands", 5, 6, 3, |l, b, s| (l + b + s) as f32);
    let mut s = session(&model, Mode::Dense, 1);
    let out_dir = dir.path().join("out");
    let mut src = FileSource::open(&scene, None).unwrap();
    let err = s
        .run_stream(
            &mut src,
            &out_dir,
            SegmentOptions {
                segment_lines: 0,
                keep_scores: false,
            },
            &mut |_| {},
        )
        .unwrap_err();
    let text = format!("{err:#}");
    assert!(text.contains("3 bands") && text.contains("204"), "{text}");
    assert!(!out_dir.exists());

    // A scene that ends before its first line has no maps: an error, and no folder.
    let one = write_cube(dir.path(), "one", 1, 6, 204, |_, _, _| 0.0);
    let mut src = Unannounced::new(FileSource::open(&one, None).unwrap(), &[]);
    let mut line = vec![0u8; src.info().line_bytes()];
    assert!(
        src.next_line(&mut line).unwrap().is_some(),
        "the one line is read away first"
    );
    let err = s
        .run_stream(
            &mut src,
            &out_dir,
            SegmentOptions {
                segment_lines: 0,
                keep_scores: false,
            },
            &mut |_| {},
        )
        .unwrap_err();
    assert!(format!("{err:#}").contains("no lines"), "{err:#}");
    assert!(!out_dir.exists());
}

#[test]
fn a_scene_resumed_after_its_committed_segments_gives_the_segments_an_uninterrupted_run_gives() {
    use hsiedge::job::Resume;
    let (Some(data), Some(model)) = (data(), common::model("hybridsn_salinas_a")) else {
        return;
    };
    let scene = data.join("salinas_a/salinas_a.hdr");
    let dir = tempfile::tempdir().unwrap();
    let opts = SegmentOptions {
        segment_lines: 20,
        keep_scores: false,
    };
    for (mode, batch, name) in [(Mode::Dense, 2, "dense"), (Mode::Patch, 64, "patch")] {
        if mode == Mode::Patch && emulator().is_some() {
            skip("the resumed Salinas-A scene in patch mode: minutes under an emulator; the native run covers it");
            continue;
        }
        let mut s = session(&model, mode, batch);
        // Announced length: balanced tile rows of 28 lines (83 at tile 32). Resumed at line 60
        // (3 segments), in the row 56..84 whose halo of 5 needs the row 28..56: 55 lines run.
        // Unannounced: rows of 32; resumed at line 80 (4 segments), row 64..83, halo row 32..64.
        for (announced, kept, computed) in [(true, 3, 55), (false, 4, 51)] {
            let open = || -> Box<dyn LineSource> {
                let f = FileSource::open(&scene, None).unwrap();
                if announced {
                    Box::new(f)
                } else {
                    Box::new(Unannounced::new(f, &[]))
                }
            };
            let tag = format!("{name}-{announced}");
            let full = s
                .run_stream(&mut *open(), &dir.path().join(format!("full-{tag}")), opts, &mut |_| {})
                .unwrap();
            let resume = Resume {
                segments: full.segments[..kept].to_vec(),
            };
            let again = dir.path().join(format!("resumed-{tag}"));
            let out = s
                .run_stream_resumed(&mut *open(), &again, opts, &resume, &mut |_| {}, &mut |_, _| {})
                .unwrap();
            assert_eq!((out.resumed_from_line, out.run.lines), (kept * 20, computed), "{tag}");
            assert_eq!(out.lines_skipped + out.run.lines, 83, "{tag}");
            assert_eq!(out.segments.len(), full.segments.len(), "{tag}");
            for (a, b) in full.segments[kept..].iter().zip(&out.segments[kept..]) {
                assert_eq!(
                    (a.index, a.first_line, a.lines),
                    (b.index, b.first_line, b.lines),
                    "{tag}"
                );
                assert!(b.folder.starts_with(&again), "{tag}: {}", b.folder.display());
                for f in ["class_map.img", "confidence.img"] {
                    assert!(
                        read(a.folder.join(f)) == read(b.folder.join(f)),
                        "{tag}: segment {} {f}",
                        a.index
                    );
                }
            }
        }
    }
}

/// The first `n` lines of an unannounced source: a sensor that sends a scene again shorter.
struct Cut {
    inner: Unannounced,
    left: usize,
}

impl LineSource for Cut {
    fn info(&self) -> &SceneInfo {
        self.inner.info()
    }

    fn next_line(&mut self, line: &mut [u8]) -> Result<Option<LineStatus>, SourceError> {
        if self.left == 0 {
            return Ok(None);
        }
        self.left -= 1;
        self.inner.next_line(line)
    }

    fn stats(&self) -> SourceStats {
        self.inner.stats()
    }
}

#[test]
fn a_scene_sent_again_shorter_than_its_committed_segments_is_an_error_not_a_finished_scene() {
    use hsiedge::job::Resume;
    let (Some(data), Some(model)) = (data(), common::model("hybridsn_salinas_a")) else {
        return;
    };
    let scene = data.join("salinas_a/salinas_a.hdr");
    let dir = tempfile::tempdir().unwrap();
    let opts = SegmentOptions {
        segment_lines: 20,
        keep_scores: false,
    };
    let mut s = session(&model, Mode::Dense, 2);
    let open = || Unannounced::new(FileSource::open(&scene, None).unwrap(), &[]);
    let full = s
        .run_stream(&mut open(), &dir.path().join("full"), opts, &mut |_| {})
        .unwrap();
    // Four segments (80 lines) were committed; the scene comes again with 70 lines, then 80.
    let resume = Resume {
        segments: full.segments[..4].to_vec(),
    };
    for lines in [70, 80] {
        let mut cut = Cut {
            inner: open(),
            left: lines,
        };
        let again = dir.path().join(format!("again-{lines}"));
        let err = s
            .run_stream_resumed(&mut cut, &again, opts, &resume, &mut |_| {}, &mut |_, _| {})
            .unwrap_err();
        let msg = format!("{err:#}");
        assert!(msg.contains("ended at or before line 80"), "{lines}: {msg}");
    }
}
