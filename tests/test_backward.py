"""Backward passes on the GPU: the fused ops' gradients against float64, and both submissions called as
KernelBench's timing step calls them.

Each gradient is held to the book's rule for float32 accuracy — relative error against float64 at most 2× that
of eager PyTorch in float32 with TF32 off, on the same inputs (``kb.check.backward_reports``) — on the benchmark's
shapes, the odd shapes the forward tests use, inputs shifted by ±1000, momentum None and untracked statistics.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import kernelbook as kb

pytestmark = pytest.mark.gpu
P73, P27 = kb.problems.P73_CONV_BN_SCALE, kb.problems.P27_CONV3D_GN_MEAN
SCALE = 2.0
ODD = [  # (N, C_in, H, W, C_out): the forward tests' odd shapes (tests/test_conv_bn_scale.py)
    (1, 8, 33, 97, 64), (4, 3, 32, 32, 16), (2, 19, 9, 130, 5), (3, 1, 5, 3, 1), (5, 8, 7, 131, 64)]


@pytest.fixture(scope="module")
def cbs():
    return kb.build.load("conv_bn_scale")


@pytest.fixture(scope="module")
def p27ext():
    return kb.build.load("conv3d_gn_mean")


class Ref73(nn.Module):
    def __init__(self, c_in, c_out, momentum=0.1, track=True, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.conv = nn.Conv2d(c_in, c_out, 3)
        self.bn = nn.BatchNorm2d(c_out, momentum=momentum, track_running_stats=track)
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():  # γ of both signs and a β, so that they take part
            self.bn.weight.copy_(torch.rand(c_out, generator=g) * 3 - 1)
            self.bn.bias.copy_(torch.randn(c_out, generator=g))

    def forward(self, x):
        return self.bn(self.conv(x)) * SCALE


def _three(ext, ref: Ref73, **kw):
    """ours (float32), eager float32 and the float64 reference, all with ref's parameters and statistics."""
    return (kb.training.FusedP73(ext, ref, SCALE, **kw).cuda(), copy.deepcopy(ref).cuda(),
            copy.deepcopy(ref).cuda().double())


def _check73(ext, shape, momentum=0.1, track=True, offset=0.0, train=True, seed=0, **kw):
    n, c_in, h, w, c_out = shape
    ref = Ref73(c_in, c_out, momentum, track, seed)
    ours, eager, ref64 = _three(ext, ref, **kw)
    for m in (ours, eager, ref64):
        m.train(train)
    x = kb.check.rand((n, c_in, h, w), seed=seed + 1, device="cuda") + offset
    zero = {"conv.bias"} if train else ()  # the batch mean removes any bias: its gradient is exactly 0
    reports = kb.check.backward_reports(ours, eager, ref64, x, seed=seed, what="P73", zero=zero)
    if train and track:  # one forward per gradient evaluation: the statistics moved exactly as eager's did
        for name in ("running_mean", "running_var", "num_batches_tracked"):
            a, b = getattr(ours.bn, name), getattr(eager.bn, name)
            assert torch.allclose(a.double(), b.double(), rtol=1e-5, atol=1e-6), name
    return reports


def test_p73_training_backward_on_the_benchmark_shape(cbs):
    _check73(cbs, (*P73.input_shape, P73.init_args[1]))


@pytest.mark.parametrize("shape", ODD)
def test_p73_training_backward_on_odd_shapes(cbs, shape):
    _check73(cbs, shape)


@pytest.mark.parametrize("case", ["momentum None", "untracked", "+1000", "-1000", "in place", "ffma"])
def test_p73_training_backward_variants(cbs, case):
    kw = {"momentum None": {"momentum": None}, "untracked": {"track": False}, "+1000": {"offset": 1000.0},
          "-1000": {"offset": -1000.0}, "in place": {"strategy": "inplace"}, "ffma": {"math": "fp32"}}[case]
    _check73(cbs, (4, 8, 40, 70, 64), **kw)


@pytest.mark.parametrize("shape", [(16, 8, 128, 128, 64), (1, 8, 33, 97, 64), (2, 19, 9, 130, 5)])
def test_p73_eval_backward(cbs, shape):
    reports = _check73(cbs, shape, train=False)
    assert {"P73 dbn.weight", "P73 dbn.bias", "P73 dconv.weight", "P73 dx"} <= set(reports)


def test_p73_training_backward_frees_what_it_saved(cbs):
    ref = Ref73(8, 64)
    ours = kb.training.FusedP73(cbs, ref, SCALE).cuda()
    x = torch.rand(8, 8, 64, 64, device="cuda", requires_grad=True)
    with torch.no_grad():
        ours(x)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    y = ours(x)
    y.sum().backward()
    del y
    torch.cuda.synchronize()
    grads = sum(p.grad.numel() * 4 for p in ours.parameters()) + x.grad.numel() * 4
    assert torch.cuda.memory_allocated() - base <= grads + 2**20  # nothing of the step left but the gradients


@pytest.mark.parametrize("math, batch, offset", [("fp32", 32, 0.0), ("3xtf32", 32, 0.0), ("fp32", 8, 1000.0),
                                                 ("fp32", 8, -1000.0)])
def test_p27_backward(p27ext, math, batch, offset):
    if math == "3xtf32" and torch.cuda.get_device_capability()[0] < 8:
        pytest.skip("the tensor-core path needs sm_80 or newer")
    ref = P27.model(seed=0).cuda()
    with torch.no_grad():
        ref.group_norm.weight.uniform_(-1, 2)
        ref.group_norm.bias.uniform_(-1, 1)
    ours = kb.training.FusedP27(p27ext, ref, math).cuda()
    x = P27.inputs(seed=1, batch=batch, device="cuda") + offset
    kb.check.backward_reports(ours, copy.deepcopy(ref), copy.deepcopy(ref).double(), x, what="P27")


@pytest.mark.parametrize("problem, batch", [(P73, None), (P27, 64)])
def test_submissions_under_the_benchmarks_timing_step(problem, batch):
    """Both submissions called exactly as KernelBench's timing step calls them: .to(device, dtype), grad mode
    on, parameters requiring grad, L2 flushed before each call; the outputs match the reference's."""
    sol = kb.problems.load_solution(problem)
    res = kb.problems.kernelbench_timing(problem, lambda: sol.ModelNew(*problem.init_args), batch=batch, trials=5)
    assert res["allclose"] and res["grad_fn"], res
    assert res["ModelNew_ms"] > 0 and res["reference_ms"] > 0


def test_p27_submission_backward_matches_the_reference():
    sol = kb.problems.load_solution(P27)
    torch.manual_seed(0)
    new = sol.ModelNew(*P27.init_args).cuda()
    ref = P27.model(seed=0).cuda()
    ref.load_state_dict(new.state_dict())
    x = P27.inputs(seed=2, batch=16, device="cuda")
    kb.check.backward_reports(new, copy.deepcopy(ref), copy.deepcopy(ref).double(), x, what="P27 submission")


def test_double_backward_is_refused_by_name_on_the_gpu(cbs):
    ours = kb.training.FusedP73(cbs, Ref73(3, 4), SCALE).cuda()
    x = torch.rand(2, 3, 8, 8, device="cuda", requires_grad=True)
    with pytest.raises(RuntimeError, match="conv_bn_scale_train: double backward is not supported"):
        torch.autograd.grad(ours(x).square().sum(), x, create_graph=True)
