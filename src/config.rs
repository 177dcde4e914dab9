//! Every environment variable hsiedge reads, declared in one place with its default and meaning.
//!
//! Readers elsewhere call [`EnvVar::get`]; nothing else in the crate touches `std::env::var`, so this
//! table is the complete list (also printed by `hsiedge inspect --env`).

use std::path::PathBuf;

/// One environment variable the runtime understands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EnvVar {
    /// The variable's name.
    pub name: &'static str,
    /// What happens when it is unset.
    pub default: &'static str,
    /// What it controls.
    pub meaning: &'static str,
}

impl EnvVar {
    /// The variable's value, `None` when unset or empty.
    pub fn get(&self) -> Option<String> {
        std::env::var(self.name).ok().filter(|v| !v.is_empty())
    }

    /// The value as a path, `None` when unset or empty.
    pub fn path(&self) -> Option<PathBuf> {
        self.get().map(PathBuf::from)
    }
}

/// Path to `libonnxruntime.so`; the same variable the `ort` crate and ONNX Runtime tooling use.
pub const ORT_DYLIB_PATH: EnvVar = EnvVar {
    name: "ORT_DYLIB_PATH",
    default: "search beside the executable, then system library paths, then Python onnxruntime",
    meaning: "ONNX Runtime shared library to load (after --ort-lib)",
};

/// Python interpreter used to locate an installed `onnxruntime` package.
pub const HSIEDGE_PYTHON: EnvVar = EnvVar {
    name: "HSIEDGE_PYTHON",
    default: "python3",
    meaning: "Python interpreter asked where the onnxruntime package lives (last library fallback)",
};

/// Log verbosity for the runtime's own messages on stderr.
pub const HSIEDGE_LOG: EnvVar = EnvVar {
    name: "HSIEDGE_LOG",
    default: "info",
    meaning: "stderr log level: error, warn, info or debug",
};

/// Root of the shared benchmark data used by tests and `make demo` when present.
pub const HSIEDGE_DATA: EnvVar = EnvVar {
    name: "HSIEDGE_DATA",
    default: "../shared/data",
    meaning: "folder holding the real benchmark scenes (tests and demo use it when present)",
};

/// All variables, in the order `inspect --env` prints them.
pub const ALL: &[EnvVar] = &[ORT_DYLIB_PATH, HSIEDGE_PYTHON, HSIEDGE_LOG, HSIEDGE_DATA];

/// Log levels understood by [`HSIEDGE_LOG`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    /// Only errors.
    Error,
    /// Errors and warnings (fallbacks, clamped settings).
    Warn,
    /// Normal progress messages.
    Info,
    /// Everything, including per-batch detail.
    Debug,
}

impl LogLevel {
    /// Parses a level name; unknown names give `None` so the caller can report the value.
    pub fn parse(s: &str) -> Option<Self> {
        match s.to_ascii_lowercase().as_str() {
            "error" => Some(Self::Error),
            "warn" | "warning" => Some(Self::Warn),
            "info" => Some(Self::Info),
            "debug" | "trace" => Some(Self::Debug),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique() {
        let mut names: Vec<_> = ALL.iter().map(|v| v.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), ALL.len());
    }

    #[test]
    fn log_levels_parse() {
        assert_eq!(LogLevel::parse("WARN"), Some(LogLevel::Warn));
        assert_eq!(LogLevel::parse("loud"), None);
        assert!(LogLevel::Debug > LogLevel::Info);
    }
}
