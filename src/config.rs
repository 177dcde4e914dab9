//! Every environment variable hsiedge reads, declared in one place with its default and meaning.
//!
//! Readers elsewhere call [`EnvVar::get`]; nothing else in the crate touches `std::env::var`, so this
//! table is the complete list (also printed by `hsiedge env`).

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

/// Root of the shared benchmark data used by tests and `make demo` when present.
pub const HSIEDGE_DATA: EnvVar = EnvVar {
    name: "HSIEDGE_DATA",
    default: "../shared/data",
    meaning: "folder holding the real benchmark scenes (tests and demo use it when present)",
};

/// Intra-op threads when `--threads` is 0 (a deployment can pin the count without editing its
/// command lines).
pub const HSIEDGE_THREADS: EnvVar = EnvVar {
    name: "HSIEDGE_THREADS",
    default: "0 (one per core)",
    meaning: "intra-op threads when --threads is 0",
};

/// Where batch sweeps (`hsiedge bench sweep`) are cached for `--batch auto`'s knee cap.
pub const HSIEDGE_CACHE_DIR: EnvVar = EnvVar {
    name: "HSIEDGE_CACHE_DIR",
    default: "$XDG_CACHE_HOME/hsiedge, else $HOME/.cache/hsiedge",
    meaning: "folder of cached batch sweeps (plateau knees) per model and device",
};

/// The XDG cache root, the second choice for the sweep cache.
pub const XDG_CACHE_HOME: EnvVar = EnvVar {
    name: "XDG_CACHE_HOME",
    default: "unset",
    meaning: "cache root; sweeps go to its hsiedge/ folder when HSIEDGE_CACHE_DIR is unset",
};

/// The home folder, the last choice for the sweep cache.
pub const HOME: EnvVar = EnvVar {
    name: "HOME",
    default: "unset (no sweep cache then)",
    meaning: "sweeps go to $HOME/.cache/hsiedge when neither cache variable is set",
};

/// All variables, in the order `hsiedge env` prints them.
pub const ALL: &[EnvVar] = &[
    ORT_DYLIB_PATH,
    HSIEDGE_PYTHON,
    HSIEDGE_DATA,
    HSIEDGE_THREADS,
    HSIEDGE_CACHE_DIR,
    XDG_CACHE_HOME,
    HOME,
];

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
}
