# PyTorch eager on hsiedge's own network (models/nets.py HybridSN: 204 bands, in-graph projection,
# patch 11, fully convolutional), the same shapes hsiedge runs: dense tiles of 256 (input 266 x 266)
# and patch batches of 11 x 11. Input tensors are already on the device (pure inference), timed as
# gpu_baseline.py times (CUDA events, cudnn.benchmark on, median). Speed does not depend on the
# weights, so they are PyTorch's initial ones.
import json, os, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch
import gpu_baseline as g
from nets import HybridSN
out = os.path.join(os.environ.get("OUT", "/tmp"), "baseline_ours.json")
res = dict(device=torch.cuda.get_device_name(0), torch=torch.__version__, network="models/nets.py HybridSN(bands=204, k=6)")
dense, patch = [], []
for dtype in (torch.float32, torch.float16):
    m = HybridSN().to(g.dev, dtype).eval()
    for nb in (1, 4, 16):
        torch.cuda.empty_cache()
        x = torch.randn(nb, 1, 204, 266, 266, device=g.dev, dtype=dtype)
        with torch.inference_mode():
            ms = g.timed(lambda: m(x), warm=5, iters=20)
        dense.append(dict(dtype=str(dtype).split('.')[-1], tile=256, tiles=nb, ms=ms, pixels_per_s=nb * 256 * 256 / ms * 1e3))
        print(dense[-1], flush=True)
        del x
    for b in (1024, 8192):
        torch.cuda.empty_cache()
        x = torch.randn(b, 1, 204, 11, 11, device=g.dev, dtype=dtype)
        with torch.inference_mode():
            ms = g.timed(lambda: m(x), warm=5, iters=20)
        patch.append(dict(dtype=str(dtype).split('.')[-1], batch=b, ms=ms, samples_per_s=b / ms * 1e3))
        print(patch[-1], flush=True)
        del x
    res.update(dense=dense, patch=patch)
    json.dump(res, open(out, "w"), indent=1)
