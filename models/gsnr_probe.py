"""Gradient-signal-to-noise probe for choosing the training batch size.

reference g  = gradient of the mean loss over a large batch (all training samples, <= ref_max);
g_i          = gradients of 10 small batches of size B drawn by the class-stratified sampler;
bias         = mean(g_i) - g ;  var = mean ||g_i - mean(g_i)||^2 ;
GSNR(B)      = ||g||^2 / (||bias||^2 + var)

Usage: python3 models/gsnr_probe.py --model hybridsn_salinas_a [--sizes 6 12 24 48 96]
(prints GSNR at initialisation and after a short warm-up, and writes models/<name>/gsnr.json)."""
import argparse
import sys

import numpy as np
import torch

from common import StratifiedBatches


def flat_grad(model, loss_fn, X, y, chunk=512):
    """Gradient of the mean loss over (X, y), accumulated in chunks."""
    model.zero_grad(set_to_none=True)
    n = len(X)
    for i in range(0, n, chunk):
        xb, yb = X[i:i + chunk], y[i:i + chunk]
        (loss_fn(model(xb), yb) * (len(xb) / n)).backward()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None]).detach().clone()


def gsnr(model, loss_fn, X, y, labels_np, sizes, n_small=10, seed=0, ref_max=4096):
    was_training = model.training
    model.eval()  # dropout off: measure the data noise, not the dropout noise
    rng = np.random.default_rng(seed)
    ref_idx = np.arange(len(X)) if len(X) <= ref_max else rng.choice(len(X), ref_max, replace=False)
    g = flat_grad(model, loss_fn, X[ref_idx], y[ref_idx])
    g2 = float(g.pow(2).sum())
    out = []
    for B in sizes:
        sampler = StratifiedBatches(labels_np, B, seed + B)
        gs = torch.stack([flat_grad(model, loss_fn, X[idx], y[idx])
                          for idx in (sampler.next() for _ in range(n_small))])
        m = gs.mean(0)
        bias2 = float((m - g).pow(2).sum())
        var = float((gs - m).pow(2).sum(1).mean())
        out.append({"batch": int(B), "gsnr": round(g2 / (bias2 + var), 4), "g_norm2": g2,
                    "bias_norm2": bias2, "var": var})
    model.train(was_training)
    return out


def choose_batch(rows, threshold=1.0):
    """Smallest batch whose GSNR reaches `threshold` (gradient signal >= sampling noise + bias);
    the largest probed batch if none does."""
    for r in rows:
        if r["gsnr"] >= threshold:
            return r["batch"]
    return rows[-1]["batch"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--sizes", type=int, nargs="+", default=[6, 12, 24, 48, 96])
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    import train
    res = train.run_probe(a.model, a.sizes, a.seed)
    for phase in ("init", "warm"):
        print(f"[{a.model}] GSNR at {phase}:")
        for r in res[phase]:
            print(f"  B={r['batch']:4d}  GSNR={r['gsnr']:.4f}")
    print("chosen batch:", res["chosen"], "-", res["rule"])


if __name__ == "__main__":
    sys.exit(main())
