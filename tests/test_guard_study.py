"""The guard study's toolkit (kernelbook/models/guard_study.py): its inputs, filters and κ on the CPU; the
measurement's logic on a CPU stand-in for the kernel's binding; the measurement itself on a GPU (marked ``gpu``).

The natural-image tests need the scikit-image package installed (only its bundled PNGs are read; it is not
imported) and are skipped without it.
"""

from __future__ import annotations

import importlib.util
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import kernelbook as kb
from kernelbook.models import guard_study as gs

needs_skimage = pytest.mark.skipif(importlib.util.find_spec("skimage") is None,
                                   reason="needs the scikit-image package (its bundled photographs)")


# ------------------------------------------------------------------------------------------------ inputs

@needs_skimage
def test_natural_batch_shape_range_and_determinism():
    x = gs.natural_batch(3, seed=5)
    assert x.shape == (3, 8, 128, 128) and x.dtype == torch.float32 and x.is_contiguous()
    assert float(x.min()) >= 0.0 and float(x.max()) <= 1.0
    assert torch.equal(x, gs.natural_batch(3, seed=5))
    assert not torch.equal(x, gs.natural_batch(3, seed=6))
    assert torch.equal(gs.natural_batch(5, seed=5)[:3], x)  # a larger batch extends a smaller one
    assert gs.natural_batch(2, seed=0, size=32).shape == (2, 8, 32, 32)


@needs_skimage
def test_natural_batch_channels_are_rgb_and_grey_of_two_photographs():
    x = gs.natural_batch(2, seed=1).double()
    for img in (0, 1):
        rgb = x[:, 4 * img:4 * img + 3]
        grey = sum(c * rgb[:, k] for k, c in enumerate(gs.GREY))
        assert torch.allclose(x[:, 4 * img + 3], grey, atol=1e-6)
        assert float(x[:, 4 * img].std()) > 0.05  # a photograph, not a constant
    assert not torch.equal(x[:, :4], x[:, 4:])
    # natural images: neighbouring pixels are strongly correlated (torch.rand's are not)
    a, b = x[..., :, :-1].flatten(), x[..., :, 1:].flatten()
    assert float(torch.corrcoef(torch.stack([a, b]))[0, 1]) > 0.9


def test_natural_batch_says_which_package_is_missing(monkeypatch):
    gs._image_channels.cache_clear()
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    try:
        with pytest.raises(ModuleNotFoundError, match="scikit-image"):
            gs.natural_batch(1, seed=0)
    finally:
        monkeypatch.undo()
        gs._image_channels.cache_clear()


def test_outlier_pivot_changes_only_the_pivots():
    x = kb.check.rand((3, 8, 10, 12), seed=2)
    y = gs.with_outlier_pivot(x, 1000.0)
    assert torch.equal(x, kb.check.rand((3, 8, 10, 12), seed=2))  # the input is left as it was
    mask = torch.zeros_like(x, dtype=torch.bool)
    mask[0, :, 0, 0] = True
    assert torch.equal(y[~mask], x[~mask])
    assert torch.allclose(y[0, :, 0, 0], 1000.0 * x.abs().mean(dim=(0, 2, 3)))
    assert (gs.kernel_pivot(y) - gs.kernel_pivot(x) > 1000.0 * x.abs().mean(dim=(0, 2, 3)).double() / 17).all()


# ----------------------------------------------------------------------------------------------- filters

def test_filter_sets_shapes_determinism_and_structure():
    before = torch.get_rng_state()
    sets = gs.filter_sets(seed=0)
    assert torch.equal(before, torch.get_rng_state())  # the caller's generator is untouched
    expected = {f"{k}_{m}" for k in ("sobel_x", "sobel_y", "laplacian", "gabor") for m in ("one", "all")}
    assert expected | {"random_normal", "kaiming_uniform", "difference"} == set(sets)
    for name, (w, b) in sets.items():
        assert w.shape == (64, 8, 3, 3) and b.shape == (64,), name
        assert w.dtype == b.dtype == torch.float32 and w.is_contiguous(), name
        assert torch.isfinite(w).all() and (w.abs().flatten(1).sum(1) > 0).all(), name
        if name.endswith("_one") or name == "difference":  # one input channel per output channel
            used = w.abs().sum(dim=(2, 3)) > 0
            assert (used.sum(1) == 1).all() and (used.float().argmax(1) == torch.arange(64) % 8).all(), name
        if name.startswith(("sobel", "laplacian", "gabor")) or name == "difference":  # they ignore a constant
            assert float(w.double().sum(dim=(2, 3)).abs().max()) < 1e-6, name
    for name, (w, b) in gs.filter_sets(seed=0).items():
        assert torch.equal(w, sets[name][0]) and torch.equal(b, sets[name][1]), name
    assert not torch.equal(gs.filter_sets(seed=1)["random_normal"][0], sets["random_normal"][0])
    conv = kb.problems.P73_CONV_BN_SCALE.model(seed=0).conv  # P73's own initialisation
    assert torch.equal(sets["kaiming_uniform"][0], conv.weight.detach())
    assert torch.equal(sets["kaiming_uniform"][1], conv.bias.detach())


# --------------------------------------------------------------------------------------------------- κ

def _direct(x, w, pivot=None):
    """κ per channel straight from the definition: every patch unfolded at once, torch.cov, in float64."""
    p = F.unfold(x.double(), 3).transpose(1, 2).reshape(-1, w[0].numel())
    cov = torch.cov(p.T, correction=0)
    a = cov
    if pivot is not None:
        q = p - pivot.double().repeat_interleave(9)
        a = q.T @ q / len(q)  # second moments about the pivot
    wr = w.reshape(len(w), -1).double()
    return ((wr.abs() @ a.abs()) * wr.abs()).sum(1) / ((wr @ cov) * wr).sum(1), p.mean(0), cov


def test_kappa_matches_a_direct_float64_computation():
    x = kb.check.rand((3, 4, 9, 11), seed=3, low=-0.5, high=2.0)
    w = kb.check.rand((5, 4, 3, 3), seed=4, low=-1.0, high=1.0)
    ref, mean, cov = _direct(x, w)
    for chunk in (1, 2, 8):
        m, c = gs.patch_moments(x, chunk=chunk)
        assert torch.allclose(m, mean, rtol=1e-12, atol=1e-13) and torch.allclose(c, cov, rtol=1e-10, atol=1e-13)
        assert torch.allclose(gs.kappa(x, w, moments=(m, c)), ref, rtol=1e-10)
    assert torch.allclose(gs.kappa(x, w), ref, rtol=1e-10) and (gs.kappa(x, w) >= 1 - 1e-12).all()
    grid = x[0][:, [0, 2, 5, 8]][:, :, [0, 3, 6, 10]].double()  # the kernel's 4×4 samples of a 9×11 plane
    assert torch.allclose(gs.kernel_pivot(x), grid.mean(dim=(1, 2)), rtol=1e-6)
    piv_ref = _direct(x, w, pivot=gs.kernel_pivot(x))[0]
    assert torch.allclose(gs.kappa(x, w, "kernel"), piv_ref, rtol=1e-9)
    assert torch.allclose(gs.kappa(x, w, torch.zeros(4)), _direct(x, w, pivot=torch.zeros(4))[0], rtol=1e-9)
    with pytest.raises(ValueError, match="pivot must be"):
        gs.kappa(x, w, "mean")


def test_kappa_is_large_for_a_difference_filter_on_a_smooth_field():
    x = kb.variance.smooth_field(1e-4, seed=0)
    w = torch.zeros(2, 3, 3, 3)
    w[0, 0, 1, 1], w[0, 0, 1, 2] = 0.37, -0.37
    w[1] = kb.check.rand((3, 3, 3), seed=1, low=-0.5, high=0.5)
    kap = gs.kappa(x, w)
    assert kap[0] > 1e4 and kap[1] < 1e3
    # the kernel's pivot does not change Σ, so κ about it is never smaller
    assert (gs.kappa(x, w, "kernel") >= kap * (1 - 1e-12)).all()


def test_study_sections_without_photographs():
    secs = gs.study_sections(batches=(2,), natural=False)
    assert list(secs) == ["p73", "smooth", "outlier", "filters n2"]
    assert [c.x.shape[0] for c in secs["p73"]] == [128]
    assert len(secs["filters n2"]) == len(gs.filter_sets(0))
    names = [c.name for v in secs.values() for c in v]
    assert len(names) == len(set(names))
    for c in (c for v in secs.values() for c in v):
        assert c.x.shape[1:] == (8, 128, 128) and c.w.shape == (64, 8, 3, 3), c.name


# ------------------------------------------------------------------------------------------ measurement

class CpuBinding:
    """A CPU stand-in for the conv_bn_scale binding: PyTorch in float32 for the training call (running statistics
    updated as nn.BatchNorm2d does), and the guard's choice from κ in float64 with the kernel's thresholds."""

    U = {"fp32": 2.0**-24, "3xtf32": 16 * 2.0**-24}

    def conv_bn_scale_train(self, x, w, b, g, beta, rm, rv, nbt, momentum, eps, scale, out, strategy, math_):
        z = F.conv2d(x, w, b)
        var, mean = torch.var_mean(z, dim=(0, 2, 3), correction=0)
        n = z.numel() // z.shape[1]
        y = (z - mean.view(1, -1, 1, 1)) * (torch.rsqrt(var + eps) * g * scale).view(1, -1, 1, 1)
        out.copy_(y + (beta * scale).view(1, -1, 1, 1))
        rm.mul_(1 - momentum).add_(momentum * mean)
        rv.mul_(1 - momentum).add_(momentum * var * n / (n - 1))
        nbt.add_(1)
        return out

    def conv_bn_scale_math(self, x, math_):
        return "fp32" if math_ == "auto" else math_

    def guard_kappa_max(self, math_):
        return 1e-5 / self.U[math_]

    def conv_bn_scale_auto_choice(self, x, w, b, math_):
        kmax = self.guard_kappa_max(self.conv_bn_scale_math(x, math_))
        return "inplace" if float(gs.kappa(x, w).max()) > kmax else "moments"


def test_error_vs_kappa_rows_on_a_cpu_stand_in():
    sets = gs.filter_sets(0)
    x = kb.problems.P73_CONV_BN_SCALE.inputs(seed=1, batch=2)[..., :20, :24].contiguous()
    cases = [gs.Case("p73 / kaiming", x, *sets["kaiming_uniform"], "p73", "kaiming_uniform"),
             gs.Case("smooth / difference", kb.variance.smooth_field(1e-4, 0, n=2, c=8, h=20, w=24),
                     *sets["difference"], "smooth", "difference")]
    df = gs.error_vs_kappa(CpuBinding(), cases, strategies=("auto", "moments", "inplace"), time=False,
                           device="cpu")
    assert len(df) == 2 * 2 * 3
    assert set(df["strategy"]) == {"auto", "moments", "inplace"} and set(df["math"]) == {"fp32", "3xtf32"}
    assert (df["unwritten"] == 0).all() and (df["batches_counted"] == 1).all()
    assert df["f32_accurate"].all()  # the stand-in computes as eager does: within 2× of its error
    assert (df["var_err"] <= 4 * df["eager_var_err"] + 1e-7).all()
    p73 = df[df["case"] == "p73 / kaiming"]
    assert (p73["rel_err"] < 1e-6).all() and (p73["var_err"] < 1e-6).all()
    assert (df["choice"] == df["guard_predicts"]).all()
    by_case = df.groupby("case")
    assert set(by_case.get_group("smooth / difference")["choice"]) == {"inplace"}
    assert set(by_case.get_group("p73 / kaiming")["choice"]) == {"moments"}
    assert all(len(v) == 64 for col in ("kappa_c", "kappa_pivot_c", "var_err_c") for v in df[col])
    assert math.isclose(df["kappa_max"].iloc[0], max(df["kappa_c"].iloc[0]))
    assert (df["kappa_pivot_max"] >= df["kappa_max"] * (1 - 1e-12)).all()
    u = gs.implied_u(df, kappa_min=1.0)
    assert set(u.index) == {"fp32", "3xtf32"} and (u["channels"] == 2 * 64).all()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message given without a GPU")
def test_error_vs_kappa_needs_a_gpu():
    case = gs.Case("tiny", torch.rand(1, 8, 5, 5), torch.rand(2, 8, 3, 3))
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        gs.error_vs_kappa(None, [case])


@pytest.mark.gpu
def test_error_vs_kappa_on_the_gpu():
    mod = kb.build.load("conv_bn_scale")
    sets = gs.filter_sets(0)
    cases = [gs.Case("p73", kb.problems.P73_CONV_BN_SCALE.inputs(seed=1, batch=2), *sets["kaiming_uniform"]),
             gs.Case("smooth", kb.variance.smooth_field(1e-4, 0, n=2, c=8, h=40, w=70), *sets["difference"])]
    maths = ("fp32", "3xtf32") if torch.cuda.get_device_capability()[0] >= 8 else ("fp32",)
    df = gs.error_vs_kappa(mod, cases, maths=maths, strategies=("auto", "moments", "inplace"), rep=5)
    assert len(df) == 2 * len(maths) * 3
    assert (df["unwritten"] == 0).all() and (df["batches_counted"] == 1).all()
    assert (df["auto_ms"] > 0).all() and (df["default_ms"] > 0).all()
    assert set(df[df["case"] == "p73"]["choice"]) == {"moments"}
    assert set(df[df["case"] == "smooth"]["choice"]) == {"inplace"}
    auto = df[df["strategy"] == "auto"]
    # The guarded call by FFMA, and wherever it keeps the moments, is within the tolerance; the in-place fallback
    # forced onto the tensor cores (math="3xtf32", which the default never takes) errs more where products cancel.
    safe = auto[(auto["math"] == "fp32") | (auto["choice"] == "moments")]
    assert (safe["rel_err"] <= gs.TOL).all(), safe
    moments = safe[safe["choice"] == "moments"]  # the moments' variance: within the guard's tolerance
    assert (moments["var_err"] <= gs.TOL).all(), moments


@pytest.mark.gpu
@pytest.mark.xfail(strict=True, reason="the in-place epilogue's Welford statistics are not pivot-shifted: on a "
                   "smooth field through a difference filter the variance errs 1.2e-5, twice eager float32's")
def test_inplace_statistics_on_a_smooth_field():
    mod = kb.build.load("conv_bn_scale")
    case = gs.Case("smooth", kb.variance.smooth_field(1e-4, 0, n=2, c=8, h=40, w=70), *gs.filter_sets(0)["difference"])
    df = gs.error_vs_kappa(mod, [case], maths=("fp32",), strategies=("inplace",), time=False)
    assert (df["var_err"] <= np.maximum(gs.TOL, 2 * df["eager_var_err"])).all(), df
