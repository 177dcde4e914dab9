#!/usr/bin/env bash
# `make demo`: classify the bundled default scene with the bundled model, and the real Salinas-A
# scene too when the shared benchmark data is beside the repository.
#   tests/demo.sh MODEL_MANIFEST DATA_DIR OUT_DIR
set -euo pipefail
model=${1:-models/hybridsn_salinas_a/manifest.json}
data=${2:-../shared/data}
out=${3:-out/demo}
bin=target/release/hsiedge

echo "== bundled default scene (SYNTHETIC: drawn from the class statistics in $model)"
"$bin" simulate --model "$model" --out "$out/synthetic_scene" --lines 256 --samples 256 --fields 40 --seed 7
"$bin" classify "$out/synthetic_scene/scene.hdr" --model "$model" --out "$out/synthetic_maps" \
  --labels "$out/synthetic_scene/labels.hdr"

if [ -f "$data/salinas_a/salinas_a.hdr" ]; then
  echo "== real scene: Salinas-A (AVIRIS), $data/salinas_a"
  "$bin" classify "$data/salinas_a/salinas_a.hdr" --model "$model" --out "$out/salinas_a_maps" \
    --labels "$data/salinas_a/salinas_a_gt.hdr"
else
  echo "== real scene skipped: no $data/salinas_a (the shared benchmark data is not on this machine)"
fi
echo "quick-looks: $out/*/quicklook.png"
