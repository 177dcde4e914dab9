#!/usr/bin/env bash
# Installs the arm64 .deb into a Debian arm64 root and runs hsiedge there, all emulated. The root is
# bullseye by default (glibc 2.31, as on JetPack 5: the oldest system the package claims); DEB_SUITE=bookworm
# tests a glibc 2.36 root instead.
#   debootstrap --foreign --arch=arm64   (first stage, on the host)
#   proot -q qemu-aarch64 ... --second-stage  (binfmt_misc is not mounted, so chroot cannot run arm64 code)
#   proot ... dpkg -i hsiedge_*_arm64.deb; hsiedge --version; hsiedge doctor (without, then with ORT)
# Usage: cross/deb-install-test.sh PATH/TO/hsiedge_VERSION_arm64.deb   (via `cross/run deb-install-test`)
# The root is kept in target/deb-install/rootfs-SUITE (second run: only the install steps); DEB_ROOT_FRESH=1 rebuilds it.
set -euo pipefail
status=0
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEB=${1:-}
[ -n "$DEB" ] && [ -f "$DEB" ] || { echo "usage: $0 hsiedge_*_arm64.deb (run cross/run deb first)" >&2; exit 2; }
SUITE=${DEB_SUITE:-bullseye}
WORK=$ROOT/target/deb-install
RFS=$WORK/rootfs-$SUITE
LOG=$WORK/log
mkdir -p "$WORK"
: > "$LOG"
MIRROR=$(awk '/^URIs:/ && $2 ~ /debian\/?$/ {print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
MIRROR=${MIRROR:-http://deb.debian.org/debian}
step() { printf '[deb-install-test] %s\n' "$*" | tee -a "$LOG" >&2; }
t() { local s rc=0; s=$(date +%s); "$@" || rc=$?; step "  ($(( $(date +%s) - s )) s)"; return $rc; }

# proot: -0 fakes uid 0, -q runs guest code through qemu-aarch64; /proc, /sys, /dev from the host.
in_root() {
    proot -0 -q qemu-aarch64 -r "$RFS" -b /proc -b /sys -b /dev -w / \
        /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 DEBIAN_FRONTEND=noninteractive "$@"
}

# in_root_b EXTRA_PROOT_ARGS... -- COMMAND...
in_root_b() {
    local extra=()
    while [ "$1" != -- ]; do extra+=("$1"); shift; done; shift
    proot -0 -q qemu-aarch64 -r "$RFS" -b /proc -b /sys -b /dev "${extra[@]}" -w / \
        /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 "$@"
}

if [ "${DEB_ROOT_FRESH:-}" = 1 ]; then rm -rf "$RFS"; fi
if [ ! -e "$RFS/.stage1-done" ]; then
    rm -rf "$RFS"
    step "debootstrap --foreign --arch=arm64 $SUITE from $MIRROR"
    t nice -n 10 debootstrap --foreign --arch=arm64 --variant=minbase --include=adduser "$SUITE" "$RFS" "$MIRROR" >>"$LOG" 2>&1
    touch "$RFS/.stage1-done"
fi
# debootstrap leaves /proc as a symlink to /proc in a container (seen); proot cannot bind over it.
for d in proc sys dev; do
    if [ -L "$RFS/$d" ]; then rm "$RFS/$d"; mkdir -p "$RFS/$d"; fi
done
if [ ! -e "$RFS/.stage2-done" ]; then
    step "second stage under proot + qemu-aarch64"
    t nice -n 10 proot -0 -q qemu-aarch64 -r "$RFS" -b /proc -b /sys -b /dev -w / \
        /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root DEBOOTSTRAP_DIR=/debootstrap /debootstrap/debootstrap --second-stage >>"$LOG" 2>&1 \
        || { step "second stage FAILED; tail of $RFS/debootstrap/debootstrap.log:"; tail -n 30 "$RFS/debootstrap/debootstrap.log" >&2 || true; exit 1; }
    touch "$RFS/.stage2-done"
fi

step "uname -m inside: $(in_root uname -m)"
cp "$DEB" "$RFS/tmp/hsiedge.deb"
step "dpkg -i $(basename "$DEB")"
in_root dpkg --purge hsiedge >>"$LOG" 2>&1 || true
t in_root dpkg -i /tmp/hsiedge.deb 2>&1 | tee -a "$LOG"
in_root dpkg -s hsiedge | grep -E '^(Status|Version|Architecture):' | tee -a "$LOG"
step "service account and directories"
in_root getent passwd hsiedge | tee -a "$LOG"
# find, not stat: coreutils 9 stat uses statx, which proot 5.1 does not translate (ENOENT, seen).
in_root find /var/lib/hsiedge /var/spool/hsiedge /var/spool/hsiedge/incoming -maxdepth 0 -printf '%p %u:%g %m\n' | tee -a "$LOG"
step "hsiedge --version"
in_root /usr/bin/hsiedge --version | tee -a "$LOG"
# Until the binary has the subcommand, run the same library code as the hsiedge-doctor example.
DOCTOR=(/usr/bin/hsiedge doctor)
if ! in_root /usr/bin/hsiedge --help | grep -q '^  doctor'; then
    EX=$ROOT/target/aarch64-unknown-linux-gnu/release/examples/hsiedge-doctor
    [ -x "$EX" ] || RUSTC=/usr/bin/rustc nice -n 10 cargo build --locked --release --target aarch64-unknown-linux-gnu --example hsiedge-doctor
    cp "$EX" "$RFS/usr/local/bin/hsiedge-doctor"
    DOCTOR=(/usr/local/bin/hsiedge-doctor)
    step "hsiedge has no doctor subcommand yet: using the hsiedge-doctor example (same library code)"
fi
step "${DOCTOR[*]} without ONNX Runtime (expected: exit 1)"
set +e
in_root "${DOCTOR[@]}" 2>&1 | tee -a "$LOG"; rc=${PIPESTATUS[0]}
set -e
step "  exit $rc"
[ "$rc" = 1 ] || { step "expected exit 1"; exit 1; }
ORT=$ROOT/target/ort/aarch64/libonnxruntime.so.1.20.1
if [ -f "$ORT" ]; then
    # proot 5.1 does not translate statx(2), which Rust's std uses for every metadata call (is_file, exists):
    # paths that exist only inside the root look missing to hsiedge there (seen). Paths bound at the same
    # place inside and outside work, so the library, models and scene are reached through such a bind.
    step "${DOCTOR[*]} with libonnxruntime 1.20.1 in /usr/lib/hsiedge (known to fail under proot: statx)"
    mkdir -p "$RFS/usr/lib/hsiedge"; cp "$ORT" "$RFS/usr/lib/hsiedge/"
    set +e
    in_root "${DOCTOR[@]}" > "$WORK/doctor-usr-lib.txt" 2>&1; rc=$?
    head -n 3 "$WORK/doctor-usr-lib.txt" | tee -a "$LOG"
    set -e
    step "  exit $rc (a Jetson or a real chroot finds it; this is the proot limitation)"
    rm -f "$RFS/usr/lib/hsiedge/libonnxruntime.so.1.20.1"
    step "${DOCTOR[*]} with ORT_DYLIB_PATH=$ORT bound at the same path (expected: exit 0)"
    BIND=(-b "$ROOT:$ROOT")
    set +e
    in_root_b "${BIND[@]}" -- env ORT_DYLIB_PATH="$ORT" "${DOCTOR[@]}" 2>&1 | tee -a "$LOG"; rc=${PIPESTATUS[0]}
    set -e
    step "  exit $rc"
    [ "$rc" = 0 ] || { step "expected exit 0"; exit 1; }
    SCENE=${HSIEDGE_DATA:-$ROOT/../shared/data}/salinas_a
    if [ -f "$SCENE/salinas_a.hdr" ]; then
        step "hsiedge classify with the packaged model"
        SC=$(cd "$SCENE" && pwd)
        OUTD=$WORK/classify-out; rm -rf "$OUTD"
        # The packaged model is byte-identical to models/ (checked here); it is read through the bind.
        cmp "$RFS/usr/share/hsiedge/models/hybridsn_salinas_a/patch.onnx" "$ROOT/models/hybridsn_salinas_a/patch.onnx"
        if t in_root_b -b "$ROOT:$ROOT" -b "$SC:$SC" -- env ORT_DYLIB_PATH="$ORT" /usr/bin/hsiedge classify "$SC/salinas_a.hdr" \
            --model "$ROOT/models/hybridsn_salinas_a/manifest.json" --out "$OUTD" --json \
            > "$WORK/classify.json" 2>>"$LOG"; then
            step "  class map $(stat -c %s "$OUTD/class_map.img") bytes; first batch $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["first_batch_s"])' "$WORK/classify.json") s"
        else
            step "  classify FAILED: $(grep -a "error" "$LOG" | tail -n 1)"
            status=1
        fi
    fi
fi
rm -f "$RFS/usr/local/bin/hsiedge-doctor"
step "dpkg --purge hsiedge"
in_root dpkg --purge hsiedge 2>&1 | tee -a "$LOG"
[ ! -e "$RFS/var/lib/hsiedge" ] && [ ! -e "$RFS/usr/bin/hsiedge" ] && step "purged: binary and state removed"
[ "$status" = 0 ] && step "OK (log: $LOG)" || step "FAILED steps above (log: $LOG)"
exit "$status"
