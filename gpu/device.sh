#!/usr/bin/env bash
# Runs on the GPU machine from the checkout root, with everything under .gpu/ (staged by gpu/run)
# and onnxruntime-gpu's libraries in /tmp/ortparts (earlier calls). Every GPU test and benchmark,
# results into $OUT/gpu-results.tar.gz plus $OUT/log.
set -u
G=$PWD/.gpu
R=/tmp/gpu-results
rm -rf "$R" && mkdir -p "$R" /tmp/ortgpu
if [ ! -f /tmp/ortgpu/libonnxruntime.so.1.31.1 ]; then
  mkdir -p /tmp/ortparts && cp "$G"/part* /tmp/ortparts/ 2>/dev/null
  cat /tmp/ortparts/part* | xz -d | tar -x -C /tmp/ortgpu || echo "unpack failed"
fi
ls -la /tmp/ortgpu
export ORT_DYLIB_PATH=/tmp/ortgpu/libonnxruntime.so.1.31.1
export LD_LIBRARY_PATH=/tmp/ortgpu:/usr/local/cuda/lib64:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib:${LD_LIBRARY_PATH:-}
export HSIEDGE_CACHE_DIR=/tmp/no-sweep-cache
B=$G/hsiedge
M=$G/models/hybridsn_salinas_a/manifest.json
S=$G/data/salinas_a/salinas_a.hdr
step() { echo "== $*"; }
step device; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$R/device.csv"
step probe; $B gpu probe | tee "$R/probe.json"
step kernels; $B gpu check > "$R/check.json"; echo "rc=$?"; head -c 600 "$R/check.json"; echo
step doctor; $B doctor --provider cuda --json > "$R/doctor_cuda.json"; echo "rc=$?"
$B doctor --provider tensorrt --json > "$R/doctor_tensorrt.json"; echo "rc=$?"
step tensorrt; $B classify "$S" --model "$M" --out /tmp/o/trt --ep tensorrt 2> "$R/tensorrt_error.txt"; echo "rc=$?"; cat "$R/tensorrt_error.txt"
# Labels: CPU against CUDA fp32 and fp16, patch and dense.
for mode in patch dense; do
  $B classify "$S" --model "$M" --out /tmp/o/cpu-$mode --mode $mode --batch 64 --json > "$R/classify_cpu_$mode.json"
  for p in fp32 fp16; do
    for algo in heuristic exhaustive; do
      $B classify "$S" --model "$M" --out /tmp/o/cuda-$mode-$p-$algo --mode $mode --batch 64 --ep cuda --precision $p \
        --cudnn-conv-algo-search $algo --json > "$R/classify_cuda_${mode}_${p}_$algo.json"; echo "classify $mode $p $algo rc=$?"
    done
  done
done
python3 - "$R" <<'PY'
import json, sys, os
R = sys.argv[1]
out = {}
for mode in ("patch", "dense"):
    cpu = open(f"/tmp/o/cpu-{mode}/class_map.img", "rb").read()
    for p in ("fp32", "fp16"):
        for algo in ("heuristic", "exhaustive"):
            f = f"/tmp/o/cuda-{mode}-{p}-{algo}/class_map.img"
            if not os.path.exists(f):
                out[f"{mode}_{p}_{algo}"] = None; continue
            g = open(f, "rb").read()
            same = sum(a == b for a, b in zip(cpu, g))
            out[f"{mode}_{p}_{algo}"] = dict(agreement=same / len(cpu), same=same, pixels=len(cpu))
json.dump(out, open(f"{R}/agreement.json", "w"), indent=1)
print(json.dumps(out, indent=1))
PY
step bench
bench() {
  local name=$1; shift
  timeout 150 $B bench classify "$S" --model "$M" --no-python --json --batch 1024 --dense-batch 16 --repeat 20 "$@" \
    > "$R/bench_$name.json" 2> "$R/bench_$name.err"; echo "bench $name rc=$?"; tail -3 "$R/bench_$name.err"
}
bench cpu --ep cpu
bench cuda_fp32_heuristic --ep cuda --cudnn-conv-algo-search heuristic
bench cuda_fp32_exhaustive --ep cuda --cudnn-conv-algo-search exhaustive
bench cuda_fp16_heuristic --ep cuda --precision fp16 --cudnn-conv-algo-search heuristic
bench cuda_fp16_exhaustive --ep cuda --precision fp16 --cudnn-conv-algo-search exhaustive
step sweep
( while sleep 0.1; do nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits; done ) > "$R/sweep_mem_used_mib.txt" 2>/dev/null &
SP=$!
for mode in patch dense; do
  timeout 150 $B bench sweep --model "$M" --mode $mode --ep cuda --no-cache --json --max-run-s 5 \
    > "$R/sweep_cuda_$mode.json" 2> "$R/sweep_cuda_$mode.err"; echo "sweep $mode rc=$?"; tail -3 "$R/sweep_cuda_$mode.err"
done
kill $SP
step nvml-peak
( while sleep 0.05; do nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits; done ) > "$R/mem_used_mib.txt" 2>/dev/null &
MP=$!
$B classify "$S" --model "$M" --out /tmp/o/mem --mode dense --batch 16 --ep cuda --gpu-mem-limit-mib 8192 --json > "$R/classify_8gib.json"; echo "8GiB limit rc=$?"
kill $MP
step pytorch
# gpu_baseline.py's HybridSN parts (its whole run, cnn3d and the OOM searches included, outlasts 300 s).
cd "$R" && OUT="$R" PYTHONUNBUFFERED=1 timeout 300 python3 "$G/baseline_subset.py" > "$R/gpu_baseline.log" 2>&1; echo "baseline rc=$?"; tail -5 "$R/gpu_baseline.log"
tar -C /tmp -czf "$OUT/gpu-results.tar.gz" gpu-results
ls -la "$R"
