#!/usr/bin/env python3
"""Small, complete workloads for compute-sanitizer: every kernel on awkward sizes and alignments.

    compute-sanitizer --tool memcheck --error-exitcode 1 python scripts/sanitize.py [kernel ...]

Sizes are small (the sanitizer slows kernels down by orders of magnitude) but cover every code path:
empty input, tails, misaligned views. Each result is also checked, so a silent wrong answer fails too.
"""

from __future__ import annotations

import sys

import torch

import kernelbook as kb
from kernelbook import check


def scale() -> None:
    mod = kb.build.load("scale")
    for n in (0, 1, 3, 4, 5, 255, 257, 1023, 4097, (1 << 16) + 3):
        for x_off, out_off in ((0, 0), (1, 0), (0, 3)):
            x = check.rand([n + x_off], seed=n + x_off, device="cuda")[x_off:]
            out = check.poisoned([n + out_off], device="cuda")[out_off:]
            mod.scale_out(x, 1.5, out)  # 1.5 is exact in float32
            check.assert_close(out, 1.5 * x.double(), tol=check.FP32_UNIT_ROUNDOFF, what=f"scale n={n}")


def bn_train() -> None:
    from torch import nn

    mod = kb.build.load("bn_train")
    # (shape, momentum, offset of x's data in floats: 1 makes a float4-able shape take the scalar path)
    cases = [((3, 5, 7, 9), 0.1, 0), ((2, 8, 1, 1), 0.1, 0), ((4, 67, 12, 16), None, 0), ((1, 3, 64, 64), 0.1, 1)]
    for shape, momentum, offset in cases:
        ref = nn.BatchNorm2d(shape[1], momentum=momentum).double().cuda()
        ours = nn.BatchNorm2d(shape[1], momentum=momentum).cuda()
        numel = shape[0] * shape[1] * shape[2] * shape[3]
        for step in range(2):
            x = check.rand([numel + offset], seed=step, device="cuda")[offset:].view(shape)
            out = check.poisoned(shape, device="cuda")
            mod.bn_scale_train(x, ours.weight, ours.bias, ours.running_mean, ours.running_var,
                               ours.num_batches_tracked, momentum, 1e-5, 2.0, out)
            with torch.no_grad():
                check.assert_close(out, ref(x.double()) * 2.0, tol=check.pivoted_normalisation_tol(x),
                                   what=f"bn train {shape}")
        y = mod.bn_scale_eval(x, ours.weight, ours.bias, ours.running_mean, ours.running_var, 1e-5, 2.0, None)
        ref.running_mean.copy_(ours.running_mean)  # eval from our statistics: check the eval kernel alone
        ref.running_var.copy_(ours.running_var)
        ref.eval()
        with torch.no_grad():
            check.assert_close(y, ref(x.double()) * 2.0, tol=1e-6, what=f"bn eval {shape}")


def conv2d_folded() -> None:
    import torch.nn.functional as F

    mod = kb.build.load("conv2d_folded")
    # (N, C_in, H, W, C_out, out offset): a partial column tile and odd widths, C_in over one staged chunk,
    # partial channel groups, several channel blocks, a misaligned output (scalar stores), and more tiles than
    # resident blocks across two channel blocks (a block restages weights while others still read theirs).
    for n, c_in, h, w, c_out, off in [(1, 3, 5, 97, 16, 0), (2, 9, 6, 131, 70, 0), (1, 2, 4, 8, 5, 1),
                                       (512, 8, 3, 10, 72, 0)]:
        x = check.rand((n, c_in, h, w), seed=c_in, device="cuda")
        wt = check.rand((c_out, c_in, 3, 3), seed=c_out, device="cuda", low=-1)
        b = check.rand((c_out,), seed=w, device="cuda")
        ref = F.conv2d(x.double(), wt.double(), b.double())
        tol = check.dot_tol(c_in * 9 + 1, F.conv2d(x.double(), wt.double().abs(), b.double()), ref)
        for fn in (mod.conv2d_simple, mod.conv2d_folded):
            out = check.poisoned([ref.numel() + off], device="cuda")[off:].view(ref.shape)
            fn(x, wt, b, out)
            check.assert_close(out, ref, tol, what=f"{fn.__name__} {(n, c_in, h, w, c_out)}")


def mappings() -> None:
    mod = kb.build.load("mappings")
    for shape in ((3, 5, 7, 9), (2, 3, 13, 37), (1, 9, 20, 250), (2, 64, 14, 126), (4, 3, 5, 7)):
        c = shape[1]
        x = check.rand(shape, seed=sum(shape), device="cuda", low=-1, high=1)
        a, b = check.rand([c], seed=1, low=-2, high=2), check.rand([c], seed=2)
        ref = x.double() * a.double().cuda().view(1, c, 1, 1) + b.double().cuda().view(1, c, 1, 1)
        for name in mod.mappings():
            if name.startswith("flat_vec4") and x.numel() % 4:  # float4 over the flat tensor: refused
                continue
            out = check.poisoned(shape, device="cuda")
            mod.affine(x, a, b, name, out)
            check.assert_close(out, ref, tol=check.FP32_UNIT_ROUNDOFF, what=f"affine {name} {shape}")


def ceilings() -> None:
    mod = kb.build.load("ceilings")
    variants = [(g, u, c) for g in ("tiles", "resident") for u in (1, 4, 8) for c in ("default", "streaming")]
    # A tile is 1024, 4096 or 8192 floats (U = 1, 4, 8): tails, partial tiles, more tiles than resident blocks.
    sizes = (0, 1, 3, 4, 5, 1023, 4096 + 3, 8192 * 5 + 4 * 7 + 3, 8192 * 1100 + 5)
    for n in sizes:
        for grid, unroll, cache in variants:
            x = check.rand([n], seed=n, device="cuda")
            out = check.poisoned([n], device="cuda")
            mod.copy(x, out, grid, unroll, cache)
            assert torch.equal(out, x), f"copy n={n} grid={grid} unroll={unroll} cache={cache}"
    for iters, blocks in ((0, 1), (37, 3)):  # 37: one unrolled trip of 32 and 5 leftover steps
        out, clocks = mod.ffma(iters, 1.0, 1.0, blocks)
        t = torch.arange(out.numel(), device="cuda", dtype=torch.float64)
        ref = sum((t % 64) + j + iters * (j + 1) for j in range(mod.FFMA_CHAINS))
        check.assert_close(out, ref, tol=check.FP32_UNIT_ROUNDOFF, what=f"ffma iters={iters}")


def group_stats() -> None:
    from torch import nn

    from kernelbook import variance

    mod = kb.build.load("group_stats")
    # (shape, groups, offset of x's data in floats): tails, misaligned rows, one block and several per group
    cases = [((3, 6, 7), 3, 0), ((2, 8, 33), 4, 1), ((1, 4, 8195), 2, 3), ((4, 4, 1), 2, 0), ((0, 4, 5), 2, 0)]
    for shape, groups, offset in cases:
        numel = shape[0] * shape[1] * shape[2]
        x = check.rand_at_offset(shape, offset, seed=numel, device="cuda", low=-1, high=3)
        m64, v64 = variance.grouped_reference(x, groups)
        for algo in ("onepass", "twopass", "welford", "welford_noshift"):
            mean = check.poisoned([shape[0], groups], device="cuda")
            var = check.poisoned([shape[0], groups], device="cuda")
            mod.group_stats(x, groups, algo, mean, var)
            check.assert_close(var, v64, variance.stats_tol(x, groups, algo) if numel else 1.0, what=f"{algo} {shape}")
            check.assert_close(mean, m64, 1e-5, what=f"{algo} mean {shape}")
        gn = nn.GroupNorm(groups, shape[1]).double().cuda()
        out = check.poisoned(shape, device="cuda")
        mod.group_norm(x, groups, gn.weight.float(), gn.bias.float(), gn.eps, out)
        if numel:
            with torch.no_grad():
                tol = check.normalisation_tol(x.reshape(shape[0], groups, -1), (2,))
                check.assert_close(out, gn(x.double()), tol, what=f"group norm {shape}")


def conv_bn_scale() -> None:
    import copy

    import torch.nn.functional as F
    from torch import nn

    mod = kb.build.load("conv_bn_scale")
    # (N, C_in, H, W, C_out, out offset): the pipelined path with a partial column tile and an odd HO, the
    # unpipelined path (C_in > 8) with two channel blocks, a misaligned output (scalar stores and apply), and
    # two channel blocks and two column tiles of the tensor-core convolution (C_in ≤ 8: its default).
    for n, c_in, h, w, c_out, off in [(1, 3, 7, 97, 16, 0), (2, 9, 5, 131, 70, 0), (1, 2, 4, 8, 5, 1),
                                      (2, 8, 6, 140, 70, 0)]:
        torch.manual_seed(n + c_in + h)
        r64 = nn.ModuleDict({"conv": nn.Conv2d(c_in, c_out, 3), "bn": nn.BatchNorm2d(c_out)}).double().cuda()
        ours = copy.deepcopy(r64).float()
        c, b = ours["conv"], ours["bn"]
        x = check.rand((n, c_in, h, w), seed=c_in, device="cuda")
        shape = (n, c_out, h - 2, w - 2)
        out = check.poisoned([n * c_out * (h - 2) * (w - 2) + off], device="cuda")[off:].view(shape)
        mod.conv_bn_scale_train(x, c.weight, c.bias, b.weight, b.bias, b.running_mean, b.running_var,
                                b.num_batches_tracked, 0.1, b.eps, 2.0, out)
        with torch.no_grad():
            check.assert_close(out, r64["bn"](r64["conv"](x.double())) * 2.0, 1e-4, what=f"cbs train {shape}")
        check.assert_close(b.running_var, r64["bn"].running_var, 1e-4, what=f"cbs running_var {shape}")
        for math in ("fp32", "auto"):  # FFMA, and the tensor cores where C_in ≤ 8
            out.fill_(float("nan"))
            mod.conv_bn_scale_eval(x, c.weight, c.bias, out, math=math)
            check.assert_close(out, F.conv2d(x.double(), c.weight.double(), c.bias.double()), 1e-5,
                               what=f"cbs eval {shape} ({math})")
    # The tensor-core convolution by mma.sync too where wgmma is the default (sm_90): the shapes above again.
    if mod.conv_bn_scale_tc_instruction(x) == "wgmma":
        mod.conv_bn_scale_tc_instruction(x, mma_sync=True)
        try:
            for n, c_in, h, w, c_out in [(2, 8, 6, 140, 70), (1, 3, 7, 97, 16)]:
                xs = check.rand((n, c_in, h, w), seed=c_in, device="cuda")
                wt = check.rand((c_out, c_in, 3, 3), seed=1, device="cuda", low=-0.5, high=0.5)
                check.assert_close(mod.conv_bn_scale_eval(xs, wt, None, math="3xtf32"),
                                   F.conv2d(xs.double(), wt.double()), 1e-5, what=f"cbs eval mma.sync {n, c_in, h, w}")
        finally:
            mod.conv_bn_scale_tc_instruction(x, mma_sync=False)
    # The moments' sums on both paths: x misaligned (scalar staging), two row tiles and two column tiles; and the
    # in-place strategy on the tensor cores (its statistics in a pass over y).
    for strategy, math in (("moments", "fp32"), ("moments", "3xtf32"), ("inplace", "3xtf32")):
        torch.manual_seed(3)
        r64 = nn.ModuleDict({"conv": nn.Conv2d(5, 4, 3), "bn": nn.BatchNorm2d(4)}).double().cuda()
        ours = copy.deepcopy(r64).float()
        c, b = ours["conv"], ours["bn"]
        x = check.rand([5 * 35 * 130 + 1], seed=9, device="cuda")[1:].view(1, 5, 35, 130)
        out = mod.conv_bn_scale_train(x, c.weight, c.bias, b.weight, b.bias, b.running_mean, b.running_var,
                                      b.num_batches_tracked, 0.1, b.eps, 2.0, strategy=strategy, math=math)
        with torch.no_grad():
            check.assert_close(out, r64["bn"](r64["conv"](x.double())) * 2.0, 1e-4, what=f"cbs {strategy} ({math})")
    # strategy="auto" on data where the moments would cancel (a difference filter on a smooth field): the
    # guard must pick the in-place path on the GPU, and both paths' kernels launch (one of them exits at once).
    r, s = torch.arange(18.0, device="cuda")[:, None], torch.arange(20.0, device="cuda")[None, :]
    x = (0.4 * torch.sin(0.01 * r + 0.007 * s) + 1e-4 * check.rand((2, 3, 18, 20), seed=5, device="cuda"))
    conv, bn = nn.Conv2d(3, 2, 3).cuda(), nn.BatchNorm2d(2, momentum=1.0).cuda()
    conv.weight.zero_()
    conv.bias.zero_()  # a bias that dwarfs the filter's small differences would cancel in the batch mean
    conv.weight[0, 0, 1, 1], conv.weight[0, 0, 1, 2] = 0.375, -0.375
    assert mod.conv_bn_scale_auto_choice(x, conv.weight, conv.bias) == "inplace"
    r64 = nn.ModuleDict({"conv": copy.deepcopy(conv), "bn": copy.deepcopy(bn)}).double()
    out = mod.conv_bn_scale_train(x, conv.weight, conv.bias, bn.weight, bn.bias, bn.running_mean, bn.running_var,
                                  bn.num_batches_tracked, 1.0, bn.eps, 2.0, strategy="auto")
    check.assert_close(out, r64["bn"](r64["conv"](x.double())) * 2.0, 1e-4, what="cbs auto, ill-conditioned")
    # A training step's backward on each strategy (saved statistics, the recomputed conv output, BatchNorm's and
    # the convolution's backward) and the eval mode's, through the fold, on a partial tile and an odd HO.
    torch.manual_seed(4)
    base = kb.problems.P73(3, 5, 3, 2.0).cuda()
    x = check.rand((2, 3, 9, 133), seed=4, device="cuda")
    for strategy, train in (("auto", True), ("moments", True), ("inplace", True), ("auto", False)):
        ours = kb.training.FusedP73(mod, base, 2.0, strategy=strategy).train(train)
        ref = copy.deepcopy(base).double().train(train)
        dy = check.rand((2, 5, 7, 131), seed=5, device="cuda", dtype=torch.float64, low=-1, high=1)
        got, want = check.gradients(ours, x, dy), check.gradients(ref, x.double(), dy)
        for name, g in got.items():
            if train and name == "conv.bias":  # exactly 0 before training-mode BatchNorm
                assert not g.any(), f"cbs backward {strategy}: dconv.bias is not 0"
                continue
            check.assert_close(g, want[name], 1e-4, what=f"cbs backward {strategy} train={train} d{name}")



def conv3d_gn_mean() -> None:
    import torch.nn.functional as F

    mod = kb.build.load("conv3d_gn_mean")
    # (N, C_in, D, H, W, C_out, groups, x offset in floats): float4 and scalar staging (misaligned, W % 4 != 0),
    # padded channel groups, and a shape whose input does not fit shared memory (slabs with a halo).
    cases = [(2, 3, 6, 9, 12, 16, 4, 0), (1, 3, 5, 7, 11, 24, 3, 1), (1, 2, 20, 40, 36, 8, 2, 0),
             (1, 2, 5, 8, 70, 12, 3, 1)]
    for n, c_in, d, h, w, c_out, g, off in cases:
        torch.manual_seed(n + c_out)
        m = kb.problems.P27(c_in, c_out, 4, num_groups=g).cuda()
        x = check.rand([n * c_in * d * h * w + off], seed=d, device="cuda")[off:].view(n, c_in, d, h, w)
        gn = m.group_norm
        with torch.no_grad():
            hh = F.hardswish(F.conv3d(x.double(), m.conv.weight.double(), m.conv.bias.double()))
            ref = F.group_norm(hh, g, gn.weight.double(), gn.bias.double(), gn.eps).mean(dim=[2, 3, 4])
        out = check.poisoned([n, c_out], device="cuda")
        mod.p27_forward(x, m.conv.weight, m.conv.bias, gn.weight, gn.bias, g, gn.eps, out)
        check.assert_close(out, ref, 1e-5, what=f"p27_forward {(n, c_in, d, h, w, c_out, g)}")
        out = check.poisoned([n, c_out], device="cuda")
        y = F.conv3d(x.double(), m.conv.weight.double(), m.conv.bias.double()).float()  # exact conv, rounded
        mod.p27_tail(y, gn.weight, gn.bias, g, gn.eps, out)
        check.assert_close(out, ref, 1e-5, what=f"p27_tail {(n, c_in, d, h, w, c_out, g)}")
        if c_out <= 16 and torch.cuda.get_device_capability() >= (8, 0):  # the tensor-core path
            out = check.poisoned([n, c_out], device="cuda")
            mod.p27_forward(x, m.conv.weight, m.conv.bias, gn.weight, gn.bias, g, gn.eps, out, math="3xtf32")
            check.assert_close(out, ref, 1e-5, what=f"p27_forward 3xtf32 {(n, c_in, d, h, w, c_out, g)}")
    # The backward (recomputed through PyTorch's ops on the saved input), on the first case.
    torch.manual_seed(1)
    m = kb.problems.P27(3, 16, 4).cuda()
    x = check.rand((2, 3, 6, 9, 12), seed=6, device="cuda")
    dy = check.rand((2, 16), seed=7, device="cuda", dtype=torch.float64, low=-1, high=1)
    got = check.gradients(kb.training.FusedP27(mod, m), x, dy)
    want = check.gradients(m.double(), x.double(), dy)
    for name, g in got.items():
        check.assert_close(g, want[name], 1e-4, what=f"p27 backward d{name}")



def gemm_3xtf32() -> None:
    if torch.cuda.get_device_capability() < (8, 0):
        return
    mod = kb.build.load("gemm_3xtf32")
    for m, n, k in ((1, 4, 4), (37, 12, 20), (130, 132, 36), (129, 260, 1028)):
        a = check.rand([m, k], seed=m, device="cuda", low=-1, high=1)
        b = check.rand([k, n], seed=n, device="cuda", low=-1, high=1)
        for passes in (1, 3):
            for version in (1, 2, 3, 4, 5):
                check.assert_close(mod.gemm_tf32(a, b, passes, version), a.double() @ b.double(),
                                   tol=1e-3, what=f"gemm {m}x{n}x{k} passes={passes} v{version}")
    assert torch.isfinite(mod.mma_peak(2, 8, torch.device("cuda"))).all()


def cutlass_peers() -> None:
    import torch.nn.functional as F

    if torch.cuda.get_device_capability() < (8, 0):
        return
    g = kb.build.load("cutlass_gemm").raw
    for m, n, k in ((1, 4, 4), (37, 12, 20), (129, 260, 68)):
        a = check.rand([m, k], seed=m, device="cuda", low=-1, high=1)
        b = check.rand([k, n], seed=n, device="cuda", low=-1, high=1)
        for passes in (1, 3):
            for tile in range(len(g.tiles(passes))):
                check.assert_close(g.cutlass_gemm(a, b, passes, tile), a.double() @ b.double(), tol=1e-3,
                                   what=f"cutlass gemm {m}x{n}x{k} passes={passes} tile {tile}")
    cv = kb.build.load("cutlass_conv").raw
    x = check.rand([2, 8, 9, 11], seed=1, device="cuda").contiguous(memory_format=torch.channels_last)
    w = check.rand([12, 8, 3, 3], seed=2, device="cuda").contiguous(memory_format=torch.channels_last)
    bias = check.rand([12], seed=3, device="cuda")
    for it in (0, 1):
        check.assert_close(cv.cutlass_conv2d(x, w, bias, it), F.conv2d(x.double(), w.double(), bias.double()),
                           tol=1e-5, what=f"cutlass conv2d iterator {it}")
    x3 = check.rand([2, 4, 5, 6, 7], seed=4, device="cuda").contiguous(memory_format=torch.channels_last_3d)
    w3 = check.rand([16, 4, 3, 3, 3], seed=5, device="cuda").contiguous(memory_format=torch.channels_last_3d)
    b3 = check.rand([16], seed=6, device="cuda")
    check.assert_close(cv.cutlass_conv3d(x3, w3, b3), F.conv3d(x3.double(), w3.double(), b3.double()), tol=1e-5,
                       what="cutlass conv3d")
    pr = kb.build.load("mma_probe").raw
    a, c = torch.ones(16, 8, device="cuda"), torch.ones(16, 8, device="cuda")
    assert torch.equal(pr.mma_probe(a, torch.ones(8, 8, device="cuda"), c, True), 9 * c)
    seeds = torch.arange(6 * pr.ceiling_config()["threads"], dtype=torch.int32, device="cuda")
    assert torch.isfinite(pr.mma_ceiling(seeds, 2, 8)[0]).all()


def gemm_wgmma() -> None:
    mod = kb.build.load("gemm_wgmma")
    if not mod.available(torch.device("cuda")):
        return
    for m, n, k in ((1, 4, 4), (37, 12, 20), (33, 17, 7), (130, 132, 36), (129, 260, 1028)):
        a = check.rand([m, k], seed=m, device="cuda", low=-1, high=1)
        b = check.rand([k, n], seed=n, device="cuda", low=-1, high=1)
        for passes in (1, 3):
            for version in (1, 2):
                check.assert_close(mod.gemm(a, b, passes, version), a.double() @ b.double(), tol=1e-3,
                                   what=f"wgmma gemm {m}x{n}x{k} passes={passes} v{version}")
    seeds = torch.arange(1, 257, dtype=torch.int32, device="cuda")
    assert torch.isfinite(mod.wgmma_ceiling(seeds, 2, 8)[0]).all()


WORKLOADS = {"scale": scale, "bn_train": bn_train, "conv2d_folded": conv2d_folded, "mappings": mappings,
             "ceilings": ceilings, "group_stats": group_stats, "conv_bn_scale": conv_bn_scale,
             "conv3d_gn_mean": conv3d_gn_mean, "gemm_3xtf32": gemm_3xtf32, "cutlass_peers": cutlass_peers,
             "gemm_wgmma": gemm_wgmma}

if __name__ == "__main__":
    names = sys.argv[1:] or list(WORKLOADS)
    torch.set_grad_enabled(False)  # forward passes, except where a workload turns autograd on for a backward
    for name in names:
        WORKLOADS[name]()
        torch.cuda.synchronize()
        print(f"workload {name}: ok", flush=True)
