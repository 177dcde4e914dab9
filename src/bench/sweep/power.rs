//! Power modes for `hsiedge bench sweep --power-modes`: nvpmodel's modes and the one in force,
//! switching with the original restored on every way out, and the energy of a timed window from
//! the module's total rail.
//!
//! Mode ids and names come from `/etc/nvpmodel.conf` under the platform root
//! ([`crate::platform::jetson`]); the mode in force is what `nvpmodel -q` prints, and a switch is
//! `nvpmodel -m N` (root on a real board). [`ModeSwitch`] restores the original mode when it is
//! dropped (a normal end or an error) and from a signal thread on SIGINT or SIGTERM, which then
//! exits with 128 + the signal.
//!
//! Energy is the trapezoid rule over samples of the module total ([`module_total_milliwatts`]:
//! `VDD_IN`, or the sum of the supply rails on AGX Orin) taken by a thread every
//! [`EnergyMeter::interval`] while the window is open, plus one sample at each end of it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::platform::{self, PowerMode, Rail, module_total_milliwatts};

/// Errors of the power-mode sweep; each names the program, mode or file concerned.
#[derive(Debug, thiserror::Error)]
pub enum PowerError {
    /// The platform has no nvpmodel configuration.
    #[error("{conf}: no power modes (`< POWER_MODEL ID=n NAME=... >` lines) under the platform root")]
    NoModes {
        /// The conf file looked at.
        conf: PathBuf,
    },
    /// `--power-modes` named a mode the conf does not have, or was not `all` or ids.
    #[error("--power-modes {value}: {why} (modes in {conf}: {known})")]
    Selection {
        /// The value given.
        value: String,
        /// What is wrong with it.
        why: String,
        /// The conf file.
        conf: PathBuf,
        /// Its modes, `ID=NAME`.
        known: String,
    },
    /// nvpmodel could not be started.
    #[error("running `{program} {args}`")]
    Spawn {
        /// The program.
        program: PathBuf,
        /// Its arguments.
        args: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// nvpmodel exited with a failure.
    #[error("`{program} {args}` failed ({status}): {stderr}")]
    Failed {
        /// The program.
        program: PathBuf,
        /// Its arguments.
        args: String,
        /// Its exit status.
        status: String,
        /// Its standard error, trimmed.
        stderr: String,
    },
    /// `nvpmodel -q` printed no mode this conf knows.
    #[error("`{program} -q` printed no mode id or known mode name: {stdout:?}")]
    Query {
        /// The program.
        program: PathBuf,
        /// What it printed.
        stdout: String,
    },
    /// The signal thread could not be set up.
    #[error("catching {signal} to restore the power mode: {source}")]
    Signal {
        /// `SIGINT` or `SIGTERM`.
        signal: &'static str,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// The modes `--power-modes` selects from `modes` (the conf's): `all`, or ids separated by commas,
/// in the order given.
pub fn select(value: &str, modes: &[PowerMode], conf: &Path) -> Result<Vec<PowerMode>, PowerError> {
    let err = |why: String| PowerError::Selection {
        value: value.to_string(),
        why,
        conf: conf.to_path_buf(),
        known: modes
            .iter()
            .map(|m| format!("{}={}", m.id, m.name))
            .collect::<Vec<_>>()
            .join(", "),
    };
    if value.trim() == "all" {
        return Ok(modes.to_vec());
    }
    let mut out: Vec<PowerMode> = Vec::new();
    for word in value.split(',').map(str::trim) {
        let id: u32 = word
            .parse()
            .map_err(|_| err(format!("`{word}` is not a mode id (a non-negative integer) nor `all`")))?;
        let m = modes
            .iter()
            .find(|m| m.id == id)
            .ok_or_else(|| err(format!("no mode {id}")))?;
        if out.iter().any(|o| o.id == id) {
            return Err(err(format!("mode {id} is named twice")));
        }
        out.push(m.clone());
    }
    Ok(out)
}

/// The mode `nvpmodel -q` reports: a line holding only the id (as nvpmodel prints it after
/// `NV Power Mode: NAME`), else the name on the `NV Power Mode:` line looked up in `modes`.
pub fn parse_query(stdout: &str, modes: &[PowerMode]) -> Option<PowerMode> {
    let by_id = stdout
        .lines()
        .filter_map(|l| l.trim().parse::<u32>().ok())
        .find_map(|id| modes.iter().find(|m| m.id == id));
    let by_name = || {
        stdout
            .lines()
            .find_map(|l| l.trim().strip_prefix("NV Power Mode:"))
            .map(str::trim)
            .and_then(|name| modes.iter().find(|m| m.name == name))
    };
    by_id.or_else(by_name).cloned()
}

/// nvpmodel, run as a program.
#[derive(Debug, Clone)]
pub struct Nvpmodel {
    /// The program (`nvpmodel`, or a stand-in).
    pub program: PathBuf,
}

impl Nvpmodel {
    fn run(&self, args: &[&str]) -> Result<String, PowerError> {
        let joined = args.join(" ");
        let out = Command::new(&self.program)
            .args(args)
            .output()
            .map_err(|source| PowerError::Spawn {
                program: self.program.clone(),
                args: joined.clone(),
                source,
            })?;
        if !out.status.success() {
            return Err(PowerError::Failed {
                program: self.program.clone(),
                args: joined,
                status: out.status.to_string(),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The mode in force (`nvpmodel -q`).
    pub fn query(&self, modes: &[PowerMode]) -> Result<PowerMode, PowerError> {
        let stdout = self.run(&["-q"])?;
        parse_query(&stdout, modes).ok_or_else(|| PowerError::Query {
            program: self.program.clone(),
            stdout,
        })
    }

    /// Switches to mode `id` (`nvpmodel -m id`).
    pub fn set(&self, id: u32) -> Result<(), PowerError> {
        self.run(&["-m", &id.to_string()]).map(|_| ())
    }
}

/// Holds the board in switched modes and puts the original back: on [`ModeSwitch::restore`], on
/// drop, and on SIGINT or SIGTERM (then the process exits with 128 + the signal).
pub struct ModeSwitch {
    shared: Arc<Shared>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

struct Shared {
    nvpmodel: Nvpmodel,
    original: PowerMode,
    /// Held while a switch or the restore runs, so a signal's restore comes after it.
    lock: Mutex<()>,
    switched: AtomicBool,
}

impl Shared {
    /// Restores the original mode if another was set; says what it did on stderr.
    fn restore(&self) -> Result<(), PowerError> {
        let _held = self.lock.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if !self.switched.swap(false, Ordering::SeqCst) {
            return Ok(());
        }
        let r = self.nvpmodel.set(self.original.id);
        match &r {
            Ok(()) => eprintln!("power mode restored to {} ({})", self.original.id, self.original.name),
            Err(e) => eprintln!(
                "hsiedge: could not restore power mode {} ({}): {e}",
                self.original.id, self.original.name
            ),
        }
        r
    }
}

impl ModeSwitch {
    /// Starts the signal thread; `original` is what [`Nvpmodel::query`] reported.
    pub fn new(nvpmodel: Nvpmodel, original: PowerMode) -> Result<Self, PowerError> {
        let shared = Arc::new(Shared {
            nvpmodel,
            original,
            lock: Mutex::new(()),
            switched: AtomicBool::new(false),
        });
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()
            .map_err(|source| PowerError::Signal {
                signal: "SIGINT",
                source,
            })?;
        use tokio::signal::unix::{SignalKind, signal};
        // Registered here, before any switch, so a signal during the first switch is caught.
        let (mut int, mut term) = rt.block_on(async {
            let int = signal(SignalKind::interrupt()).map_err(|source| PowerError::Signal {
                signal: "SIGINT",
                source,
            })?;
            let term = signal(SignalKind::terminate()).map_err(|source| PowerError::Signal {
                signal: "SIGTERM",
                source,
            })?;
            Ok::<_, PowerError>((int, term))
        })?;
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let s = Arc::clone(&shared);
        let thread = std::thread::spawn(move || {
            let code = rt.block_on(async {
                tokio::select! {
                    _ = int.recv() => Some(130),
                    _ = term.recv() => Some(143),
                    _ = &mut stopped => None,
                }
            });
            if let Some(code) = code {
                eprintln!("hsiedge: interrupted; restoring the power mode");
                let ok = s.restore().is_ok();
                std::process::exit(if ok { code } else { 1 });
            }
        });
        Ok(Self {
            shared,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// The mode in force before the sweep.
    pub fn original(&self) -> &PowerMode {
        &self.shared.original
    }

    /// Switches to `mode` (the original is restored later, whatever happens).
    pub fn switch(&self, mode: &PowerMode) -> Result<(), PowerError> {
        let _held = self
            .shared
            .lock
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // Marked before the call: a switch that fails half-way is restored too.
        self.shared.switched.store(true, Ordering::SeqCst);
        self.shared.nvpmodel.set(mode.id)
    }

    /// Puts the original mode back now (a no-op when it was never left).
    pub fn restore(&self) -> Result<(), PowerError> {
        self.shared.restore()
    }
}

impl Drop for ModeSwitch {
    fn drop(&mut self) {
        // The error was printed; a drop has no one to hand it to.
        let _ = self.shared.restore();
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Energy of one timed window.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Energy {
    /// Joules over the window (module total).
    pub joules: f64,
    /// The window's length.
    pub seconds: f64,
    /// `joules / seconds`.
    pub mean_watts: f64,
    /// Power samples taken (the two ends included).
    pub samples: usize,
    /// Output pixels the window's runs produced.
    pub pixels: u64,
    /// `joules / pixels`.
    pub joules_per_pixel: f64,
    /// `pixels / joules`.
    pub pixels_per_joule: f64,
}

/// Samples the module total over windows.
pub struct EnergyMeter {
    rails: Vec<Rail>,
    /// Between samples inside a window.
    pub interval: Duration,
}

impl EnergyMeter {
    /// The rails under `root`; `None` when the board has none (no energy figures then).
    pub fn discover(root: &Path, interval: Duration) -> Option<Self> {
        let rails = platform::find_rails(root);
        module_total_milliwatts(&rails).map(|_| Self { rails, interval })
    }

    /// The module total now, in watts; `None` when no rail could be read.
    fn watts(rails: &mut [Rail]) -> Option<f64> {
        for r in rails.iter_mut() {
            // A rail that fails now is left out of this sample; the total needs one that reads.
            if r.refresh().is_err() {
                r.millivolts = None;
            }
        }
        module_total_milliwatts(rails).map(|mw| mw as f64 / 1e3)
    }

    /// Runs `body` as one window of `pixels` output pixels and returns its energy beside its
    /// result (`None` when no sample could be read).
    pub fn window<R>(&mut self, pixels: u64, body: impl FnOnce() -> R) -> (R, Option<Energy>) {
        let interval = self.interval;
        let first = Self::watts(&mut self.rails);
        let open = AtomicBool::new(true);
        let rails = &mut self.rails;
        let start = Instant::now();
        let (r, end, mut samples, rails) = std::thread::scope(|scope| {
            let open = &open;
            let sampler = scope.spawn(move || {
                let mut v: Vec<(f64, f64)> = first.map(|w| (0.0, w)).into_iter().collect();
                loop {
                    std::thread::sleep(interval);
                    if !open.load(Ordering::Acquire) {
                        break;
                    }
                    if let Some(w) = Self::watts(rails) {
                        v.push((start.elapsed().as_secs_f64(), w));
                    }
                }
                (v, rails)
            });
            let r = body();
            let end = start.elapsed().as_secs_f64();
            open.store(false, Ordering::Release);
            match sampler.join() {
                Ok((v, rails)) => (r, end, v, Some(rails)),
                Err(_) => (r, end, Vec::new(), None),
            }
        });
        // A sample read after the window closed belongs to the closing one below.
        samples.retain(|&(t, _)| t <= end);
        if let Some(w) = rails.and_then(|rails| Self::watts(rails)) {
            samples.push((end, w));
        }
        (r, energy(&samples, end, pixels))
    }
}

/// The trapezoid rule over `(t, watts)` samples in a window of `seconds`; a single sample is
/// held over the whole window.
pub fn energy(samples: &[(f64, f64)], seconds: f64, pixels: u64) -> Option<Energy> {
    let joules = match samples {
        [] => return None,
        [(_, w)] => w * seconds,
        _ => samples
            .windows(2)
            .map(|p| (p[1].0 - p[0].0) * (p[0].1 + p[1].1) / 2.0)
            .sum(),
    };
    let px = pixels as f64;
    Some(Energy {
        joules,
        seconds,
        mean_watts: if seconds > 0.0 { joules / seconds } else { 0.0 },
        samples: samples.len(),
        pixels,
        joules_per_pixel: if px > 0.0 { joules / px } else { 0.0 },
        pixels_per_joule: if joules > 0.0 { px / joules } else { 0.0 },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn modes() -> Vec<PowerMode> {
        [(0, "15W"), (1, "7W"), (2, "MAXN_SUPER")]
            .iter()
            .map(|&(id, name)| PowerMode { id, name: name.into() })
            .collect()
    }

    #[test]
    fn selection_all_ids_and_errors_naming_the_value() {
        let conf = Path::new("/etc/nvpmodel.conf");
        assert_eq!(select("all", &modes(), conf).unwrap().len(), 3);
        let ids: Vec<u32> = select("2,0", &modes(), conf).unwrap().iter().map(|m| m.id).collect();
        assert_eq!(ids, [2, 0]);
        let e = select("0,9", &modes(), conf).unwrap_err().to_string();
        assert!(
            e.contains("--power-modes 0,9") && e.contains("no mode 9") && e.contains("1=7W"),
            "{e}"
        );
        assert!(
            select("x", &modes(), conf)
                .unwrap_err()
                .to_string()
                .contains("`x` is not a mode id")
        );
        assert!(select("1,1", &modes(), conf).unwrap_err().to_string().contains("twice"));
    }

    #[test]
    fn query_output_by_id_line_or_name() {
        let m = modes();
        assert_eq!(
            parse_query("NV Fan Mode:quiet\nNV Power Mode: 7W\n1\n", &m).map(|m| m.id),
            Some(1)
        );
        assert_eq!(parse_query("NV Power Mode: MAXN_SUPER\n", &m).map(|m| m.id), Some(2));
        assert_eq!(parse_query("NV Power Mode: 99W\n", &m), None);
    }

    #[test]
    fn trapezoid_energy_per_pixel() {
        let e = energy(&[(0.0, 10.0), (1.0, 20.0), (2.0, 20.0)], 2.0, 1000).unwrap();
        assert!((e.joules - 35.0).abs() < 1e-12);
        assert!((e.mean_watts - 17.5).abs() < 1e-12);
        assert!((e.joules_per_pixel - 0.035).abs() < 1e-12 && (e.pixels_per_joule - 1000.0 / 35.0).abs() < 1e-9);
        let one = energy(&[(0.0, 5.0)], 2.0, 10).unwrap();
        assert!((one.joules - 10.0).abs() < 1e-12);
        assert!(energy(&[], 1.0, 1).is_none());
    }

    #[test]
    fn a_window_on_a_recorded_board_integrates_its_total_rail() {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/telemetry/orin_nano");
        let mut meter = EnergyMeter::discover(&root, Duration::from_millis(5)).unwrap();
        let (v, e) = meter.window(100, || {
            std::thread::sleep(Duration::from_millis(30));
            7
        });
        let e = e.unwrap();
        assert_eq!(v, 7);
        // VDD_IN 5056 mV x 1310 mA (whole milliwatts), constant in the recording.
        let w = f64::from(5056 * 1310 / 1000) / 1e3;
        assert!(e.samples >= 2 && e.seconds >= 0.03);
        assert!((e.mean_watts - w).abs() < 1e-9, "{e:?}");
        assert!((e.joules - w * e.seconds).abs() < 1e-6);
        let x86 = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/telemetry/x86_host");
        assert!(EnergyMeter::discover(&x86, Duration::from_millis(5)).is_none());
    }
}
