"""P27 fused (conv3d + hardswish + GroupNorm + spatial mean) and its tail-only baseline, against float64.

The reference is the real module (kernelbook.problems.P27) in float64. GPU tests are marked ``gpu``; the
algebra the kernel relies on, the argument checks that need no GPU and the generated solution file run
everywhere (the last two need nvcc: ``compile``).
"""

from __future__ import annotations

import copy
import importlib.util
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import kernelbook as kb
from kernelbook import check, gn_mean
from kernelbook.harness.paths import ROOT

P27 = kb.problems.P27_CONV3D_GN_MEAN
SOLUTION = ROOT / "solutions" / "27_Conv3d_HardSwish_GroupNorm_Mean.py"
TOL = 1e-5  # our bound on the relative error against float64


@pytest.fixture(scope="module")
def ext():
    return kb.build.load("conv3d_gn_mean", arch=None if kb.gpu() else "90")


@pytest.fixture(autouse=True)
def _no_grad():
    """The forward's tests run with grad mode off, as the chapter does (test_grad_mode_returns_a_tracked_output
    turns it back on; tests/test_backward.py runs the backward)."""
    with torch.no_grad():
        yield


def _model(c_in=3, c_out=16, groups=4, bias=True, affine=True, seed=0, device="cuda"):
    """A P27 module with non-trivial GroupNorm parameters (γ of both signs, β ≠ 0)."""
    torch.manual_seed(seed)
    m = kb.problems.P27(c_in, c_out, 4, num_groups=groups, bias=bias)
    if not affine:
        m.group_norm = nn.GroupNorm(groups, c_out, affine=False)
    else:
        with torch.no_grad():
            m.group_norm.weight.uniform_(-2, 2)
            m.group_norm.bias.uniform_(-1, 1)
    return m.to(device)


def _reference(m: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, float]:
    """(float64 output of the module, tolerance): TOL, or wider where |μ|/σ of a group makes fp32 statistics
    inherently lose digits (inputs shifted by 1e3): k roundings of u·(1 + |μ|/σ), k = 64 for the 4-level sum.
    Groups of equal values (σ = 0, e.g. one value per group) do not widen it: their output is exactly β."""
    m64 = copy.deepcopy(m).double()
    with torch.no_grad():
        h = F.hardswish(m64.conv(x.double()))
        ref = _group_norm64(h, m64.group_norm).mean(dim=[2, 3, 4])
        hg = h.reshape(h.shape[0], m64.group_norm.num_groups, -1)
        spread = hg.std(dim=-1, unbiased=False) > 0  # a group of equal values normalises to exactly 0 (output β)
        tol = max(TOL, check.normalisation_tol(hg[spread], dims=(1,), k=64.0)) if spread.any() else TOL
    return ref, tol


def _group_norm64(h: torch.Tensor, gn: nn.GroupNorm) -> torch.Tensor:
    """GroupNorm of h in h's dtype, written out: F.group_norm refuses groups of one value ("Expected more than
    1 value per channel when training"), which a 1x1x1 conv output with one channel per group has (the output
    is then β: the deviation from the mean is 0). Checked against F.group_norm wherever PyTorch accepts it."""
    n, g = h.shape[0], gn.num_groups
    hg = h.reshape(n, g, -1)
    mu = hg.mean(dim=-1, keepdim=True)
    var = ((hg - mu) ** 2).mean(dim=-1, keepdim=True)                  # biased, as GroupNorm
    y = ((hg - mu) / torch.sqrt(var + gn.eps)).reshape(h.shape)
    if gn.affine:
        shape = (1, -1) + (1,) * (h.dim() - 2)
        y = y * gn.weight.reshape(shape) + gn.bias.reshape(shape)
    if hg.shape[-1] > 1:
        torch.testing.assert_close(y, gn(h), rtol=1e-12, atol=1e-12)
    return y


def _run(ext, m, x, out=None, math="fp32", smem_limit=0):
    gn = m.group_norm
    return ext.p27_forward(x, m.conv.weight, m.conv.bias, gn.weight, gn.bias, gn.num_groups, gn.eps, out,
                           smem_limit=smem_limit, math=math)


# ---------------------------------------------------------------------------------------------- algebra (CPU)


def test_mean_of_groupnorm_needs_only_channel_statistics():
    """mean_DHW(GN(h))[b, c] = γ_c (m_c − μ_g)/√(var_g + ε) + β_c, with group statistics merged exactly from
    per-channel (mean, M2): within-channel plus between-channel sums of squares."""
    m = _model(device="cpu").double()
    x = torch.rand(2, 3, 9, 10, 11, dtype=torch.float64)
    with torch.no_grad():
        h = F.hardswish(m.conv(x))
        ref = m(x)
    n, c = h.shape[2] * h.shape[3] * h.shape[4], h.shape[1]
    mc = h.mean(dim=(2, 3, 4))                                     # (N, C)
    m2c = ((h - mc[..., None, None, None]) ** 2).sum(dim=(2, 3, 4))
    g = 4
    mu = mc.view(2, g, c // g).mean(-1)                            # equal counts: the mean of the means
    m2g = (m2c.view(2, g, -1) + n * (mc.view(2, g, -1) - mu[..., None]) ** 2).sum(-1)
    var = m2g / (n * c // g)
    gw, gb = m.group_norm.weight.detach(), m.group_norm.bias.detach()
    ours = gw * (mc - mu.repeat_interleave(c // g, 1)) / torch.sqrt(var.repeat_interleave(c // g, 1) + 1e-5) + gb
    torch.testing.assert_close(ours, ref, rtol=1e-12, atol=1e-12)


def test_hardswish_at_its_boundaries():
    """x·clamp(x + 3, 0, 6)/6 is 0 at −3 and x at 3, as F.hardswish; the kernel's 6h = x·clamp(x+3, 0, 6)."""
    x = torch.tensor([-4.0, -3.0, -2.9999, -1.0, 0.0, 2.9999, 3.0, 4.0], dtype=torch.float64)
    six_h = x * torch.clamp(x + 3, 0, 6)
    torch.testing.assert_close(six_h / 6, F.hardswish(x), rtol=1e-15, atol=0)
    assert six_h[1] == 0 and six_h[6] / 6 == 3.0


# ---------------------------------------------------------------------------------------------- fused (GPU)


@pytest.mark.gpu
def test_benchmark_shape(ext):
    m = _model(seed=1)
    x = P27.inputs(seed=0, batch=128, device="cuda")  # 1/8 of the benchmark batch; dev/p27.py runs all
    ref, _ = _reference(m, x)
    out = check.poisoned(ref.shape, device="cuda")
    assert _run(ext, m, x, out).data_ptr() == out.data_ptr()
    check.assert_close(out, ref, TOL, what="P27 (128, 3, 16, 32, 32)")


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [
    (1, 3, 16, 32, 32, 16, 4),     # N = 1
    (2, 3, 9, 17, 23, 16, 4),      # odd D, H, W: WO = 20, partial column blocks
    (3, 3, 9, 17, 23, 8, 2),       # one channel tile of 8
    (2, 3, 9, 17, 23, 24, 3),      # 24 channels padded to 32
    (2, 5, 7, 11, 13, 32, 8),      # 5 input channels, 4 channel tiles
    (1, 1, 4, 4, 4, 16, 16),       # a single output position, one channel per group (var = 0)
    (2, 3, 20, 40, 36, 16, 4),     # the input does not fit: slabs of output depths with a halo
    (2, 2, 6, 9, 130, 64, 16),     # long rows, 64 channels
    (2, 3, 5, 8, 8, 128, 32),      # the largest channel count
    (1, 3, 16, 32, 33, 16, 1),     # W not a multiple of 4 (scalar staging), one group
])
def test_matches_float64(ext, shape):
    n, c_in, d, h, w, c_out, g = shape
    m = _model(c_in, c_out, g, seed=sum(shape))
    x = check.rand((n, c_in, d, h, w), seed=sum(shape), device="cuda")
    ref, tol = _reference(m, x)
    check.assert_close(_run(ext, m, x, check.poisoned(ref.shape, device="cuda")), ref, tol, what=f"{shape}")


@pytest.mark.gpu
@pytest.mark.parametrize("limit, aligned", [
    (166912, True),    # an A100's opt-in shared memory: P27 in 2 slabs of 7 and 6 output depths
    (101376, True),    # sm_86/89: 4 slabs (4, 4, 4, 1)
    (65536, False),    # a T4: 13 slabs of one output depth, scalar staging (misaligned x)
])
def test_depth_slabs_as_on_smaller_gpus(ext, limit, aligned):
    """P27's exact shape planned for a GPU with less shared memory (smem_limit): the slab path with its halo."""
    m = _model(seed=8)
    x = P27.inputs(seed=8, batch=3, device="cuda")
    if not aligned:  # 4-byte aligned only: the scalar staging path
        buf = torch.empty(x.numel() + 1, device="cuda")
        buf[1:] = x.reshape(-1)
        x = buf[1:].view(x.shape)
    assert (x.data_ptr() % 16 == 0) == aligned
    ref, tol = _reference(m, x)
    out = check.poisoned(ref.shape, device="cuda")
    gn = m.group_norm
    ext.p27_forward(x, m.conv.weight, m.conv.bias, gn.weight, gn.bias, gn.num_groups, gn.eps, out, smem_limit=limit)
    check.assert_close(out, ref, tol, what=f"P27 with {limit} B of shared memory per block")


@pytest.mark.gpu
@pytest.mark.parametrize("shift", [1e1, 1e3, -1e3])
def test_shifted_inputs(ext, shift):
    """|mean| ≫ std: E[x²] − E[x]² would cancel; the pivot-shifted sums must not."""
    m = _model(seed=3)
    x = P27.inputs(seed=5, batch=8, device="cuda") + shift
    ref, tol = _reference(m, x)
    check.assert_close(_run(ext, m, x), ref, tol, what=f"inputs + {shift:g} (tolerance {tol:.1e})")


@pytest.mark.gpu
@pytest.mark.parametrize("bias, affine", [(False, True), (True, False)])
def test_without_bias_or_affine(ext, bias, affine):
    m = _model(bias=bias, affine=affine, seed=4)
    x = P27.inputs(seed=6, batch=3, device="cuda")
    ref, tol = _reference(m, x)
    check.assert_close(_run(ext, m, x), ref, tol, what=f"bias={bias} affine={affine}")


@pytest.mark.gpu
def test_misaligned_input_empty_batch_and_side_stream(ext):
    m = _model(seed=7)
    base = check.rand((2 * 3 * 16 * 32 * 32 + 1,), seed=7, device="cuda")
    x = base[1:].view(2, 3, 16, 32, 32)  # 4-byte aligned only: the scalar staging path
    ref, tol = _reference(m, x)
    check.assert_close(_run(ext, m, x), ref, tol, what="misaligned x")
    assert _run(ext, m, x[:0]).shape == (0, 16)
    side, out = torch.cuda.Stream(), torch.empty(ref.shape, device="cuda")
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        _run(ext, m, x, out)
    torch.cuda.synchronize()
    check.assert_close(out, ref, tol, what="on a side stream")


# ---------------------------------------------------------------------------------------------- tensor cores (GPU)


@pytest.mark.gpu
@pytest.mark.parametrize("shape, limit, offset", [
    ((16, 3, 16, 32, 32, 16, 4), 0, 0),        # P27's sample shape
    ((2, 3, 9, 17, 23, 16, 4), 0, 0),          # odd D, H, W: WO = 20 (one partial column group), HO odd
    ((3, 3, 9, 17, 23, 8, 2), 0, 0),           # 8 channels: the tile's other 8 rows are padding
    ((2, 2, 6, 9, 70, 12, 3), 0, 1),           # three column groups, 12 channels, misaligned x (scalar staging)
    ((1, 1, 4, 4, 5, 1, 1), 0, 0),             # one input and one output channel, two output positions
    ((1, 3, 16, 32, 33, 16, 1), 0, 0),         # W not a multiple of 4
    ((2, 3, 20, 40, 36, 16, 4), 0, 0),         # the input does not fit: slabs of output depths with a halo
    ((3, 3, 16, 32, 32, 16, 4), 166912, 0),    # P27 planned as on an A100 (2 slabs)
    ((3, 3, 16, 32, 32, 16, 4), 101376, 0),    # ... and as on an RTX 30/40 (4 slabs)
    ((2, 6, 7, 12, 12, 16, 4), 0, 0),          # 6 input channels: 48 k-steps
])
def test_tensor_cores_match_float64(ext, shape, limit, offset):
    n, c_in, d, h, w, c_out, g = shape
    m = _model(c_in, c_out, g, seed=sum(shape))
    x = check.rand((n * c_in * d * h * w + offset,), seed=sum(shape), device="cuda")[offset:].view(n, c_in, d, h, w)
    ref, tol = _reference(m, x)
    out = check.poisoned(ref.shape, device="cuda")
    assert _run(ext, m, x, out, "3xtf32", limit).data_ptr() == out.data_ptr()
    check.assert_close(out, ref, tol, what=f"3xtf32 {shape} limit {limit}")


@pytest.mark.gpu
@pytest.mark.parametrize("shift", [0.0, 1e3, -1e3])
def test_tensor_cores_err_like_eager_float32(ext, shift):
    """On P27's data, plain and shifted by ±1000, the 3xTF32 path errs within 1.5× eager PyTorch's float32
    error (measured on an H200: 0.5–1.1×) and at most 5× FFMA's (3.4× on P27 itself)."""
    m = _model(seed=3)
    x = P27.inputs(seed=5, batch=16, device="cuda") + shift
    ref, tol = _reference(m, x)
    with kb.precision.tf32(False):
        err = {k: check.report(f(), ref, tol)["rel_err"] for k, f in {
            "eager": lambda: m(x), "fp32": lambda: _run(ext, m, x), "3xtf32": lambda: _run(ext, m, x, math="3xtf32")
        }.items()}
    assert err["3xtf32"] <= tol and err["3xtf32"] <= 1.5 * err["eager"] and err["3xtf32"] <= 5 * err["fp32"], err


@pytest.mark.gpu
def test_tensor_cores_ignore_the_low_bits_of_tf32_operands():
    """split_fast (tf32.cuh) leaves the 13 bits below a TF32 operand's mantissa in place, trusting mma.sync to
    read only the top 19: a build that clears them must give bit-identical results (both tensor-core kernels
    share split_fast; this one is checked on P27's data and on inputs shifted by 1000)."""
    if torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("TF32 tensor cores need sm_80")
    cleared = kb.build.load("conv3d_gn_mean", defines={"KB_TF32_CLEAR_LOW_BITS": 1})
    ext = kb.build.load("conv3d_gn_mean")
    m = _model(seed=9)
    for shift in (0.0, 1e3):
        x = P27.inputs(seed=9, batch=8, device="cuda") + shift
        assert torch.equal(_run(ext, m, x, math="3xtf32"), _run(cleared, m, x, math="3xtf32")), shift


# ---------------------------------------------------------------------------------------------- tail (GPU)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(16, 3, 16, 32, 32, 16, 4), (3, 3, 9, 17, 23, 24, 3), (2, 2, 4, 4, 5, 8, 8)])
def test_tail_matches_float64(ext, shape):
    n, c_in, d, h, w, c_out, g = shape
    m = _model(c_in, c_out, g, seed=sum(shape))
    x = check.rand((n, c_in, d, h, w), seed=sum(shape), device="cuda")
    ref, tol = _reference(m, x)
    with torch.no_grad():
        y = F.conv3d(x.double(), m.conv.weight.double(), m.conv.bias.double()).float()  # rounded exact conv
    gn = m.group_norm
    out = check.poisoned(ref.shape, device="cuda")
    ext.p27_tail(y, gn.weight, gn.bias, g, gn.eps, out)
    check.assert_close(out, ref, tol, what=f"tail {shape}")


# ---------------------------------------------------------------------------------------------- bad input


@pytest.mark.gpu
@pytest.mark.parametrize("call, message", [
    (lambda e, x, w, b, m: e.p27_forward(x.cpu(), w, b, None, None, 4, 1e-5), "x must be a CUDA tensor"),
    (lambda e, x, w, b, m: e.p27_forward(x.double(), w, b, None, None, 4, 1e-5), "x must be float32, got float64"),
    (lambda e, x, w, b, m: e.p27_forward(x.transpose(3, 4), w, b, None, None, 4, 1e-5), "x must be contiguous"),
    (lambda e, x, w, b, m: e.p27_forward(x[0], w, b, None, None, 4, 1e-5), "x must be 5-D"),
    (lambda e, x, w, b, m: e.p27_forward(x, w[:, :, :3, :3, :3].contiguous(), b, None, None, 4, 1e-5),
     "specialised for 4x4x4 filters"),
    (lambda e, x, w, b, m: e.p27_forward(x, w[:, :2].contiguous(), b, None, None, 4, 1e-5),
     "conv_weight has 2 input channels but x has 3"),
    (lambda e, x, w, b, m: e.p27_forward(x, w, b[:3], None, None, 4, 1e-5), r"conv_bias must have shape \[16\]"),
    (lambda e, x, w, b, m: e.p27_forward(x, w, b, None, None, 5, 1e-5), "multiple of num_groups = 5"),
    (lambda e, x, w, b, m: e.p27_forward(x, w, b, None, None, 0, 1e-5), "num_groups must be at least 1"),
    (lambda e, x, w, b, m: e.p27_forward(x, torch.ones(136, 3, 4, 4, 4, device="cuda"), None, None, None, 4, 1e-5),
     "out_channels must be between 1 and 128"),
    (lambda e, x, w, b, m: e.p27_forward(x[..., :3].contiguous(), w, b, None, None, 4, 1e-5),
     "smaller than the 4x4x4 filter"),
    (lambda e, x, w, b, m: e.p27_forward(torch.ones(1, 3, 5, 400, 400, device="cuda"), w, b, None, None, 4, 1e-5),
     "bytes of shared memory, more than the"),
    (lambda e, x, w, b, m: e.p27_forward(x, w, b, None, None, 4, 1e-5, torch.empty(2, 8, device="cuda")),
     r"out must have shape \[2, 16\]"),
    (lambda e, x, w, b, m: e.p27_forward(x, w, b, None, None, 4, 1e-5, smem_limit=-1), "smem_limit must be 0"),
    (lambda e, x, w, b, m: e.p27_forward(x, w, b, None, None, 4, 1e-5, smem_limit=4096),
     r"bytes of shared memory, more than the 4096 this GPU allows per block \(or smem_limit\)"),
    (lambda e, x, w, b, m: e.p27_tail(torch.ones(2, 600, 5, device="cuda"), None, None, 4, 1e-5),
     "channel count must be between 1 and 512"),
    (lambda e, x, w, b, m: e.p27_forward(x, w, b, None, None, 4, 1e-5, math="tf32"),
     "math must be 'fp32' or '3xtf32', got 'tf32'"),
    (lambda e, x, w, b, m: e.p27_forward(x[:0], w, b, None, None, 4, 1e-5, math="auto"),
     "math must be 'fp32' or '3xtf32', got 'auto'"),
    (lambda e, x, w, b, m: e.p27_forward(x, torch.ones(24, 3, 4, 4, 4, device="cuda"), None, None, None, 4, 1e-5,
                                         math="3xtf32"), "supports at most 16 output channels"),
    (lambda e, x, w, b, m: e.p27_forward(torch.ones(1, 3, 16, 32, 32, device="cuda"), w, b, None, None, 4, 1e-5,
                                         smem_limit=65536, math="3xtf32"),
     r"math='3xtf32' needs \d+ bytes of shared memory for one output depth of this input, more than the 65536"),
])
def test_bad_input_is_named(ext, call, message):
    m = _model(seed=0)
    x = torch.rand(2, 3, 6, 7, 8, device="cuda")
    with pytest.raises(RuntimeError, match=message):
        call(ext, x, m.conv.weight, m.conv.bias, m)


@pytest.mark.compile
def test_bad_input_without_a_gpu(ext):
    w, b = torch.ones(16, 3, 4, 4, 4), torch.ones(16)
    with pytest.raises(RuntimeError, match="x must be 5-D"):
        ext.p27_forward(torch.ones(3, 6, 6, 6), w, b, None, None, 4, 1e-5)
    with pytest.raises(RuntimeError, match="x must be float32, got float64"):
        ext.p27_forward(torch.ones(1, 3, 6, 6, 6, dtype=torch.float64), w, b, None, None, 4, 1e-5)
    with pytest.raises(RuntimeError, match="x must be a CUDA tensor"):
        ext.p27_forward(torch.ones(1, 3, 6, 6, 6), w, b, None, None, 4, 1e-5)
    with pytest.raises(RuntimeError, match="y must be a CUDA tensor"):
        ext.p27_tail(torch.ones(1, 16, 6, 6, 6), None, None, 4, 1e-5)


@pytest.mark.gpu
def test_grad_mode_returns_a_tracked_output(ext):
    """With grad mode on and parameters that require grad, the fused op joins the graph (tests/test_backward.py
    checks its gradients); under no_grad it is called directly."""
    m, x = _model(), torch.rand(2, 3, 6, 7, 8, device="cuda")
    with torch.enable_grad():
        y = _run(ext, m, x)
    assert y.grad_fn is not None
    assert _run(ext, m, x).grad_fn is None


@pytest.mark.compile
def test_config_and_plans_agree_with_the_kernel(ext):
    """config() holds the kernel's constants; plan() the launcher's shared-memory plan (no GPU needed)."""
    cfg = ext.config()
    assert (cfg["kernel_size"], cfg["channels_per_thread"], cfg["columns_per_thread"]) == (4, 8, 8)
    assert cfg["window_columns"] == 4 * -(-(cfg["columns_per_thread"] + 3) // 4)  # COLS + K − 1, as float4
    c_in, d, h, w = P27.input_shape[1:]
    plans = {g: ext.plan(c_in, d, h, w, 16, b) for g, b in gn_mean.SMEM_LIMITS.items()}
    for (g, b), p in zip(gn_mean.SMEM_LIMITS.items(), plans.values(), strict=True):
        assert 0 < p["smem_bytes"] <= b and p["slabs"] * p["depths_per_slab"] >= d - 3, (g, p)
        assert p["row_pitch"] % 4 == 0 and p["row_pitch"] >= w
    assert plans["H100/H200 (sm_90)"]["slabs"] == 1 and plans["T4 (sm_75)"]["depths_per_slab"] == 1
    assert plans["A100 (sm_80)"]["row_pitch"] == 36  # the conflict-free pitch, where it fits
    assert ext.plan(3, 5, 400, 400, 16, 232448)["depths_per_slab"] == 0  # refused by p27_forward
    # The tensor-core path: the filter as TF32 (hi, lo) fragment planes (8 KB per input channel), pitch W.
    tc = {g: ext.plan(c_in, d, h, w, 16, b, math="3xtf32") for g, b in gn_mean.SMEM_LIMITS.items()}
    assert tc["H100/H200 (sm_90)"]["slabs"] == 1 and tc["H100/H200 (sm_90)"]["smem_bytes"] <= 232448
    assert tc["A100 (sm_80)"]["row_pitch"] == 32 and tc["T4 (sm_75)"]["depths_per_slab"] == 0
    with pytest.raises(RuntimeError, match="math must be 'fp32' or '3xtf32'"):
        ext.plan(c_in, d, h, w, 16, 232448, math="auto")


def test_design_and_ladder_of_the_chapter():
    cfg = {"channels_per_thread": 8, "columns_per_thread": 8, "threads": 512}
    dz = gn_mean.design(cfg, 16, (13, 29, 29))
    assert (dz["groups"], dz["warps_per_group"], dz["items"], dz["rounds"]) == (2, 8, 1508, 6)
    assert dz["useful"] == pytest.approx(29 / 32 * 1508 / 1536)
    rec = {"timings_ms": {v: {"median": 1.0} for v in ("eager", "compile", "compile_max", "tail_fused",
                                                       "ours", "ours_kd2", "ours_kd4", "ours_tc")}}
    rows = gn_mean.ladder(rec, floor_ms=0.5)
    assert rows and all(r["version"] and r["what changed"] for r in rows)
    assert [r["% of FFMA peak"] for r in rows if r["variant"]] == [50.0] * 8


def test_pivot_shifted_sums_keep_their_digits():
    rng = np.random.default_rng(0)
    h = (1000 + rng.standard_normal((4, 10_000))).astype(np.float32)
    v64 = h.astype(np.float64).var(axis=1)
    err = {k: np.abs(v / v64 - 1).max() for k, v in gn_mean.shifted_variances(h).items()}
    assert err["E[h²] − E[h]²"] > 1e-2 and err["pivot-shifted sums (kernel)"] < 1e-5


# ---------------------------------------------------------------------------------------------- solution file


def test_solution_is_generated_from_the_kernels():
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "make_solutions.py"), "--check"],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def _solution_module():
    spec = importlib.util.spec_from_file_location("p27_solution", SOLUTION)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_solution_has_the_reference_interface(monkeypatch):
    """Same constructor arguments, submodules and seeded initialisation as the reference (compiling skipped)."""
    import inspect

    mod = _solution_module()
    monkeypatch.setattr(mod, "_ext", lambda: None)
    params = inspect.signature(mod.ModelNew.__init__).parameters
    assert list(params)[1:] == ["in_channels", "out_channels", "kernel_size", "num_groups", "bias"]
    assert params["num_groups"].default == 4 and params["bias"].default is True
    for args in (P27.init_args, (2, 24, 4, 3, False)):
        torch.manual_seed(0)
        ref = kb.problems.P27(*args)
        torch.manual_seed(0)
        ours = mod.ModelNew(*args)
        a, b = ref.state_dict(), ours.state_dict()
        assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.gpu
def test_solution_passes_kernelbench_check_and_float64():
    """KernelBench's check: both modules seeded alike, 5 seeded trials of torch.rand, allclose(1e-2, 1e-2)."""
    mod = _solution_module()
    torch.manual_seed(42)
    ref = kb.problems.P27(*P27.init_args).cuda()
    torch.manual_seed(42)
    ours = mod.ModelNew(*P27.init_args).cuda()
    for trial in range(5):
        torch.manual_seed(trial)
        x = torch.rand(16, *P27.input_shape[1:], device="cuda")
        with torch.no_grad():
            a, b = ref(x), ours(x)
        assert a.shape == b.shape and torch.allclose(a, b, atol=1e-2, rtol=1e-2), f"trial {trial}"
    r64, tol = _reference(ours, x)
    with torch.no_grad():
        check.assert_close(ours(x), r64, tol, what="solution vs float64")


@pytest.mark.compile
def test_the_numpy_emulation_plans_slabs_as_the_kernel_does():
    """dev/emulate_p27.py re-derives the kernel's shared-memory plan: it must agree with the module's plan()."""
    spec = importlib.util.spec_from_file_location("emulate_p27", ROOT / "dev" / "emulate_p27.py")
    emu = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(emu)
    mod = kb.build.load("conv3d_gn_mean", arch="90")
    for shape in [(3, 16, 32, 32, 16), (3, 9, 17, 23, 16), (1, 5, 5, 5, 8), (4, 16, 64, 64, 24)]:
        for limit in (232_448, 166_912, 101_376, 65_536):
            want = mod.plan(*shape, limit)["depths_per_slab"]
            assert emu.slab(*shape, limit) == want, (shape, limit)


# ------------------------------------------------------------------------------ the chapter's tables, on the CPU


def test_eager_passes_list_every_kernel_eager_ran():
    """The traffic table is the profile's kernels as passes over memory: the bias add is one of them."""
    import pandas as pd

    rec = kb.records.load("08_capstone_conv3d_groupnorm_mean", "h200")
    prof = pd.DataFrame(rec["kernels"])
    t = gn_mean.eager_passes(prof, kb.roofline.p27_fused())
    ran = prof[prof.variant == "eager"]
    assert t["µs"].iloc[:-2].sum() == pytest.approx(ran.total_us.sum())
    assert "bias add" in t.index and not t.index.str.contains("not modelled").any()
    y = 4 * 1024 * 16 * 13 * 29 * 29  # bytes of the conv output
    assert t.loc["conv3d (cuDNN), no bias", "bytes written"] == y
    assert t.loc["bias add", "bytes read"] >= y and t.loc["bias add", "bytes written"] == y
    total = t.loc["eager, all kernels"]
    assert total["bytes read"] + total["bytes written"] > 9 * y  # conv write, 4 read+write passes, 2 reads
    odd = pd.DataFrame([{"variant": "eager", "kernel": "void some_new_kernel<float>(int)", "total_us": 3.0}])
    assert "some_new_kernel<float> (not modelled)" in gn_mean.eager_passes(odd, kb.roofline.p27_fused()).index


def test_the_ladder_tells_each_step_with_the_records_numbers():
    rec = {"timings_ms": {v: {"median": m} for v, m in (("eager", 12.0), ("compile", 10.0), ("compile_max", 10.0),
                                                          ("tail_fused", 10.8), ("ours", 2.0), ("ours_kd2", 2.4),
                                                          ("ours_kd4", 3.0), ("ours_tc", 1.5))}}
    rows = {r["version"]: r for r in gn_mean.ladder(rec, floor_ms=1.0)}
    assert all("{" not in r["what changed"] for r in rows.values())
    assert "1.20× eager" in rows["torch.compile"]["what changed"]
    assert "1.20× v3's time" in rows["v3, filter depths unrolled 2×"]["what changed"]
    assert not any("cudnn.benchmark" in v for v in rows)  # an optional peer the record lacks is left out
    rec["timings_ms"]["cudnn_bench"] = {"median": 11.0}
    assert any("cudnn.benchmark" in r["version"] for r in gn_mean.ladder(rec, floor_ms=1.0))


def test_the_ladder_table_and_figure_give_each_version_its_own_floor():
    """The table keeps our versions (library paths are in the variants table); the tail-only design is set
    against cuDNN's convolution kernel alone, shown as a mark across its bar."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rec = kb.records.load("08_capstone_conv3d_groupnorm_mean", "h200")
    steps = gn_mean.ladder(rec, 1.0, floors={"tail_fused": 9.8, "ours_tc": 0.66})
    tab = gn_mean.ladder_table(steps)
    assert "tail fused" in tab.index and "torch.compile" not in tab.index
    assert tab.loc["tail fused", "% of its floor"] == pytest.approx(
        100 * 9.8 / rec["timings_ms"]["tail_fused"]["median"])
    assert not any("KB_" in t for t in tab["what changed"])  # no build switches in the prose
    fig = gn_mean.plot_ladder(steps, 1.0, rec, floors={"3xTF32 floor": 0.66},
                              marks={"tail_fused": "tail-only floor"})
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert any(t.startswith("tail-only floor: 9.80 ms") for t in labels)
    plt.close(fig)


def test_cudnn_benchmark_is_said_to_change_nothing_when_it_picks_eagers_kernel():
    rec = kb.records.load("08_capstone_conv3d_groupnorm_mean", "h200")
    said = gn_mean.peer_said(rec)["bench_said"]
    assert "the same convolution kernel as eager" in said and "does not change" in said


def test_peers_missing_from_a_record_say_so():
    rec = kb.records.load("08_capstone_conv3d_groupnorm_mean", "h200")
    said = gn_mean.peer_said(rec)
    t = dict(rec["timings_ms"])
    if "cudnn_bench" not in t:
        assert "not in this record" in said["bench_said"]
    names = ["eager", "ours", "cudnn_bench", "cutlass_conv3d"]
    tab = gn_mean.variants_table(rec, names, 6.9e10, 1.0)
    assert list(tab.index) == names
    for n in names[2:]:
        assert (n in t) == (tab.loc[n, "math"] != "not in this record")
    t["cudnn_bench"] = t["cutlass_conv3d"] = {"median": 5.0, "q20": 5.0, "q80": 5.0}
    errs = dict(rec["variant_errors"], cutlass_conv3d={"rel_err": 1e-7}, conv_only={"rel_err": 1e-7})
    said = gn_mean.peer_said(dict(rec, timings_ms=t, variant_errors=errs))
    assert "not in this record" not in said["bench_said"] + said["cutlass_said"]
    assert "5.00 ms at an error of 1.0e-07" in said["cutlass_said"]


def test_cutlass_operands_pad_the_channels_to_four():
    m = gn_mean.model(seed=0, device="cpu")
    x = torch.rand(2, 3, 6, 7, 8)
    xp, wp, b = gn_mean.cutlass_operands(m, x)
    assert xp.shape == (2, 4, 6, 7, 8) and wp.shape == (16, 4, 4, 4, 4) and b.shape == (16,)
    assert xp.is_contiguous(memory_format=torch.channels_last_3d) and (xp[:, 3] == 0).all()
    ref = F.conv3d(x.double(), m.conv.weight.double(), m.conv.bias.double())
    torch.testing.assert_close(F.conv3d(xp.double(), wp.double(), b.double()), ref)  # the zero channel adds 0


def test_figure_of_the_block_is_drawn_at_the_column_width_with_legible_text():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kb.plots.style()
    rec = kb.records.load("08_capstone_conv3d_groupnorm_mean", "h200")
    dz = gn_mean.design(rec["config"], 16, (13, 29, 29))
    fig = gn_mean.draw_block(dz, rec["plans"]["H100/H200 (sm_90)"], (13, 29, 29), 3, 32, 4, 232448)
    assert fig.get_size_inches()[0] <= 6.3 + 1e-9  # shown unscaled in the text column
    sizes = [t.get_fontsize() for t in fig.findobj(matplotlib.text.Text) if t.get_text()]
    assert sizes and min(sizes) >= 9
    plt.close(fig)
