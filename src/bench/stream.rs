//! `hsiedge bench stream`: a long pushbroom stream through the daemon's path (wire protocol over a
//! Unix socket, ring, tiler, engine, strip sink writing the maps) against pure inference of the
//! same batches, repetition by repetition; with `--rate`, each row's latency from its last input
//! line to its maps.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::{BenchError, median, quartiles};
use crate::cube::Cube;
use crate::engine::EngineOptions;
use crate::job::{ModeChoice, ModelSession, SessionBatch, SessionSpec};
use crate::map::SegmentOptions;
use crate::pipeline::Latency;
use crate::source::stream::{Faults, Limits, SceneHeader, SensorStream};
use crate::source::{LineSource, LineStatus, SceneInfo, SourceError, SourceStats, StreamSource};

/// What `bench stream` runs.
#[derive(Debug, Clone)]
pub struct StreamBenchOptions {
    /// The scene whose lines are replayed (cycled to `lines`).
    pub scene: PathBuf,
    /// The model session.
    pub session: SessionSpec,
    /// Lines in the stream.
    pub lines: usize,
    /// Lines per second (0: as fast as the receiver takes them).
    pub rate: f64,
    /// Repetitions.
    pub repeat: usize,
    /// Lines per output segment (0: one set).
    pub segment_lines: usize,
}

/// What `bench stream` measured (medians over repetitions).
#[derive(Debug, Clone, serde::Serialize)]
pub struct StreamBench {
    /// Model name.
    pub model: String,
    /// Mode.
    pub mode: crate::pipeline::Mode,
    /// Units per batch.
    pub batch: usize,
    /// Tile (lines, samples).
    pub tile: (usize, usize),
    /// Halo.
    pub halo: usize,
    /// Lines streamed.
    pub lines: usize,
    /// Samples per line.
    pub samples: usize,
    /// Rate asked (lines/s, 0 = unthrottled).
    pub rate: f64,
    /// Repetitions.
    pub repeat: usize,
    /// Intra-op threads.
    pub threads: usize,
    /// Seconds from the first byte sent to the last segment committed.
    pub end_to_end_s: f64,
    /// Seconds inside the engine for the same batches, built on one thread.
    pub inference_s: f64,
    /// Median of the per-repetition ratios end to end / inference, and their quartiles.
    pub e2e_over_inference: f64,
    /// Lower and upper quartiles of the ratio.
    pub e2e_over_inference_quartiles: [f64; 2],
    /// Pixels per second end to end.
    pub pixels_per_s: f64,
    /// Row latency of the last repetition.
    pub row_latency_s: Option<Latency>,
    /// `(tile + halo) / rate`: the lines a row may wait for, as seconds at this rate (0 when
    /// unthrottled); a row's latency should stay within it plus one batch time.
    pub wait_bound_s: f64,
    /// Median seconds of one batch in the engine.
    pub batch_s: f64,
}

/// A scene's raw lines in memory, replayed in a cycle for `lines` lines, its length unannounced.
struct Replay {
    info: SceneInfo,
    raw: Vec<Vec<u8>>,
    lines: usize,
    next: usize,
}

impl Replay {
    fn new(cube: Cube, lines: usize) -> Result<Self, SourceError> {
        let mut src = crate::source::FileSource::new(cube, Some("bench"))?;
        let info = SceneInfo {
            lines: None,
            ..src.info().clone()
        };
        let mut raw = Vec::new();
        let mut l = vec![0u8; info.line_bytes()];
        while src.next_line(&mut l)?.is_some() {
            raw.push(l.clone());
        }
        Ok(Self {
            info,
            raw,
            lines,
            next: 0,
        })
    }
}

impl LineSource for Replay {
    fn info(&self) -> &SceneInfo {
        &self.info
    }

    fn next_line(&mut self, line: &mut [u8]) -> Result<Option<LineStatus>, SourceError> {
        if self.next >= self.lines || self.raw.is_empty() {
            return Ok(None);
        }
        line.copy_from_slice(&self.raw[self.next % self.raw.len()]);
        self.next += 1;
        Ok(Some(LineStatus::Received))
    }

    fn stats(&self) -> SourceStats {
        SourceStats {
            lines: self.next as u64,
            ..SourceStats::default()
        }
    }
}

/// Runs the benchmark.
pub fn stream(opts: &StreamBenchOptions) -> Result<StreamBench, BenchError> {
    if opts.repeat == 0 || opts.lines == 0 {
        return Err(BenchError::Setting("--repeat and --lines must be at least 1".into()));
    }
    let open = || Cube::open(&opts.scene).map_err(|e| BenchError::Job(e.into()));
    let cube = open()?;
    let mut session = ModelSession::open(&opts.session)?;
    let tmp = tempfile::tempdir().map_err(BenchError::Temp)?;
    let (mut e2e, mut inf, mut last_latency, mut batches) = (Vec::new(), Vec::new(), None, 0);
    let source_err = |e: SourceError| BenchError::Job(crate::pipeline::PipelineError::Source(e).into());
    // One untimed repetition warms the session's arena and kernels.
    for rep in 0..=opts.repeat {
        let (mut ours, theirs) = std::os::unix::net::UnixStream::pair().map_err(BenchError::Temp)?;
        let mut replay = Replay::new(open()?, opts.lines).map_err(source_err)?;
        let rate = opts.rate;
        let t0 = Instant::now();
        let sender = std::thread::spawn(move || -> std::io::Result<()> {
            let mut s = SensorStream::new(std::io::BufWriter::new(theirs), Faults::default());
            s.begin(&SceneHeader::from_info(replay.info()))?;
            let mut line = vec![0u8; replay.info().line_bytes()];
            let mut seq = 0u64;
            while let Ok(Some(_)) = replay.next_line(&mut line) {
                if rate > 0.0 {
                    // Absolute deadlines: pacing does not drift with send times.
                    let due = t0 + Duration::from_secs_f64(seq as f64 / rate);
                    std::thread::sleep(due.saturating_duration_since(Instant::now()));
                }
                s.line(seq, &line)?;
                seq += 1;
            }
            s.end(seq)?;
            std::io::Write::flush(&mut s.into_inner())
        });
        let mut src = StreamSource::open(&mut ours, "bench", Limits::default())
            .map_err(source_err)?
            .ok_or_else(|| BenchError::Setting("the sender closed before its scene".into()))?;
        let out = tmp.path().join(format!("rep{rep}"));
        let segments = SegmentOptions {
            segment_lines: opts.segment_lines,
            keep_scores: false,
        };
        let outcome = session.run_stream(&mut src, &out, segments, &mut |_| {})?;
        let end_to_end = t0.elapsed().as_secs_f64();
        sender
            .join()
            .map_err(|_| BenchError::Setting("the sender thread panicked".into()))?
            .map_err(BenchError::Temp)?;
        let _ = std::fs::remove_dir_all(&out);
        let mut replay = Replay::new(open()?, opts.lines).map_err(source_err)?;
        let (inference, n) = session.time_inference(&mut replay)?;
        if rep > 0 {
            e2e.push(end_to_end);
            inf.push(inference);
            last_latency = outcome.run.row_latency_s;
            batches = n;
        }
    }
    let ratios: Vec<f64> = e2e.iter().zip(&inf).map(|(a, b)| a / b.max(1e-12)).collect();
    let run = session.run_options().clone();
    let manifest = session.manifest();
    let grid = crate::tile::TileGrid::streaming(cube.samples(), run.tile, manifest.halo);
    Ok(StreamBench {
        model: manifest.name.clone(),
        mode: run.mode,
        batch: run.batch,
        tile: (grid.tile_h, grid.tile_w),
        halo: manifest.halo,
        lines: opts.lines,
        samples: cube.samples(),
        rate: opts.rate,
        repeat: opts.repeat,
        threads: opts.session.engine.threads,
        end_to_end_s: median(&e2e),
        inference_s: median(&inf),
        e2e_over_inference: median(&ratios),
        e2e_over_inference_quartiles: quartiles(&ratios),
        pixels_per_s: (opts.lines * cube.samples()) as f64 / median(&e2e).max(1e-12),
        row_latency_s: last_latency,
        wait_bound_s: if opts.rate > 0.0 {
            (grid.tile_h + manifest.halo) as f64 / opts.rate
        } else {
            0.0
        },
        batch_s: median(&inf) / batches.max(1) as f64,
    })
}

impl std::fmt::Display for StreamBench {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "bench stream: {} ({:?}, batch {}, tile {}x{}, halo {}), {} lines x {} samples, {} repetitions, {} threads, rate {}",
            self.model,
            self.mode,
            self.batch,
            self.tile.0,
            self.tile.1,
            self.halo,
            self.lines,
            self.samples,
            self.repeat,
            self.threads,
            if self.rate > 0.0 {
                format!("{} lines/s", self.rate)
            } else {
                "unthrottled".into()
            }
        )?;
        writeln!(
            f,
            "  end to end {:.3} s ({:.0} px/s), pure inference {:.3} s: e2e/inference {:.3} (quartiles {:.3}-{:.3})",
            self.end_to_end_s,
            self.pixels_per_s,
            self.inference_s,
            self.e2e_over_inference,
            self.e2e_over_inference_quartiles[0],
            self.e2e_over_inference_quartiles[1]
        )?;
        if let Some(l) = &self.row_latency_s {
            write!(
                f,
                "  row latency over {} rows: p50 {:.3} s, p99 {:.3} s, max {:.3} s (wait bound (tile + halo) / rate {:.3} s, one batch {:.3} s)",
                l.rows, l.p50, l.p99, l.max, self.wait_bound_s, self.batch_s
            )?;
        }
        Ok(())
    }
}

/// The engine settings of a bench session: `threads` intra-op threads, defaults otherwise.
pub fn engine(threads: usize) -> EngineOptions {
    EngineOptions {
        threads,
        ..EngineOptions::default()
    }
}

/// The session spec of a bench run.
pub fn session(
    manifest: PathBuf,
    mode: ModeChoice,
    batch: Option<usize>,
    tile: usize,
    engine: EngineOptions,
) -> SessionSpec {
    SessionSpec {
        manifest,
        mode,
        batch: batch.map_or(SessionBatch::ModeDefault, SessionBatch::Fixed),
        tile,
        engine,
        keep_scores: false,
    }
}
