"""Check and time dev/p27w/conv3d_wgmma.cuh (P27's convolution on wgmma, a prototype) on an sm_90 GPU.

    python dev/p27w/run.py                 # checks on odd shapes and the definition's classes, then P27's timings
    python dev/p27w/run.py --small         # checks on small shapes only (compute-sanitizer)
    python dev/p27w/run.py --nd 2,3        # builds with P27W_ND = 2 and 3 (output depths per unit)
    python dev/p27w/run.py --version 3,4   # 1 the first; 2 staged by rows; 3 the bulk tensor copy; 4 3 + m64n32k8
    python dev/p27w/run.py --ncu           # two launches on P27's input, for Nsight Compute

Checks: y against float64 (beside cuDNN float32, TF32 off) on odd shapes, NaN-free and complete; the sums mode's
Σ 6h and Σ (6h)² against the float64 output's; the whole of P27 (sums mode + finish_kernel) against the float64
module, beside eager float32. Timings (do_bench medians, P27's full input): the convolution
written (y, 716 MB), the sums mode (what the fused kernel would do), the book's P27 kernels (FFMA and mma.sync
3xTF32: the whole problem, with their epilogue), the prototype's whole problem, cuDNN's conv3d.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

ARCH = "-gencode=arch=compute_90a,code=sm_90a"
SHAPES = [  # (N, C_in, D, H, W, C_out): P27's channels, a whole P27 sample, odd sizes, a one-output image, C_in 4
    (2, 3, 10, 12, 12, 16), (1, 3, 16, 32, 32, 16), (3, 2, 7, 9, 29, 5), (1, 1, 4, 4, 4, 1), (2, 4, 9, 33, 20, 11)]


def build(nd: int, version: int = 2):
    from torch.utils.cpp_extension import load

    return load(name=f"p27w_nd{nd}_v{version}", sources=[str(HERE / "ext.cu")], extra_include_paths=[str(HERE)],
                extra_cuda_cflags=["-O3", ARCH, f"-DP27W_ND={nd}", f"-DP27W_STAGE={min(version, 3)}",
                                   f"-DP27W_DESC={min(version, 2)}", f"-DP27W_MMA={2 if version >= 4 else 1}"],
                verbose=False)


def checks(mods, small: bool) -> list[dict]:
    import torch
    import torch.nn.functional as F

    import kernelbook as kb
    from kernelbook import check

    rows = []
    for (n, c, d, h, w, k) in SHAPES[:3] if small else SHAPES:
        x = check.rand((n, c, d, h, w), seed=k, device="cuda")
        wt = check.rand((k, c, 4, 4, 4), seed=1, device="cuda", low=-0.5, high=0.5)
        b = check.rand((k,), seed=2, device="cuda", low=-1.0, high=1.0)
        ref = F.conv3d(x.double(), wt.double(), b.double())
        with kb.precision.tf32(False):
            lib = check.report(F.conv3d(x, wt, b), ref, 1.0)["rel_err"]
        h6 = ref * (ref + 3).clamp(0, 6)
        want = torch.stack([h6.sum(dim=(2, 3, 4)), (h6**2).sum(dim=(2, 3, 4))], dim=-1)
        row = {"shape": [n, c, d, h, w, k], "cudnn_fp32": lib}
        for name, m in mods.items():
            y = m.conv3d_wgmma(x, wt, b)
            r = check.report(y, ref, 1.0)
            sums = m.conv3d_wgmma(x, wt, b, sums=True)
            serr = float(((sums - want).abs() / want.abs().clamp_min(1e-30)).max())
            row[name] = r["rel_err"]
            row[name + "_sums_err"] = serr
            row[name + "_ok"] = bool(r["unwritten"] == 0 and torch.isfinite(y).all() and r["rel_err"] <= 2 * lib
                                     and serr <= 1e-4)
        # The whole of P27 (sums mode + finish) against the float64 module and eager float32 (TF32 off).
        groups = 4 if k % 4 == 0 else 1
        gw = check.rand((k,), seed=3, device="cuda", low=0.5, high=1.5)
        gb = check.rand((k,), seed=4, device="cuda", low=-0.5, high=0.5)

        def whole(y, groups=groups, gw=gw, gb=gb):
            return F.group_norm(F.hardswish(y), groups, gw.to(y.dtype), gb.to(y.dtype), 1e-5).mean(dim=(2, 3, 4))

        if ref[0, :1].numel() * (k // groups) < 2:  # one value a group: GroupNorm is undefined
            rows.append(row)
            continue
        pref = whole(ref)
        with kb.precision.tf32(False):
            row["eager_p27_fp32"] = check.report(whole(F.conv3d(x, wt, b)), pref, 1.0)["rel_err"]
        for name, m in mods.items():
            e = check.report(m.p27_forward(x, wt, b, gw, gb, groups, 1e-5), pref, 1.0)["rel_err"]
            row[name + "_p27"] = e
            row[name + "_ok"] = row[name + "_ok"] and e <= max(2 * row["eager_p27_fp32"], 1e-6)
        rows.append(row)
    return rows


def shift_checks(mods) -> list[dict]:
    """The whole of P27 on 8 of its samples shifted by ±1000 (the definition's shifted class), against the float64
    module and eager float32 (TF32 off)."""
    import torch

    import kernelbook as kb
    from kernelbook import check

    p = kb.problems.P27_CONV3D_GN_MEAN
    m = p.model(seed=0).cuda()
    m64 = p.model(seed=0).cuda().double()
    c, gn = m.conv, m.group_norm
    args = (c.weight.detach(), c.bias.detach(), gn.weight.detach(), gn.bias.detach(), gn.num_groups, gn.eps)
    rows = []
    for shift in (1e3, -1e3):
        x = (p.inputs(seed=5, batch=8).cuda() + shift).contiguous()
        ref = m64(x.double())
        with kb.precision.tf32(False):
            row = {"shift": shift, "eager_fp32": check.report(m(x), ref, 1.0)["rel_err"]}
        for name, mod in mods.items():
            e = check.report(mod.p27_forward(x, *args), ref, 1.0)["rel_err"]
            row[name + "_p27"] = e
            row[name + "_ok"] = bool(e <= max(2 * row["eager_fp32"], 1e-6) and torch.isfinite(torch.tensor(e)))
        rows.append(row)
    return rows


def timings(mods) -> dict:
    import torch
    import torch.nn.functional as F
    import triton.testing as tt

    import kernelbook as kb

    p = kb.problems.P27_CONV3D_GN_MEAN
    x = p.inputs(seed=0).cuda()
    m = p.model(seed=0).cuda()
    wt, b = m.conv.weight.detach().contiguous(), m.conv.bias.detach().contiguous()
    gn = m.group_norm
    ext = kb.build.load("conv3d_gn_mean")
    out = {}
    for _ in range(2):
        for name, mod in mods.items():
            out.setdefault(name + "_y", []).append(tt.do_bench(lambda mod=mod: mod.conv3d_wgmma(x, wt, b), warmup=50,
                                                               rep=300))
            out.setdefault(name + "_sums", []).append(
                tt.do_bench(lambda mod=mod: mod.conv3d_wgmma(x, wt, b, sums=True), warmup=50, rep=300))
            out.setdefault(name + "_p27", []).append(tt.do_bench(
                lambda mod=mod: mod.p27_forward(x, wt, b, gn.weight, gn.bias, gn.num_groups, gn.eps), warmup=50,
                rep=300))
        for math in ("fp32", "3xtf32"):
            out.setdefault(f"book_p27_{math}", []).append(tt.do_bench(
                lambda math=math: ext.p27_forward(x, wt, b, gn.weight, gn.bias, gn.num_groups, gn.eps, None,
                                                  math=math), warmup=50, rep=300))
        with kb.precision.tf32(True):
            out.setdefault("cudnn_conv3d_tf32", []).append(tt.do_bench(lambda: F.conv3d(x, wt, b), warmup=50,
                                                                       rep=300))
    ref = F.conv3d(x[:8].double(), wt.double(), b.double())
    out["error_8_samples"] = {n: kb.check.report(mod.conv3d_wgmma(x[:8].contiguous(), wt, b), ref, 1.0)["rel_err"]
                              for n, mod in mods.items()}
    x64 = x[:64].contiguous()  # the whole problem's error on 64 samples, against the float64 module
    pref = p.model(seed=0).cuda().double()(x64.double())
    args = (wt, b, gn.weight, gn.bias, gn.num_groups, gn.eps)
    out["error_p27"] = {n: kb.check.report(mod.p27_forward(x64, *args), pref, 1.0)["rel_err"]
                        for n, mod in mods.items()}
    out["error_p27_book"] = {m: kb.check.report(ext.p27_forward(x64, *args, None, math=m), pref, 1.0)["rel_err"]
                             for m in ("fp32", "3xtf32")}
    torch.cuda.synchronize()
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nd", default="3")
    ap.add_argument("--version", default="3",
                    help="4: 3 with X_hi·[W_hi | W_lo] as one m64n32k8; 3: the bulk tensor copy; 2: staged by rows, "
                    "descriptors by addition; 1: the first")
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--build-only", action="store_true")
    ap.add_argument("--ncu", action="store_true", help="two sums-mode launches on P27's input (ncu profiles one)")
    args = ap.parse_args()
    import torch

    mods = {f"nd{nd}v{v}": build(int(nd), int(v)) for nd in args.nd.split(",") for v in args.version.split(",")}
    if args.build_only:
        return 0
    if args.ncu:
        import kernelbook as kb

        p = kb.problems.P27_CONV3D_GN_MEAN
        x, conv = p.inputs(seed=0).cuda(), p.model(seed=0).conv.cuda()
        with torch.no_grad():
            for mod in mods.values():
                for _ in range(2):
                    mod.conv3d_wgmma(x, conv.weight.detach(), conv.bias.detach(), sums=True)
        torch.cuda.synchronize()
        return 0
    with torch.no_grad():
        res = {"checks": checks(mods, args.small)}
        if not args.small:
            res["checks"] += shift_checks(mods)
        if not args.small:
            res["timing_ms"] = timings(mods)
    from dev.report import finish

    return finish(res)


if __name__ == "__main__":
    sys.exit(main())
