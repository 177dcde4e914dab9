//! Discrete NVIDIA GPUs through NVML: board power, utilisation, memory and temperature.
//!
//! `libnvidia-ml` is loaded at run time (`nvml-wrapper` opens it with `dlopen`), so the binary
//! runs unchanged where there is no NVIDIA driver: [`NvmlGpu::load`] is then an error the
//! caller reports once as an absent source. Integrated GPUs (Jetson) have no NVML power or
//! utilisation; they are read through [`super::power`] and [`super::devfreq`].

use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::TemperatureSensor;
use nvml_wrapper::error::NvmlError;
use serde::{Deserialize, Serialize};

use super::PlatformError;

/// Library names tried in order: the development symlink, then the driver's versioned soname
/// (a machine with only the driver installed has only the latter).
const LIBRARIES: &[&str] = &["libnvidia-ml.so", "libnvidia-ml.so.1"];

/// One reading of one GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NvmlSample {
    /// NVML device index.
    pub index: u32,
    /// Board name, e.g. `NVIDIA H100 80GB HBM3`.
    pub name: String,
    /// Board power draw in watts.
    pub power_w: Option<f64>,
    /// Share of the last sample period a kernel ran, 0..=1.
    pub utilization: Option<f64>,
    /// Device memory allocated, bytes.
    pub memory_used_bytes: Option<u64>,
    /// Device memory installed, bytes.
    pub memory_total_bytes: Option<u64>,
    /// Die temperature, degrees Celsius.
    pub temperature_c: Option<f64>,
}

/// NVML, loaded and initialised, with the GPUs it sees.
pub struct NvmlGpu {
    nvml: Nvml,
    names: Vec<String>,
}

impl std::fmt::Debug for NvmlGpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlGpu").field("names", &self.names).finish()
    }
}

fn nvml_err(call: &'static str) -> impl Fn(NvmlError) -> PlatformError {
    move |e| PlatformError::Nvml {
        call,
        message: e.to_string(),
    }
}

impl NvmlGpu {
    /// Loads `libnvidia-ml` and initialises NVML; an error when the library or the driver is
    /// missing, or when it sees no GPU.
    pub fn load() -> Result<Self, PlatformError> {
        let mut last = None;
        for lib in LIBRARIES {
            match Nvml::builder().lib_path(std::ffi::OsStr::new(lib)).init() {
                Ok(nvml) => return Self::with(nvml),
                Err(e) => last = Some(e),
            }
        }
        Err(PlatformError::Nvml {
            call: "nvmlInit_v2",
            message: last.map_or_else(|| "no library name to try".into(), |e| e.to_string()),
        })
    }

    fn with(nvml: Nvml) -> Result<Self, PlatformError> {
        let count = nvml.device_count().map_err(nvml_err("nvmlDeviceGetCount"))?;
        if count == 0 {
            return Err(PlatformError::Nvml {
                call: "nvmlDeviceGetCount",
                message: "no GPU".into(),
            });
        }
        let names = (0..count)
            .map(|i| {
                nvml.device_by_index(i)
                    .and_then(|d| d.name())
                    .map_err(nvml_err("nvmlDeviceGetName"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self { nvml, names })
    }

    /// The GPUs' names, by index.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// Reads every GPU. A quantity a board does not support is `None`; a GPU that NVML cannot
    /// open any more (fallen off the bus) is an error.
    pub fn sample(&self) -> Result<Vec<NvmlSample>, PlatformError> {
        let mut out = Vec::with_capacity(self.names.len());
        for (i, name) in self.names.iter().enumerate() {
            let index = u32::try_from(i).unwrap_or(u32::MAX);
            let d = self
                .nvml
                .device_by_index(index)
                .map_err(nvml_err("nvmlDeviceGetHandleByIndex"))?;
            let memory = d.memory_info().ok();
            out.push(NvmlSample {
                index,
                name: name.clone(),
                power_w: d.power_usage().ok().map(|mw| f64::from(mw) / 1000.0),
                utilization: d.utilization_rates().ok().map(|u| f64::from(u.gpu) / 100.0),
                memory_used_bytes: memory.as_ref().map(|m| m.used),
                memory_total_bytes: memory.as_ref().map(|m| m.total),
                temperature_c: d.temperature(TemperatureSensor::Gpu).ok().map(f64::from),
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where there is an NVIDIA driver, every GPU reads; where there is none, loading is an
    /// error naming the call (never a crash of the process for want of the library).
    #[test]
    fn loads_or_reports_why_not() {
        match NvmlGpu::load() {
            Ok(gpu) => {
                let s = gpu.sample().map_err(|e| e.to_string());
                assert!(s.as_ref().is_ok_and(|s| s.len() == gpu.names().len()), "{s:?}");
            }
            Err(e) => assert!(e.to_string().starts_with("NVML nvmlInit_v2"), "{e}"),
        }
    }
}
