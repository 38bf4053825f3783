"""Check and time dev/conv_wgmma.cuh (P73's convolution through wgmma) on an sm_90 GPU.

    python dev/conv_wgmma.py                 # correctness on odd shapes, then P73's timings, as JSON on stdout
    python dev/conv_wgmma.py --small         # correctness only, small shapes (for compute-sanitizer)
    python dev/conv_wgmma.py --variants 1:1,2:1 --build-only

Each variant (taps in flight 1 or 2 : epilogue through shared memory 1 or direct 0 : ping-pong 0/1 : taps chained
per FADD 1 or 3 [: flags — h, each tap as two m64n64 chains; b, bulk copies of the rows' aligned middles; d, the
producer loads nothing; s, no epilogue (d and s are diagnostics)]) is built with torch's cpp_extension for
sm_90a. Errors are norm-wise against float64, beside cuDNN float32's (TF32 off) and the book's mma.sync 3xTF32
path (conv_bn_scale_eval, math="3xtf32").
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.cpp_extension import load

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import kernelbook as kb  # noqa: E402


def build(variant: str):
    taps, smem, pp, chain, *diag = variant.split(":")
    diag = "".join(diag)
    return load(name=f"cbw_dev_{variant.replace(':', '_')}", sources=[str(ROOT / "dev" / "conv_wgmma_ext.cu")],
                extra_include_paths=[str(ROOT / "dev"), str(ROOT / "kernels")],
                extra_cuda_cflags=["-O3", "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a",
                                   f"-DKB_CBW_TAPS_IN_FLIGHT={taps}", f"-DKB_CBW_SMEM_EPILOGUE={smem}",
                                   f"-DKB_CBW_PINGPONG={pp}", f"-DKB_CBW_CHAIN={chain}",
                                   f"-DKB_CBW_DIAG_NOLOAD={int('d' in diag)}",
                                   f"-DKB_CBW_DIAG_NOSTORE={int('s' in diag)}",
                                   f"-DKB_CBW_NSPLIT={2 if 'h' in diag else 1}",
                                   f"-DKB_CBW_BULK_STORE={int('b' in diag)}"], verbose=False)


def err(y, ref):
    return kb.check.report(y, ref, 1.0)


SHAPES = [  # (N, C_in, H, W, C_out, x offset in floats)
    (2, 3, 34, 34, 64, 0), (2, 8, 33, 97, 64, 0), (3, 5, 20, 150, 100, 0), (1, 1, 3, 3, 1, 0),
    (2, 8, 9, 131, 7, 1), (1, 3, 40, 262, 130, 3), (4, 8, 5, 4, 64, 0),
]


def check(mods, cbs, shapes, seed=0):
    rows = []
    for (n, c, h, w, k, off) in shapes:
        g = torch.Generator(device="cuda").manual_seed(seed)
        x = torch.rand(n * c * h * w + off, device="cuda", generator=g)[off:].view(n, c, h, w)
        wt = torch.rand(k, c, 3, 3, device="cuda", generator=g) - 0.5
        b = torch.rand(k, device="cuda", generator=g) - 0.5
        ref = F.conv2d(x.double(), wt.double(), b.double())
        with kb.precision.tf32(False):
            lib = err(F.conv2d(x, wt, b), ref)["rel_err"]
        row = {"shape": [n, c, h, w, k, off], "cudnn_fp32": lib,
               "mma_sync": err(cbs.conv_bn_scale_eval(x, wt, b, math="3xtf32"), ref)["rel_err"]}
        for name, m in mods.items():
            y = torch.full_like(ref, float("nan"), dtype=torch.float32)
            m.conv_wgmma(x, wt, b, y)
            r = err(y, ref)
            row[name] = r["rel_err"]
            row[name + "_unwritten"] = r["unwritten"]
            row[name + "_ok"] = bool(r["unwritten"] == 0 and r["rel_err"] <= 2 * max(lib, 2 ** -24))
        rows.append(row)
    return rows


def timings(mods, cbs):
    import triton.testing as tt

    p = kb.problems.P73_CONV_BN_SCALE
    x = p.inputs(seed=1).cuda()
    conv = p.model(seed=0).conv.cuda()
    wt, b = conv.weight.detach().contiguous(), conv.bias.detach().contiguous()
    y = torch.empty(x.shape[0], 64, 126, 126, device="cuda")
    out = {}
    for name, m in mods.items():
        out[name] = tt.do_bench(lambda m=m: m.conv_wgmma(x, wt, b, y), warmup=100, rep=400)
    for math in ("3xtf32", "fp32"):
        out[f"book_{math}"] = tt.do_bench(lambda math=math: cbs.conv_bn_scale_eval(x, wt, b, y, math=math),
                                          warmup=100, rep=400)
    out["fill"] = tt.do_bench(lambda: y.fill_(1.0), warmup=100, rep=400)
    ref = F.conv2d(x[:16].double(), wt.double(), b.double())
    out["errors_16"] = {name: err(m.conv_wgmma(x[:16].contiguous(), wt, b), ref)["rel_err"] for name, m in mods.items()}
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--variants", default="1:1:0:1,1:1:0:1:h,1:1:0:1:b,1:1:0:1:hb,1:1:0:1:s,1:1:0:1:hs")
    ap.add_argument("--build-only", action="store_true")
    ap.add_argument("--ncu", action="store_true", help="only two launches on P73, for Nsight Compute")
    args = ap.parse_args()
    mods = {"wgmma_" + v.replace(":", "_"): build(v) for v in args.variants.split(",")}
    if args.build_only:
        return 0
    if args.ncu:  # two launches on P73's shapes: ncu profiles the second
        p = kb.problems.P73_CONV_BN_SCALE
        x, conv = p.inputs(seed=1).cuda(), p.model(seed=0).conv.cuda()
        for m in mods.values():
            for _ in range(2):
                m.conv_wgmma(x, conv.weight.detach(), conv.bias.detach())
        torch.cuda.synchronize()
        return 0
    cbs = kb.build.load("conv_bn_scale")
    with torch.no_grad():
        res = {"check": check(mods, cbs, SHAPES[:4] if args.small else SHAPES)}
        if not args.small:
            res["timing_ms"] = timings(mods, cbs)
    torch.cuda.synchronize()
    print(json.dumps(res, indent=1))
    ok = all(r[k] for r in res["check"] for k in r if k.endswith("_ok"))
    print("ALL OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
