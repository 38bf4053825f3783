"""Chapter 2's direct convolution (simple and tiled) against float64, and the folding it runs.

GPU tests are marked ``gpu``; folding and the argument checks that need no GPU run everywhere.
"""

from __future__ import annotations

import copy
import types

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import kernelbook as kb
from kernelbook import check
from kernelbook.models import autograd_ops

FUNCTIONS = ["conv2d_simple", "conv2d_folded"]


@pytest.fixture(scope="module")
def conv():
    return kb.build.load("conv2d_folded", arch=None if kb.gpu() else "90")


def _case(n, c_in, h, w, c_out, k=3, seed=0):
    return kb.folding.conv_case((n, c_in, h, w, c_out), seed=seed, device="cuda", k=k)


@pytest.mark.gpu
@pytest.mark.parametrize("fn", FUNCTIONS)
@pytest.mark.parametrize("shape", [
    (128, 8, 128, 128, 64),   # P73
    (1, 3, 5, 97, 16), (1, 3, 5, 97, 64), (2, 8, 3, 3, 64), (3, 19, 9, 130, 5),  # odd; C_in over one chunk
    (2, 8, 17, 300, 100), (1, 1, 40, 131, 1), (4, 2, 33, 66, 80),                # several column/channel tiles
    (512, 8, 3, 10, 72),  # 1024 tiles in 2 channel blocks: persistent blocks move to the next block's weights
])
def test_matches_float64(conv, fn, shape):
    n, c_in, h, w, c_out = shape
    x, wt, b, ref, tol = _case(n, c_in, h, w, c_out, seed=sum(shape))
    out = check.poisoned(ref.shape, device="cuda")
    y = getattr(conv, fn)(x, wt, b, out)
    assert y.data_ptr() == out.data_ptr()
    check.assert_close(out, ref, tol, what=f"{fn} {shape}")


@pytest.mark.gpu
@pytest.mark.parametrize("fn", FUNCTIONS)
def test_misaligned_output_view(conv, fn):
    x, wt, b, ref, tol = _case(2, 3, 10, 36, 20, seed=7)  # WO = 34: even rows, so alignment is the view's
    buf = check.poisoned((ref.numel() + 1,), device="cuda")
    out = buf[1:].view(ref.shape)
    getattr(conv, fn)(x, wt, b, out)
    check.assert_close(out, ref, tol, what=f"{fn} into a misaligned view")
    assert torch.isnan(buf[0])


@pytest.mark.gpu
@pytest.mark.parametrize("k", [1, 2, 5])
def test_simple_takes_other_kernel_sizes_and_tiled_names_its_limit(conv, k):
    x, wt, b, ref, tol = _case(2, 4, 11, 13, 6, k=k, seed=k)
    check.assert_close(conv.conv2d_simple(x, wt, b, None), ref, tol, what=f"simple {k}x{k}")
    with pytest.raises(RuntimeError, match=f"specialised for 3x3 filters, got {k}x{k}"):
        conv.conv2d_folded(x, wt, b, None)


@pytest.mark.gpu
@pytest.mark.parametrize("fn", FUNCTIONS)
def test_empty_batch_and_current_stream(conv, fn):
    x, wt, b, ref, tol = _case(3, 8, 12, 20, 64, seed=11)
    assert getattr(conv, fn)(x[:0].contiguous(), wt, b, None).shape == (0, 64, 10, 18)
    side, out = torch.cuda.Stream(), torch.empty(ref.shape, device="cuda")
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        getattr(conv, fn)(x, wt, b, out)
    torch.cuda.synchronize()
    check.assert_close(out, ref, tol, what=f"{fn} on a side stream")


@pytest.mark.gpu
def test_folded_module_runs_the_kernel_and_is_never_stale(conv):
    torch.manual_seed(0)
    c, bn = nn.Conv2d(8, 64, 3).cuda(), nn.BatchNorm2d(64).cuda()
    with torch.no_grad():
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
        bn.weight.uniform_(-2, 2)
    folded = kb.folding.FoldedConvBNScale(c, bn, 2.0, conv_fn=conv.conv2d_folded).eval()
    x = check.rand((2, 8, 20, 20), seed=3, device="cuda")
    for _ in range(2):
        with torch.no_grad():
            ref = copy.deepcopy(bn).double()(copy.deepcopy(c).double()(x.double())) * 2.0
            check.assert_close(folded(x), ref, 1e-5, what="folded module")
            bn.running_mean.add_(0.5)  # a changed statistic must show in the next call
    with pytest.raises(RuntimeError, match="only in eval mode"):
        folded.train()(x)


@pytest.mark.gpu
@pytest.mark.parametrize("fn", FUNCTIONS)
@pytest.mark.parametrize("call, message", [
    (lambda f, x, w, b: f(x.cpu(), w, b, None), "x must be a CUDA tensor"),
    (lambda f, x, w, b: f(x.double(), w, b, None), "x must be float32, got float64"),
    (lambda f, x, w, b: f(x.transpose(2, 3), w, b, None), "x must be contiguous"),
    (lambda f, x, w, b: f(x[0], w, b, None), "x must be 4-D"),
    (lambda f, x, w, b: f(x, w[:, :2].contiguous(), b, None), "weight has 2 input channels but x has 3"),
    (lambda f, x, w, b: f(x, w[..., :2].contiguous(), b, None), "only square kernels"),
    (lambda f, x, w, b: f(x, w, b[:3], None), r"bias must have shape \[5\]"),
    (lambda f, x, w, b: f(x, w, b.cpu(), None), "bias must be a CUDA tensor"),
    (lambda f, x, w, b: f(x[..., :2].contiguous(), w, b, None), "smaller than the 3x3 kernel"),
    (lambda f, x, w, b: f(x, w, b, torch.empty(2, 5, 4, 4, device="cuda")), r"out must have shape \[2, 5, 4, 5\]"),
    (lambda f, x, w, b: f(x, w, b, x), "out must have shape"),
])
def test_bad_input_is_named(conv, fn, call, message):
    x = torch.rand(2, 3, 6, 7, device="cuda")
    w, b = torch.rand(5, 3, 3, 3, device="cuda"), torch.rand(5, device="cuda")
    with pytest.raises(RuntimeError, match=message):
        call(getattr(conv, fn), x, w, b)


@pytest.mark.compile
@pytest.mark.parametrize("fn", FUNCTIONS)
def test_bad_input_without_a_gpu(conv, fn):
    w, b = torch.ones(5, 3, 3, 3), torch.ones(5)
    with pytest.raises(RuntimeError, match="x must be 4-D"):
        getattr(conv, fn)(torch.ones(3, 6, 6), w, b, None)
    with pytest.raises(RuntimeError, match="x must be float32, got float64"):
        getattr(conv, fn)(torch.ones(1, 3, 6, 6, dtype=torch.float64), w, b, None)
    with pytest.raises(RuntimeError, match="x must be a CUDA tensor"):
        getattr(conv, fn)(torch.ones(1, 3, 6, 6), w, b, None)


@pytest.mark.parametrize("bias", [True, False])
def test_fold_matches_unfolded_eval_in_float64(bias):
    torch.manual_seed(1)
    c, bn = nn.Conv2d(3, 6, 3, bias=bias).double(), nn.BatchNorm2d(6).double()
    with torch.no_grad():
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0, 1e-6)  # var ≈ 0: ε dominates
        bn.weight.copy_(torch.tensor([0.0, -1.5, 2.0, 1.0, -0.1, 3.0], dtype=torch.float64))  # γ = 0, negative γ
        bn.bias.uniform_(-1, 1)
    bn.eval()
    x = torch.rand(2, 3, 9, 9, dtype=torch.float64)
    for s in (2.0, -0.5):
        w, b = kb.folding.fold(c, bn, s)
        assert torch.allclose(F.conv2d(x, w, b), bn(c(x)) * s, rtol=1e-12, atol=1e-12)


def test_fold_refuses_what_it_cannot_fold():
    with pytest.raises(ValueError, match="batch statistics in every mode"):
        kb.folding.fold(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4, track_running_stats=False))
    with pytest.raises(ValueError, match="4 output channels but BatchNorm has 5"):
        kb.folding.fold(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(5))
    with pytest.raises(ValueError, match="stride 1, no padding"):
        kb.folding.FoldedConvBNScale(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), 2.0, conv_fn=F.conv2d)


@pytest.mark.compile
def test_config_reports_the_compiled_tile_shape(conv):
    cfg = conv.config()
    assert {"K", "CO_T", "ROWS", "GROUPS", "MIN_BLOCKS", "TILE_W", "THREADS"} <= set(cfg)
    assert cfg["K"] == 3 and cfg["CO_T"] % 4 == 0
    assert cfg["THREADS"] == 32 * cfg["ROWS"] * cfg["GROUPS"]


@pytest.mark.parametrize("case", kb.folding.EDGE_CASES)
def test_edge_cases_fold_within_the_bound(case):
    torch.manual_seed(2)
    model = nn.Module()
    model.conv, model.bn = nn.Conv2d(3, 6, 3), nn.BatchNorm2d(6)
    with torch.no_grad():
        model.bn.running_mean.uniform_(-0.3, 0.3)
        model.bn.running_var.uniform_(0.01, 0.2)
        model.bn.weight.uniform_(-2, 2)
    model.eval()
    m, s = kb.folding.perturbed(model, case, 2.0)
    x = torch.rand(2, 3, 9, 9)
    ref, tol = kb.folding.eval_reference(m, s, x)
    with torch.no_grad():
        check.assert_close(F.conv2d(x, *kb.folding.fold(m.conv, m.bn, s)), ref, tol, what=case)
        check.assert_close(m.bn(m.conv(x)) * s, ref, tol, what=case)


def test_pinned_sets_tf32_and_no_grad_per_call():
    seen = []
    fn = kb.folding.pinned(lambda: seen.append((kb.precision.state()["conv"],
                                                torch.is_grad_enabled())), False)
    with kb.precision.tf32(True):
        fn()
        assert kb.precision.state()["conv"]
    assert seen == [(False, False)]


def _cpu_binding(x, w, b, out=None):
    """The binding's contract on the CPU (refuses what the real one refuses first), for the plumbing."""
    if x.dtype != torch.float32 or not x.is_contiguous():
        raise RuntimeError("float32 contiguous input expected")
    y = F.conv2d(x, w, b)
    return y if out is None else out.copy_(y)


_cpu_stand_in = autograd_ops.wrap("conv2d_folded", types.SimpleNamespace(conv2d_folded=_cpu_binding))


def test_chapter_plumbing_runs_on_the_cpu(monkeypatch):
    """The notebook's GPU path (checks, bad inputs, variants) on CPU tensors with a stand-in module,
    so a typo there fails here rather than on the GPU."""
    mod = types.SimpleNamespace(conv2d_simple=_cpu_stand_in, conv2d_folded=_cpu_stand_in)
    p73 = kb.problems.P73_CONV_BN_SCALE
    small = types.SimpleNamespace(input_shape=(2, 8, 10, 12), init_args=p73.init_args,
                                  inputs=lambda seed, device: torch.rand(2, 8, 10, 12, device=device))
    model = kb.folding.demo_model(p73)
    monkeypatch.setattr(kb.folding, "CHECK_SHAPES", kb.folding.CHECK_SHAPES[:2])
    checks = kb.folding.gpu_checks(mod, model, 2.0, small, device="cpu")
    assert len(checks) == 2 * 3 + 1 and all(c["passed"] for c in checks.values())
    bad = kb.folding.bad_inputs(mod, device="cpu")
    assert bad["a backward through it"].startswith("conv2d_folded: this kernel has no backward")
    monkeypatch.setattr(kb.folding, "COMPILED", {})
    variants, (x, _, _, y) = kb.folding.eval_variants(mod, model, 2.0, small, {"flop": 1}, device="cpu")
    assert {"eager_eval", "cudnn_cl_fp32", "ours_fast", "ours_fold_at_call"} <= set(variants)
    assert variants["ours_fast"].role == "headline" and y.shape == (2, 64, 8, 10)
    with torch.no_grad():
        ref = copy.deepcopy(model).double()(x.double())
    for name, v in variants.items():
        check.assert_close(v.fn(), ref, 1e-5, what=name)
