"""Shared helpers for the hsiedge model scripts: ENVI reading, normalisation, splits,
class-stratified sampling, metrics, class statistics, ONNX export / fp16 conversion / ORT checks.

Data is read in place from ../shared/data (never copied into the repo)."""
import hashlib
import json
import os
import re

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.environ.get("HSIEDGE_DATA", os.path.join(os.path.dirname(REPO), "shared", "data"))
if not os.path.isdir(DATA):
    DATA = "/work/shared/data"
MODELS = os.path.join(REPO, "models")

ENVI_DTYPES = {1: "u1", 2: "i2", 3: "i4", 4: "f4", 5: "f8", 12: "u2", 13: "u4", 14: "i8", 15: "u8"}


def read_envi_header(hdr_path):
    text = open(hdr_path).read()
    hdr = {}
    for m in re.finditer(r"^\s*([^=\n]+?)\s*=\s*(\{[^}]*\}|[^\n]*)", text, re.M):
        key, val = m.group(1).strip().lower(), m.group(2).strip()
        if val.startswith("{"):
            val = [v.strip() for v in val[1:-1].split(",")]
        hdr[key] = val
    return hdr


def read_envi(base):
    """Read an ENVI cube `base`.hdr/.img -> ndarray (lines, samples, bands), native dtype."""
    hdr = read_envi_header(base + ".hdr")
    lines, samples, bands = int(hdr["lines"]), int(hdr["samples"]), int(hdr["bands"])
    order = "<" if int(hdr.get("byte order", 0)) == 0 else ">"
    dt = np.dtype(order + ENVI_DTYPES[int(hdr["data type"])])
    off = int(hdr.get("header offset", 0))
    raw = np.fromfile(base + ".img", dtype=dt, offset=off, count=lines * samples * bands)
    il = hdr.get("interleave", "bsq").lower()
    if il == "bsq":
        cube = raw.reshape(bands, lines, samples).transpose(1, 2, 0)
    elif il == "bil":
        cube = raw.reshape(lines, bands, samples).transpose(0, 2, 1)
    elif il == "bip":
        cube = raw.reshape(lines, samples, bands)
    else:
        raise ValueError(il)
    return np.ascontiguousarray(cube), hdr


SALINAS_NAMES = {1: "Brocoli_green_weeds_1", 10: "Corn_senesced_green_weeds", 11: "Lettuce_romaine_4wk",
                 12: "Lettuce_romaine_5wk", 13: "Lettuce_romaine_6wk", 14: "Lettuce_romaine_7wk"}
SALINAS_COLORS = {1: [230, 25, 75], 10: [255, 225, 25], 11: [60, 180, 75], 12: [0, 130, 200],
                  13: [145, 30, 180], 14: [245, 130, 48]}
SALINAS_IDS = [1, 10, 11, 12, 13, 14]


def load_salinas_a():
    cube, _ = read_envi(os.path.join(DATA, "salinas_a", "salinas_a"))
    gt, _ = read_envi(os.path.join(DATA, "salinas_a", "salinas_a_gt"))
    return cube, gt[:, :, 0]


def band_stats(cube):
    """Per-band mean/std over all scene pixels in raw units, as float32 (the values written to
    the manifest are exactly these float32 numbers)."""
    x = cube.reshape(-1, cube.shape[-1]).astype(np.float64)
    mean = x.mean(0).astype(np.float32)
    std = np.maximum(x.std(0), 1e-6).astype(np.float32)
    return mean, std


def normalise(cube, mean, std):
    """float32 (x - mean) / std, exactly as the runtime does it."""
    return ((cube.astype(np.float32) - mean.astype(np.float32)) / std.astype(np.float32)).astype(np.float32)


# ---------------------------------------------------------------- splits
# Spatially disjoint split of Salinas-A. The fields run diagonally, so a cut along the line
# 2*row - 3*col = const crosses every field: each class lands on both sides.
# train: 2*row - 3*col <  TRAIN_MAX_EXCL ; test: 2*row - 3*col >= TEST_MIN
# A Chebyshev step changes 2r-3c by at most 5, so the gap (55) keeps train and test >= 11 px apart.
DIAG = {"kind": "linear", "expr": "a*row + b*col (row = line index, col = sample index, 0-based)",
        "a": 2, "b": -3, "train": "a*row+b*col < -50", "test": "a*row+b*col >= 5",
        "train_max_exclusive": -50, "test_min": 5, "labelled_only": True}


def diag_split(gt):
    R, C = np.indices(gt.shape)
    s = DIAG["a"] * R + DIAG["b"] * C
    lab = gt > 0
    tr = lab & (s < DIAG["train_max_exclusive"])
    te = lab & (s >= DIAG["test_min"])
    return tr, te


def min_chebyshev(a_mask, b_mask):
    ar = np.argwhere(a_mask)
    br = np.argwhere(b_mask)
    best = 10 ** 9
    for i in range(0, len(ar), 512):
        d = np.abs(ar[i:i + 512, None, :] - br[None, :, :]).max(-1)
        best = min(best, int(d.min()))
    return best


def random_split(gt, frac, seed, ids=None):
    """Class-stratified random split: `frac` of each class's labelled pixels for training."""
    rng = np.random.default_rng(seed)
    ids = ids if ids is not None else [int(v) for v in np.unique(gt) if v > 0]
    tr = np.zeros(gt.shape, bool)
    for i in ids:
        idx = np.flatnonzero(gt.ravel() == i)
        n = max(1, int(round(frac * len(idx))))
        tr.ravel()[rng.choice(idx, n, replace=False)] = True
    te = (gt > 0) & ~tr
    return tr, te


def mask_sha256(mask):
    return hashlib.sha256(np.ascontiguousarray(mask.astype(np.uint8)).tobytes()).hexdigest()


# ---------------------------------------------------------------- sampling
class StratifiedBatches:
    """Every batch holds every class: B // K samples of each class plus the remainder spread over
    randomly chosen classes; classes are walked through reshuffled per-class permutations."""

    def __init__(self, labels, batch, seed):
        self.labels = np.asarray(labels)
        self.classes = np.unique(self.labels)
        assert batch >= len(self.classes), "batch must be >= number of classes"
        self.batch = batch
        self.rng = np.random.default_rng(seed)
        self.pools = {c: np.flatnonzero(self.labels == c) for c in self.classes}
        self.perm = {c: self.rng.permutation(self.pools[c]) for c in self.classes}
        self.pos = {c: 0 for c in self.classes}

    def _take(self, c, n):
        out = []
        while n > 0:
            if self.pos[c] >= len(self.perm[c]):
                self.perm[c] = self.rng.permutation(self.pools[c])
                self.pos[c] = 0
            k = min(n, len(self.perm[c]) - self.pos[c])
            out.append(self.perm[c][self.pos[c]:self.pos[c] + k])
            self.pos[c] += k
            n -= k
        return np.concatenate(out)

    def next(self):
        K = len(self.classes)
        per = np.full(K, self.batch // K)
        per[self.rng.choice(K, self.batch % K, replace=False)] += 1
        idx = np.concatenate([self._take(c, int(n)) for c, n in zip(self.classes, per)])
        return self.rng.permutation(idx)


# ---------------------------------------------------------------- metrics
def cls_metrics(y_true, y_pred, ids):
    ids = list(ids)
    K = len(ids)
    pos = {c: i for i, c in enumerate(ids)}
    cm = np.zeros((K, K), np.int64)
    for t, p in zip(y_true, y_pred):
        cm[pos[int(t)], pos[int(p)]] += 1
    n = cm.sum()
    oa = float(np.trace(cm) / n)
    present = cm.sum(1) > 0
    per = {str(c): (float(cm[i, i] / cm[i].sum()) if cm[i].sum() else None) for i, c in enumerate(ids)}
    aa = float(np.mean([cm[i, i] / cm[i].sum() for i in range(K) if present[i]]))
    pe = float((cm.sum(0) * cm.sum(1)).sum() / n ** 2)
    kappa = (oa - pe) / (1 - pe)
    return {"oa": round(oa, 6), "aa": round(aa, 6), "kappa": round(float(kappa), 6),
            "per_class": {k: (round(v, 6) if v is not None else None) for k, v in per.items()},
            "n": int(n), "confusion": cm.tolist()}


# ---------------------------------------------------------------- class stats
def class_stats(samples, n_basis=3):
    """mean, residual std and a low-rank basis (rows = eigvec * sqrt(eigval)) in raw units."""
    x = samples.astype(np.float64)
    mu = x.mean(0)
    xc = x - mu
    cov = xc.T @ xc / max(len(x) - 1, 1)
    w, v = np.linalg.eigh(cov)
    order = np.argsort(w)[::-1][:n_basis]
    basis = (v[:, order] * np.sqrt(np.maximum(w[order], 0))).T
    # sign convention: largest-magnitude entry positive (deterministic)
    for j in range(len(basis)):
        if basis[j][np.argmax(np.abs(basis[j]))] < 0:
            basis[j] = -basis[j]
    resid = np.maximum(np.diag(cov) - (basis ** 2).sum(0), 0)
    std = np.sqrt(np.maximum(resid, (1e-3 * np.sqrt(np.diag(cov)).mean()) ** 2))
    r = lambda a: [float(f"{t:.6g}") for t in a]
    return {"mean": r(mu), "std": r(std), "basis": [r(b) for b in basis], "n": int(len(x))}


# ---------------------------------------------------------------- ONNX
def export_onnx(module, dummy, path, dynamic_axes, input_name="input", output_name="output"):
    import onnx
    import torch
    module.eval()
    with torch.no_grad():
        torch.onnx.export(module, (dummy,), path, dynamo=False, opset_version=17,
                          input_names=[input_name], output_names=[output_name],
                          dynamic_axes=dynamic_axes, do_constant_folding=True)
    m = onnx.load(path)
    finalize(m, path)


def finalize(m, path):
    import onnx
    del m.graph.value_info[:]
    m = onnx.shape_inference.infer_shapes(m, strict_mode=True)
    onnx.checker.check_model(m, full_check=True)
    onnx.save(m, path)
    return m


def to_fp16(src, dst):
    """fp16 variant: every float initializer/constant/activation becomes float16; the graph keeps
    float32 input and output through a Cast at each end."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    m = onnx.load(src)
    g = m.graph
    for init in g.initializer:
        if init.data_type == TensorProto.FLOAT:
            init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init).astype(np.float16), init.name))
    for node in g.node:
        for a in node.attribute:
            if a.type == onnx.AttributeProto.TENSOR and a.t.data_type == TensorProto.FLOAT:
                a.t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(a.t).astype(np.float16), a.t.name))
            if node.op_type == "Cast" and a.name == "to" and a.i == TensorProto.FLOAT:
                a.i = TensorProto.FLOAT16
    inp, out = g.input[0].name, g.output[0].name
    for node in g.node:
        node.input[:] = [inp + "_fp16" if x == inp else x for x in node.input]
        node.output[:] = [out + "_fp16" if x == out else x for x in node.output]
    g.node.insert(0, helper.make_node("Cast", [inp], [inp + "_fp16"], to=TensorProto.FLOAT16, name="cast_in_fp16"))
    g.node.append(helper.make_node("Cast", [out + "_fp16"], [out], to=TensorProto.FLOAT, name="cast_out_fp32"))
    finalize(m, dst)


def ort_session(path):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def ort_run(sess, x, chunk=256):
    name = sess.get_inputs()[0].name
    outs = [sess.run(None, {name: x[i:i + chunk]})[0] for i in range(0, len(x), chunk)]
    return np.concatenate(outs)


def extract_patches(padded_chw, centers, p):
    """padded_chw: (C, H+2r, W+2r); centers: (n, 2) unpadded (row, col) -> (n, C, p, p)."""
    out = np.empty((len(centers), padded_chw.shape[0], p, p), np.float32)
    for i, (r, c) in enumerate(centers):
        out[i] = padded_chw[:, r:r + p, c:c + p]
    return out


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=1)
        f.write("\n")


def file_sha256(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()
