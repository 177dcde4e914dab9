"""Single entry point: train, evaluate, export and document one model.

    nice -n 10 python3 models/train.py --model hybridsn_salinas_a

Writes models/<name>/{manifest.json, metrics.json, gsnr.json, patch.onnx, dense.onnx,
patch_fp16.onnx, dense_fp16.onnx}. Seeded and deterministic on CPU (2 threads)."""
import argparse
import datetime
import hashlib
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common as C  # noqa: E402
import gsnr_probe  # noqa: E402
import nets  # noqa: E402

# One intra-op thread: the machine's 2 cores are shared with Rust builds; measured under that load,
# 2 OpenMP threads were 1.6-10x SLOWER per step than 1 (barrier spinning when preempted).
torch.set_num_threads(1)
torch.set_num_interop_threads(1)

CONFIGS = {
    "hybridsn_salinas_a": dict(task="classification", scene="salinas_a", net="HybridSN", layout="n1chw",
                               samples=30_000, lr=2e-3,
                               description="HybridSN-style spectral-spatial CNN for Salinas-A: in-graph learned "
                                           "204->20 band projection (PCA-initialised), three 3-D convs, one 2-D conv "
                                           "(over channels x spectral depth), 3x3 classifier conv; fully "
                                           "convolutional, patch 11"),
    "cnn3d_salinas_a": dict(task="classification", scene="salinas_a", net="CNN3D", layout="n1chw",
                            samples=100_000, lr=3e-3,
                            description="Light 3-D CNN (Hamida et al. / Li et al. style, spectral strides only) for "
                                        "Salinas-A; fully convolutional, patch 7"),
    "spectral1d_salinas_a": dict(task="classification", scene="salinas_a", net="Spectral1D", layout="nc",
                                 samples=100_000, lr=2e-3,
                                 description="Per-pixel 1-D spectral CNN (Hu et al. 2015 style) for Salinas-A"),
    "unmix_jasper_ridge": dict(task="abundance", scene="jasper_ridge", net="UnmixMLP", layout="nc",
                               samples=300_000, lr=2e-3, endmembers=["tree", "water", "soil", "road"],
                               description="Per-pixel supervised abundance estimator for Jasper Ridge "
                                           "(tree, water, soil, road), softmax head"),
    "unmix_samson": dict(task="abundance", scene="samson", net="UnmixMLP", layout="nc",
                         samples=300_000, lr=2e-3, endmembers=["soil", "tree", "water"],
                         description="Per-pixel supervised abundance estimator for Samson (3 endmembers), "
                                     "softmax head"),
}
SIZES = [6, 12, 24, 48, 96]
WARM_STEPS = 100
RANDOM_FRAC = 0.10


def seed_all(seed):
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True)


# ------------------------------------------------------------------------ data
class Scene:
    def __init__(self, cfg):
        self.cfg = cfg
        if cfg["scene"] == "salinas_a":
            self.cube, self.gt = C.load_salinas_a()
            self.ids = C.SALINAS_IDS
        else:
            base = os.path.join(C.DATA, cfg["scene"], cfg["scene"])
            self.cube, _ = C.read_envi(base)
            self.abund, hdr = C.read_envi(base + "_abundance")
            self.abund = self.abund.astype(np.float32)
            self.gt = None
        self.H, self.W, self.B = self.cube.shape
        self.mean, self.std = C.band_stats(self.cube)
        self.norm = C.normalise(self.cube, self.mean, self.std)  # H x W x B float32

    def padded_chw(self, r):
        chw = np.ascontiguousarray(self.norm.transpose(2, 0, 1))
        if r == 0:
            return chw
        return np.pad(chw, ((0, 0), (r, r), (r, r)), mode="reflect")

    def inputs(self, mask_or_centers, p, layout):
        centers = np.argwhere(mask_or_centers) if mask_or_centers.ndim == 2 and mask_or_centers.dtype == bool \
            else mask_or_centers
        if layout == "nc":
            return self.norm[centers[:, 0], centers[:, 1]]
        pad = self.padded_chw((p - 1) // 2)
        x = C.extract_patches(pad, centers, p)
        return x[:, None] if layout == "n1chw" else x


def build_net(cfg, scene):
    k = len(scene.ids) if cfg["task"] == "classification" else len(cfg["endmembers"])
    if cfg["net"] == "UnmixMLP":
        return nets.UnmixMLP(scene.B, k)
    net = getattr(nets, cfg["net"])(bands=scene.B, k=k)
    if cfg["net"] == "HybridSN":
        # PCA initialisation of the in-graph band projection (normalised data is zero-mean)
        x = scene.norm.reshape(-1, scene.B).astype(np.float64)
        w, v = np.linalg.eigh(np.cov(x.T))
        comp = v[:, np.argsort(w)[::-1][:net.proj.out_channels]].T
        with torch.no_grad():
            net.proj.weight.copy_(torch.tensor(comp, dtype=torch.float32)[:, None, :, None, None])
            net.proj.bias.zero_()
    return net


def loss_fn_for(cfg):
    if cfg["task"] == "classification":
        def lf(out, y):
            return F.cross_entropy(torch.flatten(out, 1), y, label_smoothing=0.05)
    else:
        def lf(out, y):
            return F.mse_loss(out, y)
    return lf


def augment(xb, layout, rng):
    if layout == "nc":
        return xb
    k = int(rng.integers(4))
    if k:
        xb = torch.rot90(xb, k, dims=(-2, -1))
    if rng.integers(2):
        xb = torch.flip(xb, dims=(-1,))
    return xb


def train_net(cfg, scene, X, y, strat_labels, batch, seed, log=""):
    seed_all(seed)
    net = build_net(cfg, scene)
    lf = loss_fn_for(cfg)
    steps = int(math.ceil(cfg["samples"] / batch))
    opt = torch.optim.AdamW(net.parameters(), lr=cfg["lr"], weight_decay=1e-4)
    warm = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps)))
    sampler = C.StratifiedBatches(strat_labels, batch, seed)
    rng = np.random.default_rng(seed + 1)
    net.train()
    t0 = time.time()
    for s in range(steps):
        idx = sampler.next()
        xb = augment(X[idx], cfg["layout"], rng)
        loss = lf(net(xb), y[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        if s % max(1, steps // 10) == 0 or s == steps - 1:
            print(f"  {log} step {s}/{steps} loss {loss.item():.4f} ({time.time() - t0:.0f}s)", flush=True)
    net.eval()
    return net, steps, time.time() - t0


@torch.no_grad()
def predict(net, X, chunk=512):
    net.eval()
    return torch.cat([torch.flatten(net(X[i:i + chunk]), 1) for i in range(0, len(X), chunk)]).numpy()


# ------------------------------------------------------------------------ splits / targets
def splits(cfg, scene):
    """{'spatial_disjoint': (train_mask, test_mask, description), 'random': (...)}"""
    if cfg["task"] == "classification":
        tr, te = C.diag_split(scene.gt)
        rtr, rte = C.random_split(scene.gt, RANDOM_FRAC, 0, scene.ids)
        return {"spatial_disjoint": (tr, te, dict(C.DIAG)), "random": (rtr, rte, {
            "kind": "random", "train_fraction": RANDOM_FRAC, "stratified_by_class": True, "seed": 0,
            "test": "all other labelled pixels"})}
    H, W = scene.H, scene.W
    R, Cc = np.indices((H, W))
    # spatially disjoint: top block trains, bottom block tests, 10-row gap (per-pixel model, p=1;
    # rows balance the endmembers better than columns: water sits almost only in the left half)
    cut = int(round(0.5 * H))
    gap = 10
    tr = R < cut - gap // 2
    te = R >= cut + gap // 2
    rng = np.random.default_rng(0)
    rtr = np.zeros((H, W), bool)
    rtr.ravel()[rng.choice(H * W, int(round(RANDOM_FRAC * H * W)), replace=False)] = True
    return {"spatial_disjoint": (tr, te, {"kind": "blocks", "axis": "row", "train_max_exclusive": cut - gap // 2,
                                          "test_min": cut + gap // 2, "gap_rows": gap,
                                          "train": f"row < {cut - gap // 2}", "test": f"row >= {cut + gap // 2}"}),
            "random": (rtr, ~rtr, {"kind": "random", "train_fraction": RANDOM_FRAC, "seed": 0,
                                   "test": "all other pixels"})}


def targets(cfg, scene, mask):
    if cfg["task"] == "classification":
        lab = scene.gt[mask]
        pos = {c: i for i, c in enumerate(scene.ids)}
        yi = np.array([pos[int(v)] for v in lab], np.int64)
        return torch.tensor(yi), yi
    a = scene.abund[mask]
    return torch.tensor(a), np.argmax(a, 1)  # stratify batches by dominant endmember


def evaluate(cfg, scene, out, mask):
    if cfg["task"] == "classification":
        pred = np.array(scene.ids)[np.argmax(out, 1)]
        return C.cls_metrics(scene.gt[mask], pred, scene.ids)
    ref = scene.abund[mask]
    err = out - ref
    per = np.sqrt((err ** 2).mean(0))
    return {"rmse": round(float(np.sqrt((err ** 2).mean())), 6),
            "per_endmember_rmse": {n: round(float(v), 6) for n, v in zip(cfg["endmembers"], per)},
            "mean_pixel_rmse": round(float(np.sqrt((err ** 2).mean(1)).mean()), 6),
            "n": int(mask.sum())}


# ------------------------------------------------------------------------ probe
def run_probe(name, sizes=SIZES, seed=0, scene=None, write=True):
    cfg = CONFIGS[name]
    scene = scene or Scene(cfg)
    tr, _, _ = splits(cfg, scene)["spatial_disjoint"]
    p = getattr(build_net(cfg, scene), "patch", 1)
    X = torch.tensor(scene.inputs(tr, p, cfg["layout"]))
    y, strat = targets(cfg, scene, tr)
    lf = loss_fn_for(cfg)
    seed_all(seed)
    net = build_net(cfg, scene)
    res = {"init": gsnr_probe.gsnr(net, lf, X, y, strat, sizes, seed=seed)}
    # short warm-up (B=24, Adam) so the probe also sees the gradient regime past initialisation
    opt = torch.optim.AdamW(net.parameters(), lr=cfg["lr"] * 0.5, weight_decay=1e-4)
    sampler = C.StratifiedBatches(strat, 24, seed)
    net.train()
    for _ in range(WARM_STEPS):
        idx = sampler.next()
        loss = lf(net(X[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    res["warm"] = gsnr_probe.gsnr(net, lf, X, y, strat, sizes, seed=seed)
    res["chosen"] = gsnr_probe.choose_batch(res["warm"])
    res["rule"] = (f"smallest batch with GSNR >= 1 after {WARM_STEPS} warm-up steps (gradient signal at least "
                   f"the sampling noise + stratification bias); largest probed if none")
    res["reference"] = f"full spatial-disjoint training set ({len(X)} samples), 10 small batches per size"
    if write:
        os.makedirs(os.path.join(C.MODELS, name), exist_ok=True)
        C.write_json(os.path.join(C.MODELS, name, "gsnr.json"), res)
    return res


# ------------------------------------------------------------------------ export
class DenseHead(torch.nn.Module):
    def __init__(self, core):
        super().__init__()
        self.core = core

    def forward(self, x):
        return self.core(x)


def export_all(cfg, name, net, scene):
    d = os.path.join(C.MODELS, name)
    p = getattr(net, "patch", 1)
    r = (p - 1) // 2
    files = {}
    if cfg["layout"] == "nc":
        dummy = torch.tensor(scene.norm.reshape(-1, scene.B)[:4])
        C.export_onnx(net, dummy, os.path.join(d, "patch.onnx"), {"input": {0: "n"}, "output": {0: "n"}})
        C.to_fp16(os.path.join(d, "patch.onnx"), os.path.join(d, "patch_fp16.onnx"))
        files = {"patch": "patch.onnx", "patch_fp16": "patch_fp16.onnx"}
    else:
        lead = (1,) if cfg["layout"] == "n1chw" else ()
        sp = len(lead) + 2
        dummy = torch.zeros((2,) + lead + (scene.B, p, p))
        C.export_onnx(nets.PatchHead(net), dummy, os.path.join(d, "patch.onnx"),
                      {"input": {0: "n"}, "output": {0: "n"}})
        dummy = torch.zeros((1,) + lead + (scene.B, 2 * r + 8, 2 * r + 9))
        C.export_onnx(DenseHead(net), dummy, os.path.join(d, "dense.onnx"),
                      {"input": {0: "n", sp: "h_padded", sp + 1: "w_padded"},
                       "output": {0: "n", 2: "h", 3: "w"}})
        C.to_fp16(os.path.join(d, "patch.onnx"), os.path.join(d, "patch_fp16.onnx"))
        C.to_fp16(os.path.join(d, "dense.onnx"), os.path.join(d, "dense_fp16.onnx"))
        files = {"patch": "patch.onnx", "dense": "dense.onnx", "patch_fp16": "patch_fp16.onnx",
                 "dense_fp16": "dense_fp16.onnx"}
    files["notes"] = ("fp32 files: float32 input/output. *_fp16 files: float16 weights and activations, "
                      "float32 input and output (a Cast to float16 after the input, a Cast to float32 before "
                      "the output). Patch graphs have a symbolic batch dim and fixed p x p; dense graphs have "
                      "symbolic batch, height and width (input H+2r x W+2r -> output H x W).")
    return files


def scene_inputs_iter(scene, p, layout, chunk=512):
    H, W = scene.H, scene.W
    centers = np.argwhere(np.ones((H, W), bool))  # row-major
    for i in range(0, len(centers), chunk):
        yield scene.inputs(centers[i:i + chunk], p, layout)


def ort_checks(cfg, name, scene, files, test_mask, p):
    """Whole-scene inference through onnxruntime with reflect padding, as the Rust runtime does."""
    d = os.path.join(C.MODELS, name)
    r = (p - 1) // 2
    res = {}
    sess = C.ort_session(os.path.join(d, files["patch"]))
    nm = sess.get_inputs()[0].name
    out = np.concatenate([sess.run(None, {nm: x})[0] for x in scene_inputs_iter(scene, p, cfg["layout"])])
    K = out.shape[1]
    out_map = out.reshape(scene.H, scene.W, K)
    sess16 = C.ort_session(os.path.join(d, files["patch_fp16"]))
    out16 = np.concatenate([sess16.run(None, {nm: x})[0] for x in scene_inputs_iter(scene, p, cfg["layout"])])
    if cfg["task"] == "classification":
        labels = np.array(scene.ids, np.uint8)[np.argmax(out_map, -1)]
        lab = scene.gt > 0
        res["ort_full_scene"] = {
            "model_file": files["patch"],
            "input": "whole scene, normalised in float32 as (raw - input.mean) / input.std with the manifest "
                     "values, then np.pad(mode='reflect') by the halo on both spatial axes (pixel -1 maps to 1, "
                     "edge not repeated)",
            "test_mask": dict(test_mask, description="test = labelled pixels (gt > 0) with 2*row - 3*col >= 5"
                              if cfg["layout"] != "x" else ""),
            "test_mask_sha256": C.mask_sha256(scene_test_mask(scene)),
            "oa_test": round(float((labels[scene_test_mask(scene)] == scene.gt[scene_test_mask(scene)]).mean()), 6),
            "n_test": int(scene_test_mask(scene).sum()),
            "oa_all_labelled": round(float((labels[lab] == scene.gt[lab]).mean()), 6),
            "n_all_labelled": int(lab.sum()),
            "labels_sha256": hashlib.sha256(np.ascontiguousarray(labels).tobytes()).hexdigest(),
            "labels_encoding": "uint8 class ids (from outputs[k].id, argmax over logits), row-major lines x samples, "
                               "every pixel predicted (no 0)",
            "min_top2_logit_margin": float((np.sort(out, 1)[:, -1] - np.sort(out, 1)[:, -2]).min()),
            "margin_note": "smallest (best - second best) logit over the scene: a runtime whose logits differ from "
                           "onnxruntime CPU fp32 by less than half of it reproduces labels_sha256 exactly; the same "
                           "hash results with float64 normalisation or with multiplication by 1/std",
        }
        lab16 = np.array(scene.ids, np.uint8)[np.argmax(out16, -1)].reshape(scene.H, scene.W)
        res["fp16_vs_fp32_patch"] = {"label_agreement": round(float((lab16 == labels).mean()), 6),
                                     "max_abs_logit_diff": float(np.abs(out16 - out).max())}
    else:
        ref = scene.abund.reshape(-1, K)
        res["ort_full_scene"] = {"model_file": files["patch"],
                                 "rmse_all_pixels": round(float(np.sqrt(((out - ref) ** 2).mean())), 6),
                                 "max_abs_sum_to_one_error": float(np.abs(out.sum(1) - 1).max()),
                                 "min_abundance": float(out.min())}
        res["fp16_vs_fp32_patch"] = {"max_abs_diff": float(np.abs(out16 - out).max())}
    if "dense" in files:
        lead = (1,) if cfg["layout"] == "n1chw" else ()
        pad = scene.padded_chw(r)[None].reshape((1,) + lead + scene.padded_chw(r).shape)
        dsess = C.ort_session(os.path.join(d, files["dense"]))
        dn = dsess.get_inputs()[0].name
        dout = dsess.run(None, {dn: pad})[0][0].transpose(1, 2, 0)  # H x W x K
        agree = float((np.argmax(dout, -1) == np.argmax(out_map, -1)).mean())
        res["dense_vs_patch"] = {"pixels": int(scene.H * scene.W), "label_agreement": round(agree, 6),
                                 "max_abs_logit_diff": float(np.abs(dout - out_map).max()),
                                 "pass": bool(agree >= 0.999 and np.abs(dout - out_map).max() <= 1e-4),
                                 "criterion": "same labels on >= 99.9 % of pixels and max |logit diff| <= 1e-4 "
                                              "(fp32, onnxruntime CPU, whole scene)"}
        d16 = C.ort_session(os.path.join(d, files["dense_fp16"])).run(None, {dn: pad})[0][0].transpose(1, 2, 0)
        res["dense_fp16_vs_dense"] = {"label_agreement": round(float(
            (np.argmax(d16, -1) == np.argmax(dout, -1)).mean()), 6), "max_abs_logit_diff": float(np.abs(d16 - dout).max())}
        assert res["dense_vs_patch"]["pass"], res["dense_vs_patch"]
    return res


def scene_test_mask(scene):
    return C.diag_split(scene.gt)[1]


def stats_for(cfg, scene):
    out = []
    if cfg["task"] == "classification":
        for i in scene.ids:
            s = C.class_stats(scene.cube[scene.gt == i])
            out.append({"id": i, "mean": s["mean"], "std": s["std"], "basis": s["basis"]})
    else:
        a = scene.abund.reshape(-1, scene.abund.shape[-1])
        x = scene.cube.reshape(-1, scene.B)
        for k, n in enumerate(cfg["endmembers"]):
            sel = a[:, k] >= 0.9
            if sel.sum() < 30:
                sel = a[:, k] >= np.sort(a[:, k])[-30]
            s = C.class_stats(x[sel])
            out.append({"id": k + 1, "name": n, "mean": s["mean"], "std": s["std"], "basis": s["basis"],
                        "pixels": int(sel.sum())})
    return out


# ------------------------------------------------------------------------ main
def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, choices=sorted(CONFIGS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch", type=int, default=0, help="override the GSNR-chosen batch")
    ap.add_argument("--reuse-probe", action="store_true",
                    help="reuse models/<name>/gsnr.json from an earlier run instead of re-probing")
    a = ap.parse_args()
    name, cfg = a.model, CONFIGS[a.model]
    t_all = time.time()
    scene = Scene(cfg)
    d = os.path.join(C.MODELS, name)
    os.makedirs(d, exist_ok=True)

    t0 = time.time()
    gpath = os.path.join(d, "gsnr.json")
    if a.reuse_probe and os.path.exists(gpath):
        import json
        probe = json.load(open(gpath))
    else:
        probe = run_probe(name, SIZES, a.seed, scene)
    t_probe = time.time() - t0
    for ph in ("init", "warm"):
        print(f"GSNR {ph}: " + ", ".join(f"B={r['batch']}: {r['gsnr']:.3f}" for r in probe[ph]), flush=True)
    batch = a.batch or probe["chosen"]
    print("batch", batch, flush=True)

    p = getattr(build_net(cfg, scene), "patch", 1)
    results, nets_ = {}, {}
    for split in ("spatial_disjoint", "random"):
        tr, te, desc = splits(cfg, scene)[split]
        X = torch.tensor(scene.inputs(tr, p, cfg["layout"]))
        y, strat = targets(cfg, scene, tr)
        net, steps, wall = train_net(cfg, scene, X, y, strat, batch, a.seed, log=split)
        Xt = torch.tensor(scene.inputs(te, p, cfg["layout"]))
        m = evaluate(cfg, scene, predict(net, Xt), te)
        info = {"split": desc, "n_train": int(tr.sum()), "n_test": int(te.sum()),
                "train_mask_sha256": C.mask_sha256(tr), "test_mask_sha256": C.mask_sha256(te),
                "batch": batch, "steps": steps, "epochs": round(steps * batch / int(tr.sum()), 2),
                "train_wall_s": round(wall, 1), "metrics": m}
        if cfg["task"] == "classification":
            info["train_counts"] = {str(i): int((scene.gt[tr] == i).sum()) for i in scene.ids}
            info["test_counts"] = {str(i): int((scene.gt[te] == i).sum()) for i in scene.ids}
            if split == "spatial_disjoint":
                info["min_chebyshev_train_test"] = C.min_chebyshev(tr, te)
        print(split, {k: v for k, v in m.items() if k not in ("confusion",)}, flush=True)
        results[split] = info
        nets_[split] = net

    ship = nets_["spatial_disjoint"]
    files = export_all(cfg, name, ship, scene)
    checks = ort_checks(cfg, name, scene, files, results["spatial_disjoint"]["split"], p)
    metrics = {"model": name, "shipped_weights": "spatial_disjoint",
               "shipped_note": "the ONNX files hold the model trained on the spatial_disjoint split's training "
                               "pixels; the random-split model is a second training run with the same recipe, "
                               "reported for comparison only (not shipped)",
               "splits": results, **checks,
               "gsnr_probe": {"file": "gsnr.json", "chosen_batch": batch},
               "total_wall_s": round(time.time() - t_all, 1), "probe_wall_s": round(t_probe, 1),
               "torch": torch.__version__, "threads": torch.get_num_threads()}
    C.write_json(os.path.join(d, "metrics.json"), metrics)

    if cfg["task"] == "classification":
        outputs = [{"id": i, "name": C.SALINAS_NAMES[i], "color": C.SALINAS_COLORS[i]} for i in scene.ids]
    else:
        outputs = [{"id": k + 1, "name": n} for k, n in enumerate(cfg["endmembers"])]
    warm = {r["batch"]: r["gsnr"] for r in probe["warm"]}
    manifest = {
        "name": name, "version": "1", "task": cfg["task"], "description": cfg["description"],
        "input": {"bands": int(scene.B), "layout": cfg["layout"],
                  "mean": [float(v) for v in scene.mean], "std": [float(v) for v in scene.std]},
        "patch": p, "halo": (p - 1) // 2, "outputs": outputs, "files": files,
        "output_kind": "logits" if cfg["task"] == "classification" else "probabilities",
        "class_stats": stats_for(cfg, scene),
        "provenance": {
            "data": f"../shared/data/{cfg['scene']}", "script": f"models/train.py --model {name}",
            "seed": a.seed, "batch": batch,
            "batch_reason": (f"GSNR probe (models/gsnr_probe.py, gsnr.json) after {WARM_STEPS} warm-up steps: "
                             + ", ".join(f"B={b}: {g:.3g}" for b, g in warm.items())
                             + f"; {probe['rule']}" + (" (overridden by --batch)" if a.batch else "")),
            "sampler": "class-stratified: every batch holds every class" if cfg["task"] == "classification"
            else "stratified by dominant endmember: every batch holds every endmember's pixels",
            "epochs": results["spatial_disjoint"]["epochs"], "steps": results["spatial_disjoint"]["steps"],
            "optimizer": f"AdamW lr {cfg['lr']} wd 1e-4, linear warm-up + cosine decay",
            "normalisation_layers": "none (no BatchNorm/GroupNorm: keeps patch and dense twins identical)",
            "trained_on": "spatial_disjoint split training pixels (see metrics.json)",
            "train_wall_s": results["spatial_disjoint"]["train_wall_s"],
            "trained": datetime.date.today().isoformat(), "torch": torch.__version__},
        "metrics": "metrics.json",
    }
    C.write_json(os.path.join(d, "manifest.json"), manifest)
    print("done", name, f"{time.time() - t_all:.0f}s", flush=True)


if __name__ == "__main__":
    main()
