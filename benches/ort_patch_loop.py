"""Peer baseline for `hsiedge bench classify`: a bare onnxruntime Python loop over the same patches.

It reads the ENVI scene with numpy, normalises with the manifest's statistics, pads by reflection
(numpy mode="reflect", as hsiedge does) and feeds every pixel's p x p patch to the patch model in
batches of --batch, in the same pixel order. Two timings:
  run_loop_s     only the sess.run calls (patch batches are built outside the clock);
  with_gather_s  the DeepHyperX-style loop: copy each window into the batch, then run.
Prints one JSON object on stdout: their medians over --repeat runs. With --serve it prints
{"onnxruntime": version} once set up, then runs one repetition for each line read on stdin and
prints its two timings, so `hsiedge bench` can interleave its repetitions with its own.
"""
import sys
import argparse, json, os, re, time
try:
    import numpy as np
    import onnxruntime as ort
except ImportError as e:
    # One line, no traceback: `hsiedge bench` names the package and says how to install it.
    sys.exit(f"ort_patch_loop.py: {e} ({sys.executable})")

DTYPES = {1: "u1", 2: "i2", 3: "i4", 4: "f4", 5: "f8", 12: "u2"}


def read_envi(hdr):
    text = open(hdr).read()
    kv = {}
    for m in re.finditer(r"^\s*([^=\n]+?)\s*=\s*(\{[^}]*\}|[^\n]*)", text, re.M):
        kv[m.group(1).strip().lower()] = m.group(2).strip()
    s, l, b = int(kv["samples"]), int(kv["lines"]), int(kv["bands"])
    order = ">" if kv.get("byte order", "0") == "1" else "<"
    dt = np.dtype(order + DTYPES[int(kv["data type"])])
    base = os.path.splitext(hdr)[0]
    data = next(p for p in (base + ".img", base + ".dat", base) if os.path.isfile(p))
    raw = np.fromfile(data, dtype=dt, offset=int(kv.get("header offset", "0")))
    il = kv["interleave"].lower()
    shape = {"bsq": (b, l, s), "bil": (l, b, s), "bip": (l, s, b)}[il]
    cube = raw.reshape(shape)
    axes = {"bsq": (1, 2, 0), "bil": (0, 2, 1), "bip": (0, 1, 2)}[il]
    return np.ascontiguousarray(cube.transpose(axes)).astype(np.float32)  # lines x samples x bands


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--manifest", required=True)
    ap.add_argument("--scene", required=True)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--serve", action="store_true", help="one repetition per stdin line")
    ap.add_argument("--spin", type=int, default=0, help="session.intra_op.allow_spinning, as hsiedge sets it")
    a = ap.parse_args()
    m = json.load(open(a.manifest))
    cube = read_envi(a.scene)
    mean = np.array(m["input"]["mean"], np.float32)
    std = np.array(m["input"]["std"], np.float32)
    x = ((cube - mean) / std).transpose(2, 0, 1)  # C x H x W
    r, p = m["halo"], m["patch"]
    layout = m["input"]["layout"]
    xp = np.pad(x, ((0, 0), (r, r), (r, r)), mode="reflect")
    so = ort.SessionOptions()
    so.intra_op_num_threads = a.threads
    so.add_session_config_entry("session.intra_op.allow_spinning", str(a.spin))
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sess = ort.InferenceSession(os.path.join(os.path.dirname(a.manifest), m["files"]["patch"]), so,
                                providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    C, H, W = x.shape
    pixels = [(i, j) for i in range(H) for j in range(W)]

    def batch_of(chunk):
        out = np.empty((len(chunk), C, p, p), np.float32)
        for n, (i, j) in enumerate(chunk):
            out[n] = xp[:, i:i + p, j:j + p]
        if layout == "n1chw":
            return out[:, None]
        if layout == "nc":
            return np.ascontiguousarray(out[:, :, 0, 0])
        return out

    chunks = [pixels[k:k + a.batch] for k in range(0, len(pixels), a.batch)]
    sess.run(None, {name: batch_of(chunks[0])})
    def rep():
        spent = 0.0
        for c in chunks:
            b = batch_of(c)
            t = time.perf_counter()
            sess.run(None, {name: b})
            spent += time.perf_counter() - t
        t = time.perf_counter()
        for c in chunks:
            sess.run(None, {name: batch_of(c)})
        return spent, time.perf_counter() - t

    if a.serve:
        # The protocol keeps the real stdout to itself; anything else printing to stdout (a
        # library's warning) goes to stderr instead of into the replies.
        replies = os.fdopen(os.dup(1), "w")
        os.dup2(2, 1)
        print(json.dumps({"onnxruntime": ort.__version__}), file=replies, flush=True)
        for _ in sys.stdin:
            run, gather = rep()
            print(json.dumps({"run_loop_s": run, "with_gather_s": gather}), file=replies, flush=True)
        return
    runs, gathers = zip(*(rep() for _ in range(a.repeat)))
    med = lambda v: sorted(v)[len(v) // 2]
    print(json.dumps({"run_loop_s": med(runs), "with_gather_s": med(gathers), "onnxruntime": ort.__version__}))

if __name__ == "__main__":
    main()
