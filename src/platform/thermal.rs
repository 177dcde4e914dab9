//! Thermal zones: `/sys/devices/virtual/thermal/thermal_zone*/{type,temp}`, temperatures in
//! millidegrees Celsius.

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::{PlatformError, read_number, read_trimmed, sorted_entries, under};

/// One thermal zone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ThermalZone {
    /// N of `thermal_zoneN`.
    pub index: u32,
    /// Its `type`, e.g. `cpu-thermal`, `gpu-thermal`, `tj-thermal`.
    pub kind: String,
    /// Its `temp` file, as seen from here.
    pub temp: PathBuf,
}

impl ThermalZone {
    /// The zone's temperature in degrees Celsius. A zone whose sensor is off fails to read
    /// (the kernel answers EINVAL or ENODATA): an error naming the file.
    pub fn celsius(&self) -> Result<f64, PlatformError> {
        match read_number(&self.temp, "an integer in millidegrees Celsius")? {
            Some(m) => Ok(m as f64 / 1000.0),
            None => Err(PlatformError::Io {
                path: self.temp.clone(),
                source: std::io::Error::from(std::io::ErrorKind::NotFound),
            }),
        }
    }
}

/// Every zone with a `type` and a `temp` file under `root`, in index order.
pub fn find_zones(root: &Path) -> Vec<ThermalZone> {
    let mut zones: Vec<ThermalZone> = sorted_entries(&under(root, "/sys/devices/virtual/thermal"))
        .into_iter()
        .filter_map(|dir| {
            let index = dir
                .file_name()?
                .to_str()?
                .strip_prefix("thermal_zone")?
                .parse::<u32>()
                .ok()?;
            let kind = read_trimmed(&dir.join("type"))?;
            let temp = dir.join("temp");
            temp.is_file().then_some(ThermalZone { index, kind, temp })
        })
        .collect();
    zones.sort_by_key(|z| z.index);
    zones
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
    fn orin_nano_zones() {
        let zones = find_zones(&fixture("orin_nano"));
        let kinds: Vec<&str> = zones.iter().map(|z| z.kind.as_str()).collect();
        assert_eq!(
            kinds,
            [
                "cpu-thermal",
                "gpu-thermal",
                "cv0-thermal",
                "soc0-thermal",
                "tj-thermal"
            ]
        );
        assert_eq!(zones[0].celsius().ok(), Some(48.5));
        assert_eq!(zones[4].celsius().ok(), Some(49.218));
    }

    #[test]
    fn agx_orin_zone_with_its_sensor_off_is_an_error_naming_it() {
        let zones = find_zones(&fixture("agx_orin"));
        assert!(zones.len() >= 2);
        let off = zones.iter().find(|z| z.kind == "cv0-thermal");
        let msg = off
            .and_then(|z| z.celsius().err())
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(msg.contains("thermal_zone") && msg.contains("temp"), "{msg}");
        assert!(
            zones
                .iter()
                .filter(|z| z.kind != "cv0-thermal")
                .all(|z| z.celsius().is_ok())
        );
    }

    #[test]
    fn x86_host_has_no_zones() {
        assert!(find_zones(&fixture("x86_host")).is_empty());
    }
}
