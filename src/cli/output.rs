//! What `classify` and `inspect` print and write.

use std::io::IsTerminal;

use anyhow::{Context, Result};

use super::args::TelemetryArgs;
use hsiedge::job::{Job, JobSpec};

/// Prints a report as pretty JSON or as its text form.
pub fn print_report<T: serde::Serialize + std::fmt::Display>(report: &T, json: bool) -> Result<()> {
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(report).context("serialising the report")?
        );
    } else {
        println!("{report}");
    }
    Ok(())
}

// The job's error is returned as built (it names what failed); it is not on a hot path.
#[allow(clippy::result_large_err)]
pub fn classify(spec: JobSpec, json: bool, telemetry: &TelemetryArgs) -> Result<()> {
    use hsiedge::telemetry::{self as tm, JsonLines, LatestSnapshot, MetricsServer, Sink};
    // Checked before the model loads, so a bad path or address fails at once.
    let listener = telemetry.metrics.as_deref().map(tm::http::bind_local).transpose()?;
    telemetry
        .telemetry
        .as_deref()
        .map(JsonLines::check_writable)
        .transpose()?;
    let mut job = Job::resolve(spec)?;
    // Created (emptied) only once it is known not to be an input or a file of the output set.
    if let Some(path) = telemetry.telemetry.as_deref() {
        job.check_side_file("--telemetry", path)?;
    }
    let mut jsonl = telemetry.telemetry.as_deref().map(JsonLines::create).transpose()?;
    let total = job.cube.lines() * job.cube.samples();
    let bar = if std::io::stderr().is_terminal() && !json {
        let b = indicatif::ProgressBar::new(total as u64);
        b.set_style(
            indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} px {per_sec} eta {eta}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        Some(b)
    } else {
        None
    };
    let mut latest = LatestSnapshot::new();
    let server = match listener {
        Some(l) => {
            let server = MetricsServer::start(l, latest.clone())?;
            eprintln!("hsiedge: metrics on http://{}/metrics", server.addr());
            Some(server)
        }
        None => None,
    };
    let summary = if jsonl.is_some() || server.is_some() {
        let mut sampler = tm::Sampler::discover(std::path::Path::new("/"), true);
        let info = tm::RunInfo {
            batch: job.run.batch as u64,
            batch_reason: match &job.plan {
                Some(auto) => format!("auto: {}", auto.plan.limited_by),
                None => "fixed".into(),
            },
            pixels_total: Some(total as u64),
            provider: job.runtime.provider().ort_name().into(),
            provider_fallbacks: job.runtime.fallbacks().iter().map(ToString::to_string).collect(),
        };
        let mut sinks: Vec<&mut dyn Sink> = Vec::new();
        if let Some(f) = jsonl.as_mut() {
            sinks.push(f);
        }
        if server.is_some() {
            sinks.push(&mut latest);
        }
        let (result, outcome) = tm::run(&tm::TelemetryConfig::default(), &mut sampler, info, &mut sinks, |rec| {
            infer_and_write(&mut job, bar.as_ref(), Some(rec))
        });
        let outcome = outcome?;
        for n in &outcome.notices {
            eprintln!("hsiedge: telemetry: {n}");
        }
        for e in &outcome.sink_errors {
            eprintln!("hsiedge: warning: telemetry stopped writing to {e}");
        }
        result?
    } else {
        infer_and_write(&mut job, bar.as_ref(), None)?
    };
    if let Some(server) = server {
        server.stop();
    }
    if summary.nonfinite_pixels > 0 {
        eprintln!(
            "warning: {} pixels got a NaN or infinite model output (a non-finite value in {} or a \
             model overflow); they are class 0 (unclassified) with NaN confidence",
            summary.nonfinite_pixels,
            summary.scene.display()
        );
    }
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&summary).context("serialising the summary")?
        );
    } else {
        println!(
            "{} pixels in {:.3} s ({:.0} px/s), mode {:?}, batch {}, model {}",
            summary.pixels, summary.elapsed_s, summary.pixels_per_s, summary.mode, summary.batch, summary.model
        );
        if let Some(a) = &summary.accuracy {
            println!(
                "overall accuracy {:.2} % ({} of {} labelled pixels)",
                a.overall_accuracy * 100.0,
                a.correct,
                a.labelled_pixels
            );
        }
        println!("maps in {}", job.spec.out.display());
    }
    Ok(())
}

/// Runs the job and writes its maps, showing progress on `bar` and recording each batch on
/// `rec`; telemetry's final snapshot is taken while the maps are written.
#[allow(clippy::result_large_err)]
fn infer_and_write(
    job: &mut Job,
    bar: Option<&indicatif::ProgressBar>,
    mut rec: Option<&mut hsiedge::telemetry::Recorder<'_>>,
) -> Result<hsiedge::job::Summary, hsiedge::job::JobError> {
    let (maps, stats) = job.infer(&mut |done| {
        if let Some(b) = bar {
            b.set_position(done.pixels_done as u64);
        }
        if let Some(r) = rec.as_deref_mut() {
            r.record(done);
        }
    })?;
    if let Some(r) = rec {
        r.end();
    }
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    job.write(&maps, &stats)
}

pub fn inspect(file: &std::path::Path) -> Result<()> {
    let is_json = file.extension().is_some_and(|e| e.eq_ignore_ascii_case("json"));
    if is_json {
        let m = hsiedge::model::Manifest::load(file)?;
        println!(
            "{}",
            serde_json::to_string_pretty(&m).context("serialising the manifest")?
        );
    } else {
        let (h, warnings) = hsiedge::cube::Header::read_with_warnings(&hsiedge::cube::header_path_for(file))?;
        for w in warnings {
            eprintln!("hsiedge: warning: {w}");
        }
        println!(
            "{}",
            serde_json::to_string_pretty(&h).context("serialising the header")?
        );
    }
    Ok(())
}
