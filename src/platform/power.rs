//! INA3221 power rails: `/sys/bus/i2c/devices/*/hwmon/hwmon*/in{N}_label` with `in{N}_input`
//! (millivolts) and `curr{N}_input` (milliamperes), the layout of Jetson Orin kernels (JetPack 6).
//!
//! Rail names differ by module: Orin NX and Nano have `VDD_IN` (the module's input, its total),
//! `VDD_CPU_GPU_CV` and `VDD_SOC`; AGX Orin has `VDD_GPU_SOC`, `VDD_CPU_CV`, `VIN_SYS_5V0` and
//! `VDDQ_VDD2_1V8AO` and no total rail, so its total is their sum ([`module_total_milliwatts`]).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{PlatformError, read_number, read_trimmed, sorted_entries, under};

/// The rail that measures the whole module where the module has one.
pub const TOTAL_RAIL: &str = "VDD_IN";

/// One INA3221 power rail.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rail {
    /// `in{N}_label`, e.g. `VDD_IN`.
    pub label: String,
    /// The hwmon folder, as seen from here.
    pub hwmon: PathBuf,
    /// Channel number N.
    pub channel: u32,
    /// `in{N}_input` in millivolts, when readable.
    pub millivolts: Option<u64>,
    /// `curr{N}_input` in milliamperes, when readable.
    pub milliamps: Option<u64>,
}

impl Rail {
    /// Power in milliwatts, when both voltage and current were read.
    pub fn milliwatts(&self) -> Option<u64> {
        Some(self.millivolts?.saturating_mul(self.milliamps?) / 1000)
    }

    /// True for a channel that is a real supply: not a summing channel (`sum of shunt voltages`)
    /// nor one marked not connected (`NC`).
    pub fn is_supply(&self) -> bool {
        !(self.label.eq_ignore_ascii_case("NC") || self.label.to_ascii_lowercase().starts_with("sum of"))
    }

    /// Re-reads voltage and current. A value file that vanished leaves `None`; one that cannot
    /// be read or holds no integer is an error naming it. The INA3221's readings are signed: a
    /// negative one (a rail at rest reads a little below zero) counts as 0.
    pub fn refresh(&mut self) -> Result<(), PlatformError> {
        let read = |file: String| -> Result<Option<u64>, PlatformError> {
            let path = self.hwmon.join(file);
            Ok(read_number(&path, "an integer")?.map(at_least_zero))
        };
        self.millivolts = read(format!("in{}_input", self.channel))?;
        self.milliamps = read(format!("curr{}_input", self.channel))?;
        Ok(())
    }
}

/// Every labelled INA3221 channel under `root`, with its current reading (a value that cannot be
/// read is `None`). Empty when the board has no rails.
pub fn find_rails(root: &Path) -> Vec<Rail> {
    let mut rails = Vec::new();
    for dev in sorted_entries(&under(root, "/sys/bus/i2c/devices")) {
        for hwmon in sorted_entries(&dev.join("hwmon")) {
            let is_hwmon = hwmon
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("hwmon"));
            if !is_hwmon {
                continue;
            }
            for f in sorted_entries(&hwmon) {
                let Some(name) = f.file_name().and_then(|n| n.to_str()) else {
                    continue;
                };
                let Some(channel) = name
                    .strip_prefix("in")
                    .and_then(|r| r.strip_suffix("_label"))
                    .and_then(|n| n.parse::<u32>().ok())
                else {
                    continue;
                };
                let Some(label) = read_trimmed(&f) else {
                    continue;
                };
                let num = |file: String| {
                    read_trimmed(&hwmon.join(file))
                        .and_then(|s| s.parse::<i64>().ok())
                        .map(at_least_zero)
                };
                rails.push(Rail {
                    label,
                    hwmon: hwmon.clone(),
                    channel,
                    millivolts: num(format!("in{channel}_input")),
                    milliamps: num(format!("curr{channel}_input")),
                });
            }
        }
    }
    rails
}

/// The module's total power in milliwatts: the `VDD_IN` rail where there is one (Orin NX and
/// Nano), else the sum of every supply rail (AGX Orin). `None` when a rail it needs was not read:
/// a sum missing a rail would read as a lower power, not as a gap.
pub fn module_total_milliwatts(rails: &[Rail]) -> Option<u64> {
    if let Some(total) = rails.iter().find(|r| r.label == TOTAL_RAIL) {
        return total.milliwatts();
    }
    rails
        .iter()
        .filter(|r| r.is_supply())
        .try_fold(None, |acc: Option<u64>, r| {
            Some(Some(acc.unwrap_or(0) + r.milliwatts()?))
        })
        .flatten()
}

fn at_least_zero(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/telemetry")
            .join(name)
    }

    fn rail(label: &str, mv: Option<u64>, ma: Option<u64>) -> Rail {
        Rail {
            label: label.into(),
            hwmon: PathBuf::new(),
            channel: 1,
            millivolts: mv,
            milliamps: ma,
        }
    }

    #[test]
    fn orin_nano_rails_and_total() {
        let rails = find_rails(&fixture("orin_nano"));
        let labels: Vec<&str> = rails.iter().map(|r| r.label.as_str()).collect();
        assert_eq!(labels, ["VDD_IN", "VDD_CPU_GPU_CV", "VDD_SOC", "sum of shunt voltages"]);
        // VDD_IN: 5056 mV x 1310 mA.
        assert_eq!(rails[0].milliwatts(), Some(5056 * 1310 / 1000));
        assert_eq!(module_total_milliwatts(&rails), Some(5056 * 1310 / 1000));
        // The summing channel has a voltage but no current: no power, not a supply.
        assert_eq!(rails[3].milliwatts(), None);
        assert!(!rails[3].is_supply());
    }

    #[test]
    fn agx_orin_total_is_the_sum_of_its_rails() {
        let rails = find_rails(&fixture("agx_orin"));
        let labels: Vec<&str> = rails.iter().map(|r| r.label.as_str()).collect();
        assert_eq!(
            labels,
            ["VDD_GPU_SOC", "VDD_CPU_CV", "VIN_SYS_5V0", "NC", "VDDQ_VDD2_1V8AO"]
        );
        let sum: u64 = rails
            .iter()
            .filter(|r| r.label != "NC")
            .filter_map(Rail::milliwatts)
            .sum();
        assert!(sum > 0);
        assert_eq!(module_total_milliwatts(&rails), Some(sum));
    }

    #[test]
    fn x86_host_has_no_rails() {
        assert!(find_rails(&fixture("x86_host")).is_empty());
        assert_eq!(module_total_milliwatts(&[]), None);
    }

    #[test]
    fn total_needs_a_reading() {
        assert_eq!(module_total_milliwatts(&[rail("VDD_IN", Some(5000), None)]), None);
        assert_eq!(
            module_total_milliwatts(&[rail("A", Some(5000), Some(100)), rail("B", Some(1000), Some(1000))]),
            Some(1500)
        );
        // A sum missing a supply rail would read as less power: no total instead.
        assert_eq!(
            module_total_milliwatts(&[rail("A", Some(5000), Some(100)), rail("B", Some(1000), None)]),
            None
        );
    }

    #[test]
    fn refresh_reads_new_values_and_names_a_bad_file() {
        let dir = tempfile::tempdir().unwrap();
        let hw = dir.path().join("sys/bus/i2c/devices/1-0040/hwmon/hwmon3");
        std::fs::create_dir_all(&hw).unwrap();
        std::fs::write(hw.join("in1_label"), "VDD_IN\n").unwrap();
        std::fs::write(hw.join("in1_input"), "5000\n").unwrap();
        std::fs::write(hw.join("curr1_input"), "1000\n").unwrap();
        let mut rails = find_rails(dir.path());
        assert_eq!(rails.len(), 1);
        assert_eq!(rails[0].milliwatts(), Some(5000));
        std::fs::write(hw.join("curr1_input"), "2000\n").unwrap();
        assert!(rails[0].refresh().is_ok());
        assert_eq!(rails[0].milliwatts(), Some(10000));
        // A rail at rest reads a little below zero.
        std::fs::write(hw.join("curr1_input"), "-5\n").unwrap();
        assert!(rails[0].refresh().is_ok());
        assert_eq!(rails[0].milliwatts(), Some(0));
        std::fs::write(hw.join("curr1_input"), "x\n").unwrap();
        let msg = rails[0].refresh().err().map(|e| e.to_string()).unwrap_or_default();
        assert!(msg.contains("curr1_input") && msg.contains("`x`"), "{msg}");
    }
}
