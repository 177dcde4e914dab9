//! The text forms of a sweep's results (`--json` prints them as they are).

use std::fmt::{Display, Formatter, Result};

use crate::budget::knee;

use super::{PowerPlan, PowerSweep, SweepOutput, SweepResult};

impl Display for SweepResult {
    fn fmt(&self, f: &mut Formatter<'_>) -> Result {
        let r = &self.record;
        let unit = if r.key.mode == "dense" { "tile" } else { "sample" };
        writeln!(
            f,
            "model {} ({} mode{}), {} threads{}, {} repeats, {}",
            r.key.model,
            r.key.mode,
            r.key.tile.map(|t| format!(", tile {t}")).unwrap_or_default(),
            r.threads_used,
            if r.key.threads == 0 { " (one per core)" } else { "" },
            r.repeat,
            r.key.cpu
        )?;
        writeln!(
            f,
            "{:>7} {:>11} {:>21} {:>11} {:>11} {:>9} {:>12}",
            "batch",
            format!("ms/{unit}"),
            "p5-p95",
            format!("{unit}s/s"),
            "elasticity",
            "RSS MiB",
            "uJ/pixel"
        )?;
        for (p, s) in r.points.iter().zip(&self.stats) {
            writeln!(
                f,
                "{:>7} {:>11.4} {:>21} {:>11.1} {:>11} {:>9} {:>12}",
                p.batch,
                s.ms_per_unit,
                format!("{:.4}-{:.4}", s.ms_per_unit_p5_p95[0], s.ms_per_unit_p5_p95[1]),
                s.units_per_s,
                p.elasticity.map(|e| format!("{e:.3}")).unwrap_or_else(|| "-".into()),
                s.rss_bytes.map(|b| (b >> 20).to_string()).unwrap_or_else(|| "-".into()),
                s.energy
                    .map(|e| format!("{:.3}", e.joules_per_pixel * 1e6))
                    .unwrap_or_else(|| "-".into())
            )?;
        }
        match r.knee {
            Some(k) => writeln!(
                f,
                "knee: {k} {unit}s (the smallest batch within {:.0} % of the best per-{unit} time)",
                knee::PLATEAU_TOLERANCE * 100.0
            )?,
            None => writeln!(
                f,
                "knee: none (a plateau needs {} sizes above the pick, up to {}x it)",
                knee::CONFIRM_SIZES,
                knee::CONFIRM_SPAN
            )?,
        }
        let a = &self.analysis;
        match a.plateau {
            Some(p) => writeln!(f, "plateau (|elasticity| < 0.05): batch {} to {}", p.from, p.to)?,
            None => writeln!(f, "plateau (|elasticity| < 0.05): none measured")?,
        }
        let m = &a.memory;
        writeln!(
            f,
            "memory: measured {} per {unit}, the budget's model {:.2} MiB per {unit}; budget {} MiB ({}); \
             wall predicted by the budget {}, on the measured line {}",
            m.measured_bytes_per_unit
                .map(|b| format!("{:.2} MiB", b / f64::from(1 << 20)))
                .unwrap_or_else(|| "-".into()),
            m.model_bytes_per_unit as f64 / f64::from(1 << 20),
            m.budget_bytes >> 20,
            m.budget_binding,
            m.predicted_wall.map(|w| w.to_string()).unwrap_or_else(|| "-".into()),
            m.measured_wall.map(|w| w.to_string()).unwrap_or_else(|| "-".into()),
        )?;
        for part in &a.regimes {
            writeln!(
                f,
                "  {:>5}..{:<5} {}: {}",
                part.batches.from,
                part.batches.to,
                part.regime.words(),
                part.evidence
            )?;
        }
        if let Some(p) = &self.precision {
            writeln!(
                f,
                "fp16 ({}): median per-{unit} time ratio fp16/fp32 {:.3} over {} sizes",
                p.fp16_file.display(),
                p.median_ratio,
                p.ratio_fp16_over_fp32.len()
            )?;
        }
        write!(f, "stopped: {}", r.stopped)?;
        if let Some(p) = &self.cache_file {
            write!(f, "\ncached: {}", p.display())?;
        }
        Ok(())
    }
}

impl Display for PowerSweep {
    fn fmt(&self, f: &mut Formatter<'_>) -> Result {
        for m in &self.modes {
            writeln!(f, "== power mode {} ({})", m.mode.id, m.mode.name)?;
            writeln!(f, "{}", m.sweep)?;
            match m.best_energy {
                Some(b) => writeln!(
                    f,
                    "best energy: batch {} at {:.3} uJ/pixel ({:.0} pixels/J)",
                    b.batch,
                    b.joules_per_pixel * 1e6,
                    b.pixels_per_joule
                )?,
                None => writeln!(f, "best energy: no power readings")?,
            }
        }
        write!(
            f,
            "power mode restored to {} ({})",
            self.original.id, self.original.name
        )
    }
}

impl Display for PowerPlan {
    fn fmt(&self, f: &mut Formatter<'_>) -> Result {
        writeln!(
            f,
            "dry run: the mode now is {} ({}); would run:",
            self.original.id, self.original.name
        )?;
        for (i, c) in self.commands.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "  {c}")?;
        }
        Ok(())
    }
}

impl Display for SweepOutput {
    fn fmt(&self, f: &mut Formatter<'_>) -> Result {
        match self {
            Self::Plain(r) => r.fmt(f),
            Self::Power(p) => p.fmt(f),
            Self::Plan(p) => p.fmt(f),
        }
    }
}
