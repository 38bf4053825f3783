"""The ops' autograd (kernelbook/models/autograd_ops.py), on the CPU: the wrappers' logic around a stand-in
extension that computes the bindings' values with PyTorch's ops in float64.

The backward formulas are checked by finite differences (``torch.autograd.gradcheck``) and against autograd of
the reference modules; the bookkeeping by what the stand-in saw: the forward called once per step, the saved
statistics asked for only while autograd records, the running statistics updated by the forward alone. The
GPU tests run the same wrappers on the real kernels.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import kernelbook as kb
from kernelbook.harness.build import Extension
from kernelbook.models import autograd_ops as ops


class Stand:
    """The bindings' values by PyTorch (a float64 stand-in for the compiled extension)."""

    def __init__(self):
        self.calls: list[tuple[str, object]] = []

    def conv_bn_scale_train(self, x, w, b, g, be, rm, rv, nbt, momentum, eps, s, out=None, strategy="auto",
                            math="auto"):
        self.calls.append(("train", math))
        z = F.conv2d(x, w, b)
        mean, var = z.mean((0, 2, 3)), z.var((0, 2, 3), unbiased=False)
        if rm is not None:
            m = momentum if momentum is not None else 1.0 / (int(nbt) + 1)
            n = z.numel() / z.shape[1]
            rm.mul_(1 - m).add_(m * mean)
            rv.mul_(1 - m).add_(m * var * n / (n - 1))
            nbt.add_(1)
        y = (z - mean.view(1, -1, 1, 1)) * torch.rsqrt(var + eps).view(1, -1, 1, 1)
        y = (y * (g.view(1, -1, 1, 1) if g is not None else 1) + (be.view(1, -1, 1, 1) if be is not None else 0)) * s
        return out.copy_(y) if out is not None else y

    def conv_bn_scale_eval(self, x, w, b, out=None, math="auto"):
        self.calls.append(("eval", math))
        y = F.conv2d(x, w, b)
        return out.copy_(y) if out is not None else y

    def p27_forward(self, x, w, b, gw, gb, groups, eps, out=None, smem_limit=0, math="fp32"):
        self.calls.append(("p27", None))
        y = F.group_norm(F.hardswish(F.conv3d(x, w, b)), groups, gw, gb, eps).mean(dim=(2, 3, 4))
        return out.copy_(y) if out is not None else y

    def twice(self, x, out=None, *, offset=0.0):
        y = 2 * x + offset
        return out.copy_(y) if out is not None else y

    def halves(self, x):
        return [x / 2, x.sum() / 2]  # a binding returning std::vector<Tensor>: a Python list

    def config(self):
        return [4, 8]


def _p73(seed=0, c_in=3, c_out=4, momentum=0.1, track=True, affine=True, bias=True):
    torch.manual_seed(seed)
    m = nn.ModuleDict(dict(conv=nn.Conv2d(c_in, c_out, 3, bias=bias),
                           bn=nn.BatchNorm2d(c_out, momentum=momentum, affine=affine, track_running_stats=track)))
    if affine:
        with torch.no_grad():
            m["bn"].weight.uniform_(-1.5, 2.0)
            m["bn"].bias.uniform_(-1, 1)
    return m.double()


def _train_call(ext, m, x, s=2.0, **kw):
    c, b = m["conv"], m["bn"]
    return ops.conv_bn_scale_train(ext, x, c.weight, c.bias, b.weight, b.bias, b.running_mean, b.running_var,
                                   b.num_batches_tracked, b.momentum, b.eps, s, **kw)


def _params(m):
    return [p for p in m.parameters()]


@pytest.mark.parametrize("momentum,track,affine,bias", [(0.1, True, True, True), (None, True, True, False),
                                                        (0.1, False, False, True), (1.0, True, True, True)])
def test_p73_training_gradients_match_the_reference_module(momentum, track, affine, bias):
    ext, m = Stand(), _p73(momentum=momentum, track=track, affine=affine, bias=bias)
    ref = _p73(momentum=momentum, track=track, affine=affine, bias=bias)
    x = torch.rand(2, 3, 7, 6, dtype=torch.float64, requires_grad=True)
    xr = x.detach().clone().requires_grad_()
    dy = torch.randn(2, 4, 5, 4, dtype=torch.float64)
    y = _train_call(ext, m, x, s=-0.7)
    yr = ref["bn"](ref["conv"](xr)) * -0.7
    torch.testing.assert_close(y, yr)
    y.backward(dy)
    yr.backward(dy)
    torch.testing.assert_close(x.grad, xr.grad)
    for p, q in zip(_params(m), _params(ref), strict=True):
        torch.testing.assert_close(p.grad, q.grad)
    for name, buf in m["bn"].named_buffers():  # updated once, by the forward: exactly as the module's
        torch.testing.assert_close(buf, dict(ref["bn"].named_buffers())[name])


def test_p73_training_gradcheck():
    ext, m = Stand(), _p73()
    x = torch.rand(2, 3, 5, 6, dtype=torch.float64, requires_grad=True)
    c, b = m["conv"], m["bn"]

    def f(x, w, cb, g, be):
        return ops.conv_bn_scale_train(ext, x, w, cb, g, be, None, None, None, 0.1, 1e-5, 2.0)

    assert torch.autograd.gradcheck(f, (x, c.weight, c.bias, b.weight, b.bias))


def test_p73_eval_gradients_reach_batchnorm():
    ext, m = Stand(), _p73()
    m.eval()
    with torch.no_grad():
        m["bn"].running_mean.uniform_(-1, 1)
        m["bn"].running_var.uniform_(0.5, 2)
    c, b = m["conv"], m["bn"]
    x = torch.rand(2, 3, 6, 5, dtype=torch.float64, requires_grad=True)

    def f(x, w, cb, g, be):
        fw, fb = ops.fold_bn_scale(w, cb, g, be, b.running_mean, b.running_var, b.eps, 2.0)
        return ops.conv_bn_scale_eval(ext, x, fw, fb)

    assert torch.autograd.gradcheck(f, (x, c.weight, c.bias, b.weight, b.bias))

    def g(x, w, cb, gm, be):  # the eval op: BatchNorm's eval-mode backward on the recomputed conv output
        return ops.conv_bn_scale_folded(ext, x, w, cb, gm, be, b.running_mean, b.running_var, b.eps, 2.0)

    assert torch.autograd.gradcheck(g, (x, c.weight, c.bias, b.weight, b.bias))
    y = g(x, c.weight, c.bias, b.weight, b.bias)
    torch.testing.assert_close(y, b(c(x)) * 2.0)
    before = [t.clone() for t in b.buffers()]
    y.sum().backward()
    assert b.weight.grad is not None and b.bias.grad is not None and c.weight.grad is not None
    assert all(torch.equal(u, v) for u, v in zip(before, b.buffers(), strict=True))


def test_p27_gradcheck_and_reference():
    ext = Stand()
    torch.manual_seed(0)
    x = torch.rand(2, 3, 5, 5, 6, dtype=torch.float64, requires_grad=True)
    w = torch.randn(8, 3, 4, 4, 4, dtype=torch.float64, requires_grad=True)
    b, gw, gb = (torch.randn(8, dtype=torch.float64, requires_grad=True) for _ in range(3))

    def f(x, w, b, gw, gb):
        return ops.p27_forward(ext, x, w, b, gw, gb, 4, 1e-5)

    assert torch.autograd.gradcheck(f, (x, w, b, gw, gb))


def test_no_grad_calls_the_binding_directly():
    ext, m = Stand(), _p73()
    x = torch.rand(2, 3, 5, 5, dtype=torch.float64)
    with torch.no_grad():
        y = _train_call(ext, m, x)
    assert y.grad_fn is None and ext.calls == [("train", "auto")]
    with torch.inference_mode():
        assert _train_call(ext, m, x).grad_fn is None
    y = _train_call(ext, m, x.requires_grad_())
    assert y.grad_fn is not None and len(ext.calls) == 3 and int(m["bn"].num_batches_tracked) == 3


def test_backward_never_calls_the_training_forward_again():
    ext, m = Stand(), _p73()
    x = torch.rand(2, 3, 5, 5, dtype=torch.float64, requires_grad=True)
    _train_call(ext, m, x).sum().backward()
    assert ext.calls == [("train", "auto"), ("eval", "fp32")]  # the conv output recomputed by FFMA
    assert int(m["bn"].num_batches_tracked) == 1


def test_out_argument_is_returned_and_tracked():
    ext, m = Stand(), _p73()
    x = torch.rand(2, 3, 5, 5, dtype=torch.float64, requires_grad=True)
    out = torch.full((2, 4, 3, 3), float("nan"), dtype=torch.float64)
    y = _train_call(ext, m, x, out=out)
    assert y.data_ptr() == out.data_ptr() and y.grad_fn is not None and torch.isfinite(out).all()
    y.sum().backward()
    assert x.grad is not None


@pytest.mark.parametrize("which", ["train", "eval", "p27"])
def test_double_backward_is_refused_by_name(which):
    ext, m = Stand(), _p73()
    x = torch.rand(2, 3, 5, 6, dtype=torch.float64, requires_grad=True)
    if which == "train":
        y, op = _train_call(ext, m, x), "conv_bn_scale_train"
    elif which == "eval":
        y, op = ops.conv_bn_scale_eval(ext, x, m["conv"].weight, m["conv"].bias), "conv_bn_scale_eval"
    else:
        x = torch.rand(1, 3, 4, 4, 5, dtype=torch.float64, requires_grad=True)
        w = torch.randn(4, 3, 4, 4, 4, dtype=torch.float64, requires_grad=True)
        y, op = ops.p27_forward(ext, x, w, None, None, None, 2, 1e-5), "p27_forward"
    with pytest.raises(RuntimeError, match=f"{op}: double backward is not supported"):
        torch.autograd.grad(y.square().sum(), x, create_graph=True)


def test_the_other_ops_are_their_bindings_outside_autograd():
    """With nothing to record (no_grad, or no input requiring grad) an op is its binding's call, unchanged."""
    ext = Extension(Stand())
    x = torch.rand(5, dtype=torch.float64)
    assert ext.config() == [4, 8] and ext.twice.__name__ == "twice"
    y = ext.twice(x, offset=1.0)
    assert torch.equal(y, 2 * x + 1) and y.grad_fn is None
    with torch.no_grad():
        assert ext.twice(x.requires_grad_()).grad_fn is None


def test_the_other_ops_run_in_grad_mode_and_refuse_a_backward_by_name():
    """In grad mode a forward-only op gives the same values (keyword arguments, out= and list results
    included), its outputs join the graph, and a backward through any of them raises naming the op."""
    ext = Extension(Stand())
    x = torch.rand(5, dtype=torch.float64, requires_grad=True)
    y = ext.twice(x, offset=1.0)
    assert torch.equal(y.detach(), 2 * x.detach() + 1) and y.requires_grad
    with pytest.raises(RuntimeError, match="twice: this kernel has no backward"):
        y.sum().backward()
    out = torch.empty(5, dtype=torch.float64)
    assert ext.twice(x, out) is out and torch.equal(out.detach(), 2 * x.detach()) and out.grad_fn is not None
    halves = ext.halves(x)
    assert isinstance(halves, list) and len(halves) == 2 and all(h.grad_fn is not None for h in halves)
    with pytest.raises(RuntimeError, match="halves: this kernel has no backward"):
        halves[1].backward()
    assert x.grad is None
    z = torch.rand(5, dtype=torch.float64)
    (x * 3).sum().backward()  # a graph without the kernel is untouched
    assert torch.equal(x.grad, torch.full_like(z, 3.0))


def test_extension_routes_the_fused_ops_to_their_functions():
    stand = Stand()
    ext, m = Extension(stand), _p73()
    x = torch.rand(2, 3, 5, 5, dtype=torch.float64, requires_grad=True)
    c, b = m["conv"], m["bn"]
    y = ext.conv_bn_scale_train(x, c.weight, c.bias, b.weight, b.bias, b.running_mean, b.running_var,
                                b.num_batches_tracked, b.momentum, b.eps, 2.0)
    assert type(y.grad_fn).__name__ == "_ConvBnScaleBackward"
    y.sum().backward()
    assert c.weight.grad is not None and b.weight.grad is not None
    assert ext.raw is stand and "conv_bn_scale_eval" in dir(ext)


@pytest.mark.parametrize("train", [True, False])
def test_p73_forward_decides_as_batchnorm_does(train):
    ext, m, ref = Stand(), _p73(), _p73()
    m.train(train)
    ref.train(train)
    x = torch.rand(2, 3, 6, 7, dtype=torch.float64)
    y = ops.p73_forward(ext, m["conv"], m["bn"], 2.0, x)
    torch.testing.assert_close(y, ref["bn"](ref["conv"](x)) * 2.0)
    assert [k for k, _ in ext.calls] == ["train" if train else "eval"]
    for name, buf in m["bn"].named_buffers():
        torch.testing.assert_close(buf, dict(ref["bn"].named_buffers())[name])


@pytest.mark.parametrize("problem, shape", [(kb.problems.P73_CONV_BN_SCALE, (2, 8, 10, 12)),
                                            (kb.problems.P27_CONV3D_GN_MEAN, (2, 3, 6, 7, 8))])
def test_solutions_train_as_the_benchmarks_timing_step_calls_them(monkeypatch, problem, shape):
    """The submission's ModelNew with grad mode on and its parameters requiring grad (KernelBench's timing step),
    its extension replaced by the stand-in: the same output as the reference, a grad_fn, the same gradients."""
    sol = kb.problems.load_solution(problem)
    monkeypatch.setattr(sol, "_ext", Stand)
    torch.manual_seed(42)
    ref = problem.module(*problem.init_args).double()
    torch.manual_seed(42)
    new = sol.ModelNew(*problem.init_args).double()
    assert all(p.requires_grad for p in new.parameters())
    x = torch.rand(shape, dtype=torch.float64)
    y, y_ref = new(x), ref(x)
    assert y.grad_fn is not None
    torch.testing.assert_close(y, y_ref)
    dy = torch.rand_like(y)
    for (name, a), b in zip(kb.check.gradients(new, x, dy).items(), kb.check.gradients(ref, x, dy).values(),
                            strict=True):
        torch.testing.assert_close(a, b, msg=name)
    with torch.no_grad():
        assert new(x).grad_fn is None
