# gpu_baseline.py's HybridSN parts only (dense tiles fp32/fp16, then the patch sweep fp32/fp16), its
# own functions; the JSON is rewritten after each part, so a run cut short keeps what it finished.
import json, os, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch
import gpu_baseline as g
out = os.path.join(os.environ.get("OUT", "/tmp"), "baseline_subset.json")
res = dict(device=torch.cuda.get_device_name(0), torch=torch.__version__)
def save():
    json.dump(res, open(out, "w"), indent=1)
dense = []
for dtype in (torch.float32, torch.float16):
    m = g.HybridSN().to(g.dev, dtype).eval()
    for tile in (64, 128, 256):
        for nb in (1, 4, 16):
            torch.cuda.empty_cache(); torch.cuda.reset_peak_memory_stats(); base = torch.cuda.memory_allocated()
            x = torch.randn(nb, 1, 30, tile + 24, tile + 24, device=g.dev, dtype=dtype)
            with torch.inference_mode():
                ms = g.timed(lambda: m.dense(x), warm=5, iters=30)
            dense.append(dict(dtype=str(dtype).split('.')[-1], tile=tile, tiles=nb, ms=ms,
                              pixels_per_s=nb * tile * tile / ms * 1e3,
                              peak_mib=(torch.cuda.max_memory_allocated() - base) / 2**20))
            print(dense[-1], flush=True)
            del x
    res["dense"] = dense
    save()
b2 = [2 ** k for k in range(0, 14)]
hyb = g.HybridSN()
rows = []
for dtype in (torch.float32, torch.float16):
    rows += g.sweep("hybridsn_patch", hyb, lambda b: (b, 1, 30, 25, 25), b2, dtype)
    res["sweep"] = rows
    save()
    print("sweep done", dtype, flush=True)
best = max(r["samples_per_s"] for r in rows if r.get("dtype") == "float32" and "samples_per_s" in r)
print("best fp32 patch samples/s", best)
