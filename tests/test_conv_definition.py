"""The capstones' convolutions on the input classes of the book's definition of float32-accurate (the method
chapter): relative error against float64 at most twice the float32 library path's (cuDNN, TF32 off) on the same
inputs — the benchmark's, inputs shifted by ±1000, products that cancel, and magnitudes spread over 2^±60.

Every path is held to it where it meets it, and below the ratio measured on an H200 where it does not. The
misses are the 3xTF32 convolutions' where products cancel — a split product errs ≈ 2^-22 of |a·b|, an FFMA's
2^-24 — but not training mode's default: its guard predicts the tensor-core convolution's own error too and
takes the FFMA convolution where that would cost the output its accuracy.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kernelbook as kb
from kernelbook import check

P73, P27 = kb.problems.P73_CONV_BN_SCALE, kb.problems.P27_CONV3D_GN_MEAN
# Where the 3xTF32 paths miss the definition, the ratio they are held to: cancelling products (measured 2.6–4.2×
# in chapters 6 and 7) and magnitudes over 2^±60 (the GEMMs' 1.96–2.04×: a split's lo part of a value near
# 2^-60 keeps fewer bits).
TF32_MISS = {"cancelling": 6.0, "wide": 2.5}
P27_TF32_CANCEL = 100.0  # P27's 3xTF32 path on cancelling products: 71× measured (GroupNorm divides by a small σ)


@pytest.fixture(autouse=True)
def _no_grad():
    with torch.no_grad():
        yield


def _u(shape, seed, low=-1.0, high=1.0):
    return check.rand(list(shape), seed=seed, device="cuda", low=low, high=high)


def _classes(x_shape, w_shape, wide_exp: float) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """name → (input, filter): the definition's input classes for a convolution. "cancelling": inputs
    1 + 10⁻³·u and a filter whose taps alternate in sign down its C_in·taps inputs, so each output sums
    terms of size ≈ 1 to ≈ 10⁻²; "wide": input magnitudes 2^k, k uniform in ±``wide_exp``."""
    n_taps = int(torch.tensor(w_shape[1:]).prod())
    w = _u(w_shape, 2, -0.5, 0.5)
    sign = (torch.arange(n_taps, device="cuda") % 2 * 2 - 1).float().reshape(w_shape[1:])
    wide = torch.sign(_u(x_shape, 3)) * torch.exp2(torch.round(_u(x_shape, 4, -wide_exp, wide_exp)))
    return {"benchmark": (_u(x_shape, 1, 0.0, 1.0), w),
            "shifted +1000": (_u(x_shape, 1, 0.0, 1.0) + 1000, w),
            "shifted -1000": (_u(x_shape, 1, 0.0, 1.0) - 1000, w),
            "cancelling": (1 + 1e-3 * _u(x_shape, 5), sign * (1 + 1e-3 * _u(w_shape, 6))),
            "wide": (wide * (1 + 0.5 * _u(x_shape, 7, 0.0, 1.0)), w)}


P73_CLASSES = ("benchmark", "shifted +1000", "shifted -1000", "cancelling", "wide")


@pytest.fixture(scope="module")
def cbs():
    return kb.build.load("conv_bn_scale")


@pytest.fixture(scope="module")
def p73_inputs():
    return _classes((4, 8, 34, 34), (64, 8, 3, 3), 60.0)


@pytest.fixture(scope="module")
def p73_train_inputs():
    return _classes((4, 8, 34, 34), (64, 8, 3, 3), 30.0)


def _ratio(out, ref, lib) -> tuple[float, float, float]:
    err, lib_err = (check.report(t, ref, tol=1.0)["rel_err"] for t in (out, lib))
    return err / lib_err, err, lib_err


@pytest.mark.gpu
@pytest.mark.parametrize("name", P73_CLASSES)
@pytest.mark.parametrize("math", ["auto", "3xtf32"])
def test_p73_eval_convolution_on_the_definitions_inputs(cbs, p73_inputs, name, math):
    """Eval mode (the folded convolution): the default (math="auto", FFMA: eval mode has no guard) is
    float32-accurate on every class; the 3xTF32 path on the benchmark's and shifted inputs, and within TF32_MISS
    elsewhere."""
    if math == "3xtf32" and torch.cuda.get_device_capability()[0] < 8:
        pytest.skip("3xTF32 needs TF32 tensor cores (sm_80 or newer)")
    x, w = p73_inputs[name]
    b = _u((64,), 8)
    ref = F.conv2d(x.double(), w.double(), b.double())
    with kb.precision.tf32(False):
        lib = F.conv2d(x, w, b)
    ratio, err, lib_err = _ratio(cbs.conv_bn_scale_eval(x, w, b, math=math), ref, lib)
    bound = TF32_MISS.get(name, 2.0) if math == "3xtf32" else 2.0
    assert ratio <= bound, f"{name}, math={math}: error {err:.2e}, cuDNN float32 {lib_err:.2e} ({ratio:.2f}×)"


def _train(cbs, x, w, b, math):
    """Training-mode P73 with fresh BN state (γ, β non-trivial), and the float64 and float32-library outputs."""
    c_out = w.shape[0]
    gamma, beta = _u((c_out,), 9, 0.5, 1.5), _u((c_out,), 10)

    def run(fn_conv, dtype):
        z = fn_conv(x.to(dtype), w.to(dtype), b.to(dtype))
        return F.batch_norm(z, None, None, gamma.to(dtype), beta.to(dtype), True, 0.0, 1e-5) * 2.0

    ref = run(F.conv2d, torch.float64)
    with kb.precision.tf32(False):
        lib = run(F.conv2d, torch.float32)
    rm, rv, nbt = torch.zeros(c_out, device="cuda"), torch.ones(c_out, device="cuda"), torch.zeros(
        (), dtype=torch.long, device="cuda")
    out = cbs.conv_bn_scale_train(x, w, b, gamma, beta, rm, rv, nbt, 0.1, 1e-5, 2.0, math=math)
    z = F.conv2d(x.double(), w.double(), b.double())
    var, mean = torch.var_mean(z, dim=(0, 2, 3), correction=1)
    # the running statistics updated once, by exactly one path: the mean within 1e-5 of its size plus its spread
    mean_err = ((rm.double() - 0.1 * mean).abs() / (0.1 * (mean.abs() + var.sqrt()))).max()
    assert mean_err <= 1e-5, f"running_mean off by {mean_err:.2e} (of |mean| + σ)"
    check.assert_close(rv, 0.9 + 0.1 * var, 1e-5, what="running_var")
    assert int(nbt) == 1
    return out, ref, lib


@pytest.mark.gpu
@pytest.mark.parametrize("name", P73_CLASSES)
def test_p73_training_default_on_the_definitions_inputs(cbs, p73_train_inputs, name):
    """Training mode's default (strategy and math "auto": the guard picks the path) is float32-accurate on every
    class. On cancelling products the guard keeps the moments' statistics but runs their convolution by FFMA
    where the tensor cores are the default (their 3xTF32 convolution erred 3.95× eager's there); on the
    benchmark's input it keeps the tensor cores. "wide" spans 2^±30 here: the batch variance of outputs near 2^60
    exceeds float32's range in any float32 BatchNorm, the library's included."""
    x, w = p73_train_inputs[name]
    b = _u((64,), 8)
    out, ref, lib = _train(cbs, x, w, b, "auto")
    ratio, err, lib_err = _ratio(out, ref, lib)
    assert ratio <= 2.0, f"{name}: error {err:.2e}, eager float32 {lib_err:.2e} ({ratio:.2f}×)"
    if cbs.conv_bn_scale_math(x) == "3xtf32" and name in ("benchmark", "cancelling"):
        g = cbs.conv_bn_scale_guard(x, w, b, "auto", _u((64,), 9, 0.5, 1.5), _u((64,), 10), 1e-5, 2.0)
        assert (g["choice"], g["conv"]) == ("moments", "3xtf32" if name == "benchmark" else "fp32"), g


@pytest.fixture(scope="module")
def p27_ext():
    return kb.build.load("conv3d_gn_mean")


@pytest.mark.gpu
@pytest.mark.parametrize("name", P73_CLASSES)
@pytest.mark.parametrize("math", ["fp32", "3xtf32"])
def test_p27_on_the_definitions_inputs(p27_ext, name, math):
    """P27 against eager PyTorch's float32 (cuDNN, TF32 off): the default (FFMA) on every class, the 3xTF32 path
    within TF32_MISS where it misses; "wide" spans 2^±30 (GroupNorm's variance, as above)."""
    if math == "3xtf32" and torch.cuda.get_device_capability()[0] < 8:
        pytest.skip("3xTF32 needs TF32 tensor cores (sm_80 or newer)")
    x, w = _classes((2, 3, 10, 12, 12), (16, 3, 4, 4, 4), 30.0)[name]
    m = P27.model(seed=0).cuda()
    m.conv.weight.copy_(w)
    gn = m.group_norm
    gn.weight.copy_(_u((16,), 11, -2.0, 2.0))
    gn.bias.copy_(_u((16,), 12))
    m64 = P27.model(seed=0).cuda().double()
    m64.load_state_dict(m.state_dict())
    ref = m64(x.double())
    with kb.precision.tf32(False):
        lib = m(x)
    out = p27_ext.p27_forward(x, m.conv.weight, m.conv.bias, gn.weight, gn.bias, gn.num_groups, gn.eps, None,
                              math=math)
    ratio, err, lib_err = _ratio(out, ref, lib)
    bound = (P27_TF32_CANCEL if name == "cancelling" else TF32_MISS.get(name, 2.0)) if math == "3xtf32" else 2.0
    assert ratio <= bound, f"{name}, math={math}: error {err:.2e}, eager float32 {lib_err:.2e} ({ratio:.2f}×)"
