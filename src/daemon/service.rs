//! The service loop: binds from the configuration, starts the models' workers, then waits on the
//! I/O edge (signals, control commands, the watchdog) until a drain ends it.
//!
//! SIGTERM and SIGINT drain: intake stops (listeners close, connections waiting between scenes
//! close), scenes in flight run to their end — up to `intake.drain_timeout_s`, after which their
//! connections are cut and they fail and move aside with what they committed — then the workers
//! end and the process exits 0. SIGHUP reloads the configuration.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::{Semaphore, mpsc};

use super::config::{self, Config};
use super::control::{self, Command};
use super::intake::Routes;
use super::journal;
use super::listen::{self, Listener};
use super::notify::{self, Notifier};
use super::outbox;
use super::spool::SpoolIntake;
use super::status::Status;
use super::worker::{ModelPool, WorkerContext};
use super::{DaemonError, Shared, log};
use crate::delivery::Delivery;
use crate::engine::error_chain;

/// How often systemd's `STATUS=` line is refreshed.
const STATUS_PERIOD: Duration = Duration::from_secs(2);

/// How long a drain waits, once it has cut the connections off, for their threads to end.
const CUT_WAIT: Duration = Duration::from_secs(10);

/// Runs the daemon the configuration at `path` describes until it is drained (then `Ok`).
pub fn serve(path: &Path) -> Result<(), DaemonError> {
    let config = config::load(path)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| DaemonError::Runtime {
            what: "starting the I/O runtime",
            source,
        })?;
    rt.block_on(run(config))
}

/// The models and what a reload changes.
struct Daemon {
    config: Config,
    pools: BTreeMap<String, ModelPool>,
    retired: Vec<JoinHandle<()>>,
    ctx: Arc<WorkerContext>,
}

fn routes_of(config: &Config, pools: &BTreeMap<String, ModelPool>) -> Routes {
    Routes {
        models: pools.iter().map(|(n, p)| (n.clone(), p.route.clone())).collect(),
        default_model: config.intake.default_model.clone(),
        segment_lines: config.intake.segment_lines,
        limits: config.intake.limits,
        max_line_bytes: config.intake.max_line_bytes,
        idle_timeout: config.intake.idle_timeout,
        line_timeout: config.intake.line_timeout,
    }
}

fn start_pools(config: &Config, ctx: &Arc<WorkerContext>) -> Result<BTreeMap<String, ModelPool>, DaemonError> {
    let mut pools = BTreeMap::new();
    for (name, m) in &config.models {
        match ModelPool::start(name, m, config.intake.queue, ctx.clone()) {
            Ok(p) => {
                pools.insert(name.clone(), p);
            }
            Err(e) => {
                for (_, p) in pools {
                    join_all(p.stop());
                }
                return Err(e);
            }
        }
    }
    Ok(pools)
}

fn join_all(threads: Vec<JoinHandle<()>>) {
    for t in threads {
        let _ = t.join();
    }
}

async fn run(config: Config) -> Result<(), DaemonError> {
    let runtime_err = |what| move |source| DaemonError::Runtime { what, source };
    // Signals are caught from the start, so a stop during model loading is not lost.
    let mut sigterm = signal(SignalKind::terminate()).map_err(runtime_err("catching SIGTERM"))?;
    let mut sigint = signal(SignalKind::interrupt()).map_err(runtime_err("catching SIGINT"))?;
    let mut sighup = signal(SignalKind::hangup()).map_err(runtime_err("catching SIGHUP"))?;
    let notifier = Arc::new(Notifier::from_env().map_err(runtime_err("the NOTIFY_SOCKET socket"))?);

    outbox::prepare(&config.outbox, &config.state)?;
    let delivery = Delivery::start(&config.delivery, &config.state).map_err(|e| DaemonError::Runtime {
        what: "starting delivery",
        source: std::io::Error::other(error_chain(&e)),
    })?;
    let queue = delivery.as_ref().map(|d| d.queue.clone());
    // A scene with a journal to resume from stays in place, like one that had completed.
    let completed = |f: &Path| queue.as_ref().is_some_and(|q| q.holds_scene(f)) || journal::resumable(&config.state, f);
    // What an interrupted scene committed and queued is delivered from where it goes.
    let record = |from: &Path, to: &Path| outbox::relocate(queue.as_deref(), from, to);
    for i in outbox::recover(&config.outbox, &config.state, &completed, &record)? {
        log::event(
            "recovered",
            &format!(
                "{}: in flight when the daemon last stopped; {}",
                i.folder.display(),
                match (&i.moved_to, &i.not_moved) {
                    (_, Some(e)) => format!("could not be moved aside ({e}); the next start tries again"),
                    (Some(p), None) => format!("moved to {}", p.display()),
                    (None, None) if journal::resumable(&config.state, &i.folder) => {
                        "kept: its journal resumes it after its last committed segment when it comes again".into()
                    }
                    (None, None) if i.completed => "it had completed and is queued for delivery".into(),
                    (None, None) => "its folder was gone".into(),
                }
            ),
            serde_json::json!({"folder": i.folder, "moved_to": i.moved_to, "completed": i.completed}),
        );
    }
    // Journals of scenes moved aside, complete, or with nothing committed resume nothing.
    journal::prune(&config.state)?;
    let mut listeners = Vec::new();
    if let Some(addr) = config.tcp {
        listeners.push(listen::bind_tcp(addr)?);
    }
    if let Some(path) = &config.unix {
        listeners.push(Listener::Unix(listen::bind_unix(path)?, path.clone()));
    }
    let control_listener = listen::bind_unix(&config.control)?;
    let latest = crate::telemetry::LatestSnapshot::new();
    // Stopped when dropped, at the end of the service.
    let _metrics_server = match config.metrics {
        Some(addr) => {
            let server = crate::telemetry::http::bind_local(&addr.to_string())
                .and_then(|l| crate::telemetry::MetricsServer::start(l, latest.clone()))
                .map_err(DaemonError::Metrics)?;
            log::event(
                "metrics",
                &format!("metrics on http://{}/metrics", server.addr()),
                serde_json::json!({"addr": server.addr().to_string()}),
            );
            Some(server)
        }
        None => None,
    };

    let status = Arc::new(Status::default());
    let ctx = Arc::new(WorkerContext {
        outbox: config.outbox.clone(),
        state: config.state.clone(),
        status: status.clone(),
        metrics: config.metrics.map(|_| super::metrics::Metrics::new(latest.clone())),
        delivery: queue.clone(),
        outbox_min_free: config.delivery.outbox_min_free,
        draining: std::sync::atomic::AtomicBool::new(false),
    });
    let pools = start_pools(&config, &ctx)?;
    let listening: Vec<String> = listeners.iter().map(Listener::describe).collect();
    let shared = Arc::new(Shared::new(
        routes_of(&config, &pools),
        status,
        listening.clone(),
        config.path.clone(),
        queue.clone(),
    ));
    let unix_paths: Vec<_> = config.unix.iter().chain([&config.control]).cloned().collect();
    let drain_timeout = config.intake.drain_timeout;
    let daemon = Arc::new(Mutex::new(Daemon {
        config,
        pools,
        retired: Vec::new(),
        ctx,
    }));

    let spool = match &lock(&daemon).config.spool {
        Some(root) => Some(SpoolIntake::start(root, shared.clone())?),
        None => None,
    };
    // Streams a killed daemon had read to their end are finished from their recorded input.
    super::replay::submit_recorded(&lock(&daemon).config.state, shared.clone());
    let permits = Arc::new(Semaphore::new(lock(&daemon).config.intake.max_connections));
    let mut tasks = Vec::new();
    for l in listeners {
        log::event(
            "listening",
            &format!("listening on {}", l.describe()),
            serde_json::json!({"listener": l.describe()}),
        );
        tasks.push(tokio::spawn(listen::accept_loop(l, shared.clone(), permits.clone())));
    }
    let (commands_tx, mut commands) = mpsc::channel(8);
    let control_path = lock(&daemon).config.control.clone();
    log::event(
        "control",
        &format!("control socket {}", control_path.display()),
        serde_json::json!({"control": control_path}),
    );
    let control_task = tokio::spawn(control::serve(control_listener, shared.clone(), commands_tx));

    let models: Vec<String> = lock(&daemon).pools.keys().cloned().collect();
    log::event(
        "ready",
        &format!("serving models {} on {}", models.join(", "), listening.join(", ")),
        serde_json::json!({"models": models, "pid": std::process::id()}),
    );
    warn(notifier.ready(&shared.status.summary("serving")));

    let mut watchdog = notify::watchdog_interval().map(tokio::time::interval);
    let mut status_tick = tokio::time::interval(STATUS_PERIOD);
    let why = loop {
        tokio::select! {
            _ = sigterm.recv() => break "SIGTERM",
            _ = sigint.recv() => break "SIGINT",
            // A reload runs beside this loop (opening sessions takes a while: the watchdog goes
            // on); reloads queue on the daemon's lock.
            _ = sighup.recv() => {
                let (d, s, n) = (daemon.clone(), shared.clone(), notifier.clone());
                tokio::spawn(async move {
                    let reply = reload(&d, &s, &n).await;
                    log_reload("SIGHUP", &reply);
                });
            }
            cmd = commands.recv() => match cmd {
                Some(Command::Drain) | None => break "drain requested on the control socket",
                Some(Command::Reload(reply)) => {
                    let (d, s, n) = (daemon.clone(), shared.clone(), notifier.clone());
                    tokio::spawn(async move {
                        let r = reload(&d, &s, &n).await;
                        log_reload("control socket", &r);
                        let _ = reply.send(r);
                    });
                }
            },
            _ = tick(&mut watchdog) => warn(notifier.watchdog()),
            _ = status_tick.tick() => warn(notifier.status(&shared.status.summary("serving"))),
        }
    };

    // Drain.
    log::event(
        "draining",
        &format!(
            "{why}: draining ({} scene(s) in flight)",
            shared.status.in_flight().len()
        ),
        serde_json::json!({"cause": why}),
    );
    shared.draining.store(true, std::sync::atomic::Ordering::Release);
    if let Some(q) = &queue {
        // Scenes already accepted run to their end and are queued, full or not.
        q.lift_bound();
    }
    lock(&daemon)
        .ctx
        .draining
        .store(true, std::sync::atomic::Ordering::Release);
    warn(notifier.stopping(&shared.status.summary("draining")));
    if let Some(s) = spool {
        // Returns once a scene it is handing over has a place in its model's queue.
        let _ = tokio::task::spawn_blocking(move || s.stop()).await;
    }
    for t in &tasks {
        t.abort();
    }
    for t in tasks {
        let _ = t.await;
    }
    if let Some(p) = &lock(&daemon).config.unix {
        let _ = std::fs::remove_file(p);
    }
    shared.conns.drain();
    let start = Instant::now();
    let mut cut = false;
    while !shared.conns.is_empty() {
        if !cut && start.elapsed() > drain_timeout {
            let n = shared.conns.cut_all();
            log::event(
                "drain_timeout",
                &format!(
                    "intake.drain_timeout_s ({:.0} s) passed: cutting {n} connection(s); their scenes fail and move aside",
                    drain_timeout.as_secs_f64()
                ),
                serde_json::Value::Null,
            );
            cut = true;
        }
        if cut && start.elapsed() > drain_timeout + CUT_WAIT {
            log::note(
                "drain_timeout",
                "connections still open after being cut; stopping anyway",
            );
            break;
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(50)) => {}
            _ = tick(&mut watchdog) => warn(notifier.watchdog()),
            _ = status_tick.tick() => warn(notifier.status(&shared.status.summary("draining"))),
        }
    }
    control_task.abort();
    let _ = control_task.await;
    let (d, s) = (daemon.clone(), shared.clone());
    let joined = tokio::task::spawn_blocking(move || {
        let mut d = lock(&d);
        // The routes hold the models' queues open: without them the workers see their queue
        // close once it is empty, and end.
        s.set_routes(routes_of(&d.config, &BTreeMap::new()));
        let pools = std::mem::take(&mut d.pools);
        let retired = std::mem::take(&mut d.retired);
        for (_, p) in pools {
            join_all(p.stop());
        }
        join_all(retired);
    });
    let _ = joined.await;
    if let Some(d) = delivery {
        // What the sinks have not delivered stays queued on disk for the next start.
        let _ = tokio::task::spawn_blocking(move || d.stop()).await;
    }
    for p in unix_paths {
        let _ = std::fs::remove_file(p);
    }
    let t = shared.status.totals();
    log::event(
        "stopped",
        &format!(
            "stopped: {} scene(s) done, {} failed, {} refused",
            t.scenes_done, t.scenes_failed, t.refused
        ),
        serde_json::json!({"totals": t}),
    );
    Ok(())
}

fn lock(d: &Mutex<Daemon>) -> std::sync::MutexGuard<'_, Daemon> {
    d.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

async fn tick(t: &mut Option<tokio::time::Interval>) {
    match t {
        Some(i) => {
            i.tick().await;
        }
        None => std::future::pending().await,
    }
}

fn warn(r: std::io::Result<()>) {
    if let Err(e) = r {
        log::note("notify_failed", &format!("systemd notification: {e}"));
    }
}

fn log_reload(cause: &str, reply: &serde_json::Value) {
    let ok = reply["ok"].as_bool().unwrap_or(false);
    let msg = if ok {
        format!("reloaded ({cause})")
    } else {
        format!(
            "reload ({cause}) failed; the configuration in force is kept: {}",
            reply["error"].as_str().unwrap_or("")
        )
    };
    log::event(if ok { "reloaded" } else { "reload_failed" }, &msg, reply.clone());
}

/// Re-reads the configuration file (on a blocking thread: opening a session takes a while) and
/// applies it: a model whose settings did not change keeps its workers and sessions, a changed or
/// new one gets new workers, a removed one finishes its queue and stops. Keys only a restart can
/// apply keep their value and are named. On any error nothing changes.
async fn reload(daemon: &Arc<Mutex<Daemon>>, shared: &Arc<Shared>, notifier: &Notifier) -> serde_json::Value {
    warn(notifier.reloading());
    let (d, s) = (daemon.clone(), shared.clone());
    let result = tokio::task::spawn_blocking(move || reload_blocking(&d, &s)).await;
    warn(notifier.ready(&shared.status.summary("serving")));
    result.unwrap_or_else(|e| serde_json::json!({"ok": false, "error": format!("the reload thread failed: {e}")}))
}

fn reload_blocking(daemon: &Mutex<Daemon>, shared: &Shared) -> serde_json::Value {
    let mut d = lock(daemon);
    if shared.draining() {
        return serde_json::json!({"ok": false, "error": "the daemon is draining: nothing is reloaded"});
    }
    let new = match config::load(&d.config.path) {
        Ok(c) => c,
        Err(e) => return serde_json::json!({"ok": false, "error": error_chain(&e)}),
    };
    let restart_needed = d.config.restart_only_changes(&new);
    let same_queue = new.intake.queue == d.config.intake.queue;
    let (mut kept, mut started) = (Vec::new(), Vec::new());
    let mut fresh = BTreeMap::new();
    for (name, m) in &new.models {
        if same_queue && d.pools.get(name).is_some_and(|p| p.config == *m) {
            kept.push(name.clone());
            continue;
        }
        match ModelPool::start(name, m, new.intake.queue, d.ctx.clone()) {
            Ok(p) => {
                started.push(name.clone());
                fresh.insert(name.clone(), p);
            }
            Err(e) => {
                for (_, p) in fresh {
                    d.retired.extend(p.stop());
                }
                return serde_json::json!({"ok": false, "error": error_chain(&e)});
            }
        }
    }
    let mut stopped = Vec::new();
    for (name, p) in std::mem::take(&mut d.pools) {
        if kept.contains(&name) {
            fresh.insert(name, p);
        } else {
            stopped.push(name);
            // Scenes already queued still run on the old workers, which end after them.
            d.retired.extend(p.stop());
        }
    }
    let old = &d.config;
    let merged = Config {
        tcp: old.tcp,
        unix: old.unix.clone(),
        outbox: old.outbox.clone(),
        state: old.state.clone(),
        control: old.control.clone(),
        spool: old.spool.clone(),
        intake: super::config::Intake {
            max_connections: old.intake.max_connections,
            ..new.intake
        },
        models: new.models,
        delivery: old.delivery.clone(),
        path: new.path,
        metrics: old.metrics,
    };
    shared.set_routes(routes_of(&merged, &fresh));
    d.pools = fresh;
    d.config = merged;
    serde_json::json!({
        "ok": true,
        "kept": kept,
        "started": started,
        "stopped": stopped,
        "restart_needed": restart_needed,
    })
}
