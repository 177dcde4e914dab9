//! The board's side of a snapshot: power, temperatures, GPU load, nvpmodel, memory and NVML,
//! found once ([`Sampler::discover`]) and re-read on every tick.
//!
//! A source that is absent is reported once, as a notice, never as an error; a source that fails
//! to read is reported once and not read again (a thermal zone whose sensor is off fails on
//! every read).

use std::path::{Path, PathBuf};

use crate::platform::memory::MemoryReader;
use crate::platform::{self, GpuDevfreq, MemorySample, NvmlGpu, NvmlSample, Rail, ThermalZone};

use super::snapshot::{PowerModeNow, RailPower, Temperature};

/// One power reading.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PowerSample {
    /// The module total, watts (see [`platform::module_total_milliwatts`]), else the sum of the
    /// NVML board powers.
    pub total_w: Option<f64>,
    /// Every rail.
    pub rails: Vec<RailPower>,
    /// Every NVML GPU (read with the power, since their board power is the power there).
    pub nvml: Vec<NvmlSample>,
}

/// One reading of the slower sources.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BoardSample {
    /// Memory.
    pub memory: Option<MemorySample>,
    /// Thermal zones that read.
    pub temperatures: Vec<Temperature>,
    /// Integrated GPU load, 0..=1.
    pub gpu_load: Option<f64>,
    /// Integrated GPU clock, hertz.
    pub gpu_freq_hz: Option<u64>,
    /// nvpmodel mode.
    pub nvpmodel: Option<PowerModeNow>,
}

/// The sources found under one root.
#[derive(Debug)]
pub struct Sampler {
    root: PathBuf,
    rails: Vec<Rail>,
    zones: Vec<ThermalZone>,
    gpu: Option<GpuDevfreq>,
    nvml: Option<NvmlGpu>,
    modes: Vec<platform::PowerMode>,
    has_nvpmodel: bool,
    memory: Option<MemoryReader>,
    notices: Vec<String>,
}

impl Sampler {
    /// Finds the sources under `root`. NVML is tried only when `nvml` is set and the board is not
    /// a Jetson (its GPU is not an NVML device); it describes this machine whatever the root,
    /// so tests of recorded trees pass `false`.
    pub fn discover(root: &Path, nvml: bool) -> Self {
        let mut notices = Vec::new();
        let rails = platform::find_rails(root);
        let jetson = platform::jetson::detect_jetson(root).is_some();
        if rails.is_empty() {
            notices.push(
                "power: no INA3221 rails under /sys/bus/i2c/devices/*/hwmon/hwmon*/ (rail power, energy \
                 not reported unless NVML gives board power)"
                    .into(),
            );
        }
        let zones = platform::find_zones(root);
        if zones.is_empty() {
            notices.push("temperature: no thermal zones under /sys/devices/virtual/thermal/".into());
        }
        let gpu = platform::find_gpu(root);
        if gpu.is_none() && jetson {
            notices.push("gpu load: no devfreq device named ga10b or gpu under /sys/class/devfreq/".into());
        }
        let nvpmodel = platform::read_nvpmodel(root);
        if nvpmodel.is_absent() && jetson {
            notices.push("nvpmodel: no /etc/nvpmodel.conf nor /var/lib/nvpmodel/status".into());
        }
        let nvml = if nvml && !jetson {
            match NvmlGpu::load() {
                Ok(g) => Some(g),
                Err(e) => {
                    notices.push(format!("nvml: {e} (no discrete GPU power, utilisation or memory)"));
                    None
                }
            }
        } else {
            None
        };
        let memory = match MemoryReader::new(root).and_then(|mut r| r.read().map(|_| r)) {
            Ok(r) => Some(r),
            Err(e) => {
                notices.push(format!("memory: {e}"));
                None
            }
        };
        Self {
            root: root.to_path_buf(),
            rails,
            zones,
            gpu,
            nvml,
            has_nvpmodel: !nvpmodel.is_absent(),
            modes: nvpmodel.modes,
            memory,
            notices,
        }
    }

    /// Notices not yet reported; each is returned once.
    pub fn take_notices(&mut self) -> Vec<String> {
        std::mem::take(&mut self.notices)
    }

    /// The rails found.
    pub fn rails(&self) -> &[Rail] {
        &self.rails
    }

    /// True when a power source exists (rails or NVML).
    pub fn has_power(&self) -> bool {
        !self.rails.is_empty() || self.nvml.is_some()
    }

    /// Reads the rails (and NVML).
    pub fn power(&mut self) -> PowerSample {
        let mut failed = None;
        for r in &mut self.rails {
            if let Err(e) = r.refresh() {
                failed = Some(e.to_string());
                r.millivolts = None;
                r.milliamps = None;
            }
        }
        if let Some(e) = failed {
            self.notices.push(format!("power: {e}"));
        }
        let rails: Vec<RailPower> = self
            .rails
            .iter()
            .filter(|r| r.is_supply())
            .filter_map(|r| {
                let (mv, ma) = (r.millivolts?, r.milliamps?);
                Some(RailPower {
                    label: r.label.clone(),
                    volts: mv as f64 / 1000.0,
                    amps: ma as f64 / 1000.0,
                    watts: (mv * ma) as f64 / 1e6,
                })
            })
            .collect();
        let nvml = match self.nvml.as_ref().map(NvmlGpu::sample) {
            Some(Ok(v)) => v,
            Some(Err(e)) => {
                self.notices.push(format!("nvml: {e}; no longer read"));
                self.nvml = None;
                Vec::new()
            }
            None => Vec::new(),
        };
        let total_w = platform::module_total_milliwatts(&self.rails)
            .map(|mw| mw as f64 / 1000.0)
            .or_else(|| {
                let w: Vec<f64> = nvml.iter().filter_map(|g| g.power_w).collect();
                (!w.is_empty()).then(|| w.iter().sum())
            });
        PowerSample { total_w, rails, nvml }
    }

    /// Reads memory, temperatures, GPU load and the nvpmodel mode.
    pub fn board(&mut self) -> BoardSample {
        let memory = match self.memory.as_mut().map(MemoryReader::read) {
            Some(Ok(m)) => Some(m),
            Some(Err(e)) => {
                self.notices.push(format!("memory: {e}; no longer read"));
                self.memory = None;
                None
            }
            None => None,
        };
        let mut temperatures = Vec::with_capacity(self.zones.len());
        let mut off = Vec::new();
        for (i, z) in self.zones.iter().enumerate() {
            match z.celsius() {
                Ok(c) => temperatures.push(Temperature {
                    zone: z.kind.clone(),
                    celsius: c,
                }),
                Err(e) => off.push((i, format!("temperature {}: {e}; no longer read", z.kind))),
            }
        }
        for (i, notice) in off.into_iter().rev() {
            self.zones.remove(i);
            self.notices.push(notice);
        }
        let (gpu_load, gpu_freq_hz) = match self.gpu.as_ref().map(GpuDevfreq::read) {
            Some(Ok(l)) => (Some(l.load), l.freq_hz),
            Some(Err(e)) => {
                self.notices.push(format!("gpu load: {e}; no longer read"));
                self.gpu = None;
                (None, None)
            }
            None => (None, None),
        };
        let nvpmodel = if self.has_nvpmodel {
            platform::jetson::current_mode(&self.root).map(|id| PowerModeNow {
                id,
                name: self.modes.iter().find(|m| m.id == id).map(|m| m.name.clone()),
            })
        } else {
            None
        };
        BoardSample {
            memory,
            temperatures,
            gpu_load,
            gpu_freq_hz,
            nvpmodel,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/telemetry")
            .join(name)
    }

    #[test]
    fn orin_nano_reads_every_source() {
        let mut s = Sampler::discover(&fixture("orin_nano"), false);
        assert_eq!(s.take_notices(), Vec::<String>::new());
        let p = s.power();
        assert_eq!(p.total_w, Some(6.623));
        assert_eq!(
            p.rails.iter().map(|r| r.label.as_str()).collect::<Vec<_>>(),
            ["VDD_IN", "VDD_CPU_GPU_CV", "VDD_SOC"]
        );
        let b = s.board();
        assert_eq!(b.temperatures.len(), 5);
        assert_eq!(b.gpu_load, Some(0.627));
        assert_eq!(
            b.nvpmodel,
            Some(PowerModeNow {
                id: 0,
                name: Some("15W".into())
            })
        );
        assert!(b.memory.is_some_and(|m| m.nvmap_used_bytes.is_some()));
        assert!(s.take_notices().is_empty());
    }

    #[test]
    fn agx_orin_total_and_a_zone_off_reported_once() {
        let mut s = Sampler::discover(&fixture("agx_orin"), false);
        assert!(s.take_notices().is_empty());
        let p = s.power();
        // No VDD_IN: the sum of the four supplies in whole milliwatts, 10999 + 3982 + 4507 + 758
        // (the NC channel left out).
        assert_eq!(p.total_w, Some(20.246), "{p:?}");
        assert_eq!(p.rails.len(), 4);
        let first = s.board();
        let notices = s.take_notices();
        assert_eq!(notices.len(), 1, "{notices:?}");
        assert!(notices[0].starts_with("temperature cv0-thermal"), "{notices:?}");
        let second = s.board();
        assert!(s.take_notices().is_empty());
        assert_eq!(first.temperatures, second.temperatures);
        assert_eq!(first.nvpmodel.and_then(|m| m.name).as_deref(), Some("50W"));
    }

    #[test]
    fn x86_host_absent_sources_are_reported_once() {
        let mut s = Sampler::discover(&fixture("x86_host"), false);
        let notices = s.take_notices();
        assert_eq!(notices.len(), 2, "{notices:?}");
        assert!(notices[0].starts_with("power: no INA3221 rails"));
        assert!(notices[1].starts_with("temperature: no thermal zones"));
        assert!(!s.has_power());
        for _ in 0..3 {
            assert_eq!(s.power(), PowerSample::default());
            let b = s.board();
            assert!(b.memory.is_some() && b.temperatures.is_empty() && b.nvpmodel.is_none());
            assert!(s.take_notices().is_empty());
        }
    }
}
