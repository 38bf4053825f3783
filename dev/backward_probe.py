#!/usr/bin/env python3
"""Where P73's backward loses accuracy against eager PyTorch (a GPU probe; prints a table).

For a few shapes: the error against float64 of dz (the gradient at the convolution's output), of its
channel sums (dconv.bias = Σ dz, zero in exact arithmetic), and of dW, for eager float32 (cuDNN's BatchNorm
backward on the z it kept) and for ours (PyTorch's native BatchNorm backward on z recomputed, with the saved
statistics), with and without projecting dz onto zero channel mean; and the saved mean against the mean of the
recomputed z. Eval mode: dγ through the fold against eager's.

    python dev/backward_probe.py
"""

from __future__ import annotations

import copy

import torch

import kernelbook as kb
from kernelbook.models import autograd_ops as ops


def rel(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def probe(ext, shape, seed=0, eval_mode=False):
    n, c_in, h, w, c_out = shape
    torch.manual_seed(seed)
    conv, bn = torch.nn.Conv2d(c_in, c_out, 3).cuda(), torch.nn.BatchNorm2d(c_out).cuda()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        bn.weight.copy_(torch.rand(c_out, generator=g) * 3 - 1)
        bn.bias.copy_(torch.randn(c_out, generator=g))
    x = kb.check.rand((n, c_in, h, w), seed=seed + 1, device="cuda")
    dy = kb.check.rand((n, c_out, h - 2, w - 2), seed=seed, device="cuda", low=-1, high=1)
    s, eps = 2.0, bn.eps
    out = {"shape": str(shape)}
    with kb.precision.tf32(False, False):
        # float64 reference: z, dz, dW
        c64, b64 = copy.deepcopy(conv).double(), copy.deepcopy(bn).double()
        z64 = c64(x.double()).detach().requires_grad_()
        y64 = b64(z64) * s
        (dz64,) = torch.autograd.grad(y64, z64, dy.double())
        dw64 = torch.ops.aten.convolution_backward(dz64, x.double(), c64.weight, [c_out], [1, 1], [0, 0],
                                                   [1, 1], False, [0, 0], 1, [False, True, True])
        # eager float32
        c32, b32 = copy.deepcopy(conv), copy.deepcopy(bn)
        z32 = c32(x).detach().requires_grad_()
        (dz32,) = torch.autograd.grad(b32(z32) * s, z32, dy)
        dw32 = ops._conv_backward(dz32, x, conv.weight, True, (False, True, True))
        # ours: forward with saved statistics, z recomputed, native BN backward
        stats = torch.empty(2, c_out, device="cuda")
        bo = copy.deepcopy(bn)
        with torch.no_grad():
            ext.conv_bn_scale_train(x, conv.weight, conv.bias, bo.weight, bo.bias, bo.running_mean, bo.running_var,
                                    bo.num_batches_tracked, 0.1, eps, s, None, "auto", "auto", stats)
            z = ext.conv_bn_scale_eval(x, conv.weight, conv.bias, None, "auto")
            zf = ext.conv_bn_scale_eval(x, conv.weight, conv.bias, None, "fp32")
            gs = bn.weight * s
            dz = torch.ops.aten.native_batch_norm_backward(dy, z, gs, None, None, stats[0], stats[1], True, eps,
                                                           [True, False, False])[0]
            mean32 = z32.detach().mean((0, 2, 3))
            dz_own = torch.ops.aten.native_batch_norm_backward(
                dy, z, gs, None, None, z.mean((0, 2, 3)), torch.rsqrt(z.var((0, 2, 3), unbiased=False) + eps),
                True, eps, [True, False, False])[0]
            dzp = dz - dz.mean((0, 2, 3), keepdim=True)
            dz_f = torch.ops.aten.native_batch_norm_backward(dy, zf, gs, None, None, stats[0], stats[1], True, eps,
                                                             [True, False, False])[0]
            vf, mf = torch.var_mean(zf, dim=(0, 2, 3), correction=0)
            dz_fo = torch.ops.aten.native_batch_norm_backward(dy, zf, gs, None, None, mf, torch.rsqrt(vf + eps),
                                                              True, eps, [True, False, False])[0]
        dw_f = ops._conv_backward(dz_f, x, conv.weight, True, (False, True, True))
        dw_fo = ops._conv_backward(dz_fo, x, conv.weight, True, (False, True, True))
        dwo = ops._conv_backward(dz, x, conv.weight, True, (False, True, True))
        dwp = ops._conv_backward(dzp, x, conv.weight, True, (False, True, True))
        dwown = ops._conv_backward(dz_own, x, conv.weight, True, (False, True, True))
    m64 = z64.detach().mean((0, 2, 3))
    out.update({
        "dz eager": rel(dz32, dz64), "dz ours": rel(dz, dz64), "dz ours (own stats)": rel(dz_own, dz64),
        "Σdz eager": float(dz32.double().sum((0, 2, 3)).norm()), "Σdz ours": float(dz.double().sum((0, 2, 3)).norm()),
        "dW eager": rel(dw32[1], dw64[1]), "dW ours": rel(dwo[1], dw64[1]), "dW ours projected": rel(dwp[1], dw64[1]),
        "dW ours own stats": rel(dwown[1], dw64[1]),
        "dz z-ffma saved": rel(dz_f, dz64), "dW z-ffma saved": rel(dw_f[1], dw64[1]),
        "dz z-ffma own": rel(dz_fo, dz64), "dW z-ffma own": rel(dw_fo[1], dw64[1]),
        "db eager": rel(dw32[2], dw64[2]), "db z-ffma own": rel(dw_fo[2], dw64[2]),
        "saved μ − μ64": float((stats[0].double() - m64).abs().max()),
        "eager μ − μ64": float((mean32.double() - m64).abs().max()),
        "mean(z auto) − μ64": float((z.double().mean((0, 2, 3)) - m64).abs().max()),
        "mean(z ffma) − μ64": float((zf.double().mean((0, 2, 3)) - m64).abs().max()),
        "saved r rel": float(((stats[1].double() - torch.rsqrt(z64.detach().var((0, 2, 3), unbiased=False) + eps))
                              / stats[1].double()).abs().max()),
    })
    # eval: dγ through the fold vs eager's
    bn_e = copy.deepcopy(bn).eval()
    with torch.no_grad():
        bn_e.running_mean.copy_(torch.randn(c_out, generator=g))
        bn_e.running_var.copy_(torch.rand(c_out, generator=g) + 0.5)
    leaves = {}
    for name, dt in (("64", torch.float64), ("32", torch.float32), ("fold", torch.float32)):
        cc, bb = copy.deepcopy(conv).to(dt), copy.deepcopy(bn_e).to(dt)
        with torch.enable_grad(), kb.precision.tf32(False, False):
            if name == "fold":
                wf, bf = ops.fold_bn_scale(cc.weight, cc.bias, bb.weight, bb.bias, bb.running_mean, bb.running_var,
                                           bb.eps, s)
                y = ops.conv_bn_scale_eval(ext.raw, x, wf, bf)
            else:
                y = bb(cc(x.to(dt))) * s
            leaves[name] = torch.autograd.grad(y, [bb.weight, bb.bias, cc.weight], dy.to(dt))
    with torch.no_grad(), kb.precision.tf32(False, False):
        ze = ext.conv_bn_scale_eval(x, conv.weight, conv.bias, None, "fp32")
        _, dge, _ = torch.ops.aten.native_batch_norm_backward(dy, ze, bn_e.weight * s, bn_e.running_mean,
                                                              bn_e.running_var, None, None, False, bn_e.eps,
                                                              [True, True, True])
    out["eval dγ direct"] = rel(dge * s, leaves["64"][0])
    for i, k in enumerate(("dγ", "dβ", "dW")):
        out[f"eval {k} eager"] = rel(leaves["32"][i], leaves["64"][i])
        out[f"eval {k} fold"] = rel(leaves["fold"][i], leaves["64"][i])
    return out


if __name__ == "__main__":
    import pandas as pd

    ext = kb.build.load("conv_bn_scale")
    rows = [probe(ext, s) for s in [(1, 8, 33, 97, 64), (4, 3, 32, 32, 16), (4, 8, 40, 70, 64), (16, 8, 128, 128, 64)]]
    pd.set_option("display.width", 250)
    print(pd.DataFrame(rows).set_index("shape").T.to_string(float_format=lambda v: f"{v:.3e}"))
