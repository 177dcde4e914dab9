"""Build the model card (models/README.md) from the committed files only: manifests, ONNX graphs
(value_info) and metrics.json. Nothing is re-measured here except graph arithmetic.

    python3 models/card.py            # rewrites models/README.md
"""
import copy
import json
import os

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
ORDER = ["hybridsn_salinas_a", "cnn3d_salinas_a", "spectral1d_salinas_a", "unmix_jasper_ridge", "unmix_samson"]
ESIZE = {TensorProto.FLOAT: 4, TensorProto.FLOAT16: 2, TensorProto.INT64: 8, TensorProto.DOUBLE: 8}
NOTES = """## Notes

- **Splits.** Salinas-A's fields are diagonal stripes, so the spatially disjoint split cuts along
  `2*row - 3*col`: train = labelled pixels with `2*row - 3*col < -50`, test = labelled pixels with
  `2*row - 3*col >= 5` (row = line, col = sample, 0-based). A Chebyshev step changes `2r-3c` by at most 5,
  so train and test pixels are >= 11 px apart (measured minimum 12, `min_chebyshev_train_test`): no test
  patch (p <= 11) overlaps a training pixel, and every class is in both train and test. The same split and
  the same shipped-weights rule hold for all three Salinas-A classifiers. The random split is 10 % of each
  class's labelled pixels (seed 0), trained as a separate run with the same recipe and not shipped.
  Unmixing: spatial split by rows (train rows < H/2-5, test rows >= H/2+5; rows balance the endmembers better
  than columns: water lies almost only in the left half of both scenes); random split 10 % of pixels.
- **Dense twins.** All spatial models use valid convolutions, no spatial stride/pooling and no normalisation
  layers (GroupNorm/BatchNorm would normalise over the spatial extent and make dense != patch), so the dense
  twin is the same graph on a larger input; `dense_vs_patch` in each metrics.json is measured through
  onnxruntime on the whole scene. HybridSN's "2-D convolution over (channels x spectral depth)" is a Conv3d
  whose kernel spans the full remaining spectral depth (identical to HybridSN's reshape + Conv2d, and avoids a
  shape-dependent Reshape in the dense graph).
- **Batch size (GSNR).** `gsnr.json` holds the probe at initialisation and after 100 warm-up steps. With the
  class-stratified sampler the "bias" term (class-balanced vs natural class frequencies) does not shrink with
  B, so GSNR saturates instead of growing ~linearly, and with 10 small batches the estimates are noisy
  (not always monotone in B). Rule used: the smallest B whose warm GSNR >= 1, else the largest probed (96).
- **Caveat.** Salinas-A is an easy, saturated benchmark (6 spectrally distinct crops): all three classifiers
  reach 99.5-100 % OA even on the disjoint split, so it does not rank the architectures; use the Salinas /
  Indian Pines label maps with synthetic scenes for stress tests.
"""
TILE = 64  # dense-mode figures are per output pixel of a TILE x TILE output tile


def concrete(model, dims):
    """Copy of `model` with the input dims fixed to `dims`, shapes re-inferred."""
    m = copy.deepcopy(model)
    for d, v in zip(m.graph.input[0].type.tensor_type.shape.dim, dims):
        d.Clear()
        d.dim_value = v
    for o in m.graph.output:
        for d in o.type.tensor_type.shape.dim:
            d.Clear()
    del m.graph.value_info[:]
    return onnx.shape_inference.infer_shapes(m, strict_mode=True)


def shapes(m):
    out = {}
    for v in list(m.graph.value_info) + list(m.graph.input) + list(m.graph.output):
        tt = v.type.tensor_type
        out[v.name] = ([d.dim_value for d in tt.shape.dim], tt.elem_type)
    for init in m.graph.initializer:
        out[init.name] = (list(init.dims), init.data_type)
    return out


def flops(m):
    """2 x multiply-accumulates of Conv / Gemm / MatMul nodes (+ bias adds)."""
    sh = shapes(m)
    total = 0
    for n in m.graph.node:
        if n.op_type == "Conv":
            out = int(np.prod(sh[n.output[0]][0]))
            w = sh[n.input[1]][0]
            group = next((a.i for a in n.attribute if a.name == "group"), 1)
            total += 2 * out * int(np.prod(w[1:])) + (out if len(n.input) > 2 else 0)
            del group
        elif n.op_type in ("Gemm", "MatMul"):
            a = sh[n.input[0]][0]
            out = int(np.prod(sh[n.output[0]][0]))
            total += 2 * out * a[-1] + (out if len(n.input) > 2 else 0)
    return total


def act_bytes(m):
    """Sum and max of the intermediate tensors listed in value_info (batch 1)."""
    sizes = []
    for v in m.graph.value_info:
        tt = v.type.tensor_type
        sizes.append(int(np.prod([d.dim_value for d in tt.shape.dim])) * ESIZE.get(tt.elem_type, 4))
    return sum(sizes), max(sizes) if sizes else 0


def params(m):
    return int(sum(np.prod(i.dims) for i in m.graph.initializer
                   if i.data_type in (TensorProto.FLOAT, TensorProto.FLOAT16)))


def layout_dims(layout, c, h, w):
    return {"n1chw": [1, 1, c, h, w], "nchw": [1, c, h, w], "nc": [1, c]}[layout]


def fmt_bytes(b):
    return f"{b / 1024:.1f} KiB" if b < 1024 ** 2 else f"{b / 1024 ** 2:.2f} MiB"


def fmt_flops(f):
    return f"{f / 1e6:.2f} M" if f >= 1e5 else f"{f / 1e3:.1f} k"


def row(name):
    d = os.path.join(HERE, name)
    man = json.load(open(os.path.join(d, "manifest.json")))
    met = json.load(open(os.path.join(d, "metrics.json")))
    lay, c, p, r = man["input"]["layout"], man["input"]["bands"], man["patch"], man["halo"]
    pm = onnx.load(os.path.join(d, man["files"]["patch"]))
    pc = concrete(pm, layout_dims(lay, c, p, p))
    info = {"name": name, "man": man, "met": met, "params": params(pm), "patch_flops": flops(pc),
            "patch_act": act_bytes(pc)}
    if man["files"].get("dense"):
        dm = onnx.load(os.path.join(d, man["files"]["dense"]))
        dc = concrete(dm, layout_dims(lay, c, TILE + 2 * r, TILE + 2 * r))
        info["dense_flops"] = flops(dc) / TILE ** 2
        s, mx = act_bytes(dc)
        info["dense_act"] = (s / TILE ** 2, mx / TILE ** 2)
    info["bytes"] = sum(os.path.getsize(os.path.join(d, f)) for k, f in man["files"].items() if k != "notes")
    return info


def metric_text(i):
    met, sd = i["met"], i["met"]["splits"]
    if i["man"]["task"] == "classification":
        a, b = sd["spatial_disjoint"]["metrics"], sd["random"]["metrics"]
        ort = met["ort_full_scene"]
        return (f"disjoint OA {a['oa'] * 100:.2f} % / AA {a['aa'] * 100:.2f} % / kappa {a['kappa']:.4f}; "
                f"random ({sd['random']['split']['train_fraction'] * 100:.0f} %) OA {b['oa'] * 100:.2f} %; "
                f"ORT full scene OA test {ort['oa_test'] * 100:.2f} %, all labelled {ort['oa_all_labelled'] * 100:.2f} %")
    a, b = sd["spatial_disjoint"]["metrics"], sd["random"]["metrics"]
    return (f"disjoint RMSE {a['rmse']:.4f} ({', '.join(f'{k} {v:.3f}' for k, v in a['per_endmember_rmse'].items())}); "
            f"random ({sd['random']['split']['train_fraction'] * 100:.0f} %) RMSE {b['rmse']:.4f}")


def main():
    rows = [row(n) for n in ORDER if os.path.exists(os.path.join(HERE, n, "metrics.json"))]
    L = []
    L.append("# hsiedge models — model card\n")
    L.append("Generated by `python3 models/card.py` from the manifests, the ONNX graphs (`value_info`) and each "
             "model's `metrics.json`; metrics are quoted from `metrics.json` only. Contract: `MANIFEST.md`.\n")
    L.append("Setup: `pip install -r models/requirements.txt`; data is read in place from `../shared/data` "
             "(ENVI, numpy reader in `common.py`). Training: `nice -n 10 python3 models/train.py --model NAME` "
             "(1 torch thread on the shared 2 cores, seed 0, bit-reproducible ONNX; trains the random-split and the spatially-disjoint-split models, ships the "
             "latter, exports patch/dense fp32+fp16 ONNX, runs the onnxruntime checks, writes manifest + metrics). "
             "Batch size: `python3 models/gsnr_probe.py --model NAME` (also run inside train.py; result in "
             "`gsnr.json`). Fixtures for the Rust tests: `python3 models/fixtures/make_fixtures.py`.\n")
    L.append(f"FLOPs are 2 x multiply-accumulates of Conv/Gemm/MatMul. Patch mode = one patch forward per pixel. "
             f"Dense mode = dense twin on a {TILE}x{TILE} output tile (input {TILE}+2r), divided by {TILE}x{TILE}. "
             f"Activation bytes = sum (max) of the intermediate tensors in the graph's `value_info`, fp32, batch 1 "
             f"(dense: per output pixel of the {TILE}x{TILE} tile). Wall times were measured at nice 10 on 2 cores shared "
             f"with Rust builds (1 torch thread), so they are upper bounds.\n")
    L.append("| model | input (patch file) | halo | params | FLOPs/pixel patch | FLOPs/pixel dense | "
             "activations/sample patch: sum (max) | dense per pixel: sum (max) | ONNX bytes (all files) | metrics | "
             "train wall time |")
    L.append("|---|---|---|---|---|---|---|---|---|---|---|")
    for i in rows:
        man = i["man"]
        lay, c, p = man["input"]["layout"], man["input"]["bands"], man["patch"]
        shape = {"n1chw": f"N x 1 x {c} x {p} x {p}", "nchw": f"N x {c} x {p} x {p}", "nc": f"N x {c}"}[lay]
        dflop = fmt_flops(i["dense_flops"]) if "dense_flops" in i else "- (per-pixel)"
        dact = (f"{fmt_bytes(i['dense_act'][0])} ({fmt_bytes(i['dense_act'][1])})" if "dense_act" in i else "-")
        sd = i["met"]["splits"]["spatial_disjoint"]
        wall = (f"{sd['train_wall_s']:.0f} s shipped model, {i['met']['total_wall_s']:.0f} s whole run "
                f"(`models/train.py --model {i['name']}`)")
        L.append(f"| `{i['name']}` | {shape} ({lay}) | {man['halo']} | {i['params']:,} | {fmt_flops(i['patch_flops'])} | "
                 f"{dflop} | {fmt_bytes(i['patch_act'][0])} ({fmt_bytes(i['patch_act'][1])}) | {dact} | "
                 f"{i['bytes']:,} | {metric_text(i)} | {wall} |")
    L.append("")
    for i in rows:
        man, met = i["man"], i["met"]
        L.append(f"## {i['name']}\n")
        L.append(f"{man['description']}.\n")
        L.append(f"- task `{man['task']}`, output `{man['output_kind']}`, outputs: "
                 + ", ".join(f"{o['name']}" + (f" (id {o['id']})" if o.get('id') else "") for o in man["outputs"]))
        L.append(f"- shipped weights: `{met['shipped_weights']}` split. Splits: "
                 + "; ".join(f"**{k}**: {json.dumps(v['split'])} (train {v['n_train']}, test {v['n_test']})"
                             for k, v in met["splits"].items()))
        L.append(f"- batch {man['provenance']['batch']}: {man['provenance']['batch_reason']}")
        if "dense_vs_patch" in met:
            dv = met["dense_vs_patch"]
            L.append(f"- dense vs patch (onnxruntime, whole scene): label agreement {dv['label_agreement']}, "
                     f"max |logit diff| {dv['max_abs_logit_diff']:.3g}")
        if "ort_full_scene" in met and "labels_sha256" in met["ort_full_scene"]:
            o = met["ort_full_scene"]
            L.append(f"- onnxruntime whole scene (reflect padding): OA test {o['oa_test']}, OA all labelled "
                     f"{o['oa_all_labelled']}, labels_sha256 `{o['labels_sha256']}`")
        L.append(f"- fp16: {json.dumps(met.get('fp16_vs_fp32_patch'))}")
        L.append(f"- files: {man['files']['notes']}\n")
    L.append(NOTES)
    L.append("Data: Salinas-A (AVIRIS, Grupo de Inteligencia Computacional UPV/EHU), Jasper Ridge and Samson "
             "(as distributed by Zhu et al.). Research benchmarks; cite the providers.\n")
    open(os.path.join(HERE, "README.md"), "w").write("\n".join(L))
    print("\n".join(L[:8 + len(rows)]))


if __name__ == "__main__":
    main()
