//! `hsiedge bench auto`: does `--batch auto` reach the plateau, and at what memory?
//!
//! For one model, scene and mode: B_safe is planned without a knee (memory, `--max-batch`, the
//! scene), then `hsiedge classify` runs at every power of two below it, at B_safe itself and at
//! `--batch auto` (with an empty sweep cache, so the in-run sweep decides), each in a fresh
//! process (what one run leaves in the allocator cannot weigh on the next). The runs are
//! interleaved, one of each per repetition in an order rotated from one repetition to the next,
//! and every number is a median over repetitions: auto's throughput against the best fixed
//! batch's (and the median of the per-repetition ratios), its peak memory against B_safe's, and
//! its start-up cost (calibration and sweep) against a fixed batch's.

use std::path::{Path, PathBuf};

use crate::budget::Limit;
use crate::engine::EngineOptions;
use crate::job::{BudgetSettings, InferencePlan, JobError, ModeChoice, PlanReport, PlanRequest};
use crate::pipeline::Mode;

use super::{BenchError, median, quartiles};

/// Settings of `bench auto`.
#[derive(Debug, Clone)]
pub struct AutoBenchOptions {
    /// The scene's header.
    pub scene: PathBuf,
    /// Model manifest.
    pub manifest: PathBuf,
    /// Mode (auto: dense when the model has a dense twin).
    pub mode: ModeChoice,
    /// Tile side.
    pub tile: usize,
    /// Engine settings (the runs get the same library and thread count).
    pub engine: EngineOptions,
    /// Repetitions of every configuration.
    pub repeat: usize,
}

/// One `hsiedge classify` run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct AutoRun {
    /// The batch it ran at.
    pub batch: u64,
    /// Pixels per second of the pipeline (read, tile, infer, stitch; not start-up, not writing).
    pub pixels_per_s: f64,
    /// Peak anonymous memory of the run.
    pub peak_anon_bytes: u64,
    /// Start-up seconds (scene, model, session; with `--batch auto` calibration and sweep too).
    pub load_s: f64,
    /// `--batch auto`: what bound the batch.
    pub limited_by: Option<Limit>,
    /// `--batch auto`: seconds its sweep spent on sizes of its own.
    pub sweep_s: Option<f64>,
    /// `--batch auto`: seconds its calibration took.
    pub calibration_s: Option<f64>,
}

/// One configuration (a fixed batch, or auto) over the repetitions.
#[derive(Debug, Clone, serde::Serialize)]
pub struct AutoConfig {
    /// `1`, `2`, ... or `auto`.
    pub batch: String,
    /// Median pixels per second.
    pub pixels_per_s: f64,
    /// Its quartiles.
    pub pixels_per_s_quartiles: [f64; 2],
    /// Median peak anonymous memory.
    pub peak_anon_bytes: u64,
    /// Median start-up seconds.
    pub load_s: f64,
    /// Every run, in repetition order.
    pub runs: Vec<AutoRun>,
}

/// Result of `bench auto`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct AutoBench {
    /// Scene header.
    pub scene: PathBuf,
    /// Model name.
    pub model: String,
    /// Mode run.
    pub mode: Mode,
    /// Units in the scene (pixels, or tiles in dense mode).
    pub units: u64,
    /// Intra-op threads the runs used.
    pub threads_used: usize,
    /// Repetitions of every configuration.
    pub repeat: usize,
    /// B_safe: the largest batch memory, `--max-batch` and the scene allow.
    pub b_safe: u64,
    /// What bound it.
    pub b_safe_limited_by: Limit,
    /// The fixed batches: powers of two below B_safe, and B_safe.
    pub fixed: Vec<AutoConfig>,
    /// `--batch auto`.
    pub auto: AutoConfig,
    /// The fixed batch with the highest median throughput.
    pub best_batch: u64,
    /// Auto's median throughput over the best fixed batch's.
    pub auto_over_best: f64,
    /// The median (and quartiles) of auto's throughput over the best batch's in the same
    /// repetition.
    pub auto_over_best_paired: (f64, [f64; 2]),
    /// Auto's median peak memory over B_safe's.
    pub auto_memory_over_b_safe: f64,
    /// The same above batch 1's peak: `(auto - batch 1) / (B_safe - batch 1)`, the share of what
    /// B_safe adds over the smallest batch that auto spends (the process's own memory, session
    /// and maps, is in both and can dominate `auto_memory_over_b_safe`); 0 when B_safe is 1.
    pub auto_batch_memory_over_b_safe: f64,
    /// Auto's median start-up over the median start-up of the fixed batches: what calibration
    /// and the sweep add.
    pub auto_added_startup_s: f64,
    /// `/proc/loadavg` before and after (the machine is shared).
    pub load_average: [String; 2],
}

/// Runs the benchmark.
pub fn auto(opts: &AutoBenchOptions) -> Result<AutoBench, BenchError> {
    if opts.repeat == 0 {
        return Err(BenchError::Setting("--repeat must be at least 1".into()));
    }
    let loadavg = || std::fs::read_to_string("/proc/loadavg").map_or_else(|_| "?".into(), |s| s.trim().to_string());
    let load_before = loadavg();
    let req = PlanRequest {
        manifest: opts.manifest.clone(),
        scene: Some(opts.scene.clone()),
        mode: opts.mode,
        tile: opts.tile,
        engine: opts.engine.clone(),
        budget: BudgetSettings {
            sweep: false,
            sweep_cache: None,
            ..BudgetSettings::default()
        },
        train: None,
        verify: false,
        probe_wall: false,
    };
    let PlanReport::Inference(planned) = crate::job::plan(&req)? else {
        return Err(BenchError::Setting("bench auto plans inference, not training".into()));
    };
    let InferencePlan { auto: planned, .. } = *planned;
    let plan = planned.plan;
    let mode = if plan.mode == "dense" { Mode::Dense } else { Mode::Patch };
    let b_safe = plan.batch_ceiling.max(1);
    let mut batches: Vec<u64> = std::iter::successors(Some(1u64), |b| b.checked_mul(2))
        .take_while(|&b| b < b_safe)
        .collect();
    batches.push(b_safe);
    let manifest = crate::model::Manifest::load(&opts.manifest).map_err(JobError::from)?;
    let cube = crate::cube::Cube::open(&opts.scene).map_err(JobError::from)?;
    let units = match mode {
        Mode::Patch => (cube.lines() * cube.samples()) as u64,
        Mode::Dense => crate::tile::TileGrid::new(cube.lines(), cube.samples(), opts.tile, manifest.halo).len() as u64,
    };
    let exe = std::env::current_exe().map_err(|e| BenchError::Setting(format!("finding hsiedge itself: {e}")))?;
    let tmp = tempfile::tempdir().map_err(BenchError::Temp)?;
    let cache = tmp.path().join("empty-sweep-cache");
    let labels: Vec<Option<u64>> = batches.iter().map(|&b| Some(b)).chain([None]).collect();
    let mut runs: Vec<Vec<AutoRun>> = vec![Vec::new(); labels.len()];
    for rep in 0..opts.repeat {
        for k in 0..labels.len() {
            let i = (k + rep) % labels.len();
            let out = tmp.path().join(format!("r{rep}-{i}"));
            let run = classify(&exe, opts, mode, labels[i], &out, &cache)?;
            runs[i].push(run);
            // Each run's maps go now: a large scene's outputs would otherwise pile up.
            let _ = std::fs::remove_dir_all(&out);
        }
    }
    let configs: Vec<AutoConfig> = labels
        .iter()
        .zip(runs)
        .map(|(label, runs)| summarise(label.map_or_else(|| "auto".into(), |b| b.to_string()), runs))
        .collect();
    let (fixed, auto) = configs.split_at(configs.len() - 1);
    let auto = auto[0].clone();
    let best = fixed
        .iter()
        .enumerate()
        .max_by(|a, b| a.1.pixels_per_s.total_cmp(&b.1.pixels_per_s))
        .map_or(0, |(i, _)| i);
    let paired: Vec<f64> = auto
        .runs
        .iter()
        .zip(&fixed[best].runs)
        .map(|(a, b)| a.pixels_per_s / b.pixels_per_s.max(1e-9))
        .collect();
    let fixed_load = median(&fixed.iter().map(|c| c.load_s).collect::<Vec<_>>());
    let b_safe_config = &fixed[fixed.len() - 1];
    Ok(AutoBench {
        scene: opts.scene.clone(),
        model: manifest.name,
        mode,
        units,
        threads_used: super::sweep::threads_used(opts.engine.threads),
        repeat: opts.repeat,
        b_safe,
        b_safe_limited_by: plan.ceiling_limited_by,
        best_batch: batches[best],
        auto_over_best: auto.pixels_per_s / fixed[best].pixels_per_s.max(1e-9),
        auto_over_best_paired: (median(&paired), quartiles(&paired)),
        auto_memory_over_b_safe: auto.peak_anon_bytes as f64 / b_safe_config.peak_anon_bytes.max(1) as f64,
        auto_batch_memory_over_b_safe: {
            let one = fixed[0].peak_anon_bytes as f64;
            let span = b_safe_config.peak_anon_bytes as f64 - one;
            if span > 0.0 {
                (auto.peak_anon_bytes as f64 - one) / span
            } else {
                0.0
            }
        },
        auto_added_startup_s: auto.load_s - fixed_load,
        fixed: fixed.to_vec(),
        auto,
        load_average: [load_before, loadavg()],
    })
}

/// Runs `hsiedge classify` once at `batch` (`None`: auto) and reads its summary.
fn classify(
    exe: &Path,
    opts: &AutoBenchOptions,
    mode: Mode,
    batch: Option<u64>,
    out: &Path,
    cache: &Path,
) -> Result<AutoRun, BenchError> {
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("classify")
        .arg(&opts.scene)
        .arg("--model")
        .arg(&opts.manifest)
        .arg("--out")
        .arg(out)
        .args(["--mode", if mode == Mode::Dense { "dense" } else { "patch" }])
        .args(["--batch", &batch.map_or_else(|| "auto".into(), |b| b.to_string())])
        .args(["--tile", &opts.tile.to_string(), "--json"])
        .arg("--sweep-cache")
        .arg(cache);
    if let Some(lib) = &opts.engine.ort_lib {
        cmd.arg("--ort-lib").arg(lib);
    }
    if opts.engine.threads > 0 {
        cmd.args(["--threads", &opts.engine.threads.to_string()]);
    }
    let line = format!("{cmd:?}");
    let o = cmd
        .output()
        .map_err(|e| BenchError::Setting(format!("running {line}: {e}")))?;
    let fail = |why: String| BenchError::Setting(format!("{line}: {why}"));
    if !o.status.success() {
        return Err(fail(format!(
            "{}: {}",
            o.status,
            String::from_utf8_lossy(&o.stderr).trim()
        )));
    }
    let s: serde_json::Value = serde_json::from_slice(&o.stdout).map_err(|e| fail(format!("summary: {e}")))?;
    let num = |v: &serde_json::Value, name: &str| v.as_f64().ok_or_else(|| fail(format!("summary has no {name}")));
    let plan = &s["batch_plan"];
    Ok(AutoRun {
        batch: s["batch"].as_u64().ok_or_else(|| fail("summary has no batch".into()))?,
        pixels_per_s: num(&s["pixels_per_s"], "pixels_per_s")?,
        peak_anon_bytes: s["peak_anon_bytes"]
            .as_u64()
            .ok_or_else(|| fail("summary has no peak_anon_bytes".into()))?,
        load_s: num(&s["load_s"], "load_s")?,
        limited_by: serde_json::from_value(plan["plan"]["limited_by"].clone()).ok(),
        sweep_s: plan["sweep"]["sweep_s"].as_f64(),
        calibration_s: plan["calibration_s"].as_f64(),
    })
}

/// The medians of one configuration's runs.
fn summarise(batch: String, runs: Vec<AutoRun>) -> AutoConfig {
    let px: Vec<f64> = runs.iter().map(|r| r.pixels_per_s).collect();
    let mut peaks: Vec<u64> = runs.iter().map(|r| r.peak_anon_bytes).collect();
    peaks.sort_unstable();
    AutoConfig {
        batch,
        pixels_per_s: median(&px),
        pixels_per_s_quartiles: quartiles(&px),
        peak_anon_bytes: peaks.get(peaks.len() / 2).copied().unwrap_or(0),
        load_s: median(&runs.iter().map(|r| r.load_s).collect::<Vec<_>>()),
        runs,
    }
}

impl std::fmt::Display for AutoBench {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mib = |b: u64| b as f64 / 1048576.0;
        writeln!(
            f,
            "{} on {} ({:?} mode), {} threads, {} interleaved repetitions; B_safe {} (limited by {})",
            self.model,
            self.scene.display(),
            self.mode,
            self.threads_used,
            self.repeat,
            self.b_safe,
            self.b_safe_limited_by
        )?;
        writeln!(
            f,
            "{:>7} {:>10} {:>21} {:>10} {:>8}",
            "batch", "px/s", "quartiles", "peak MiB", "load s"
        )?;
        for c in self.fixed.iter().chain([&self.auto]) {
            writeln!(
                f,
                "{:>7} {:>10.0} {:>10.0}-{:<10.0} {:>10.1} {:>8.2}",
                c.batch,
                c.pixels_per_s,
                c.pixels_per_s_quartiles[0],
                c.pixels_per_s_quartiles[1],
                mib(c.peak_anon_bytes),
                c.load_s
            )?;
        }
        let chosen: Vec<String> = self
            .auto
            .runs
            .iter()
            .map(|r| match r.limited_by {
                Some(l) => format!("{} ({l})", r.batch),
                None => r.batch.to_string(),
            })
            .collect();
        writeln!(f, "auto chose: {}", chosen.join(", "))?;
        let (p, [q1, q3]) = self.auto_over_best_paired;
        writeln!(
            f,
            "auto/best throughput {:.3} (best: batch {}; per repetition median {p:.3}, quartiles {q1:.3}-{q3:.3})",
            self.auto_over_best, self.best_batch
        )?;
        writeln!(
            f,
            "auto/B_safe memory {:.3} ({:.3} of what B_safe adds over batch 1); auto start-up +{:.2} s over a fixed batch",
            self.auto_memory_over_b_safe, self.auto_batch_memory_over_b_safe, self.auto_added_startup_s
        )?;
        write!(
            f,
            "load average before: {}; after: {}",
            self.load_average[0], self.load_average[1]
        )
    }
}
