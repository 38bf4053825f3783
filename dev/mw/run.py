"""Check and time dev/mw/moments_wgmma.cuh (the moments' lag sums on wgmma, a prototype) on an sm_90 GPU.

    python dev/mw/run.py            # checks on odd shapes, then P73's timing beside the book's moments_tc_kernel
    python dev/mw/run.py --small    # checks on small shapes only (compute-sanitizer)
    python dev/mw/run.py --kg 1,2   # builds with MW_KG = 1 and 2 (wgmmas per commit group)
    python dev/mw/run.py --ncu      # two launches on P73's input, for Nsight Compute

Checks: every lag sum Σ x̃_i(q)·x̃_j(q + d) and first moment Σ x̃_i against float64 (x̃ = x − the kernel's pivot,
computed here in the same float32 order), as errors in units of u = 2^-24 of Σ |x̃_i(q)·x̃_j(q + d)| (rms and
max over the sums); the same for float32 sums by torch (TF32 off) as a yardstick.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

ARCH = "-gencode=arch=compute_90a,code=sm_90a"
SHAPES = [  # (N, C, H, W): P73's channels, odd sizes, one channel, a tile-sized image, wide rows, C = 3
    (2, 8, 34, 34), (3, 5, 20, 150), (1, 1, 3, 3), (2, 8, 4, 32), (1, 8, 9, 131), (4, 3, 37, 61)]
CI_MAX, NJ, D1, ND, SLOTS = 8, 9, 3, 5, 25
U = 2.0**-24


def build(kg: int):
    from torch.utils.cpp_extension import load

    return load(name=f"mw_kg{kg}", sources=[str(HERE / "ext.cu")], extra_include_paths=[str(HERE)],
                extra_cuda_cflags=["-O3", ARCH, f"-DMW_KG={kg}"], verbose=False)


def pivots(x):
    """conv_moments.cuh's pivot: the mean of 16 values of sample 0 on a 4×4 grid, in its float32 order."""
    import numpy as np

    n, c, h, w = x.shape
    xs = x[0].cpu().numpy()
    out = []
    for ch in range(c):
        s = np.float32(0.0)
        for i in range(4):
            for j in range(4):
                s = np.float32(s + xs[ch, i * (h - 1) // 3, j * (w - 1) // 3])
        out.append(np.float32(s * np.float32(0.0625)))
    return out


def reference(x):
    """Float64 lag sums and their magnitude sums, and torch's float32 sums, as {(i, j, d1, d2i): values}."""
    import torch

    import kernelbook as kb

    n, c, h, w = x.shape
    piv = torch.tensor(pivots(x), device=x.device, dtype=torch.float32).view(1, c, 1, 1)
    xt = x - piv  # float32, as the kernel rounds it
    x64 = xt.double()
    pad = torch.nn.functional.pad(x64, (2, 2, 0, 2))  # columns ±2, rows up to +2
    pad32 = torch.nn.functional.pad(xt, (2, 2, 0, 2))
    ref, mag, lib = {}, {}, {}
    with kb.precision.tf32(False):
        for d1 in range(D1):
            for d2i in range(ND):
                d2 = d2i - 2
                sh = pad[:, :, d1:d1 + h, 2 + d2:2 + d2 + w]
                sh32 = pad32[:, :, d1:d1 + h, 2 + d2:2 + d2 + w]
                g = torch.einsum("nihw,njhw->ij", x64, sh)
                a = torch.einsum("nihw,njhw->ij", x64.abs(), sh.abs())
                g32 = torch.einsum("nihw,njhw->ij", xt, sh32).double()
                for i in range(c):
                    for j in range(c):
                        ref[(i, j, d1, d2i)], mag[(i, j, d1, d2i)] = g[i, j].item(), a[i, j].item()
                        lib[(i, j, d1, d2i)] = g32[i, j].item()
        s1, a1 = x64.sum(dim=(0, 2, 3)), x64.abs().sum(dim=(0, 2, 3))
        s1_32 = xt.sum(dim=(0, 2, 3)).double()
        for i in range(c):
            ref[(i, CI_MAX, 0, 2)], mag[(i, CI_MAX, 0, 2)] = s1[i].item(), a1[i].item()
            lib[(i, CI_MAX, 0, 2)] = s1_32[i].item()
    return ref, mag, lib


def combo(i, j, d1, d2i):
    return ((i * NJ + j) * D1 + d1) * ND + d2i


def errors(got: dict, ref: dict, mag: dict) -> dict:
    import math

    e = [abs(got[k] - ref[k]) / max(mag[k], 1e-300) / U for k in ref]
    return {"rms_u": math.sqrt(sum(v * v for v in e) / len(e)), "max_u": max(e)}


def checks(mods, small: bool) -> list[dict]:
    import torch

    from kernelbook import check

    rows = []
    for n, c, h, w in SHAPES[:3] if small else SHAPES:
        x = check.rand((n, c, h, w), seed=h * w + c, device="cuda")
        ref, mag, lib = reference(x)
        row = {"shape": [n, c, h, w], "torch_fp32": errors(lib, ref, mag)}
        for name, m in mods.items():
            acc = m.mw_sums(x).cpu()
            got = {k: acc[combo(*k) * SLOTS].item() for k in ref}
            untouched = int((acc != 0).sum()) - sum(1 for k in ref if acc[combo(*k) * SLOTS] != 0)
            r = errors(got, ref, mag)
            row[name] = r
            row[name + "_ok"] = bool(r["max_u"] <= 64 and untouched == 0 and torch.isfinite(acc).all())
        rows.append(row)
    return rows


def book_moments_us(x) -> dict:
    """The book's moments kernels' times (µs) in one call of P73's training-mode default, by torch.profiler."""
    import torch

    import kernelbook as kb
    from kernelbook.models.training import FusedP73

    p = kb.problems.P73_CONV_BN_SCALE
    fused = FusedP73(kb.build.load("conv_bn_scale"), p.model(seed=0).cuda())
    with torch.no_grad():
        for _ in range(3):
            fused(x)
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                fused(x)
            torch.cuda.synchronize()
    out = {}
    for ev in prof.key_averages():
        if "moments" in ev.key:
            out[ev.key.split("(")[0]] = ev.device_time_total / ev.count
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kg", default="2")
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--build-only", action="store_true")
    ap.add_argument("--ncu", action="store_true")
    args = ap.parse_args()
    import torch
    import triton.testing as tt

    import kernelbook as kb

    mods = {f"kg{k}": build(int(k)) for k in args.kg.split(",")}
    if args.build_only:
        return 0
    p = kb.problems.P73_CONV_BN_SCALE
    if args.ncu:
        x = p.inputs(seed=0).cuda()
        for m in mods.values():
            for _ in range(2):
                m.mw_sums(x)
        torch.cuda.synchronize()
        return 0
    res = {"checks": checks(mods, args.small)}
    if not args.small:
        x = p.inputs(seed=0).cuda()
        res["timing_ms"] = {n: tt.do_bench(lambda m=m: m.mw_sums(x), warmup=50, rep=300) for n, m in mods.items()}
        res["book_us"] = book_moments_us(x)
        ref, mag, _ = reference(x[:16].contiguous())  # P73's data, 16 samples
        res["p73_16_errors"] = {}
        for n, m in mods.items():
            acc = m.mw_sums(x[:16].contiguous()).cpu()
            res["p73_16_errors"][n] = errors({k: acc[combo(*k) * SLOTS].item() for k in ref}, ref, mag)
    from dev.report import finish

    return finish(res)


if __name__ == "__main__":
    sys.exit(main())
