#!/usr/bin/env bash
# Salinas-A end to end on both architectures: x86_64 natively, aarch64 under qemu-aarch64; compares the
# class maps byte for byte and the confidence maps within 1e-4. Usage: cross/e2e.sh [release|debug]
# (called by `cross/run e2e`; expects `cross/run setup` done).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PROFILE=${1:-release}
TARGET=aarch64-unknown-linux-gnu
SCENE=${HSIEDGE_DATA:-$ROOT/../shared/data}/salinas_a/salinas_a.hdr
ORT_X86=$ROOT/target/ort/x86_64/libonnxruntime.so.1.31.1
ORT_ARM=$ROOT/target/ort/aarch64/libonnxruntime.so.1.20.1
flag=(); [ "$PROFILE" = release ] && flag=(--release)
nice -n 10 cargo build --locked "${flag[@]}" --bin hsiedge
"$ROOT/cross/run" build "${flag[@]}" --bin hsiedge
HOST_BIN=$ROOT/target/$PROFILE/hsiedge
ARM_BIN=$ROOT/target/$TARGET/$PROFILE/hsiedge
OUT=${E2E_OUT:-$ROOT/target/e2e}
rm -rf "$OUT"; mkdir -p "$OUT"
status=0
for manifest in models/*/manifest.json; do
    name=$(basename "$(dirname "$manifest")")
    python3 -c 'import json,sys; m=json.load(open(sys.argv[1])); sys.exit(0 if m["task"]=="classification" and m["input"]["bands"]==204 else 1)' "$manifest" || continue
    ORT_DYLIB_PATH=$ORT_X86 "$HOST_BIN" classify "$SCENE" --model "$manifest" --out "$OUT/$name-x86_64" --json --threads 1 > "$OUT/$name-x86_64.json"
    ORT_DYLIB_PATH=$ORT_ARM qemu-aarch64 -L / "$ARM_BIN" classify "$SCENE" --model "$manifest" \
        --out "$OUT/$name-aarch64" --json --threads 1 > "$OUT/$name-aarch64.json"
    python3 - "$OUT/$name-x86_64" "$OUT/$name-aarch64" "$name" <<'PY' || status=1
import sys, struct
a, b, name = sys.argv[1:]
ca, cb = open(a + "/class_map.img", "rb").read(), open(b + "/class_map.img", "rb").read()
diff = sum(x != y for x, y in zip(ca, cb)) + abs(len(ca) - len(cb))
fa, fb = open(a + "/confidence.img", "rb").read(), open(b + "/confidence.img", "rb").read()
n = len(fa) // 4
va, vb = struct.unpack("<%df" % n, fa), struct.unpack("<%df" % n, fb[: 4 * n])
worst = max(abs(x - y) for x, y in zip(va, vb))
print(f"{name}: class map {'identical' if diff == 0 else f'{diff} pixels differ'} ({len(ca)} px), "
      f"max |confidence diff| {worst:.3g}")
sys.exit(0 if diff == 0 and worst <= 1e-4 else 1)
PY
done
exit $status
