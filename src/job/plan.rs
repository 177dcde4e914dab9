//! `hsiedge plan`: the memory plan printed without a run, verified against fresh processes or the real wall.

use super::*;

/// What `hsiedge plan` is asked.
#[derive(Debug, Clone)]
pub struct PlanRequest {
    /// Model manifest.
    pub manifest: PathBuf,
    /// Scene to plan for; one tile of the model's bands when absent.
    pub scene: Option<PathBuf>,
    /// Mode.
    pub mode: ModeChoice,
    /// Tile side.
    pub tile: usize,
    /// Engine settings (the plan calibrates with a real session).
    pub engine: EngineOptions,
    /// Budget settings.
    pub budget: BudgetSettings,
    /// Plan training for this many classes with this optimizer instead of inference.
    pub train: Option<(u64, budget::Optimizer)>,
    /// After planning, run the scene at batches from 1 to `batch_ceiling` (B_safe before the
    /// knee) and compare each measured peak with the prediction.
    pub verify: bool,
    /// After planning, find the wall under a cgroup capped at the budget (`--probe-wall`).
    pub probe_wall: bool,
}

/// `plan --probe-wall`: the batch at which the plan predicts the wall against the one found.
#[derive(Debug, Clone, serde::Serialize)]
pub struct WallReport {
    /// The cap the probes ran under: the plan's budget.
    pub cap_bytes: u64,
    /// The largest batch whose predicted `M(B)` fits the cap (no fragmentation margin).
    pub predicted_largest_fit: u64,
    /// What the search found.
    pub search: budget::WallSearch,
    /// `(predicted - found) / found` for the largest fitting batch.
    pub error: f64,
    /// OOM kills in the cap's cgroup (the failed probes).
    pub oom_kills: u64,
    /// Why each failed probe failed (last stderr line), in probe order.
    pub failures: Vec<String>,
}

/// One row of `plan --verify`: predicted against measured peak at one batch.
#[derive(Debug, Clone, serde::Serialize)]
pub struct VerifyRow {
    /// Batch (units).
    pub batch: u64,
    /// Batches in flight besides the running one at this batch on this scene.
    pub in_flight: u64,
    /// `M(B)` with that many in flight.
    pub predicted_bytes: u64,
    /// Peak `RssAnon` of a full run at this batch.
    pub measured_bytes: u64,
    /// `(measured - predicted) / predicted`.
    pub error: f64,
}

/// `hsiedge plan`'s answer for inference: the plan, and the checks asked for.
#[derive(Debug, Clone, serde::Serialize)]
pub struct InferencePlan {
    /// The calibrated plan, the sweep behind its knee, the pipeline's share.
    #[serde(flatten)]
    pub auto: AutoBatch,
    /// `--verify`: predicted against measured peaks, one row per batch (empty when not asked).
    pub verify: Vec<VerifyRow>,
    /// `--probe-wall`: the wall found against the one predicted.
    pub wall: Option<WallReport>,
    /// The execution provider the plan was made on, and each preferred one that did not register.
    pub provider: String,
    /// Providers skipped before `provider`, with why.
    pub provider_fallbacks: Vec<crate::engine::Fallback>,
    /// The GPU a CUDA or TensorRT session runs on (its free memory bounds the provider's arena).
    pub device: Option<crate::gpu::DeviceInfo>,
}

/// `hsiedge plan`'s answer: one JSON object whose `kind` says which.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum PlanReport {
    /// Inference: the calibrated plan, the verification rows and the wall search when asked for.
    Inference(Box<InferencePlan>),
    /// Training memory from the graph.
    Training(Box<budget::TrainingPlan>),
}

impl std::fmt::Display for PlanReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Inference(r) => {
                let (a, rows, wall) = (&r.auto, &r.verify, &r.wall);
                write!(f, "{}", a.plan)?;
                if let Some(d) = &a.device {
                    let mib = |b: u64| b as f64 / 1048576.0;
                    write!(
                        f,
                        "\n  device          {:?}: budget {:.1} MiB (usable {:.1}), {:.1} MiB in use before; a run \
                         adds {:.1} MiB + {:.2} MiB/unit (fit to {} probes) -> at most {} units{}; predicted \
                         device peak at batch {}: {:.1} MiB",
                        d.source,
                        mib(d.budget_bytes),
                        mib(d.usable_bytes),
                        mib(d.used_before_bytes),
                        mib(d.fixed_bytes),
                        mib(d.per_unit_bytes),
                        d.samples.len(),
                        d.units_safe,
                        if d.binding { " (binding)" } else { "" },
                        d.batch,
                        mib(d.predicted_peak_bytes)
                    )?;
                }
                if let Some(s) = &a.sweep {
                    write!(f, "\n{}", SweepText(s, a.plan.unit))?;
                }
                if let Some(w) = wall {
                    write!(
                        f,
                        "\n  wall            cap {:.1} MiB: predicted largest fit {}, found {} (first failure {}), {:+.1} %, {} probes {:?}",
                        w.cap_bytes as f64 / 1048576.0,
                        w.predicted_largest_fit,
                        w.search.largest_fit,
                        w.search.first_fail.map_or("none".into(), |b| b.to_string()),
                        w.error * 100.0,
                        w.search.probes,
                        w.search.history
                    )?;
                }
                if !rows.is_empty() {
                    write!(
                        f,
                        "\n  verify          batch  in-flight  predicted MiB  measured MiB   error"
                    )?;
                    for r in rows {
                        write!(
                            f,
                            "\n                  {:>5}  {:>9}  {:>13.1}  {:>12.1}  {:>+6.1} %",
                            r.batch,
                            r.in_flight,
                            r.predicted_bytes as f64 / 1048576.0,
                            r.measured_bytes as f64 / 1048576.0,
                            r.error * 100.0
                        )?;
                    }
                }
                if let Some(c) = &a.calibration {
                    let pts: Vec<String> = c
                        .samples
                        .iter()
                        .map(|(b, m)| format!("B={b}: {:.1} MiB", *m as f64 / 1048576.0))
                        .collect();
                    write!(
                        f,
                        "\n  calibration     {} (fit RMS residual {:.2} MiB), {:.2} s",
                        pts.join(", "),
                        c.rms_residual_bytes / 1048576.0,
                        a.calibration_s
                    )?;
                }
                write!(
                    f,
                    "\n  pipeline        +{:.1} KiB per unit (queued inputs), +{:.1} MiB fixed (maps, tile window)",
                    a.pipeline_bytes_per_unit as f64 / 1024.0,
                    a.pipeline_fixed_bytes as f64 / 1048576.0
                )
            }
            Self::Training(t) => write!(f, "{t}"),
        }
    }
}

/// The in-run sweep as text: one line per size, then the pick.
struct SweepText<'a>(&'a budget::plateau::SweepOutcome, Unit);

impl std::fmt::Display for SweepText<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (s, unit) = (self.0, self.1);
        write!(
            f,
            "  sweep           batch   ms/{unit}  runs  elasticity   (up to {}, {:.2} s of its own)",
            s.limits.max_batch, s.sweep_s
        )?;
        for p in &s.points {
            write!(
                f,
                "\n                  {:>5}  {:>8.4}  {:>4}  {:>10}",
                p.batch,
                p.per_unit_s * 1e3,
                p.samples_s.len(),
                p.elasticity.map_or_else(|| "-".into(), |e| format!("{e:+.3}"))
            )?;
        }
        match s.pick {
            Some(p) => write!(
                f,
                "\n  knee            {} {unit}s: the smallest within {:.0} % of the best ({} at {:.4} ms/{unit}); {}, stopped: {:?}",
                p.batch,
                budget::knee::PLATEAU_TOLERANCE * 100.0,
                p.best_batch,
                p.best_per_unit_s * 1e3,
                if s.confirmed { "confirmed" } else { "not confirmed" },
                s.stopped
            ),
            None => write!(f, "\n  knee            none (no size could be timed)"),
        }
    }
}

/// Builds the plan `hsiedge plan` prints.
pub fn plan(req: &PlanRequest) -> Result<PlanReport, JobError> {
    req.budget.validate()?;
    let manifest = Manifest::load(&req.manifest)?;
    let geometry = match &req.scene {
        Some(p) => {
            let cube = Cube::open(p)?;
            if cube.bands() != manifest.input.bands {
                return Err(PipelineError::Bands {
                    cube: cube.header_path().to_path_buf(),
                    bands: cube.bands(),
                    manifest: manifest.path.clone(),
                    expected: manifest.input.bands,
                }
                .into());
            }
            SceneGeometry::of(&cube)
        }
        None => SceneGeometry {
            lines: req.tile,
            samples: req.tile,
            bands: manifest.input.bands,
            data_bytes: 0,
            sample_bytes: 4,
        },
    };
    let mode = match req.mode {
        ModeChoice::Fixed(m) => m,
        ModeChoice::Auto if manifest.files.dense.is_some() => Mode::Dense,
        ModeChoice::Auto => Mode::Patch,
    };
    if let Some((classes, optimizer)) = req.train {
        let g = graph::analyse_file(&manifest.patch_path(), &ShapeBindings::default())?;
        let cfg = BudgetConfig {
            reserve_bytes: req.budget.reserve_bytes,
            own_bytes: 0,
            device: None,
        };
        let system = budget::read_system_budget(&req.budget.root, &cfg)?;
        let choose = ChooseConfig {
            frag_margin: req.budget.frag_margin,
            max_units: req.budget.max_units,
            ..ChooseConfig::default()
        };
        let t = budget::TrainingPlan::build(
            &system,
            &g,
            classes,
            optimizer,
            budget::DEFAULT_RUNTIME_OVERHEAD_BYTES,
            &choose,
        )?;
        return Ok(PlanReport::Training(Box::new(t)));
    }
    let run = RunOptions {
        mode,
        batch: 1,
        tile: req.tile,
        queue: QUEUE_DEPTH,
        keep_scores: manifest.task == Task::Abundance,
        producer_nice: req.engine.producer_nice,
    };
    let runtime = Runtime::new(req.engine.clone())?;
    let mut graph = match mode {
        Mode::Patch => runtime.graph(&manifest, Role::Patch, &manifest.patch_path())?,
        Mode::Dense => {
            let path = manifest.dense_path().ok_or_else(|| PipelineError::NoDense {
                manifest: manifest.path.clone(),
            })?;
            runtime.graph(&manifest, Role::Dense, &path)?
        }
    };
    let scene_cube = match &req.scene {
        Some(p) => Some(Cube::open(p)?),
        None => None,
    };
    let knee = cached_knee(&manifest, &graph, mode, &run, &req.engine, &runtime, &req.budget);
    let auto = auto_batch(
        &geometry,
        scene_cube.as_ref(),
        &manifest,
        &mut graph,
        &run,
        &req.budget,
        knee,
    )?;
    let mut rows = Vec::new();
    let mut wall = None;
    if req.verify || req.probe_wall {
        let scene = req.scene.as_ref().ok_or(JobError::Setting {
            name: if req.verify { "--verify" } else { "--probe-wall" },
            value: "".into(),
            message: "needs --scene: it runs the scene at each batch".into(),
        })?;
        let cube = Cube::open(scene)?;
        let grid = crate::tile::TileGrid::new(cube.lines(), cube.samples(), run.tile, manifest.halo);
        let units = match mode {
            Mode::Patch => (cube.lines() * cube.samples()) as u64,
            Mode::Dense => grid.len() as u64,
        };
        let in_bytes = match mode {
            Mode::Patch => cube.bands() * manifest.patch * manifest.patch * 4,
            Mode::Dense => cube.bands() * grid.window_h() * grid.window_w() * 4,
        } as u64;
        let run_bytes = auto.run_bytes_per_unit;
        // Memory is checked up to the ceiling (B_safe before the knee), not only the knee.
        let safe = auto.plan.batch_ceiling.max(1);
        let mut batches: Vec<u64> = std::iter::successors(Some(1u64), |b| Some(b * 4))
            .take_while(|b| *b < safe)
            .collect();
        batches.push(safe);
        // Each batch runs in a fresh `hsiedge classify` process, so what one measurement leaves in
        // the allocator cannot inflate the next.
        let exe = std::env::current_exe().map_err(|source| {
            JobError::Map(crate::map::MapError::Io {
                path: PathBuf::from("/proc/self/exe"),
                source,
            })
        })?;
        let tmp = tempfile::tempdir().map_err(|source| {
            JobError::Map(crate::map::MapError::Io {
                path: std::env::temp_dir(),
                source,
            })
        })?;
        let classify = |cmd: &mut std::process::Command, b: u64| {
            cmd.arg("classify")
                .arg(scene)
                .arg("--model")
                .arg(&req.manifest)
                .arg("--out")
                .arg(tmp.path().join(format!("b{b}")))
                .args(["--mode", if mode == Mode::Dense { "dense" } else { "patch" }])
                .args(["--batch", &b.to_string(), "--tile", &req.tile.to_string(), "--json"]);
            if let Some(lib) = &req.engine.ort_lib {
                cmd.arg("--ort-lib").arg(lib);
            }
            if req.engine.threads > 0 {
                cmd.args(["--threads", &req.engine.threads.to_string()]);
            }
        };
        let predict =
            |b: u64| auto.plan.fixed_bytes + b * run_bytes + b * extra_buffers(run.queue, units, b) * in_bytes;
        if req.probe_wall {
            let cap_bytes = auto.plan.budget_bytes;
            let cap = budget::wall::MemoryCap::new(&req.budget.root, cap_bytes)?;
            let (mut lo, mut hi) = (0u64, units);
            while lo < hi {
                let mid = (lo + hi).div_ceil(2);
                if predict(mid) <= cap_bytes {
                    lo = mid;
                } else {
                    hi = mid - 1;
                }
            }
            let predicted = lo;
            let mut failures = Vec::new();
            let mut spawn_error = None;
            let search = budget::find_wall(auto.plan.batch_ceiling.max(1), units.max(1), 0.02, |b| {
                let mut cmd = cap.command(&exe);
                classify(&mut cmd, b);
                match cmd.output() {
                    Ok(o) if o.status.success() => true,
                    Ok(o) => {
                        let why = String::from_utf8_lossy(&o.stderr)
                            .lines()
                            .last()
                            .map_or_else(|| format!("{}", o.status), |l| format!("{}: {l}", o.status));
                        failures.push(format!("batch {b}: {why}"));
                        false
                    }
                    Err(e) => {
                        spawn_error.get_or_insert(e);
                        false
                    }
                }
            });
            if let Some(source) = spawn_error {
                return Err(JobError::Read {
                    path: exe.clone(),
                    source,
                });
            }
            let found = search.largest_fit.max(1);
            wall = Some(WallReport {
                cap_bytes,
                predicted_largest_fit: predicted,
                error: (predicted as f64 - found as f64) / found as f64,
                oom_kills: cap.oom_kills(),
                failures,
                search,
            });
        }
        if !req.verify {
            batches.clear();
        }
        for b in batches {
            let mut cmd = std::process::Command::new(&exe);
            classify(&mut cmd, b);
            let out = cmd.output().map_err(|source| {
                JobError::Map(crate::map::MapError::Io {
                    path: exe.clone(),
                    source,
                })
            })?;
            let measured = serde_json::from_slice::<serde_json::Value>(&out.stdout)
                .ok()
                .and_then(|v| v["peak_anon_bytes"].as_u64())
                .ok_or_else(|| JobError::Setting {
                    name: "--verify",
                    value: format!("batch {b}"),
                    message: format!(
                        "the classify run failed: {}",
                        String::from_utf8_lossy(&out.stderr).trim()
                    ),
                })?;
            let in_flight = extra_buffers(run.queue, units, b);
            let predicted = predict(b);
            rows.push(VerifyRow {
                batch: b,
                in_flight,
                predicted_bytes: predicted,
                measured_bytes: measured,
                error: (measured as f64 - predicted as f64) / predicted as f64,
            });
        }
    }
    let device = if runtime.provider().on_gpu() {
        crate::gpu::probe(req.engine.gpu.device_id as usize).ok().flatten()
    } else {
        None
    };
    Ok(PlanReport::Inference(Box::new(InferencePlan {
        provider: runtime.provider().ort_name().into(),
        provider_fallbacks: runtime.fallbacks().to_vec(),
        device,
        auto,
        verify: rows,
        wall,
    })))
}
