//! A model's workers: OS threads that each own one [`ModelSession`] (built once, reused scene
//! after scene) and take scenes from the model's bounded queue. A scene runs on its worker's
//! thread, reading its source through blocking `Read` as the tiler needs lines, and writes its
//! maps into its own outbox folder; a failed scene is logged with its error chain and moved aside,
//! and the worker takes the next.

use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Instant;

use crossbeam_channel::{Receiver, bounded};

use super::DaemonError;
use super::config::ModelConfig;
use super::failed::{fail_after_start, fail_before_start};
use super::intake::{Job, ModelRoute};
use super::journal::{self, Journal};
use super::log;
use super::nospace;
use super::outbox::{self, InFlight};
use super::pause::wait_for_intake;
use super::replay::{self, Recorded};
use super::status::{SceneEntry, Status};
use crate::delivery::Queue;
use crate::delivery::enqueue::{Labels, enqueue};
use crate::engine::error_chain;
use crate::job::{ModelSession, Resume, SessionBatch, anon_bytes, with_peak_anon};
use crate::map::SegmentOptions;
use crate::pipeline::Mode;
use crate::source::{LineSource, LineStatus, SceneInfo, SourceError, SourceStats};

/// What every worker shares: where scenes go and where progress is reported.
#[derive(Debug)]
pub struct WorkerContext {
    /// The outbox.
    pub outbox: PathBuf,
    /// The state folder.
    pub state: PathBuf,
    /// Scenes in flight and totals.
    pub status: Arc<Status>,
    /// Telemetry for the `/metrics` endpoint (`[telemetry] metrics`), if configured.
    pub metrics: Option<super::metrics::Metrics>,
    /// The delivery queue, when sinks besides the outbox are configured.
    pub delivery: Option<Arc<Queue>>,
    /// Bytes the outbox's file system must have free before a scene is taken (0: not checked).
    pub outbox_min_free: u64,
    /// Set by a drain: a worker paused for room takes the scenes already accepted.
    pub draining: std::sync::atomic::AtomicBool,
}

/// A model's running workers.
#[derive(Debug)]
pub struct ModelPool {
    /// The configuration they were started with (a reload keeps the pool when it is unchanged).
    pub config: ModelConfig,
    /// How intake reaches them.
    pub route: ModelRoute,
    workers: Vec<JoinHandle<()>>,
}

impl ModelPool {
    /// Starts `config.workers` workers of model `name`, each building its session on its own
    /// thread; returns once all are ready, or with the first one's error (the others stop).
    pub fn start(name: &str, config: &ModelConfig, queue: usize, ctx: Arc<WorkerContext>) -> Result<Self, DaemonError> {
        let (tx, rx) = bounded::<Job>(queue);
        let (ready_tx, ready_rx) = bounded(config.workers);
        let mut workers = Vec::new();
        for k in 0..config.workers {
            let (rx, ready, ctx) = (rx.clone(), ready_tx.clone(), ctx.clone());
            let (spec, model) = (config.session.clone(), name.to_string());
            let spawned = std::thread::Builder::new()
                .name(format!("hsiedge-{name}-{k}"))
                .spawn(move || match ModelSession::open(&spec) {
                    Ok(session) => {
                        let route_info = (session.manifest().clone(), session.run_options().clone());
                        let _ = ready.send(Ok(route_info));
                        drop(ready);
                        work(session, &spec, &model, &rx, &ctx);
                    }
                    Err(e) => {
                        let _ = ready.send(Err(e));
                    }
                })
                .map_err(|source| DaemonError::Thread {
                    what: format!("worker {k} of model `{name}`"),
                    source,
                })?;
            workers.push(spawned);
        }
        drop((ready_tx, rx));
        let mut first = None;
        for _ in 0..config.workers {
            match ready_rx.recv() {
                Ok(Ok(info)) => first = first.or(Some(Ok(info))),
                Ok(Err(e)) => first = Some(Err(e)),
                Err(_) => break,
            }
        }
        let failed = |pool: Vec<JoinHandle<()>>, tx| {
            // Closing the queue ends the workers that did start.
            drop(tx);
            for w in pool {
                let _ = w.join();
            }
        };
        match first {
            Some(Ok((manifest, run))) => {
                let batch_reason = match &config.session.batch {
                    SessionBatch::Fixed(b) => format!("configured: models.{name}.batch = {b}"),
                    SessionBatch::ModeDefault => {
                        format!("default of {} mode (models.{name}.batch not set)", mode_name(run.mode))
                    }
                    SessionBatch::Auto(_) => format!(
                        "auto (models.{name}.batch = \"auto\"): the plateau knee within the memory budget, \
                         at most one tile row, planned at the first scene of each width and governed while \
                         a scene runs; each scene_done reports its plan"
                    ),
                };
                Ok(Self {
                    config: config.clone(),
                    route: ModelRoute {
                        name: name.to_string(),
                        manifest: Arc::new(manifest),
                        run,
                        batch_reason,
                        workers: config.workers,
                        tx,
                    },
                    workers,
                })
            }
            Some(Err(source)) => {
                failed(workers, tx);
                Err(DaemonError::Model {
                    name: name.to_string(),
                    source,
                })
            }
            None => {
                failed(workers, tx);
                Err(DaemonError::Model {
                    name: name.to_string(),
                    source: crate::job::JobError::Setting {
                        name: "workers",
                        value: config.workers.to_string(),
                        message: "no worker started".into(),
                    },
                })
            }
        }
    }

    /// Closes the queue (the workers finish what it holds, then end) and returns the threads to join.
    pub fn stop(self) -> Vec<JoinHandle<()>> {
        drop(self.route);
        self.workers
    }
}

/// `dense` or `patch`.
pub fn mode_name(mode: Mode) -> &'static str {
    match mode {
        Mode::Dense => "dense",
        Mode::Patch => "patch",
    }
}

/// A worker's loop: scenes until the queue closes.
fn work(
    mut session: ModelSession,
    spec: &crate::job::SessionSpec,
    model: &str,
    rx: &Receiver<Job>,
    ctx: &WorkerContext,
) {
    loop {
        wait_for_intake(ctx, model);
        let Ok(job) = rx.recv() else { break };
        if ctx.draining.load(Ordering::Acquire) && job.scene.durable_input() {
            // A spooled cube not yet started stays where it is, for the next start: a drain
            // finishes the scenes in flight, not every cube the spool handed over.
            log::event(
                "left",
                &format!(
                    "scene `{}`: not started before the drain; its input is kept for the next start",
                    job.info.id
                ),
                serde_json::json!({"scene_id": job.info.id, "model": model}),
            );
            drop(job);
            continue;
        }
        // The pause may have begun while this worker waited for the scene: its lines stay unread.
        wait_for_intake(ctx, model);
        if run_scene(&mut session, model, job, ctx).is_err() {
            // The run panicked (possible only where panics unwind: test and dev builds; the
            // release build aborts and systemd restarts it): the session may hold a half-done
            // run, so it is built afresh.
            match ModelSession::open(spec) {
                Ok(s) => session = s,
                Err(e) => {
                    log::event(
                        "worker_stopped",
                        &format!(
                            "model `{model}`: rebuilding the session after a panic failed: {}",
                            error_chain(&e)
                        ),
                        serde_json::json!({"model": model}),
                    );
                    return;
                }
            }
        }
    }
}

/// A line source that counts the lines it hands out, for `status`.
struct Counted<'a> {
    inner: &'a mut dyn LineSource,
    lines: &'a AtomicU64,
}

impl LineSource for Counted<'_> {
    fn info(&self) -> &SceneInfo {
        self.inner.info()
    }

    fn next_line(&mut self, line: &mut [u8]) -> Result<Option<LineStatus>, SourceError> {
        let got = self.inner.next_line(line)?;
        if got.is_some() {
            self.lines.fetch_add(1, Ordering::Relaxed);
        }
        Ok(got)
    }

    fn stats(&self) -> SourceStats {
        self.inner.stats()
    }
}

/// Runs one scene; `Err(())` only when the run panicked.
fn run_scene(session: &mut ModelSession, model: &str, job: Job, ctx: &WorkerContext) -> Result<(), ()> {
    let Job {
        mut scene,
        info,
        segment_lines,
        queued,
    } = job;
    scene.started();
    let origin = info.origin.display().to_string();
    let key = journal::SceneKey::of(&info, model, segment_lines);
    // A scene an earlier process left mid-way goes on in its folder after its last journalled
    // segment; any other gets a folder and a journal of its own.
    let (folder, journal, resume) = match journal::find(&ctx.state, &ctx.outbox, &key) {
        Some((j, folder, resume)) => {
            log::event(
                "resumed",
                &format!(
                    "scene `{}` from {origin}: resumed in {} from line {} after {} committed segment(s)",
                    info.id,
                    folder.display(),
                    resume.line(),
                    resume.segments.len()
                ),
                serde_json::json!({
                    "scene_id": info.id,
                    "folder": folder,
                    "model": model,
                    "resumed_from_row": resume.line(),
                    "segments_before": resume.segments.len(),
                }),
            );
            (folder, j, resume)
        }
        None => {
            let folder = match outbox::claim(&ctx.outbox, &info.id) {
                Ok(f) => f,
                Err(e) => {
                    fail_before_start(ctx, &info, model, &origin, &e);
                    scene.release(false);
                    return Ok(());
                }
            };
            match Journal::create(&ctx.state, &key, &folder) {
                Ok(j) => (folder, j, Resume::default()),
                Err(e) => {
                    let _ = std::fs::remove_dir(&folder);
                    fail_before_start(ctx, &info, model, &origin, &e);
                    scene.release(false);
                    return Ok(());
                }
            }
        }
    };
    let journal = std::sync::Mutex::new(journal);
    let marker = match InFlight::start(&ctx.state, &folder, &info.id, model) {
        Ok(m) => m,
        Err(e) => {
            // Kept for a later resume when the scene had committed segments already.
            if resume.segments.is_empty() {
                let _ = std::fs::remove_dir(&folder);
                let _ = journal
                    .into_inner()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .finish();
            }
            fail_before_start(ctx, &info, model, &origin, &e);
            scene.release(false);
            return Ok(());
        }
    };
    let run = session.run_options().clone();
    let (key, entry) = ctx.status.begin(SceneEntry {
        scene_id: info.id.clone(),
        folder: folder.clone(),
        model: model.to_string(),
        mode: mode_name(run.mode),
        batch: AtomicU64::new(run.batch as u64),
        samples: info.samples,
        lines: AtomicU64::new(0),
        pixels: AtomicU64::new(0),
        started: Instant::now(),
    });
    let waited_s = queued.elapsed().as_secs_f64();
    let root = Path::new("/");
    let rss_start = anon_bytes(root);
    let segments = SegmentOptions {
        segment_lines,
        keep_scores: false,
    };
    let labels = Labels::of(session.manifest());
    let (result, rss_peak) = with_peak_anon(root, || {
        std::panic::catch_unwind(AssertUnwindSafe(|| {
            let run_info = crate::telemetry::RunInfo {
                batch: run.batch as u64,
                batch_reason: if session.is_auto_batch() {
                    "auto: planned for the scene's width, governed by the budget".into()
                } else {
                    "the model's configured batch".into()
                },
                pixels_total: None,
                provider: session.runtime().provider().ort_name().into(),
                provider_fallbacks: session.runtime().fallbacks().iter().map(ToString::to_string).collect(),
            };
            // The segments committed so far, where a run paused for space goes on from.
            let journalled = std::sync::Mutex::new(resume.segments.clone());
            let mark = scene.attempt_mark();
            let waiting = |w: bool| {
                if let Some(Err(e)) = mark.as_ref().map(|m| m.waiting(w)) {
                    log::event(
                        "warning",
                        &format!("scene `{}`: {}", info.id, error_chain(&e)),
                        serde_json::json!({"scene_id": info.id}),
                    );
                }
            };
            // Each segment is queued for delivery as soon as it is committed.
            let mut queue_segment = |rec: &crate::map::SegmentRecord, last: bool| {
                // A segment that fills up is committed before the scene's end is seen; a scene of
                // announced length knows it is the last.
                let last = last || info.lines == Some(rec.first_line + rec.lines);
                if let Some(q) = &ctx.delivery {
                    enqueue(q, &labels, model, &info, &folder, rec, last, &waiting);
                }
                // Journalled once queued: a resume never skips a segment that was not queued.
                let journalled_now = replay::lock(&journal).segment(rec, last);
                if journalled_now.is_ok()
                    && let Some(Err(e)) = mark
                        .as_ref()
                        .map(|m| m.progressed(u32::try_from(rec.index + 1).unwrap_or(u32::MAX)))
                {
                    log::event(
                        "warning",
                        &format!("scene `{}`: {}", info.id, error_chain(&e)),
                        serde_json::json!({"scene_id": info.id}),
                    );
                }
                if let Err(e) = journalled_now {
                    log::event(
                        "warning",
                        &format!(
                            "scene `{}`: {} (a resume would start before this segment)",
                            info.id,
                            error_chain(&e)
                        ),
                        serde_json::json!({"scene_id": info.id}),
                    );
                }
                journalled
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .push(rec.clone());
            };
            let durable = scene.durable_input();
            let mut resume = resume.clone();
            // Lines of a stream recorded before a pause for space: read back from the recording.
            let mut recorded_before: Option<usize> = None;
            let outcome = loop {
                let (result, recorded_lines) = {
                    // A stream's lines are recorded as they are read, so that a scene read to its
                    // end survives a kill without its sensor.
                    let mut recorded = None;
                    let mut rewound = None;
                    let inner: &mut dyn LineSource = match (durable, recorded_before) {
                        (true, _) => scene.source(),
                        (false, None) => recorded.insert(Recorded::new(scene.source(), &journal)),
                        (false, Some(n)) => {
                            let (path, rest): (_, &mut dyn LineSource) =
                                match Recorded::resume(scene.source(), &journal, n) {
                                    Ok((path, rec)) => (path, recorded.insert(rec)),
                                    Err((path, source)) => (path, source),
                                };
                            let again = nospace::Rewound::new(&path, n, rest).map_err(|e| error_chain(&e))?;
                            rewound.insert(again)
                        }
                    };
                    let mut counted = Counted {
                        inner,
                        lines: &entry.lines,
                    };
                    let result = super::metrics::observe(ctx.metrics.as_ref(), run_info.clone(), |record| {
                        session.run_stream_resumed(
                            &mut counted,
                            &folder,
                            segments,
                            &resume,
                            &mut |px| {
                                entry.pixels.store(px.pixels_done as u64, Ordering::Relaxed);
                                entry.batch.store(px.batch as u64, Ordering::Relaxed);
                                record(px);
                            },
                            &mut queue_segment,
                        )
                    });
                    drop(rewound);
                    // `None`: lines were read that the recording does not hold in order.
                    let lines = recorded.as_ref().map_or(recorded_before, Recorded::recorded);
                    (result, lines)
                };
                match result {
                    Err(e) if nospace::storage_full(&e) => {
                        let needed = nospace::segment_bytes(
                            if segment_lines > 0 {
                                segment_lines
                            } else {
                                info.lines.unwrap_or(run.tile)
                            },
                            info.samples,
                            session.manifest().classes(),
                            run.keep_scores,
                        );
                        let give_up = || ctx.draining.load(Ordering::Acquire);
                        if !nospace::wait_for_space(&ctx.status, model, &info.id, &ctx.outbox, needed, &give_up) {
                            break Err(e);
                        }
                        session.reset_buffers();
                        if durable && !scene.reopen() {
                            break Err(e);
                        }
                        if !durable {
                            // Lines already read from the connection are not sent again: going
                            // on without all of them in the recording would shift the scene.
                            let Some(n) = recorded_lines else {
                                log::event(
                                    "error",
                                    &format!(
                                        "scene `{}`: its input was not recorded whole, so it cannot go on after the \
                                         pause for space; the sensor must send it again",
                                        info.id
                                    ),
                                    serde_json::json!({"scene_id": info.id}),
                                );
                                break Err(e);
                            };
                            recorded_before = Some(n);
                        }
                        resume = Resume {
                            segments: journalled
                                .lock()
                                .unwrap_or_else(std::sync::PoisonError::into_inner)
                                .clone(),
                        };
                    }
                    other => break other,
                }
            }
            .map_err(|e| error_chain(&e))?;
            scene.complete().map_err(|e| error_chain(&e))?;
            Ok::<_, String>(outcome)
        }))
    });
    let rss_end = anon_bytes(root);
    ctx.status.end(key);
    let memory = serde_json::json!({
        "rss_anon_start": rss_start,
        "rss_anon_peak": rss_peak,
        "rss_anon_end": rss_end,
        "scenes_in_flight_at_end": ctx.status.in_flight().len(),
    });
    let (ok, panicked) = match result {
        Ok(Ok(outcome)) => {
            let lines = (outcome.lines_skipped + outcome.run.lines) as u64;
            ctx.status.count(|t| {
                t.scenes_done += 1;
                t.lines += lines;
            });
            let elapsed = outcome.run.elapsed_s;
            log::event(
                "scene_done",
                &format!(
                    "scene `{}` from {origin}: {lines} lines in {elapsed:.3} s into {}",
                    info.id,
                    folder.display()
                ),
                serde_json::json!({
                    "scene_id": info.id,
                    "folder": folder,
                    "model": model,
                    "origin": origin,
                    "mode": mode_name(run.mode),
                    "batch": outcome.batch.as_ref().map_or(run.batch, |b| b.plan.batch),
                    "batch_plan": outcome.batch,
                    "lines": lines,
                    "pixels": outcome.run.pixels,
                    "elapsed_s": elapsed,
                    "lines_per_s": if elapsed > 0.0 { lines as f64 / elapsed } else { 0.0 },
                    "queued_s": waited_s,
                    "row_latency_s": outcome.run.row_latency_s,
                    "missing_lines": outcome.source.missing_lines(),
                    "duplicates": outcome.source.duplicates,
                    "segments": outcome.segments.len(),
                    "resumed_from_row": outcome.resumed_from_line,
                    "lines_computed": outcome.run.lines,
                    "memory": memory,
                }),
            );
            (true, false)
        }
        Ok(Err(error)) => {
            // The failed run's batches in flight were never given back.
            session.reset_buffers();
            fail_after_start(ctx, &journal, &info, model, &origin, &folder, &error, &memory);
            (false, false)
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "a panic".into());
            fail_after_start(
                ctx,
                &journal,
                &info,
                model,
                &origin,
                &folder,
                &format!("panicked: {what}"),
                &memory,
            );
            (false, true)
        }
    };
    // The scene is over, written or moved aside: nothing is left to resume. The marker goes
    // first: a marker left without its journal would have the next start move a finished scene
    // aside, where a journal left without its marker is only pruned.
    if let Err(e) = marker.finish() {
        log::event("warning", &error_chain(&e), serde_json::Value::Null);
    }
    if let Err(e) = journal
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .finish()
    {
        log::event("warning", &error_chain(&e), serde_json::Value::Null);
    }
    scene.release(ok);
    if panicked { Err(()) } else { Ok(()) }
}
