//! `bench sweep --plot FILE.svg`: the sweep drawn with `plotters`' SVG backend.
//!
//! One sweep: per-unit time (median, p5-p95 bars) against batch on a log axis with resident memory
//! on a second axis, then throughput against batch; the plateau is shaded, the knee and the
//! budget's predicted wall are marked (the wall as a note at the right edge when it lies beyond
//! the sizes measured). A power-mode sweep: per-unit time against batch, one line per mode, then
//! energy per pixel against mode, one line per batch size.

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;

use super::{BenchError, PowerSweep, SweepOutput, SweepResult};

const SHADE: RGBColor = RGBColor(255, 214, 153);
const KNEE: RGBColor = RGBColor(200, 30, 30);
const WALL: RGBColor = RGBColor(90, 90, 90);
const TIME: RGBColor = RGBColor(31, 119, 180);
const MEMORY: RGBColor = RGBColor(44, 160, 44);
const PALETTE: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

/// Draws `out` into the SVG file `path`.
pub fn write(out: &SweepOutput, path: &Path) -> Result<(), BenchError> {
    let fail = |message: String| BenchError::Plot {
        path: path.to_path_buf(),
        message,
    };
    let root = SVGBackend::new(path, (960, 1040)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(e.to_string()))?;
    let (top, bottom) = root.split_vertically(560);
    match out {
        SweepOutput::Plain(r) => {
            curve(&top, r).map_err(fail)?;
            throughput(&bottom, r).map_err(fail)?;
        }
        SweepOutput::Power(p) => {
            modes_curve(&top, p).map_err(fail)?;
            energy_by_mode(&bottom, p).map_err(fail)?;
        }
        SweepOutput::Plan(_) => return Err(fail("a dry run measures nothing to plot".into())),
    }
    root.present().map_err(|e| fail(e.to_string()))
}

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;

fn unit(r: &SweepResult) -> &'static str {
    if r.record.key.mode == "dense" { "tile" } else { "sample" }
}

/// A log range around `lo..hi` (both positive), a little wider.
fn span(lo: f64, hi: f64) -> std::ops::Range<f64> {
    let (lo, hi) = (lo.max(f64::MIN_POSITIVE), hi.max(lo * 1.0001));
    lo / 1.3..hi * 1.3
}

fn curve(area: &Area<'_>, r: &SweepResult) -> Result<(), String> {
    let u = unit(r);
    let batches: Vec<f64> = r.stats.iter().map(|s| s.batch as f64).collect();
    let (bmin, bmax) = (
        batches.iter().copied().fold(f64::INFINITY, f64::min),
        batches.iter().copied().fold(0.0, f64::max),
    );
    let wall = r.analysis.memory.predicted_wall.map(|w| w as f64);
    // The wall is drawn where it is within 16x of the largest size; farther, it is a note.
    let xmax = match wall {
        Some(w) if w > bmax && w <= bmax * 16.0 => w,
        _ => bmax,
    };
    // Up to the highest p95, but no more than 3x the highest median: one run slowed by a
    // neighbour must not flatten the curve (its bar is cut at the top).
    let top_median = r.stats.iter().map(|s| s.ms_per_unit).fold(0.0, f64::max);
    let yhi = r
        .stats
        .iter()
        .map(|s| s.ms_per_unit_p5_p95[1])
        .fold(0.0, f64::max)
        .min(3.0 * top_median);
    let mem: Vec<(f64, f64)> = r
        .stats
        .iter()
        .filter_map(|s| s.rss_bytes.map(|b| (s.batch as f64, b as f64 / f64::from(1 << 20))))
        .collect();
    let mem_hi = mem.iter().map(|m| m.1).fold(1.0, f64::max) * 1.15;
    let xr = span(bmin, xmax);
    // Linear from 0: a log axis over less than a decade would show no tick labels.
    let yr = 0.0..yhi * 1.1;
    let mut chart = ChartBuilder::on(area)
        .caption(
            format!(
                "{} ({} mode, {} threads): ms per {u} and memory against batch",
                r.record.key.model, r.record.key.mode, r.record.threads_used
            ),
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .right_y_label_area_size(70)
        .build_cartesian_2d(xr.clone().log_scale(), yr.clone())
        .map_err(|e| e.to_string())?
        .set_secondary_coord(xr.clone().log_scale(), 0.0..mem_hi);
    chart
        .configure_mesh()
        .x_desc(format!("batch ({u}s, log)"))
        .y_desc(format!("ms per {u} (median, p5-p95)"))
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y:.3}"))
        .draw()
        .map_err(|e| e.to_string())?;
    chart
        .configure_secondary_axes()
        .y_desc(format!("{} MiB", memory_name(r)))
        .draw()
        .map_err(|e| e.to_string())?;
    if let Some(p) = r.analysis.plateau {
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [(p.from as f64, yr.start), (p.to as f64, yr.end)],
                SHADE.mix(0.5).filled(),
            )))
            .map_err(|e| e.to_string())?
            .label("plateau (|elasticity| < 0.05)")
            .legend(|(x, y)| Rectangle::new([(x, y - 5), (x + 16, y + 5)], SHADE.filled()));
    }
    let pts: Vec<(f64, f64)> = r.stats.iter().map(|s| (s.batch as f64, s.ms_per_unit)).collect();
    chart
        .draw_series(LineSeries::new(pts.clone(), TIME.stroke_width(2)))
        .map_err(|e| e.to_string())?
        .label(format!("ms per {u}"))
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], TIME.stroke_width(2)));
    chart
        .draw_series(r.stats.iter().map(|s| {
            ErrorBar::new_vertical(
                s.batch as f64,
                s.ms_per_unit_p5_p95[0],
                s.ms_per_unit,
                s.ms_per_unit_p5_p95[1],
                TIME.filled(),
                8,
            )
        }))
        .map_err(|e| e.to_string())?;
    if !mem.is_empty() {
        chart
            .draw_secondary_series(LineSeries::new(mem.clone(), MEMORY.stroke_width(2)))
            .map_err(|e| e.to_string())?
            .label(format!("{} (MiB, right axis)", memory_name(r)))
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], MEMORY.stroke_width(2)));
        chart
            .draw_secondary_series(mem.iter().map(|&p| Circle::new(p, 3, MEMORY.filled())))
            .map_err(|e| e.to_string())?;
    }
    if let Some(k) = r.record.knee {
        chart
            .draw_series(std::iter::once(PathElement::new(
                vec![(k as f64, yr.start), (k as f64, yr.end)],
                KNEE.stroke_width(2),
            )))
            .map_err(|e| e.to_string())?
            .label(format!("knee: batch {k}"))
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], KNEE.stroke_width(2)));
    }
    match wall {
        Some(w) if w <= xmax => {
            chart
                .draw_series(std::iter::once(PathElement::new(
                    vec![(w, yr.start), (w, yr.end)],
                    WALL.stroke_width(2),
                )))
                .map_err(|e| e.to_string())?
                .label(format!("predicted memory wall: batch {w:.0}"))
                .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], WALL.stroke_width(2)));
        }
        Some(w) => {
            chart
                .draw_series(std::iter::once(Text::new(
                    format!("predicted memory wall: batch {w:.0}, beyond the sizes measured ->"),
                    (xr.start * 1.1, yr.end * 0.97),
                    ("sans-serif", 14).into_font().color(&WALL),
                )))
                .map_err(|e| e.to_string())?;
        }
        None => {}
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|e| e.to_string())
}

fn throughput(area: &Area<'_>, r: &SweepResult) -> Result<(), String> {
    let u = unit(r);
    let pts: Vec<(f64, f64)> = r.stats.iter().map(|s| (s.batch as f64, s.units_per_s)).collect();
    let (bmin, bmax) = (
        pts.iter().map(|p| p.0).fold(f64::INFINITY, f64::min),
        pts.iter().map(|p| p.0).fold(0.0, f64::max),
    );
    let yhi = pts.iter().map(|p| p.1).fold(0.0, f64::max) * 1.15;
    let xr = span(bmin, bmax);
    let mut chart = ChartBuilder::on(area)
        .caption(format!("{u}s per second against batch"), ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .right_y_label_area_size(70)
        .build_cartesian_2d(xr.log_scale(), 0.0..yhi.max(1.0))
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc(format!("batch ({u}s, log)"))
        .y_desc(format!("{u}s/s (median)"))
        .x_label_formatter(&|x| format!("{x:.0}"))
        .draw()
        .map_err(|e| e.to_string())?;
    if let Some(p) = r.analysis.plateau {
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [(p.from as f64, 0.0), (p.to as f64, yhi)],
                SHADE.mix(0.5).filled(),
            )))
            .map_err(|e| e.to_string())?;
    }
    chart
        .draw_series(LineSeries::new(pts.clone(), TIME.stroke_width(2)))
        .map_err(|e| e.to_string())?;
    chart
        .draw_series(pts.iter().map(|&p| Circle::new(p, 3, TIME.filled())))
        .map_err(|e| e.to_string())?;
    if let Some(k) = r.record.knee {
        chart
            .draw_series(std::iter::once(PathElement::new(
                vec![(k as f64, 0.0), (k as f64, yhi)],
                KNEE.stroke_width(2),
            )))
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

fn modes_curve(area: &Area<'_>, p: &PowerSweep) -> Result<(), String> {
    let all = p.modes.iter().flat_map(|m| m.sweep.stats.iter());
    let (mut bmin, mut bmax, mut yhi) = (f64::INFINITY, 0.0f64, 0.0f64);
    for s in all {
        bmin = bmin.min(s.batch as f64);
        bmax = bmax.max(s.batch as f64);
        yhi = yhi.max(s.ms_per_unit);
    }
    if p.modes.is_empty() || !bmin.is_finite() {
        return Err("no mode was swept".into());
    }
    let u = unit(&p.modes[0].sweep);
    let (xr, yr) = (span(bmin, bmax), 0.0..yhi * 1.1);
    let mut chart = ChartBuilder::on(area)
        .caption(format!("ms per {u} against batch, per power mode"), ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(xr.log_scale(), yr.clone())
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc(format!("batch ({u}s, log)"))
        .y_desc(format!("ms per {u} (median)"))
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y:.3}"))
        .draw()
        .map_err(|e| e.to_string())?;
    for (i, m) in p.modes.iter().enumerate() {
        let c = PALETTE[i % PALETTE.len()];
        let pts: Vec<(f64, f64)> = m.sweep.stats.iter().map(|s| (s.batch as f64, s.ms_per_unit)).collect();
        chart
            .draw_series(LineSeries::new(pts, c.stroke_width(2)))
            .map_err(|e| e.to_string())?
            .label(format!("mode {} ({})", m.mode.id, m.mode.name))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], c.stroke_width(2)));
        if let Some(k) = m.sweep.record.knee {
            chart
                .draw_series(std::iter::once(PathElement::new(
                    vec![(k as f64, yr.start), (k as f64, yr.end)],
                    c.stroke_width(1),
                )))
                .map_err(|e| e.to_string())?;
        }
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|e| e.to_string())
}

fn energy_by_mode(area: &Area<'_>, p: &PowerSweep) -> Result<(), String> {
    let names: Vec<String> = p
        .modes
        .iter()
        .map(|m| format!("{} ({})", m.mode.id, m.mode.name))
        .collect();
    let mut batches: Vec<u64> = p
        .modes
        .iter()
        .flat_map(|m| m.sweep.stats.iter().map(|s| s.batch))
        .collect();
    batches.sort_unstable();
    batches.dedup();
    let uj = |m: &super::ModeSweep, b: u64| {
        m.sweep
            .stats
            .iter()
            .find(|s| s.batch == b)
            .and_then(|s| s.energy)
            .map(|e| e.joules_per_pixel * 1e6)
    };
    let values = || {
        p.modes
            .iter()
            .flat_map(|m| batches.iter().filter_map(move |&b| uj(m, b)))
    };
    let (ylo, yhi) = (values().fold(f64::INFINITY, f64::min), values().fold(0.0, f64::max));
    if !(ylo > 0.0 && yhi.is_finite()) {
        return Err("no energy readings: the platform root has no power rails".into());
    }
    let n = p.modes.len() as u32;
    let mut chart = ChartBuilder::on(area)
        .caption("energy per output pixel against power mode", ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        // n - 1: a segmented range has one segment past its end.
        // Log: a batch of 1 costs many times what a large one does per pixel.
        .build_cartesian_2d((0u32..n.saturating_sub(1)).into_segmented(), span(ylo, yhi).log_scale())
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc("nvpmodel mode")
        .y_desc("uJ per pixel (module total rail, log)")
        .y_label_formatter(&|y| format!("{y:.1}"))
        .x_labels(n as usize)
        .x_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) | SegmentValue::Exact(i) => names.get(*i as usize).cloned().unwrap_or_default(),
            SegmentValue::Last => String::new(),
        })
        .draw()
        .map_err(|e| e.to_string())?;
    for (j, &b) in batches.iter().enumerate() {
        let c = PALETTE[j % PALETTE.len()];
        let pts: Vec<(SegmentValue<u32>, f64)> = p
            .modes
            .iter()
            .enumerate()
            .filter_map(|(i, m)| uj(m, b).map(|v| (SegmentValue::CenterOf(i as u32), v)))
            .collect();
        chart
            .draw_series(LineSeries::new(pts.clone(), c.stroke_width(2)))
            .map_err(|e| e.to_string())?
            .label(format!("batch {b}"))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], c.stroke_width(2)));
        chart
            .draw_series(pts.into_iter().map(|q| Circle::new(q, 4, c.filled())))
            .map_err(|e| e.to_string())?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|e| e.to_string())
}

/// What the memory line measures: device memory in use on a discrete GPU's sweep, else `RssAnon`.
fn memory_name(r: &super::SweepResult) -> &'static str {
    if r.analysis.memory.budget_binding == super::DEVICE_BUDGET {
        "device memory in use"
    } else {
        "RssAnon"
    }
}
