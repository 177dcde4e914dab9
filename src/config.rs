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

    /// The value as a path, `None` when unset or empty; not required to be UTF-8.
    pub fn path(&self) -> Option<PathBuf> {
        std::env::var_os(self.name).filter(|v| !v.is_empty()).map(PathBuf::from)
    }

    /// The value as a `:`-separated list of paths, empty when unset.
    pub fn paths(&self) -> Vec<PathBuf> {
        std::env::var_os(self.name)
            .map(|s| {
                std::env::split_paths(&s)
                    .filter(|p| !p.as_os_str().is_empty())
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// Path to `libonnxruntime.so`; the same variable the `ort` crate and ONNX Runtime tooling use.
pub const ORT_DYLIB_PATH: EnvVar = EnvVar {
    name: "ORT_DYLIB_PATH",
    default: "search beside the executable, then system library paths, then Python onnxruntime",
    meaning: "ONNX Runtime shared library to load (after --ort-lib)",
};

/// The dynamic loader's search path, searched for libonnxruntime before the system folders.
pub const LD_LIBRARY_PATH: EnvVar = EnvVar {
    name: "LD_LIBRARY_PATH",
    default: "unset (system library folders only)",
    meaning: "folders searched for libonnxruntime after the executable's own, before the system ones",
};

/// Python interpreter used to locate an installed `onnxruntime` package.
pub const HSIEDGE_PYTHON: EnvVar = EnvVar {
    name: "HSIEDGE_PYTHON",
    default: "python3",
    meaning: "Python interpreter asked where the onnxruntime package lives (last library fallback)",
};

/// The Python interpreter: `HSIEDGE_PYTHON`, else its default.
pub fn python() -> String {
    HSIEDGE_PYTHON.get().unwrap_or_else(|| HSIEDGE_PYTHON.default.into())
}

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

/// How the device path (`--io device`) gets raw windows onto the GPU.
pub const HSIEDGE_DEVICE_UPLOAD: EnvVar = EnvVar {
    name: "HSIEDGE_DEVICE_UPLOAD",
    default: "mapped",
    meaning: "`mapped`: the GPU copies boxes straight from the scene's registered file mapping (falls back to `gathered`, with a warning, where registering fails); `gathered`: host threads copy each window into pinned buffers first",
};

/// The device path's upload, from [`HSIEDGE_DEVICE_UPLOAD`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceUpload {
    /// Copied by the device from the registered mapping.
    Mapped,
    /// Copied on the host first.
    Gathered,
}

/// [`HSIEDGE_DEVICE_UPLOAD`]'s value, or the value it does not know.
pub fn device_upload() -> Result<DeviceUpload, String> {
    match HSIEDGE_DEVICE_UPLOAD.get().as_deref().map(str::trim) {
        None | Some("") | Some("mapped") => Ok(DeviceUpload::Mapped),
        Some("gathered") => Ok(DeviceUpload::Gathered),
        Some(other) => Err(other.to_string()),
    }
}

/// A fault to inject, for the crash tests of the output commit.
pub const HSIEDGE_FAILPOINT: EnvVar = EnvVar {
    name: "HSIEDGE_FAILPOINT",
    default: "unset (no fault)",
    meaning: "testing only: `set-step:K` kills the process (SIGKILL) just before the K-th file-system step of writing an output set",
};

/// The service manager's notification socket (`hsiedge serve` under systemd `Type=notify`).
pub const NOTIFY_SOCKET: EnvVar = EnvVar {
    name: "NOTIFY_SOCKET",
    default: "unset (no service manager: readiness, status and watchdog messages are not sent)",
    meaning: "set by systemd: `hsiedge serve` sends READY=1, STATUS=, WATCHDOG=1 and STOPPING=1 there",
};

/// The watchdog period systemd expects pings within (`WatchdogSec=`).
pub const WATCHDOG_USEC: EnvVar = EnvVar {
    name: "WATCHDOG_USEC",
    default: "unset (no watchdog pings)",
    meaning: "set by systemd: `hsiedge serve` sends WATCHDOG=1 every half of this many microseconds",
};

/// The process the watchdog period is meant for.
pub const WATCHDOG_PID: EnvVar = EnvVar {
    name: "WATCHDOG_PID",
    default: "unset (WATCHDOG_USEC applies to this process)",
    meaning: "set by systemd: WATCHDOG_USEC applies only when this is the daemon's own pid",
};

/// All variables, in the order `hsiedge env` prints them.
pub const ALL: &[EnvVar] = &[
    ORT_DYLIB_PATH,
    LD_LIBRARY_PATH,
    HSIEDGE_PYTHON,
    HSIEDGE_DATA,
    HSIEDGE_THREADS,
    HSIEDGE_CACHE_DIR,
    XDG_CACHE_HOME,
    HOME,
    HSIEDGE_DEVICE_UPLOAD,
    HSIEDGE_FAILPOINT,
    NOTIFY_SOCKET,
    WATCHDOG_USEC,
    WATCHDOG_PID,
];

/// Variables only the test suite and CI read (the integration tests cannot use this crate's
/// private readers, so they are listed here to keep this file the complete table).
pub const TEST_ONLY: &[EnvVar] = &[
    EnvVar {
        name: "CI",
        default: "unset (missing shared data or models are skipped with a printed reason)",
        meaning: "set by CI: missing shared data, models or packages fail the tests instead",
    },
    EnvVar {
        name: "HSIEDGE_TEST_RUNNER",
        default: "unset (the binary runs directly)",
        meaning: "command prefixed to the binary under test, e.g. `qemu-aarch64 -L /usr/aarch64-linux-gnu`",
    },
    EnvVar {
        name: "HSIEDGE_MEMWALL_RUNS",
        default: "20 (`make test` passes its MEMWALL_RUNS, 3 unless given; CI gives 20)",
        meaning: "runs of the auto-batch memory-wall test under each cgroup limit",
    },
    EnvVar {
        name: "HSIEDGE_LONG_TESTS",
        default: "unset (on when `CI` is set)",
        meaning: "`1` runs the tests that take minutes on 2 cores (HybridSN patch mode over a 610 x 340 scene in `serve`)",
    },
    EnvVar {
        name: "HSIEDGE_TEST_SKIP_DIR",
        default: "unset (a skipped test only prints its reason, which cargo hides)",
        meaning: "folder where skipped tests record why; `make test` sets it and prints the records",
    },
    EnvVar {
        name: "HSIEDGE_TEST_PYTHON",
        default: "python3",
        meaning: "Python the tests run (spectral, numpy, onnxruntime); `make test` sets target/venv/bin/python",
    },
    EnvVar {
        name: "HSIEDGE_DEB_REQUIRED",
        default: "unset (a Debian package not built is skipped)",
        meaning: "1: a Debian package not built fails the package tests (cross/run deb*, cross/ci.sh set it)",
    },
    EnvVar {
        name: "HSIEDGE_E2E_HOST_BIN",
        default: "unset (the cross end-to-end test skips)",
        meaning: "the x86_64 hsiedge the aarch64 build is compared with (set by cross/run test)",
    },
    EnvVar {
        name: "HSIEDGE_E2E_HOST_ORT",
        default: "unset (the cross end-to-end test skips)",
        meaning: "the x86_64 libonnxruntime for HSIEDGE_E2E_HOST_BIN (set by cross/run test)",
    },
    EnvVar {
        name: "HSIEDGE_TEST_OUTAGE_S",
        default: "5",
        meaning: "seconds the delivery test keeps the MQTT broker stopped (docs/reliability.md records 30)",
    },
    EnvVar {
        name: "HSIEDGE_TEST_KILL_POINTS",
        default: "3",
        meaning: "random kill -9 points of the delivery crash test (docs/reliability.md records 20)",
    },
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique() {
        let mut names: Vec<_> = ALL.iter().chain(TEST_ONLY).map(|v| v.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), ALL.len() + TEST_ONLY.len());
    }
}
