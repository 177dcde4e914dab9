#!/usr/bin/env bash
# Runs on the GPU machine from the checkout root, with everything under .gpu/ (staged by gpu/run)
# and onnxruntime-gpu's libraries in /tmp/ortparts (earlier calls). Every GPU test and benchmark,
# results into $OUT/gpu-results.tar.gz plus $OUT/log.
#
#   bash .gpu/device.sh [ours|core|quick|mini|torch|rest|fix|memory|mapped|queued|all]   (default all, one call of at most ~580 s: ours, the
#   sweeps, then PyTorch in the time left; torch: the sweeps and PyTorch)
# `ours`: kernels, labels (CPU against CUDA, host and device I/O paths), benches (Salinas-A and a
# 1024 x 1024 scene, host against device path, fp32/fp16, CUDA graphs), the CPU path before and
# after (.gpu/hsiedge-base against .gpu/hsiedge, alternated), the device memory checks.
# `torch`: the batch sweeps with their plots and gpu_baseline.py's HybridSN parts; `rest`: the same
# without baseline_ours.py (after `quick`, on the same warm machine).
set -u
what=${1:-all}
G=$PWD/.gpu
# Results straight under $OUT: a call cut short by its time limit still brings back what it wrote.
R=${OUT:-/tmp}/gpu-results
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

# big NAME [bench options]: dense on a 1024 x 1024 scene ($SCENE, default the float32 one), tile 256.
big() {
  local name=$1; shift
  timeout 120 $B bench classify "${SCENE:-$SIM}" --model "$M" --no-python --json --ep cuda --only dense --tile 256 --repeat 5 "$@" \
    > "$R/big_$name.json" 2> "$R/big_$name.err"; echo "big $name rc=$?"; tail -2 "$R/big_$name.err"
  python3 -c "import json,sys; d=json.load(open(sys.argv[1]))['dense']; print({x: d[x] for x in ('batch','end_to_end_s','inference_s','write_s','pixels_per_s','e2e_over_inference')}, d.get('device_io'))" "$R/big_$name.json" 2>/dev/null
}

# patchbig NAME [bench options]: patch mode on the 512 x 512 int16 scene, tile 256.
patchbig() {
  local name=$1; shift
  timeout 150 $B bench classify /tmp/sim512/scene.hdr --model "$M" --no-python --json --ep cuda --only patch --tile 256 --repeat 3 "$@" \
    > "$R/patchbig_$name.json" 2> "$R/patchbig_$name.err"; echo "patchbig $name rc=$?"; tail -2 "$R/patchbig_$name.err"
  python3 -c "import json,sys; d=json.load(open(sys.argv[1]))['patch']; print({x: d[x] for x in ('batch','end_to_end_s','inference_s','write_s','pixels_per_s','e2e_over_inference')}, d.get('device_io'))" "$R/patchbig_$name.json" 2>/dev/null
}

# The host's side of the structural bound: pinned host-to-device bandwidth and the host's own
# memory copy bandwidth (PyTorch, the same machine), 256 MiB a copy, medians of 10.
bandwidth() {
step bandwidth
python3 - > "$R/bandwidth.json" 2> "$R/bandwidth.err" <<'PY'
import json, time, statistics, torch
n = 256 << 20
h = torch.empty(n, dtype=torch.uint8).pin_memory(); d = torch.empty(n, dtype=torch.uint8, device="cuda")
p = torch.empty(n, dtype=torch.uint8); q = torch.empty(n, dtype=torch.uint8)
def timed(f):
    t = []
    for _ in range(12):
        torch.cuda.synchronize(); s = time.perf_counter(); f(); torch.cuda.synchronize(); t.append(time.perf_counter() - s)
    return statistics.median(t[2:])
h2d = timed(lambda: d.copy_(h, non_blocking=True))
d2h = timed(lambda: h.copy_(d, non_blocking=True))
cpy = timed(lambda: q.copy_(p))
print(json.dumps(dict(bytes=n, h2d_pinned_gb_s=n / h2d / 1e9, d2h_pinned_gb_s=n / d2h / 1e9, host_copy_one_thread_gb_s=n / cpy / 1e9, torch_threads=torch.get_num_threads())))
PY
cat "$R/bandwidth.json"; tail -2 "$R/bandwidth.err"
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

ours() {
step device; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$R/device.csv"
nproc; grep -m1 "model name" /proc/cpuinfo
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
[ -z "${QUICK:-}" ] && bench cuda_fp32_host --ep cuda --io host --batch 1024 --dense-batch 16
bench cuda_fp32_device --ep cuda --io device --batch 1024 --dense-batch 16
[ -z "${QUICK:-}" ] && bench cuda_fp32_device_b128 --ep cuda --io device --batch 128 --dense-batch 16 --only patch
bench cuda_fp16_device --ep cuda --io device --precision fp16 --batch 1024 --dense-batch 16
bench cuda_fp16_device_graph --ep cuda --io device --cuda-graph --precision fp16 --batch 1024 --dense-batch 16
step bench-1024
$B simulate --model "$M" --out /tmp/sim --lines 1024 --samples 1024 > /dev/null; echo "simulate rc=$?"
$B simulate --model "$M" --out /tmp/sim16 --lines 1024 --samples 1024 --int16 > /dev/null; echo "simulate int16 rc=$?"
$B simulate --model "$M" --out /tmp/sim512 --lines 512 --samples 512 --int16 > /dev/null; echo "simulate 512 int16 rc=$?"
# float32 samples: 16 tiles in one batch (no overlap possible) and in 4 batches of 4
if [ -z "${QUICK:-}" ]; then
big fp32_host --io host --dense-batch 16
big fp32_device --io device --dense-batch 16
big fp32_device_b4 --io device --dense-batch 4
big fp16_device --io device --precision fp16 --dense-batch 16
big fp16_device_graph_b4 --io device --precision fp16 --cuda-graph --dense-batch 4
fi
big fp16_device_b4 --io device --precision fp16 --dense-batch 4
# int16 samples (a sensor's numbers): half the bytes to copy and upload
SCENE=/tmp/sim16/scene.hdr big i16_fp32_host_b4 --io host --dense-batch 4
SCENE=/tmp/sim16/scene.hdr big i16_fp32_device_b4 --io device --dense-batch 4
SCENE=/tmp/sim16/scene.hdr big i16_fp16_device_b16 --io device --precision fp16 --dense-batch 16
SCENE=/tmp/sim16/scene.hdr big i16_fp16_device_b4 --io device --precision fp16 --dense-batch 4
SCENE=/tmp/sim16/scene.hdr big i16_fp16_device_b2 --io device --precision fp16 --dense-batch 2
SCENE=/tmp/sim16/scene.hdr big i16_fp16_device_graph_b4 --io device --precision fp16 --cuda-graph --dense-batch 4
step patch-512
patchbig fp32_device --io device --batch 1024
patchbig fp16_device --io device --precision fp16 --batch 1024
[ -z "${QUICK:-}" ] && patchbig fp16_device_graph --io device --precision fp16 --cuda-graph --batch 1024
if [ -z "${QUICK:-}" ]; then memory 8192 2048; else memory 8192; fi
step cpu-before-after
[ -x "$B0" ] || echo "skipped: no .gpu/hsiedge-base (stage with BASE_BIN=...)"
[ -x "$B0" ] && for i in 1 2; do
  for b in base new; do
    bin=$B; [ $b = base ] && bin=$B0
    timeout 60 $bin bench classify "$S" --model "$M" --no-python --json --repeat 3 --ep cpu > "$R/cpu_${b}_$i.json" 2>/dev/null; echo "cpu $b $i rc=$?"
  done
done
}

# The governor on the device path: a patch run at --batch auto over the 1024 x 1024 int16 scene;
# once its telemetry shows batches going, another process (PyTorch) takes all but 256 MiB of the
# GPU's free memory for 20 s. The run must finish, record a device-memory change in
# summary.json, and give the labels of an ungoverned run at a fixed batch.
governor() {
step governor
cat > /tmp/hog.py <<'PY'
import os, sys, time, torch
tele, keep = sys.argv[1], int(sys.argv[2]) << 20
torch.cuda.init(); torch.empty(1, device="cuda")
t0 = time.time()
while time.time() - t0 < 120 and not (os.path.exists(tele) and os.path.getsize(tele) > 0):
    time.sleep(0.02)
free, total = torch.cuda.mem_get_info()
take = max(free - keep, 0)
x = torch.empty(take, dtype=torch.uint8, device="cuda")
print(f"hog took {take >> 20} MiB of {free >> 20} MiB free at {time.time() - t0:.2f} s", flush=True)
time.sleep(20)
PY
rm -f /tmp/gov.jsonl
python3 /tmp/hog.py /tmp/gov.jsonl 256 > "$R/hog.log" 2>&1 & HP=$!
sleep 4
timeout 120 $B classify /tmp/sim16/scene.hdr --model "$M" --out /tmp/o/gov --mode patch --tile 256 --batch auto --no-knee --max-batch 8192 \
  --ep cuda --io device --telemetry /tmp/gov.jsonl --json > "$R/governor.json" 2> "$R/governor.err"; echo "governed run rc=$?"
kill $HP 2>/dev/null; wait $HP 2>/dev/null; cat "$R/hog.log"; grep -E "device memory|batch" "$R/governor.err" | head -8
timeout 120 $B classify /tmp/sim16/scene.hdr --model "$M" --out /tmp/o/gov-fixed --mode patch --tile 256 --batch 1024 --ep cuda --io device \
  --json > "$R/governor_fixed.json" 2> "$R/governor_fixed.err"; echo "fixed run rc=$?"
python3 - "$R" <<'PY2'
import json, sys
R = sys.argv[1]
try:
    d = json.load(open(f"{R}/governor.json"))
    a = open("/tmp/o/gov/class_map.img", "rb").read(); b = open("/tmp/o/gov-fixed/class_map.img", "rb").read()
    print(dict(batch=d["batch"], changes=d.get("batch_changes"), batches=d["batches"], identical_to_fixed=a == b, device_peak_mib=(d.get("device_peak_bytes") or 0) >> 20))
except Exception as e:
    print("no result:", e)
PY2
}

# `mini`: the new code's checks in the least device time: labels on the device path (CUDA graphs
# too), the int16 1024 x 1024 dense runs, PyTorch on hsiedge's network, one patch run, the
# governor, the 8 GiB plan.
mini() {
step device; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$R/device.csv"
step mini-labels
for mode in patch dense; do
  $B classify "$S" --model "$M" --out /tmp/o/cpu-$mode --mode $mode --batch 64 --json > "$R/classify_cpu_$mode.json"
  for v in "fp32:" "fp16:" "fp32:--cuda-graph"; do
    p=${v%%:*}; g=${v#*:}
    timeout 60 $B classify "$S" --model "$M" --out /tmp/o/cuda-$mode-$p$g --mode $mode --batch 64 --ep cuda --io device --precision $p $g \
      --json > "$R/classify_cuda_${mode}_$p$g.json" 2> "$R/classify_cuda_${mode}_$p$g.err"; echo "classify $mode $p $g rc=$?"; tail -1 "$R/classify_cuda_${mode}_$p$g.err"
    python3 -c "import sys; a=open(sys.argv[1],'rb').read(); b=open(sys.argv[2],'rb').read(); print(sys.argv[3], 'agreement', sum(x==y for x,y in zip(a,b))/len(a))" \
      /tmp/o/cpu-$mode/class_map.img /tmp/o/cuda-$mode-$p$g/class_map.img "$mode $p $g" 2>&1 | tee -a "$R/verify_agreement.txt"
  done
done
$B simulate --model "$M" --out /tmp/sim16 --lines 1024 --samples 1024 --int16 > /dev/null; echo "simulate int16 rc=$?"
$B simulate --model "$M" --out /tmp/sim --lines 1024 --samples 1024 > /dev/null; echo "simulate rc=$?"
$B simulate --model "$M" --out /tmp/sim512 --lines 512 --samples 512 --int16 > /dev/null; echo "simulate 512 int16 rc=$?"
step mini-bench
SCENE=/tmp/sim16/scene.hdr big i16_fp16_device_b4 --io device --precision fp16 --dense-batch 4
SCENE=/tmp/sim16/scene.hdr big i16_fp16_device_b2 --io device --precision fp16 --dense-batch 2
SCENE=/tmp/sim16/scene.hdr big i16_fp16_device_b16 --io device --precision fp16 --dense-batch 16
SCENE=/tmp/sim16/scene.hdr big i16_fp32_device_b4 --io device --dense-batch 4
patchbig fp16_device --io device --precision fp16 --batch 1024
}

# `fix`: the CUDA-graph labels (the halo check no longer captures the graph) and the 8 GiB patch
# run (a first batch the arena cannot hold starts the scene again at a smaller bucket).
fix() {
step fix-labels
for mode in dense patch; do
  $B classify "$S" --model "$M" --out /tmp/o/cpu-$mode --mode $mode --batch 64 --json > "$R/classify_cpu_$mode.json"
  timeout 60 $B classify "$S" --model "$M" --out /tmp/o/cuda-$mode-graph --mode $mode --batch 64 --ep cuda --io device --cuda-graph \
    --json > "$R/classify_cuda_${mode}_fp32_graph.json" 2> "$R/classify_cuda_${mode}_fp32_graph.err"; echo "classify $mode cuda-graph rc=$?"; tail -2 "$R/classify_cuda_${mode}_fp32_graph.err"
  python3 -c "import sys; a=open(sys.argv[1],'rb').read(); b=open(sys.argv[2],'rb').read(); print(sys.argv[3], 'agreement', sum(x==y for x,y in zip(a,b))/len(a))" \
    /tmp/o/cpu-$mode/class_map.img /tmp/o/cuda-$mode-graph/class_map.img "$mode fp32 cuda-graph" 2>&1 | tee -a "$R/fix_agreement.txt"
done
$B simulate --model "$M" --out /tmp/sim --lines 1024 --samples 1024 > /dev/null; echo "simulate rc=$?"
$B simulate --model "$M" --out /tmp/sim16 --lines 1024 --samples 1024 --int16 > /dev/null; echo "simulate int16 rc=$?"
SCENE=/tmp/sim16/scene.hdr big i16_fp16_device_graph_b4 --io device --precision fp16 --cuda-graph --dense-batch 4
SCENE=/tmp/sim16/scene.hdr big i16_fp16_device_b4 --io device --precision fp16 --dense-batch 4
memory 8192
}

# `mapped`: uploads straight from the registered mapping against host-gathered windows
# (HSIEDGE_DEVICE_UPLOAD=gathered), alternated in one call: kernels (the box cases), labels on
# Salinas-A and the 1024 x 1024 scene, the dense and patch benches, the 8 GiB plan, then PyTorch.
mapped() {
step device; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$R/device.csv"
step kernels; $B gpu check > "$R/check.json"; echo "rc=$?"; grep -E '"(kernel|pass)"' "$R/check.json" | sort | uniq -c
step mapped-labels
for mode in patch dense; do
  $B classify "$S" --model "$M" --out /tmp/o/cpu-$mode --mode $mode --batch 64 --json > "$R/classify_cpu_$mode.json"
  for v in "fp32:mapped" "fp16:mapped" "fp32:gathered"; do
    p=${v%%:*}; u=${v#*:}
    HSIEDGE_DEVICE_UPLOAD=$u timeout 60 $B classify "$S" --model "$M" --out /tmp/o/cuda-$mode-$p-$u --mode $mode --batch 64 --ep cuda --io device --precision $p \
      --json > "$R/classify_cuda_${mode}_${p}_$u.json" 2> "$R/classify_cuda_${mode}_${p}_$u.err"; echo "classify $mode $p $u rc=$?"; tail -1 "$R/classify_cuda_${mode}_${p}_$u.err"
    python3 -c "import sys,json; a=open(sys.argv[1],'rb').read(); b=open(sys.argv[2],'rb').read(); d=json.load(open(sys.argv[4])); print(sys.argv[3], 'agreement', sum(x==y for x,y in zip(a,b))/len(a), 'upload', d['device_io']['upload'], d['device_io'].get('upload_fallback'))" \
      /tmp/o/cpu-$mode/class_map.img /tmp/o/cuda-$mode-$p-$u/class_map.img "$mode $p $u" "$R/classify_cuda_${mode}_${p}_$u.json" 2>&1 | tee -a "$R/mapped_agreement.txt"
  done
done
$B simulate --model "$M" --out /tmp/sim16 --lines 1024 --samples 1024 --int16 > /dev/null; echo "simulate int16 rc=$?"
$B simulate --model "$M" --out /tmp/sim512 --lines 512 --samples 512 --int16 > /dev/null; echo "simulate 512 int16 rc=$?"
for u in mapped gathered; do
  HSIEDGE_DEVICE_UPLOAD=$u timeout 60 $B classify /tmp/sim16/scene.hdr --model "$M" --out /tmp/o/sim16-$u --mode dense --tile 256 --batch 4 --ep cuda --io device --json > "$R/classify_sim16_$u.json" 2> "$R/classify_sim16_$u.err"; echo "sim16 dense $u rc=$?"; tail -1 "$R/classify_sim16_$u.err"
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print({k: d[k] for k in ('elapsed_s','inference_s','write_s')}, d['device_io'])" "$R/classify_sim16_$u.json" 2>&1
done
cmp /tmp/o/sim16-mapped/class_map.img /tmp/o/sim16-gathered/class_map.img && echo "sim16 dense: mapped and gathered class maps identical" | tee -a "$R/mapped_agreement.txt"
step mapped-bench
for i in 1 2; do
  for u in mapped gathered; do
    HSIEDGE_DEVICE_UPLOAD=$u SCENE=/tmp/sim16/scene.hdr big i16_fp16_b4_${u}_$i --io device --precision fp16 --dense-batch 4
  done
done
for u in mapped gathered; do
  HSIEDGE_DEVICE_UPLOAD=$u SCENE=/tmp/sim16/scene.hdr big i16_fp16_b2_$u --io device --precision fp16 --dense-batch 2
  HSIEDGE_DEVICE_UPLOAD=$u SCENE=/tmp/sim16/scene.hdr big i16_fp32_b4_$u --io device --dense-batch 4
  HSIEDGE_DEVICE_UPLOAD=$u patchbig fp32_$u --io device --batch 1024
done
}

# `queued`: the session runs on the kernels' stream and its runs are only queued, labels come
# back one run behind, and the maps are written strip by strip during the run. Kernels, labels
# (CPU against CUDA, patch and dense; fp32, fp16, and --cuda-graph, which keeps waiting runs),
# the dense benches at 1024 x 1024 and 2048 x 2048 (int16), the patch bench, then PyTorch.
queued() {
step device; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$R/device.csv"
step kernels; $B gpu check > "$R/check.json"; echo "rc=$?"; grep -E '"(kernel|pass)"' "$R/check.json" | sort | uniq -c
step queued-labels
for mode in patch dense; do
  $B classify "$S" --model "$M" --out /tmp/o/cpu-$mode --mode $mode --batch 64 --json > "$R/classify_cpu_$mode.json"
  for v in fp32 fp16 graph; do
    case $v in graph) extra="--cuda-graph";; *) extra="--precision $v";; esac
    timeout 60 $B classify "$S" --model "$M" --out /tmp/o/cuda-$mode-$v --mode $mode --batch 64 --ep cuda --io device $extra \
      --json > "$R/classify_cuda_${mode}_$v.json" 2> "$R/classify_cuda_${mode}_$v.err"; echo "classify $mode $v rc=$?"; tail -1 "$R/classify_cuda_${mode}_$v.err"
    python3 -c "import sys,json; a=open(sys.argv[1],'rb').read(); b=open(sys.argv[2],'rb').read(); d=json.load(open(sys.argv[4])); print(sys.argv[3], 'agreement', sum(x==y for x,y in zip(a,b))/len(a), {k: d[k] for k in ('elapsed_s','inference_s','write_s')})" \
      /tmp/o/cpu-$mode/class_map.img /tmp/o/cuda-$mode-$v/class_map.img "$mode $v" "$R/classify_cuda_${mode}_$v.json" 2>&1 | tee -a "$R/queued_agreement.txt"
  done
done
$B simulate --model "$M" --out /tmp/sim16 --lines 1024 --samples 1024 --int16 > /dev/null; echo "simulate int16 rc=$?"
$B simulate --model "$M" --out /tmp/sim512 --lines 512 --samples 512 --int16 > /dev/null; echo "simulate 512 int16 rc=$?"
$B simulate --model "$M" --out /tmp/sim2k --lines 2048 --samples 2048 --int16 > /dev/null; echo "simulate 2048 int16 rc=$?"
for v in fp32 graph; do
  case $v in graph) extra="--cuda-graph";; *) extra="";; esac
  timeout 60 $B classify /tmp/sim16/scene.hdr --model "$M" --out /tmp/o/sim16-$v --mode dense --tile 256 --batch 4 --ep cuda --io device $extra --json > "$R/classify_sim16_$v.json" 2> "$R/classify_sim16_$v.err"; echo "sim16 dense $v rc=$?"; tail -1 "$R/classify_sim16_$v.err"
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print({k: d[k] for k in ('elapsed_s','inference_s','write_s')}, d['device_io'])" "$R/classify_sim16_$v.json" 2>&1
done
cmp /tmp/o/sim16-fp32/class_map.img /tmp/o/sim16-graph/class_map.img && cmp /tmp/o/sim16-fp32/confidence.img /tmp/o/sim16-graph/confidence.img \
  && echo "sim16 dense: queued runs and CUDA graph runs give identical class and confidence maps" | tee -a "$R/queued_agreement.txt"
step queued-bench
for b in 2 1 4; do SCENE=/tmp/sim16/scene.hdr big i16_fp16_b$b --io device --precision fp16 --dense-batch $b; done
SCENE=/tmp/sim16/scene.hdr big i16_fp32_b4 --io device --dense-batch 4
for b in 2 4; do SCENE=/tmp/sim2k/scene.hdr big 2k_i16_fp16_b$b --io device --precision fp16 --dense-batch $b; done
patchbig fp32 --io device --batch 1024
}

# `queued-slim`: the checks and benches of `queued` that a call with little device time left
# needs (the patch bench and PyTorch were measured by a first `queued` call).
queued_slim() {
step device; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$R/device.csv"
step kernels; $B gpu check > "$R/check.json"; echo "rc=$?"; grep -c '"pass": true' "$R/check.json"
step queued-labels
for v in dense:fp32 dense:graph patch:fp32; do
  mode=${v%%:*}; p=${v#*:}
  case $p in graph) extra="--cuda-graph";; *) extra="--precision $p";; esac
  $B classify "$S" --model "$M" --out /tmp/o/cpu-$mode --mode $mode --batch 64 --json > "$R/classify_cpu_$mode.json"
  timeout 60 $B classify "$S" --model "$M" --out /tmp/o/cuda-$mode-$p --mode $mode --batch 64 --ep cuda --io device $extra \
    --json > "$R/classify_cuda_${mode}_$p.json" 2> "$R/classify_cuda_${mode}_$p.err"; echo "classify $mode $p rc=$?"; tail -1 "$R/classify_cuda_${mode}_$p.err"
  python3 -c "import sys; a=open(sys.argv[1],'rb').read(); b=open(sys.argv[2],'rb').read(); print(sys.argv[3], 'agreement', sum(x==y for x,y in zip(a,b))/len(a))" \
    /tmp/o/cpu-$mode/class_map.img /tmp/o/cuda-$mode-$p/class_map.img "$mode $p" 2>&1 | tee -a "$R/queued_agreement.txt"
done
$B simulate --model "$M" --out /tmp/sim16 --lines 1024 --samples 1024 --int16 > /dev/null; echo "simulate int16 rc=$?"
$B simulate --model "$M" --out /tmp/sim2k --lines 2048 --samples 2048 --int16 > /dev/null; echo "simulate 2048 int16 rc=$?"
for v in fp32 graph; do
  case $v in graph) extra="--cuda-graph";; *) extra="";; esac
  timeout 60 $B classify /tmp/sim16/scene.hdr --model "$M" --out /tmp/o/sim16-$v --mode dense --tile 256 --batch 4 --ep cuda --io device $extra --json > "$R/classify_sim16_$v.json" 2> "$R/classify_sim16_$v.err"; echo "sim16 dense $v rc=$?"; tail -1 "$R/classify_sim16_$v.err"
done
cmp /tmp/o/sim16-fp32/class_map.img /tmp/o/sim16-graph/class_map.img && cmp /tmp/o/sim16-fp32/confidence.img /tmp/o/sim16-graph/confidence.img \
  && echo "sim16 dense: queued runs and CUDA graph runs give identical class and confidence maps" | tee -a "$R/queued_agreement.txt"
step queued-bench
for b in 2 4; do SCENE=/tmp/sim16/scene.hdr big i16_fp16_b$b --io device --precision fp16 --dense-batch $b; done
SCENE=/tmp/sim16/scene.hdr big i16_fp32_b4 --io device --dense-batch 4
SCENE=/tmp/sim2k/scene.hdr big 2k_i16_fp16_b2 --io device --precision fp16 --dense-batch 2
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

# PyTorch eager on hsiedge's own network and shapes (about 40 s).
pytorch_ours() {
step pytorch-ours
(cd "$R" && OUT="$R" PYTHONUNBUFFERED=1 timeout 120 python3 "$G/baseline_ours.py" > "$R/baseline_ours.log" 2>&1); echo "baseline_ours rc=$?"; tail -3 "$R/baseline_ours.log"
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
  ours) bandwidth; ours; governor ;;
  core) bandwidth; ours; governor; pytorch_ours ;;
  quick) QUICK=1; bandwidth; pytorch_ours; ours; governor ;;
  mini) bandwidth; mini; pytorch_ours; governor; memory 8192 ;;
  torch) sweeps; pytorch_ours; pytorch ;;
  rest) sweeps; pytorch ;;
  fix) fix ;;
  mapped) mapped; DEADLINE_S=$((SECONDS + 90)) pytorch ;;
  queued) queued; DEADLINE_S=$((SECONDS + 60)) pytorch ;;
  # The same after a first queued call on an H200 (which had PyTorch): PyTorch again only on
  # another card.
  queued-slim) queued_slim ;;
  queued-again) queued; nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 || DEADLINE_S=$((SECONDS + 60)) pytorch ;;
  memory) $B simulate --model "$M" --out /tmp/sim --lines 1024 --samples 1024 > /dev/null; memory 8192 2048 ;;
  *) bandwidth; ours; governor; pytorch_ours; sweeps; pytorch ;;
esac
tar -C "$(dirname "$R")" -czf "$OUT/gpu-results-$what.tar.gz" gpu-results
ls -la "$R" | head -80
