#!/usr/bin/env bash
# Runs on the GPU machine from the checkout root, with everything under .gpu/ (staged by gpu/run)
# and onnxruntime-gpu's libraries in /tmp/ortparts (earlier calls). Every GPU test and benchmark,
# results into $OUT/gpu-results.tar.gz plus $OUT/log.
#
#   bash .gpu/device.sh [ours|torch|verify|all]   (default all, one call of at most ~580 s: ours, the
#   sweeps, then PyTorch in the time left; torch: the sweeps and PyTorch)
# `ours`: kernels, labels (CPU against CUDA, host and device I/O paths), benches (Salinas-A and a
# 1024 x 1024 scene, host against device path, fp32/fp16, CUDA graphs), the CPU path before and
# after (.gpu/hsiedge-base against .gpu/hsiedge, alternated), the device memory checks.
# `torch`: the batch sweeps with their plots and gpu_baseline.py's HybridSN parts.
set -u
what=${1:-all}
G=$PWD/.gpu
R=/tmp/gpu-results
mkdir -p "$R" /tmp/ortgpu
if [ ! -f /tmp/ortgpu/libonnxruntime.so.1.31.1 ]; then
  mkdir -p /tmp/ortparts && cp "$G"/part* /tmp/ortparts/ 2>/dev/null
  cat /tmp/ortparts/part* | xz -d | tar -x -C /tmp/ortgpu || echo "unpack failed"
fi
export ORT_DYLIB_PATH=/tmp/ortgpu/libonnxruntime.so.1.31.1
export LD_LIBRARY_PATH=/tmp/ortgpu:/usr/local/cuda/lib64:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib:${LD_LIBRARY_PATH:-}
export HSIEDGE_CACHE_DIR=/tmp/no-sweep-cache
B=$G/hsiedge
B0=$G/hsiedge-base
M=$G/models/hybridsn_salinas_a/manifest.json
S=$G/data/salinas_a/salinas_a.hdr
SIM=/tmp/sim/scene.hdr
step() { echo "== $* ($(date +%T))"; }
mem_trace() { ( while sleep 0.05; do nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits; done ) > "$1" 2>/dev/null & echo $!; }

big() {
  local name=$1; shift
  timeout 120 $B bench classify "$SIM" --model "$M" --no-python --json --ep cuda --only dense --tile 256 --dense-batch 16 --repeat 5 "$@" \
    > "$R/big_$name.json" 2> "$R/big_$name.err"; echo "big $name rc=$?"; tail -2 "$R/big_$name.err"
  python3 -c "import json,sys; d=json.load(open(sys.argv[1]))['dense']; print({x: d[x] for x in ('end_to_end_s','inference_s','tiling_s','pixels_per_s','e2e_over_inference')}, d.get('device_io'))" "$R/big_$name.json" 2>/dev/null
}

memory() {
step memory
# The plan's predicted device peak against the run's measured one (cuMemGetInfo every 1 ms in the
# run, and nvidia-smi every 50 ms beside it), at the batch the plan chose (--no-knee: memory binds).
$B plan --model "$M" --scene "$SIM" --mode dense --tile 256 --ep cuda > "$R/plan_cuda.txt" 2>&1; echo "plan rc=$?"; grep -E 'device|batch_safe|B_safe' "$R/plan_cuda.txt" | head -5
for lim in "$@"; do
  extra=""; [ $lim != none ] && extra="--gpu-mem-limit-mib $lim"
  for mode in dense patch; do
    MP=$(mem_trace "$R/mem_used_${mode}_$lim.txt")
    timeout 90 $B classify "$SIM" --model "$M" --out /tmp/o/mem-$mode-$lim --mode $mode --tile 256 --batch auto --no-knee --max-batch 65536 \
      --ep cuda --io device $extra --json > "$R/classify_auto_${mode}_$lim.json" 2> "$R/classify_auto_${mode}_$lim.err"; echo "auto $mode limit $lim rc=$?"; tail -2 "$R/classify_auto_${mode}_$lim.err"
    kill $MP
    python3 - "$R/classify_auto_${mode}_$lim.json" "$R/mem_used_${mode}_$lim.txt" <<'PY'
import json, sys
try:
    d = json.load(open(sys.argv[1])); p = d["batch_plan"]; dv = p.get("device") or {}
    smi = [int(x) for x in open(sys.argv[2]).read().split() if x.strip().isdigit()]
    pred, meas = dv.get("predicted_peak_bytes"), d.get("device_peak_bytes")
    print(dict(batch=d["batch"], limited_by=p["plan"].get("limited_by"), device_units_safe=dv.get("units_safe"), binding=dv.get("binding"),
               source=dv.get("source"), fixed_mib=(dv.get("fixed_bytes") or 0) / 2**20, per_unit_mib=(dv.get("per_unit_bytes") or 0) / 2**20,
               predicted_mib=pred and pred / 2**20, measured_mib=meas and meas / 2**20, smi_max_mib=max(smi) if smi else None,
               error=(meas - pred) / pred if pred and meas else None))
except Exception as e:
    print("no result:", e)
PY
  done
done
}

# `verify`: the CUDA-graph labels (dense and patch against the CPU), the device memory checks under
# 8 GiB and the 1024 x 1024 fp16 CUDA-graph bench: what a fix after a full run needs re-measured.
verify() {
step device; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$R/device.csv"
step graph-labels
for mode in patch dense; do
  $B classify "$S" --model "$M" --out /tmp/o/cpu-$mode --mode $mode --batch 64 --json > "$R/classify_cpu_$mode.json"
  for g in "" --cuda-graph; do
    timeout 60 $B classify "$S" --model "$M" --out /tmp/o/cuda-$mode$g --mode $mode --batch 64 --ep cuda --io device $g \
      --json > "$R/classify_cuda_${mode}${g}.json" 2> "$R/classify_cuda_${mode}${g}.err"; echo "classify $mode $g rc=$?"; tail -2 "$R/classify_cuda_${mode}${g}.err"
    python3 -c "import sys; a=open(sys.argv[1],'rb').read(); b=open(sys.argv[2],'rb').read(); print(sys.argv[3], 'agreement', sum(x==y for x,y in zip(a,b))/len(a))" \
      /tmp/o/cpu-$mode/class_map.img /tmp/o/cuda-$mode$g/class_map.img "$mode$g" 2>&1 | tee -a "$R/verify_agreement.txt"
  done
done
$B simulate --model "$M" --out /tmp/sim --lines 1024 --samples 1024 > /dev/null; echo "simulate rc=$?"
memory 8192
big fp16_device --io device --precision fp16
big fp16_device_graph --io device --precision fp16 --cuda-graph
}

ours() {
step device; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$R/device.csv"
step probe; $B gpu probe | tee "$R/probe.json"
step kernels; $B gpu check > "$R/check.json"; echo "rc=$?"; grep -E '"(kernel|mismatches|pass)"' "$R/check.json" | sort | uniq -c
step tensorrt; $B classify "$S" --model "$M" --out /tmp/o/trt --ep tensorrt 2> "$R/tensorrt_error.txt"; echo "rc=$?"; head -c 400 "$R/tensorrt_error.txt"; echo
step labels
for mode in patch dense; do
  $B classify "$S" --model "$M" --out /tmp/o/cpu-$mode --mode $mode --batch 64 --json > "$R/classify_cpu_$mode.json"
  for p in fp32 fp16; do
    for io in host device; do
      timeout 60 $B classify "$S" --model "$M" --out /tmp/o/cuda-$mode-$p-$io --mode $mode --batch 64 --ep cuda --precision $p \
        --io $io --json > "$R/classify_cuda_${mode}_${p}_$io.json" 2> "$R/classify_cuda_${mode}_${p}_$io.err"
      echo "classify $mode $p $io rc=$?"; tail -2 "$R/classify_cuda_${mode}_${p}_$io.err"
    done
  done
  timeout 60 $B classify "$S" --model "$M" --out /tmp/o/cuda-$mode-fp32-graph --mode $mode --batch 64 --ep cuda --io device \
    --cuda-graph --json > "$R/classify_cuda_${mode}_fp32_graph.json" 2> "$R/classify_cuda_${mode}_fp32_graph.err"
  echo "classify $mode cuda-graph rc=$?"; tail -2 "$R/classify_cuda_${mode}_fp32_graph.err"
done
python3 - "$R" <<'PY'
import json, sys, os
R = sys.argv[1]
out = {}
for mode in ("patch", "dense"):
    cpu = open(f"/tmp/o/cpu-{mode}/class_map.img", "rb").read()
    for v in ("fp32_host", "fp32_device", "fp16_host", "fp16_device", "fp32_graph"):
        p, io = v.split("_")
        f = f"/tmp/o/cuda-{mode}-{p}-{io}/class_map.img"
        if not os.path.exists(f):
            out[f"{mode}_{v}"] = None; continue
        g = open(f, "rb").read()
        same = sum(a == b for a, b in zip(cpu, g))
        out[f"{mode}_{v}"] = dict(agreement=same / len(cpu), same=same, pixels=len(cpu))
json.dump(out, open(f"{R}/agreement.json", "w"), indent=1)
print(json.dumps(out))
PY
step bench-salinas
bench() {
  local name=$1; shift
  timeout 120 $B bench classify "$S" --model "$M" --no-python --json --repeat 10 "$@" \
    > "$R/bench_$name.json" 2> "$R/bench_$name.err"; echo "bench $name rc=$?"; tail -2 "$R/bench_$name.err"
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); [print(k, d[k] and {x: d[k][x] for x in ('batch','end_to_end_s','inference_s','pixels_per_s','e2e_over_inference')}, d[k] and d[k].get('device_io')) for k in ('patch','dense')]" "$R/bench_$name.json" 2>/dev/null
}
bench cuda_fp32_host --ep cuda --io host --batch 1024 --dense-batch 16
bench cuda_fp32_device --ep cuda --io device --batch 1024 --dense-batch 16
bench cuda_fp32_device_b128 --ep cuda --io device --batch 128 --dense-batch 16 --only patch
bench cuda_fp16_device --ep cuda --io device --precision fp16 --batch 1024 --dense-batch 16
bench cuda_fp16_device_graph --ep cuda --io device --cuda-graph --precision fp16 --batch 1024 --dense-batch 16
step bench-1024
$B simulate --model "$M" --out /tmp/sim --lines 1024 --samples 1024 > /dev/null; echo "simulate rc=$?"
big fp32_host --io host
big fp32_device --io device
big fp16_device --io device --precision fp16
big fp16_device_graph --io device --precision fp16 --cuda-graph
memory 8192 2048
step cpu-before-after
[ -x "$B0" ] || echo "skipped: no .gpu/hsiedge-base (stage with BASE_BIN=...)"
[ -x "$B0" ] && for i in 1 2; do
  for b in base new; do
    bin=$B; [ $b = base ] && bin=$B0
    timeout 60 $bin bench classify "$S" --model "$M" --no-python --json --repeat 3 --ep cpu > "$R/cpu_${b}_$i.json" 2>/dev/null; echo "cpu $b $i rc=$?"
  done
done
}

sweeps() {
step sweep
for mode in patch dense; do
  MP=$(mem_trace "$R/sweep_mem_${mode}_mib.txt")
  timeout 60 $B bench sweep --model "$M" --mode $mode --ep cuda --no-cache --json --max-run-s 2 --repeat 3 --fp16 --plot "$R/sweep_cuda_$mode.svg" \
    > "$R/sweep_cuda_$mode.json" 2> "$R/sweep_cuda_$mode.err"; echo "sweep $mode rc=$?"; tail -3 "$R/sweep_cuda_$mode.err"
  kill $MP
done
}

pytorch() {
step pytorch
# gpu_baseline.py's HybridSN parts (its whole run, cnn3d and the OOM searches included, outlasts
# 300 s): dense tiles first, then the patch sweep; the JSON keeps each part as it finishes.
left=$(( ${DEADLINE_S:-580} - SECONDS )); [ $left -gt 300 ] && left=300
echo "pytorch gets ${left} s"
[ $left -gt 20 ] && (cd "$R" && OUT="$R" PYTHONUNBUFFERED=1 timeout $left python3 "$G/baseline_subset.py" > "$R/gpu_baseline.log" 2>&1); echo "baseline rc=$?"; tail -3 "$R/gpu_baseline.log"
}

# `all` (one call, about 580 s at most): ours, the sweeps, then PyTorch in the time left.
case $what in
  ours) ours ;;
  verify) verify ;;
  torch) sweeps; pytorch ;;
  *) ours; sweeps; pytorch ;;
esac
tar -C /tmp -czf "$OUT/gpu-results-$what.tar.gz" gpu-results
ls -la "$R" | head -80
