#!/usr/bin/env bash
# Numbers for cross/README.md "Measured": release binary sizes (stripped, LTO), package sizes, cold start to
# first tile of `hsiedge classify` on x86_64 and under qemu-aarch64. Writes target/measure.txt.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
T=aarch64-unknown-linux-gnu
SCENE=${HSIEDGE_DATA:-$ROOT/../shared/data}/salinas_a/salinas_a.hdr
MODEL=${MEASURE_MODEL:-models/hybridsn_salinas_a/manifest.json}
OUT=$ROOT/target/measure.txt
nice -n 10 cargo build --locked --release --bin hsiedge
"$ROOT/cross/run" build --release --bin hsiedge
{
echo "date: $(date -u +%FT%TZ)  host: $(uname -m), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
for b in target/release/hsiedge target/$T/release/hsiedge; do
    echo "binary $b: $(stat -c %s "$b") bytes ($(file -b "$b" | cut -d, -f1,2,5- | tr -s ' '))"
done
for d in target/debian/hsiedge_*.deb; do [ -f "$d" ] && echo "package $(basename "$d"): $(stat -c %s "$d") bytes"; done
run() { # run LABEL ORT CMD...
    local label=$1 ort=$2; shift 2
    for i in 1 2 3; do
        rm -rf "$ROOT/target/measure-out"
        local s e
        s=$(date +%s.%N)
        ORT_DYLIB_PATH=$ort "$@" classify "$SCENE" --model "$MODEL" --out "$ROOT/target/measure-out" --json --threads 1 > "$ROOT/target/measure.json"
        e=$(date +%s.%N)
        python3 - "$label" "$i" "$s" "$e" "$ROOT/target/measure.json" <<'PY'
import json, sys
label, i, s, e, f = sys.argv[1:]
j = json.load(open(f))
print(f"{label} run {i}: process wall {float(e)-float(s):.3f} s; load {j.get('load_s', 0):.3f} s, "
      f"first batch {j.get('first_batch_s', 0):.3f} s, whole scene {j.get('elapsed_s', 0):.3f} s "
      f"({j.get('mode')} mode, {j.get('tiles')} tiles, {j.get('pixels')} px)")
PY
    done
}
run "x86_64 native" target/ort/x86_64/libonnxruntime.so.1.31.1 target/release/hsiedge
run "aarch64 qemu" target/ort/aarch64/libonnxruntime.so.1.20.1 qemu-aarch64 -L / target/$T/release/hsiedge
} | tee "$OUT"
