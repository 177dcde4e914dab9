#!/usr/bin/env bash
# Predicted against measured peak memory, batch 1 to batch_safe, for every shipped model:
# `hsiedge plan --verify` inside a cgroup v1 memory limit (root; /sys/fs/cgroup/memory).
#   benches/memory_table.sh [LIMIT_MIB] [DATA_DIR]
# Prints a markdown table. Each measurement is a fresh `hsiedge classify --batch B` process.
set -euo pipefail
limit=${1:-900}
data=${2:-../shared/data}
bin=${HSIEDGE_BIN:-target/release/hsiedge}
work=$(mktemp -d)
cg=/sys/fs/cgroup/memory/hsiedge-memtable-$$
trap 'rmdir "$cg" 2>/dev/null || true; rm -rf "$work"' EXIT
mkdir "$cg"
echo $((limit << 20)) > "$cg/memory.limit_in_bytes"

synthetic() { # model -> a 640 x 640 synthetic scene drawn from its class statistics
  "$bin" simulate --model "models/$1/manifest.json" --out "$work/$1" --lines 640 --samples 640 --fields 60 >/dev/null
  echo "$work/$1/scene.hdr"
}
cases=(
  "hybridsn_salinas_a dense $(synthetic hybridsn_salinas_a)"
  "hybridsn_salinas_a patch $data/salinas_a/salinas_a.hdr"
  "cnn3d_salinas_a dense $(synthetic cnn3d_salinas_a)"
  "cnn3d_salinas_a patch $data/salinas_a/salinas_a.hdr"
  "spectral1d_salinas_a patch $data/salinas_a/salinas_a.hdr"
  "unmix_jasper_ridge patch $data/jasper_ridge/jasper_ridge.hdr"
  "unmix_samson patch $data/samson/samson.hdr"
)
echo "cgroup limit ${limit} MiB; each row: predicted M(B) from the calibrated plan vs measured peak anonymous memory of a fresh run"
echo
echo "| model | mode | scene | B | in-flight | predicted MiB | measured MiB | error |"
echo "|---|---|---|---|---|---|---|---|"
for c in "${cases[@]}"; do
  read -r model mode scene <<<"$c"
  sh -c 'echo $$ > "$0/cgroup.procs" && shift && exec "$@"' "$cg" -- \
    "$bin" plan --model "models/$model/manifest.json" --scene "$scene" --mode "$mode" --threads 2 --no-knee --verify --json \
    >"$work/plan.json"
  python3 - "$work/plan.json" "$model" "$mode" "$scene" <<'PY'
import json, os, sys
p = json.load(open(sys.argv[1]))
rows = p["verify"]
for r in rows:
    print(f"| {sys.argv[2]} | {sys.argv[3]} | {os.path.basename(sys.argv[4])} | {r['batch']} | {r['in_flight']} | "
          f"{r['predicted_bytes']/2**20:.1f} | {r['measured_bytes']/2**20:.1f} | {r['error']*100:+.1f} % |")
PY
done
echo
echo "oom kills in the cgroup: $(awk '/oom_kill /{print $2}' "$cg/memory.oom_control")"
