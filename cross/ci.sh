#!/usr/bin/env bash
# CI step for aarch64: `.ci/run` calls this after its own tests (root, fresh clone, 2 cores, 90 min).
#   cross/ci.sh            setup + aarch64 build + the whole test suite under qemu-aarch64
#   CROSS_CI_DEB=1 cross/ci.sh   also build both .deb packages and check them (tests/deb_package.rs, lintian)
#   CROSS_CI_INSTALL=1 (with CROSS_CI_DEB=1)  also install the arm64 package into a debootstrapped root
# Cost on the 2-core build machine: see cross/README.md, "Measured".
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
start=$(date +%s)
stamp() { echo "[cross/ci] $1: $(( $(date +%s) - start )) s"; }
if [ "${CROSS_CI_DEB:-}" = 1 ]; then cross/run setup; else CROSS_NO_CARGO_DEB=1 cross/run setup; fi
stamp "setup"
cross/run test
stamp "aarch64 tests under qemu"
if [ "${CROSS_CI_DEB:-}" = 1 ]; then
    cross/run deb
    cross/run deb-amd64
    HSIEDGE_DEB_REQUIRED=1 nice -n 10 cargo test --locked --test deb_package
    cross/run lintian
    stamp "packages"
    if [ "${CROSS_CI_INSTALL:-}" = 1 ]; then
        cross/run deb-install-test
        stamp "install into a debootstrapped arm64 root"
    fi
fi
stamp "cross CI total"
