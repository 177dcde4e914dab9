//! Memory pressure stall information (`/proc/pressure/memory`).

use std::path::Path;

use serde::Serialize;

use super::*;

/// `/proc/pressure/memory` (PSI). Averages are percentages of wall time some (or all) tasks
/// were stalled on memory.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Psi {
    /// `some avg10`.
    pub some_avg10: f64,
    /// `some avg60`.
    pub some_avg60: f64,
    /// `some avg300`.
    pub some_avg300: f64,
    /// `some total` (microseconds).
    pub some_total_us: u64,
    /// `full avg10`, when the file has a `full` line.
    pub full_avg10: Option<f64>,
}

/// Reads `root/proc/pressure/memory`; `Ok(None)` when the kernel has no PSI.
pub fn read_psi(root: &Path) -> Result<Option<Psi>, BudgetError> {
    let path = under(root, "/proc/pressure/memory");
    let Some(text) = read_optional(&path)? else {
        return Ok(None);
    };
    let line_fields = |kind: &str| -> Option<Vec<(String, String)>> {
        let line = text.lines().find(|l| l.starts_with(kind))?;
        Some(
            line.split_whitespace()
                .skip(1)
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    };
    let some = line_fields("some ").ok_or_else(|| BudgetError::MissingField {
        path: path.clone(),
        field: "some".into(),
    })?;
    let get = |fields: &[(String, String)], k: &str| -> Result<String, BudgetError> {
        fields
            .iter()
            .find(|(fk, _)| fk == k)
            .map(|(_, v)| v.clone())
            .ok_or_else(|| BudgetError::MissingField {
                path: path.clone(),
                field: format!("some {k}"),
            })
    };
    let float = |field: &str, v: String| -> Result<f64, BudgetError> {
        v.parse::<f64>().map_err(|_| BudgetError::BadValue {
            path: path.clone(),
            field: field.to_string(),
            value: v,
        })
    };
    let full_avg10 = line_fields("full ")
        .and_then(|f| f.into_iter().find(|(k, _)| k == "avg10"))
        .and_then(|(_, v)| v.parse::<f64>().ok());
    Ok(Some(Psi {
        some_avg10: float("some avg10", get(&some, "avg10")?)?,
        some_avg60: float("some avg60", get(&some, "avg60")?)?,
        some_avg300: float("some avg300", get(&some, "avg300")?)?,
        some_total_us: parse_u64(&path, "some total", &get(&some, "total")?)?,
        full_avg10,
    }))
}
