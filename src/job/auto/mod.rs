//! `--batch auto`: the memory plan of a run (graph prior, calibration, cached knee); `governor`
//! re-plans it between batches.

use super::*;
use crate::budget::knee::SweepPoint;
use crate::budget::plateau::SweepOutcome;

/// How much more than the graph's activation peak a run really holds per unit (im2col and
/// convolution workspaces): measured 2.2-4.3x on the shipped models by `hsiedge plan`, rounded up.
pub const PRIOR_WORKSPACE_FACTOR: u64 = 5;

/// The largest device-memory probe of a per-pixel model, samples: large enough that its batch's
/// memory stands well above the allocator's noise, small enough to take a fraction of a second.
pub const DEVICE_PROBE_MAX_SAMPLES: u64 = 4096;

/// The scene facts the memory plan needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SceneGeometry {
    /// Lines.
    pub lines: usize,
    /// Samples per line.
    pub samples: usize,
    /// Bands.
    pub bands: usize,
    /// Bytes of the mapped data file. Its pages are clean page cache the kernel reclaims under
    /// pressure, so the plan does not count them; they are reported only.
    pub data_bytes: u64,
    /// Bytes of one stored sample (the file's data type).
    pub sample_bytes: usize,
}

impl SceneGeometry {
    /// The geometry of an opened cube.
    pub fn of(cube: &Cube) -> Self {
        Self {
            lines: cube.lines(),
            samples: cube.samples(),
            bands: cube.bands(),
            data_bytes: std::fs::metadata(cube.data_path()).map_or(0, |m| m.len()),
            sample_bytes: cube.header().data_type.size(),
        }
    }
}

/// How `--batch auto` chose: the calibrated cost, the timings behind the knee, the plan.
#[derive(Debug, Clone, serde::Serialize)]
pub struct AutoBatch {
    /// The plan (budget sources, which binds, cost breakdown, `batch_safe` and what bound it,
    /// predicted peak).
    pub plan: Plan,
    /// The measured runs the cost was fitted to.
    pub calibration: Option<Calibration>,
    /// Seconds the calibration runs took (they also time their batch sizes for the sweep).
    pub calibration_s: f64,
    /// The in-run batch sweep (the timings behind the knee), when it ran: not with a cached
    /// sweep's knee, nor with `--no-knee`, nor without a scene.
    pub sweep: Option<SweepOutcome>,
    /// Bytes per unit the pipeline adds besides one run (queued input batches), at `batch_safe`.
    pub pipeline_bytes_per_unit: u64,
    /// Bytes per unit of one run (its input, the engine's activations and workspaces, its output).
    pub run_bytes_per_unit: u64,
    /// Fixed bytes the pipeline adds (maps, tile window).
    pub pipeline_fixed_bytes: u64,
    /// The cached sweep whose knee capped the batch, when one applied.
    pub knee_file: Option<PathBuf>,
    /// A GPU provider's device memory: its budget, the fitted device cost, the batch it allows
    /// and the predicted device peak at the chosen batch.
    pub device: Option<budget::device::DevicePlan>,
}

/// The in-run sweep times a batch size only if the scene holds at least this many batches of it
/// (one untimed, then the fewest timed runs any size gets): a larger batch could not be timed as
/// well, and leaves the tiling thread little to overlap with the engine.
pub const SWEEP_SCENE_BATCHES: u64 = budget::plateau::MIN_TIMED_BATCHES as u64 + 1;

/// The in-run sweep may spend this share of the run's predicted time timing sizes of its own...
pub const SWEEP_BUDGET_SHARE: f64 = 0.05;

/// ... or this many seconds, whichever is more.
pub const SWEEP_BUDGET_MIN_S: f64 = 0.5;

/// Plans `--batch auto`: sizes the graph, reads the system budget, measures two or three small
/// batches to fit `M(B) = M_fixed + a*B`, adds what the pipeline itself holds, and applies
/// `B_safe = floor((budget*(1 - r_frag) - M_fixed) / a)`, capped by `--max-batch` and the scene.
/// Then the batch is the plateau knee below that ceiling: a cached sweep's (`knee`), else the
/// in-run sweep's (the smallest batch within 5 % of the best measured throughput; the
/// calibration runs are timed too), unless `settings.sweep` is off. Fails before inference when
/// not even one unit fits.
pub fn auto_batch(
    cube: &SceneGeometry,
    scene: Option<&Cube>,
    manifest: &Manifest,
    graph: &mut Graph,
    run: &RunOptions,
    settings: &BudgetSettings,
    knee: Option<(u64, PathBuf)>,
) -> Result<AutoBatch, JobError> {
    let root = settings.root.as_path();
    let grid = crate::tile::TileGrid::new(cube.lines, cube.samples, run.tile, manifest.halo);
    let bands = cube.bands;
    let (unit, in_per_unit, gcost, prior) = graph_prior(cube, manifest, graph, run)?;
    let cfg = |own_bytes| BudgetConfig {
        reserve_bytes: settings.reserve_bytes,
        own_bytes,
        device: None,
    };
    let own = anon_bytes(root);
    let system = budget::read_system_budget(root, &cfg(own))?;
    // The graph prior misses runtime workspaces (measured 2-5x short on the shipped models), so a
    // calibration run is made only where eight times the prior's per-unit cost fits on top of what
    // the process holds now: calibration never nears the wall.
    // Samples are sized so each probe holds about 8, 32 and 96 MiB by the prior (at least 8, 32, 128
    // samples): a cheap per-pixel model needs thousands of samples before its slope rises above the
    // allocator's noise. No size exceeds the scene.
    let in_bytes = (in_per_unit * 4) as u64;
    let out_bytes = match run.mode {
        Mode::Patch => manifest.classes() as u64 * 4,
        Mode::Dense => (manifest.classes() * grid.tile_h * grid.tile_w * 4) as u64,
    };
    let pixels = (cube.lines * cube.samples) as u64;
    let scene_units = match run.mode {
        Mode::Patch => pixels,
        Mode::Dense => grid.len() as u64,
    };
    let in_flight_at = |b: u64| extra_buffers(run.queue, scene_units, b);
    let sample_sizes = {
        let per = prior.per_unit_bytes.saturating_mul(PRIOR_WORKSPACE_FACTOR).max(1);
        let room = pixels.max(1);
        let mut v: Vec<u64> = [(8u64 << 20, 8u64), (32 << 20, 32), (96 << 20, 128)]
            .iter()
            .map(|&(t, min)| (t / per).max(min).min(room))
            .collect();
        v.dedup();
        if v.len() < 3 {
            // A small scene caps every size at its room: spread them below it instead.
            v = [room / 9, room / 3, room].iter().map(|&b| b.max(1)).collect();
            v.dedup();
        }
        v
    };
    // A GPU provider's session holds device memory RSS does not see: each probe's device peak
    // over what was in use before it is measured beside its host peak.
    let gpu = graph.device();
    let device_before = gpu.and_then(|(d, _)| crate::gpu::probe(d as usize).ok().flatten());
    let device_room = device_before
        .as_ref()
        .filter(|d| !d.integrated)
        .map(|d| gpu.and_then(|(_, l)| l).map_or(d.free_bytes, |l| l.min(d.free_bytes)));
    let fits_host = |b: u64| own.saturating_add(prior.per_unit_bytes.saturating_mul(8 * b)) <= system.budget_bytes;
    let fits = |b: u64| {
        fits_host(b)
            // On a GPU a probe must also fit the device (or the arena's bound) by the same margin,
            // and run at all.
            && device_room.is_none_or(|room| prior.per_unit_bytes.saturating_mul(8 * b) <= room)
            && (gpu.is_none() || b <= budget::choose::GPU_MAX_BATCH)
    };
    let sizes = probe_sizes(unit, sample_sizes, scene_units, device_room.is_some(), fits);
    // A discrete GPU's per-pixel model gets device-sized probes (an integrated GPU's memory is the
    // host's, which the calibration probes already measure).
    let device_sizes = match (device_room, unit) {
        (Some(room), Unit::Sample) => device_probe_sizes(
            room,
            prior.per_unit_bytes,
            scene_units,
            sizes.iter().copied().max().unwrap_or(0),
        )
        .into_iter()
        .filter(|&b| fits_host(b))
        .collect::<Vec<_>>(),
        _ => Vec::new(),
    };
    // Calibration runs the real pipeline (producer, queue, engine) for a few batches at each small
    // size on the scene itself, so in-flight batches, the tile window and allocator behaviour are
    // all in the measured peak. Its batches are timed too: they are the in-run sweep's first points.
    // Each probe runs long enough (at least `queue + 3` batches and 2048 samples or 8 tiles) for
    // the runtime's per-thread allocator heaps to reach their steady size.
    let probe_units: u64 = if unit == Unit::Sample { 2048 } else { 8 };
    let mut device_samples: Vec<(u64, u64)> = Vec::new();
    let mut timed: Vec<SweepPoint> = Vec::new();
    let calibration_started = std::time::Instant::now();
    let calibration = match (scene, sizes.len() >= 2) {
        (Some(cube), true) => {
            let cal = budget::calibrate(unit, &sizes, |b| -> Result<u64, JobError> {
                let opts = RunOptions {
                    batch: usize::try_from(b).unwrap_or(1),
                    ..run.clone()
                };
                budget::reset_process_hwm(root)?;
                let device = match &device_before {
                    Some(d) => crate::gpu::memory::PeakSampler::start(d.ordinal).ok().flatten(),
                    None => None,
                };
                let (result, sampled) = with_peak_anon(root, || {
                    let batches = (run.queue + 3).max(usize::try_from(probe_units.div_ceil(b)).unwrap_or(1));
                    pipeline::probe(cube, manifest, graph, &opts, batches)
                });
                // A batch larger than the scene runs at the scene's size: timed as what it is.
                let ran = b.min(scene_units);
                if let Some(d) = device {
                    device_samples.push((ran, d.stop_added()));
                }
                if let Some(p) = budget::plateau::point_from_runs(ran, &result?) {
                    budget::plateau::put(&mut timed, p);
                }
                // The buffers in flight besides the running one (all faulted in at the start) are
                // taken out, so the fit is the run's own cost and the plan can add the count the
                // chosen batch will have.
                Ok(sampled
                    .max(hwm_anon_bound(root)?)
                    .saturating_sub(in_flight_at(b) * in_bytes * b))
            })?;
            Some(cal)
        }
        _ => None,
    };
    if let (Some(d), Some(cube), false) = (&device_before, scene, device_sizes.is_empty()) {
        let mut samples = Vec::with_capacity(device_sizes.len());
        for &b in &device_sizes {
            let opts = RunOptions {
                batch: usize::try_from(b).unwrap_or(1),
                ..run.clone()
            };
            let Some(sampler) = crate::gpu::memory::PeakSampler::start(d.ordinal).ok().flatten() else {
                break;
            };
            pipeline::probe(cube, manifest, graph, &opts, run.queue + 3)?;
            samples.push((b, sampler.stop_added()));
        }
        if samples.len() == device_sizes.len() {
            device_samples = samples;
        }
    }
    let calibration_s = calibration_started.elapsed().as_secs_f64();
    // Without calibration, the prior's per-unit cost is scaled by the largest workspace factor
    // measured on the shipped models, so the plan errs towards smaller batches.
    let (measured, measured_fixed_pipeline) = match &calibration {
        Some(c) => (
            CostModel {
                // A run holds at least its own input and output, whatever the fit's noise says.
                per_unit_bytes: c.model.per_unit_bytes.max(in_bytes + out_bytes),
                ..c.model.clone()
            },
            true,
        ),
        None => (
            CostModel {
                per_unit_bytes: prior.per_unit_bytes.saturating_mul(PRIOR_WORKSPACE_FACTOR),
                ..prior
            },
            false,
        ),
    };
    let k = manifest.classes() as u64;
    let keeps_scores = run.keep_scores || manifest.task == Task::Abundance;
    let maps = pixels * (1 + 4 + 1) + if keeps_scores { pixels * k * 4 } else { 0 };
    let window = (bands * grid.window_h() * grid.window_w() * 4) as u64;
    // In-place calibration measured the tile window already (maps come later, at run).
    let pipeline_fixed_bytes = maps + if measured_fixed_pipeline { 0 } else { window };
    // Besides the batch being run, `queue + 1` more batch buffers are held (queued, and one being
    // built; the pipeline faults them all in at the start), but no more than the scene has batches:
    // M(B) = F + B*run + in*B*(min(q+2, ceil(U/B)) - 1). It rises with B (a run holds at least its
    // own input), so the largest B that fits is found by bisection; the plan reports the straight
    // line through M(batch_safe).
    let fixed = measured.fixed_bytes + pipeline_fixed_bytes;
    let run_bytes = measured.per_unit_bytes;
    let peak_at = |b: u64| {
        fixed.saturating_add(b.saturating_mul(run_bytes)).saturating_add(
            in_bytes
                .saturating_mul(b)
                .saturating_mul(extra_buffers(run.queue, scene_units, b)),
        )
    };
    let mut device = device_before.map(|d| {
        let used = d.total_bytes.saturating_sub(d.free_bytes);
        let samples = std::mem::take(&mut device_samples);
        if d.integrated {
            budget::device::DevicePlan::shared(used, samples)
        } else {
            let limit = gpu.and_then(|(_, l)| l);
            // The probes' session copies each batch's input to the device and its output back
            // through its arena: the device path's bound input and output take their place, so
            // they are not charged again (measured on an H100: 300 MB a 256-pixel tile in the
            // probes, 414 MB in the device path, whose raw slots are the 115 MB between). The
            // device path's two raw-window slots (one preprocessed while the next is uploaded)
            // are its own: per unit in dense mode, one window each (and the planar window) in
            // patch mode.
            let raw_window = (bands * grid.window_h() * grid.window_w() * cube.sample_bytes) as u64;
            let (raw_unit, raw_fixed) = match run.mode {
                Mode::Dense => (2 * raw_window, 0),
                Mode::Patch => (0, 2 * raw_window + window),
            };
            let samples = samples
                .into_iter()
                .map(|(b, m)| (b, m + raw_unit * b + raw_fixed))
                .collect();
            budget::device::DevicePlan::discrete(d.free_bytes, limit, used, samples, settings.frag_margin)
                .at_least_per_unit(prior.per_unit_bytes + raw_unit)
        }
    });
    // On an integrated GPU the device's memory is the host's: its line joins the host's cost.
    let shared = device
        .as_ref()
        .filter(|d| d.source == budget::device::DeviceSource::Shared)
        .cloned();
    let peak_at = |b: u64| peak_at(b).saturating_add(shared.as_ref().map_or(0, |d| d.added_at(b)));
    let frag_margin_bytes = ((system.budget_bytes as f64) * settings.frag_margin).ceil() as u64;
    let usable = system.budget_bytes.saturating_sub(frag_margin_bytes);
    let (mut lo, mut hi) = (0u64, 1u64 << 48);
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        if peak_at(mid) <= usable {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    let host_units = lo;
    let device_units = device.as_ref().map_or(u64::MAX, |d| d.units_safe);
    let memory_units = host_units.min(device_units);
    let gpu_units = match gpu {
        Some(_) => budget::choose::GPU_MAX_BATCH,
        None => u64::MAX,
    };
    let mut choose = ChooseConfig {
        frag_margin: settings.frag_margin,
        max_units: settings.max_units,
        scene_units: Some(scene_units.max(1)),
        knee: knee.as_ref().map(|(k, _)| *k),
    };
    let ceiling = budget::choose::cap_gpu(memory_units, gpu_units, unit, &choose).ceiling;
    // The in-run sweep: only below a ceiling that fits, with a scene to run, and no cached knee.
    let sweep = match scene {
        Some(cube) if ceiling > 0 && choose.knee.is_none() && settings.sweep => {
            let max_batch = ceiling.min((scene_units / SWEEP_SCENE_BATCHES).max(1));
            let best = timed.iter().map(|p| p.per_unit_s).fold(f64::INFINITY, f64::min);
            let predicted_run_s = if best.is_finite() {
                best * scene_units as f64
            } else {
                0.0
            };
            let limits = budget::plateau::SweepLimits {
                max_batch,
                budget_s: (predicted_run_s * SWEEP_BUDGET_SHARE).max(SWEEP_BUDGET_MIN_S),
            };
            let out = budget::plateau::sweep(timed, limits, |b, n| -> Result<_, JobError> {
                let opts = RunOptions {
                    batch: usize::try_from(b).unwrap_or(1),
                    ..run.clone()
                };
                let t = std::time::Instant::now();
                let runs = pipeline::probe(cube, manifest, graph, &opts, n)?;
                Ok((budget::plateau::point_from_runs(b, &runs), t.elapsed().as_secs_f64()))
            })?;
            choose.knee = out.pick.map(|p| p.batch);
            Some(out)
        }
        _ => None,
    };
    let capped = budget::choose::cap_gpu(memory_units, gpu_units, unit, &choose);
    let mut limited_by = capped.limited_by;
    if let Some(s) = &sweep
        && limited_by == budget::Limit::Knee
        && !s.confirmed
        && s.pick.is_some_and(|p| p.batch == s.limits.max_batch)
        && s.limits.max_batch < capped.ceiling
    {
        // The sweep was still gaining at the largest size the scene lets it time: the scene bound it.
        limited_by = match unit {
            Unit::Sample => budget::Limit::Scene,
            Unit::Tile => budget::Limit::Tiles,
        };
    }
    let batch = capped.units;
    if let Some(d) = device.as_mut() {
        d.chose(batch, device_units < host_units && limited_by == budget::Limit::Memory);
    }
    let per_unit_bytes = if batch > 0 {
        (peak_at(batch) - fixed).div_ceil(batch)
    } else {
        run_bytes + (run.queue as u64 + 1) * in_bytes
    };
    let cost = CostModel {
        fixed_bytes: fixed,
        per_unit_bytes,
        ..measured.clone()
    };
    let choice = budget::Choice {
        unit,
        units_safe: batch,
        memory_units,
        limited_by,
        ceiling_units: capped.ceiling,
        ceiling_limited_by: capped.ceiling_limited_by,
        budget_bytes: system.budget_bytes,
        frag_margin_bytes,
        usable_bytes: usable,
        predicted_peak_bytes: peak_at(batch),
    };
    let mut plan = Plan::from_choice(&system, &cost, Some(&gcost), &choose, &choice)?;
    let pipeline_bytes_per_unit = per_unit_bytes - run_bytes;
    plan.mode = match run.mode {
        Mode::Patch => "patch".into(),
        Mode::Dense => "dense".into(),
    };
    Ok(AutoBatch {
        plan,
        calibration,
        calibration_s,
        sweep,
        pipeline_bytes_per_unit,
        run_bytes_per_unit: run_bytes,
        pipeline_fixed_bytes,
        knee_file: knee.map(|(_, p)| p),
        device,
    })
}

/// What a unit of the batch is, its input floats, and the graph's own cost model for the scene's
/// shapes (a lower bound: the runtime's workspaces come on top).
pub(super) fn graph_prior(
    cube: &SceneGeometry,
    manifest: &Manifest,
    graph: &Graph,
    run: &RunOptions,
) -> Result<(Unit, usize, graph::GraphCost, CostModel), JobError> {
    let grid = crate::tile::TileGrid::new(cube.lines, cube.samples, run.tile, manifest.halo);
    let (unit, in_per_unit, bindings) = match run.mode {
        Mode::Patch => (
            Unit::Sample,
            cube.bands * manifest.patch * manifest.patch,
            ShapeBindings::default(),
        ),
        Mode::Dense => {
            let model = graph::load_model(graph.path())?;
            let b = ShapeBindings::dense_tile(&model, grid.tile_h as u64, grid.tile_w as u64, grid.halo as u64);
            (Unit::Tile, cube.bands * grid.window_h() * grid.window_w(), b)
        }
    };
    let gcost = graph::analyse_file(graph.path(), &bindings)?;
    let prior = CostModel::from_graph(&gcost, unit, budget::DEFAULT_RUNTIME_OVERHEAD_BYTES);
    Ok((unit, in_per_unit, gcost, prior))
}

/// The calibration probes' batch sizes: a per-pixel model's `sample_sizes`, or 1, 4 and 8 tiles,
/// each kept only where it `fits` by the calibration margin, and none above the scene's units. On a discrete GPU (`on_device`),
/// where 4 tiles do not fit (a small arena bound), 1 and 2 still give the device line; on the
/// host, a budget that tight keeps the graph's prior instead.
fn probe_sizes(
    unit: Unit,
    sample_sizes: Vec<u64>,
    scene_units: u64,
    on_device: bool,
    fits: impl Fn(u64) -> bool,
) -> Vec<u64> {
    let mut v: Vec<u64> = match unit {
        Unit::Sample => sample_sizes.into_iter().filter(|&b| fits(b)).collect(),
        Unit::Tile if on_device && !fits(4) => [1u64, 2].into_iter().filter(|&b| fits(b)).collect(),
        Unit::Tile => [1u64, 4, 8].into_iter().filter(|&b| fits(b)).collect(),
    };
    // A probe larger than the scene runs at the scene's size, so it is asked at that size: fitted
    // at a size it did not run, it would flatten the line.
    for b in &mut v {
        *b = (*b).min(scene_units.max(1));
    }
    v.dedup();
    v
}

/// A per-pixel model's device-memory probes. Sized for the host's allocator noise, its
/// calibration probes add tens of MiB on the device, inside what the device allocator and cuDNN
/// already hold, and their slope is noise. Two more probes measure the device line: the largest
/// power of two whose prior cost fits `room` eight times over (at most
/// [`DEVICE_PROBE_MAX_SAMPLES`] and the scene's `scene_units`), and a quarter of it. None when
/// they would be no larger than the host's probes (`largest_host`).
fn device_probe_sizes(room: u64, prior_per_unit: u64, scene_units: u64, largest_host: u64) -> Vec<u64> {
    let top = (room / prior_per_unit.saturating_mul(8).max(1))
        .min(DEVICE_PROBE_MAX_SAMPLES)
        .min(scene_units);
    let top = top.checked_ilog2().map_or(0, |e| 1u64 << e);
    if top / 4 > largest_host {
        vec![top / 4, top]
    } else {
        Vec::new()
    }
}

/// Batch buffers a run holds besides the running batch's: the pipeline's pool limit less one.
pub(super) fn extra_buffers(queue: usize, units: u64, b: u64) -> u64 {
    let (units, b) = (
        usize::try_from(units).unwrap_or(usize::MAX),
        usize::try_from(b).unwrap_or(usize::MAX),
    );
    pipeline::BufferPool::run_limit(queue, units, b) as u64 - 1
}

/// What a batch sweep of this model must match to apply here.
pub fn sweep_key(
    manifest: &Manifest,
    graph_path: &Path,
    mode: Mode,
    tile: usize,
    engine: &crate::engine::EngineOptions,
    runtime: &Runtime,
    root: &Path,
) -> Result<budget::knee::SweepKey, JobError> {
    let bytes = std::fs::read(graph_path).map_err(|source| JobError::Read {
        path: graph_path.to_path_buf(),
        source,
    })?;
    let (cpu, cpus) = budget::knee::cpu_identity(root);
    Ok(budget::knee::SweepKey {
        model: manifest.name.clone(),
        graph_hash: format!("{:016x}", budget::knee::fnv1a(&bytes)),
        mode: match mode {
            Mode::Patch => "patch".into(),
            Mode::Dense => "dense".into(),
        },
        tile: (mode == Mode::Dense).then_some(tile),
        provider: runtime.provider().ort_name().into(),
        threads: engine.threads,
        onnxruntime: runtime.build_info(),
        cpu,
        cpus,
        jetson: budget::detect_jetson(root).and_then(|j| j.model),
        power_mode: budget::knee::power_mode(root),
    })
}

/// The knee of the cached sweep for this run, if there is one. A cache that cannot be read is
/// reported on stderr and ignored: it only ever lowers the batch, so running without it is safe.
pub(super) fn cached_knee(
    manifest: &Manifest,
    graph: &Graph,
    mode: Mode,
    run: &RunOptions,
    engine: &crate::engine::EngineOptions,
    runtime: &Runtime,
    settings: &BudgetSettings,
) -> Option<(u64, PathBuf)> {
    let dir = settings.sweep_cache.as_ref()?;
    let found = sweep_key(manifest, graph.path(), mode, run.tile, engine, runtime, &settings.root)
        .map_err(|e| e.to_string())
        .and_then(|key| budget::knee::load(dir, &key).map_err(|e| e.to_string()));
    match found {
        Ok(Some((record, path))) => record.knee.map(|k| (k, path)),
        Ok(None) => None,
        Err(e) => {
            eprintln!("hsiedge: warning: ignoring the batch sweep cache: {e}");
            None
        }
    }
}

/// This process's anonymous resident memory (`RssAnon`): what the cost model counts. File-backed
/// pages (the mapped scene, the ONNX Runtime library) are reclaimable and stay out of it.
pub fn anon_bytes(root: &Path) -> u64 {
    status_kib(root, "RssAnon:")
}

/// A `kB` field of `/proc/self/status`, in bytes (0 when absent).
pub(super) fn status_kib(root: &Path, field: &str) -> u64 {
    std::fs::read_to_string(root.join("proc/self/status")).map_or(0, |text| kib_field(&text, field))
}

/// A `kB` field of the text of a `status` file, in bytes (0 when absent).
pub(super) fn kib_field(text: &str, field: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kib| kib * 1024)
}

/// The resident high-water mark less the file and shared pages mapped now: a lower bound of the
/// anonymous peak since the mark was reset (the mapped scene's pages only grow during a run), which
/// catches a peak shorter than the sampling period.
pub(super) fn hwm_anon_bound(root: &Path) -> Result<u64, BudgetError> {
    let hwm = budget::read_process_hwm(root)?;
    let text = std::fs::read_to_string(root.join("proc/self/status")).unwrap_or_default();
    Ok(hwm.saturating_sub(kib_field(&text, "RssFile:") + kib_field(&text, "RssShmem:")))
}

/// Runs `f` while a thread samples this process's `RssAnon` every 2 ms; returns its result and the
/// peak sampled. Sampling catches the peak without counting the mapped scene's (reclaimable)
/// pages; the calibration probes use it (a timed run samples on its own thread, see
/// [`Job::infer`]). The high-water-mark bound the callers add catches a peak between samples.
pub fn with_peak_anon<T>(root: &Path, f: impl FnOnce() -> T) -> (T, u64) {
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        let sampler = scope.spawn(|| {
            let mut peak = anon_bytes(root);
            while !done.load(std::sync::atomic::Ordering::Acquire) {
                peak = peak.max(anon_bytes(root));
                // Parked rather than asleep, so the end of `f` wakes it at once and the caller
                // does not wait out a sampling period.
                std::thread::park_timeout(PEAK_SAMPLE_PERIOD);
            }
            peak.max(anon_bytes(root))
        });
        let result = f();
        done.store(true, std::sync::atomic::Ordering::Release);
        sampler.thread().unpark();
        (result, sampler.join().unwrap_or(0))
    })
}

#[cfg(test)]
mod tests;
