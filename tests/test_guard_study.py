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
    assert list(secs) == ["p73", "edge", "smooth", "outlier", "filters n2"]
    assert [c.x.shape[0] for c in secs["p73"]] == [128]
    assert len(secs["filters n2"]) == len(gs.filter_sets(0))
    names = [c.name for v in secs.values() for c in v]
    assert len(names) == len(set(names))
    for c in (c for k, v in secs.items() if k != "edge" for c in v):
        assert c.x.shape[1:] == (8, 128, 128) and c.w.shape == (64, 8, 3, 3), c.name
    assert [c.x.shape for c in secs["edge"]] == [(4, 8, 64, 64)] * len(gs.EDGE_DELTAS)


# ------------------------------------------------------------------------------------ ρ and the guard's model

def test_rho_matches_a_direct_computation_and_is_at_most_kappa():
    x = kb.check.rand((3, 4, 9, 11), seed=3, low=-0.5, high=2.0)
    w = kb.check.rand((5, 4, 3, 3), seed=4, low=-1.0, high=1.0)
    p = F.unfold(x.double(), 3).transpose(1, 2).reshape(-1, 36)
    q = p - gs.kernel_pivot(x).repeat_interleave(9)
    s, cov = q.T @ q / len(q), torch.cov(p.T, correction=0)  # second moments about the pivot; covariance
    wr = w.reshape(5, -1).double()
    ref = torch.stack([(torch.outer(v, v) * s).norm() / (v @ cov @ v) for v in wr])
    assert torch.allclose(gs.rho(x, w), ref, rtol=1e-9)
    assert (gs.rho(x, w) <= gs.kappa(x, w, "kernel") * (1 + 1e-12)).all()


def _prediction_by_hand(x, w, math_, g, be, eps, scale):
    """The guard's formula term by term (conv_moments.cuh's header), in float64."""
    floor, spread = gs.GUARD_MODEL[math_]["floor"], gs.GUARD_MODEL[math_]["spread"]
    z = F.conv2d(x.double(), w.double())
    var = z.var(dim=(0, 2, 3), unbiased=False)
    rho = gs.rho(x, w)
    num = den = 0.0
    for c in range(len(var)):
        r, gc, bc = float(var[c] / (var[c] + eps)), float(g[c]) * scale, float(be[c]) * scale
        num += gc**2 * r**3 * (floor**2 + (spread * float(rho[c])) ** 2)
        den += gc**2 * r + bc**2
    return 0.5 * gs.U * math.sqrt(num / den)


def _conv_prediction_by_hand(x, w, g, be, eps, scale):
    """The tensor-core convolution's term (conv_moments.cuh's header) from the patches themselves: per channel
    Q_c = mean over positions of Σ_k w_ck² x_k², the output's error (γ_c s)²·Q_c/(σ_c² + ε), and the norm."""
    p = F.unfold(x.double(), 3).transpose(1, 2).reshape(-1, w[0].numel())
    wr = w.reshape(len(w), -1).double()
    q = (p**2 @ (wr**2).T).mean(0)
    var = F.conv2d(x.double(), w.double()).var(dim=(0, 2, 3), unbiased=False)
    gs_, bs = g.double() * scale, be.double() * scale
    num, den = (gs_**2 * q / (var + eps)).sum(), (gs_**2 * var / (var + eps) + bs**2).sum()
    return gs.CONV_TF32_UNIT * gs.U * math.sqrt(float(num / den))


@pytest.mark.parametrize("math_", ["fp32", "3xtf32"])
def test_guard_prediction_follows_its_formula(math_):
    x = kb.variance.smooth_field(0.3, seed=2, n=2, c=3, h=20, w=24)
    w = kb.check.rand((6, 3, 3, 3), seed=5, low=-1.0, high=1.0)
    g, be = kb.check.rand((6,), seed=6, low=-2.0, high=2.0), kb.check.rand((6,), seed=7, low=-1.0, high=1.0)
    p = gs.guard_prediction(x, w, math_, g, be, eps=1e-3, scale=2.0)
    assert p["predicted"] == pytest.approx(_prediction_by_hand(x, w, math_, g, be, 1e-3, 2.0), rel=1e-6)
    assert p["allowed"] == pytest.approx(math.sqrt(3) * gs.U * math.sqrt(27))
    assert p["choice"] == ("moments" if p["predicted"] <= p["allowed"] else "inplace")
    conv = _conv_prediction_by_hand(x, w, g, be, 1e-3, 2.0) if math_ == "3xtf32" else 0.0
    assert p["predicted_conv"] == pytest.approx(conv, rel=1e-6)
    assert p["conv"] == (math_ if math.hypot(p["predicted"], conv) <= p["allowed"] else "fp32")
    # defaults: γ = 1, β = 0, ε = 1e-5; the scale then cancels
    assert gs.guard_prediction(x, w, math_)["predicted"] == pytest.approx(
        gs.guard_prediction(x, w, math_, scale=3.0)["predicted"], rel=1e-12)
    # a channel whose output is constant (zero filter) has no variance to get wrong, and weighs nothing
    w0 = w.clone()
    w0[0] = 0.0
    assert math.isfinite(gs.guard_prediction(x, w0, math_)["predicted"])


def test_guard_prediction_grows_as_the_filter_cancels():
    """Less noise on the smooth field: the difference filter cancels more, ρ and the prediction grow."""
    w = gs.filter_sets(0)["difference"][0][:8]
    preds = [gs.guard_prediction(kb.variance.smooth_field(d, 0, n=2, c=8, h=32, w=32), w, "3xtf32")["predicted"]
             for d in (1.0, 0.1, 0.01)]
    assert preds[0] < preds[1] < preds[2]


def test_the_convolutions_unit_covers_the_emulated_split():
    """CONV_TF32_UNIT, the guard's rms error of a 3xTF32 product, is at least 1.5× the split's own emulated on
    the CPU (1.2–1.3u), leaving room for the accumulation the emulation leaves out; and it is small enough that
    P73's own data keep the tensor cores, while cancelling products (the definition's class) are sent to FFMA."""
    rms = gs.split_product_error(n=1 << 18)
    assert 1.1 <= min(rms.values()) and max(rms.values()) <= 1.4, rms
    assert gs.CONV_TF32_UNIT >= 1.5 * max(rms.values())
    x = kb.check.rand((2, 8, 40, 40), seed=0, low=0.0, high=1.0)
    w = kb.problems.P73_CONV_BN_SCALE.model(seed=0).conv.weight.detach()
    assert gs.guard_prediction(x, w, "3xtf32")["conv"] == "3xtf32"
    sign = (torch.arange(72) % 2 * 2 - 1).float().reshape(8, 3, 3)
    xc = 1 + 1e-3 * kb.check.rand((2, 8, 40, 40), seed=1, low=-1.0, high=1.0)
    wc = sign * (1 + 1e-3 * kb.check.rand((64, 8, 3, 3), seed=2, low=-1.0, high=1.0))
    p = gs.guard_prediction(xc, wc, "3xtf32")
    assert (p["choice"], p["conv"]) == ("moments", "fp32"), p


EDGES = [("3xtf32", 0.4, 0.15), ("fp32", 0.3, 0.15)]  # (math, noise δ below the allowance, δ above it)


@pytest.mark.parametrize("math_, below, above", EDGES)
def test_edge_cases_straddle_the_allowance(math_, below, above):
    """The GPU tests' edge cases: the prediction at about half the allowance and at two to three times it."""
    cases = {c.input: c for c in gs.edge_cases(deltas=(below, above))}
    ratios = [gs.guard_prediction(c.x, c.w, math_)["predicted"] / gs.guard_allowance(8) for c in cases.values()]
    assert 0.33 <= ratios[0] <= 0.75 and 1.5 <= ratios[1] <= 3.5, ratios


@needs_skimage
def test_guard_takes_the_moments_on_natural_images_with_kaiming_and_sobel():
    """At the benchmark's batch: P73's own filters and a Sobel are predicted within the allowance on both
    arithmetics, a Laplacian and a Gabor filter are not (the GPU run measured them at 2.4× to 4.3× eager's error
    with the moments forced)."""
    x = gs.natural_batch(128, seed=0)
    sets, moments = gs.filter_sets(0), gs.patch_moments(x)
    for math_ in ("fp32", "3xtf32"):
        choice = {f: gs.guard_prediction(x, sets[f][0], math_, moments=moments)["choice"] for f in gs.NATURAL_FILTERS}
        assert choice == {"kaiming_uniform": "moments", "sobel_x_one": "moments", "laplacian_one": "inplace",
                          "gabor_one": "inplace", "random_normal": "moments"}, (math_, choice)


def _fake_moments_rows(math_, rms_rho, rms_err_u):
    """Moments rows of error_vs_kappa as calibrate reads them: 4 channels with the given rms ρ and error."""
    return [{"strategy": "moments", "math": math_, "rho_pivot_c": [r] * 4, "var_err_c": [e * gs.U] * 4}
            for r, e in zip(rms_rho, rms_err_u, strict=True)]


def test_calibrate_fits_floor_and_spread_and_checks_the_kernels_model():
    import pandas as pd

    df = pd.DataFrame(_fake_moments_rows("fp32", [0.5, 10.0, 100.0], [1.5, 8.0, 110.0])
                      + _fake_moments_rows("3xtf32", [0.2, 50.0], [3.0, 150.0]))
    cal = gs.calibrate(df)
    assert cal.loc["fp32", "floor measured"] == pytest.approx(1.5)
    assert cal.loc["fp32", "spread measured"] == pytest.approx(math.sqrt(110.0**2 - 4.0) / 100.0)
    assert cal.loc["fp32", "worst / model"] == pytest.approx(110.0 / math.sqrt(4.0 + 125.0**2))
    assert cal.loc["3xtf32", "worst / model"] == pytest.approx(150.0 / math.sqrt(16.0 + 100.0**2))
    assert (cal.loc["fp32", "cases"], cal.loc["3xtf32", "cases"]) == (3, 2)


def test_chapter_glue_words_and_ratios():
    rows = [{"filters": "kaiming_uniform", "default_choice": "moments", "default_rel_err": 3e-7,
             "eager_rel_err": 4e-7, "kappa_pivot_max": 288.0, "moments_3xtf32_rel_err": 3e-7,
             "default_allowed": 8.8e-7},
            {"filters": "sobel_x_one", "default_choice": "moments", "default_rel_err": 4.4e-7,
             "eager_rel_err": 5.0e-7, "kappa_pivot_max": 57.0, "moments_3xtf32_rel_err": 4.4e-7},
            {"filters": "laplacian_one", "default_choice": "inplace", "default_rel_err": 3e-7,
             "eager_rel_err": 5e-7, "kappa_pivot_max": 472.0, "moments_3xtf32_rel_err": 1.6e-6}]
    glue = gs.chapter_glue({"n": 128, "rows": rows, "u_eff": {"fp32": gs.U, "3xtf32": gs.U / 2}})
    assert glue["nat_paths"] == "the moments for P73's init and Sobel; the in-place path for Laplacian"
    assert glue["nat_ratio_moments"] == pytest.approx(0.88) and glue["nat_ratio"] == pytest.approx(0.88)
    assert glue["nat_kappa_max"] == 472.0 and glue["nat_allowed"] == 8.8e-7 and glue["u_eff_tc"] == 0.5
    assert gs.natural_table({"rows": rows})["E"].isna().all()  # a record without the predictions
    for r, e in zip(rows, (2e-7, 5e-7, 3e-6), strict=True):
        r["default_predicted"] = e
    glue = gs.chapter_glue({"n": 128, "rows": rows, "u_eff": {"fp32": gs.U, "3xtf32": gs.U / 2}})
    assert glue["nat_e_kept"] == 5e-7 and glue["nat_e_refused"] == 3e-6  # the guard's margins
    rows[1] |= {"default_math": "3xtf32", "default_conv": "fp32"}  # Sobel kept, its convolution by FFMA
    glue = gs.chapter_glue({"n": 128, "rows": rows, "u_eff": {"fp32": gs.U, "3xtf32": gs.U / 2}})
    assert glue["nat_paths"] == ("the moments for P73's init; the moments with the FFMA convolution for Sobel; "
                                 "the in-place path for Laplacian")
    assert list(gs.natural_table({"rows": rows})["path"]) == ["moments", "moments, FFMA conv", "inplace"]
    g = gs.guard_glue({}, "3xtf32")
    assert g["g_spread"] == 2.0 and math.isnan(g["g_ill_predicted"])
    assert g["g_allowed"] == pytest.approx(math.sqrt(3 * 72) * gs.U)


# ------------------------------------------------------------------------------------------ measurement

class CpuBinding:
    """A CPU stand-in for the conv_bn_scale binding: PyTorch in float32 for the training call (running statistics
    updated as nn.BatchNorm2d does), and the guard from ``guard_prediction`` in float64."""

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

    def conv_bn_scale_guard(self, x, w, b, math_, bn_w=None, bn_b=None, eps=1e-5, scale=1.0):
        sums = self.conv_bn_scale_math(x, math_)
        p = gs.guard_prediction(x, w, sums, bn_w, bn_b, eps, scale)
        return {"choice": p["choice"], "conv": p["conv"], "predicted": p["predicted"],
                "predicted_conv": p["predicted_conv"], "allowed": p["allowed"], "math": sums}


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
    assert all(len(v) == 64 for col in ("kappa_c", "kappa_pivot_c", "rho_pivot_c", "var_err_c") for v in df[col])
    assert (df["guard_predicted"] == df["predicted_cpu"]).all()
    assert (df["rho_pivot_max"] <= df["kappa_pivot_max"] * (1 + 1e-12)).all()
    assert math.isclose(df["kappa_max"].iloc[0], max(df["kappa_c"].iloc[0]))
    assert (df["kappa_pivot_max"] >= df["kappa_max"] * (1 - 1e-12)).all()
    u = gs.implied_u(df, kappa_min=1.0)
    assert set(u.index) == {"fp32", "3xtf32"} and (u["channels"] == 2 * 64).all()
    assert set(gs.calibrate(df).index) == {"fp32", "3xtf32"}
    v = gs.verdicts(df)
    assert list(v.index) == ["p73 / kaiming", "smooth / difference"] and v["f32_accurate"].all()
    assert v.loc["smooth / difference", "path"] == "inplace"


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


def _tensor_cores() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 8


@pytest.fixture(scope="module")
def cbs_gpu():
    return kb.build.load("conv_bn_scale")


@pytest.mark.gpu
@needs_skimage
def test_default_on_natural_images_takes_the_moments_for_kaiming_and_sobel(cbs_gpu):
    """The benchmark's batch of natural-image crops: the default call (math "auto") takes the moments for P73's
    own filters, a Sobel and random filters, within twice eager float32's error, and falls back for a Laplacian
    and a Gabor filter; the kernel's predicted errors (the statistics' and the tensor-core convolution's) are the
    CPU's (float64) within 5 %, and so is its choice of the moments' convolution."""
    sets, x = gs.filter_sets(0), gs.natural_batch(128, 0, device="cuda")
    cases = [gs.Case(f, x, *sets[f], input="natural", filters=f) for f in gs.NATURAL_FILTERS]
    df = gs.error_vs_kappa(cbs_gpu, cases, maths=("auto",), strategies=("auto",), time=False).set_index("filters")
    assert df["choice"].to_dict() == {"kaiming_uniform": "moments", "sobel_x_one": "moments",
                                      "laplacian_one": "inplace", "gabor_one": "inplace",
                                      "random_normal": "moments"}, df["choice"]
    cols = ["choice", "rel_err", "eager_rel_err", "guard_predicted", "predicted_cpu"]
    assert df["f32_accurate"].all() and (df["unwritten"] == 0).all(), df[cols]
    assert np.allclose(df["guard_predicted"], df["predicted_cpu"], rtol=0.05), df[cols]
    assert np.allclose(df["guard_predicted_conv"], df["predicted_conv_cpu"], rtol=0.05), df[cols]
    kept = df[df["choice"] == "moments"]  # the moments' convolution: the arithmetic the CPU predicts
    assert (kept["conv"] == kept["conv_predicts"]).all(), kept[["conv", "conv_predicts", "guard_predicted_conv"]]
    assert (df["guard_allowed"] == gs.guard_allowance(8)).all()


@pytest.mark.gpu
def test_cancelling_products_keep_the_moments_with_the_ffma_convolution(cbs_gpu):
    """The definition's cancelling class: statistics well conditioned, products that cancel. The default keeps the
    moments; where its arithmetic is 3xTF32 the guard predicts the tensor-core convolution's error above the
    allowance and runs the convolution by FFMA: within twice eager float32's error, where the tensor-core
    convolution forced is not."""
    c = gs.cancelling_check(cbs_gpu)
    assert c["choice"] == "moments" and c["passed"], c
    if c["math"] == "3xtf32":
        assert c["conv"] == "fp32" and math.hypot(c["predicted"], c["predicted_conv"]) > c["allowed"], c
        assert c["moments_3xtf32_rel_err"] > 2 * c["eager_rel_err"], c  # what the guard avoided
    else:
        assert c["predicted_conv"] == 0.0 and c["conv"] == "fp32", c


@pytest.mark.gpu
@pytest.mark.parametrize("math_, below, above", EDGES)
def test_guard_at_its_edge(cbs_gpu, math_, below, above):
    """A smooth field through dense filters that cancel on it, its noise set so that the prediction is about half
    the allowance (the moments, float32-accurate) and two to three times it (the in-place path), for each
    arithmetic of the sums; the kernel predicts what the CPU does."""
    if math_ == "3xtf32" and not _tensor_cores():
        pytest.skip("the 3xTF32 sums need sm_80 or newer")
    df = gs.error_vs_kappa(cbs_gpu, gs.edge_cases(deltas=(below, above)), maths=(math_,),
                           strategies=("auto", "moments"), time=False)
    auto = df[df["strategy"] == "auto"].set_index("input")
    cols = ["choice", "rel_err", "eager_rel_err", "guard_predicted", "guard_allowed", "predicted_cpu"]
    assert list(auto["choice"]) == ["moments", "inplace"], auto[cols]
    assert np.allclose(auto["guard_predicted"], auto["predicted_cpu"], rtol=0.05), auto[cols]
    assert bool(auto["f32_accurate"].iloc[0]), auto[cols]


@pytest.mark.gpu
@pytest.mark.parametrize("math_", ["fp32", "3xtf32"])
def test_guard_falls_back_on_cancelling_and_outlying_data(cbs_gpu, math_):
    """Cancelling sums (a difference filter on a smooth field) and a far-off pivot (values 1000× the mean at the
    pivot's first sample): the in-place path, whose output by FFMA stays float32-accurate."""
    if math_ == "3xtf32" and not _tensor_cores():
        pytest.skip("the 3xTF32 sums need sm_80 or newer")
    sets, p73 = gs.filter_sets(0), kb.problems.P73_CONV_BN_SCALE
    cases = [gs.Case("smooth", kb.variance.smooth_field(1e-2, 0, n=2, c=8, h=64, w=64), *sets["difference"]),
             gs.Case("pivot×1000", gs.with_outlier_pivot(p73.inputs(seed=1, batch=4)), *sets["kaiming_uniform"])]
    df = gs.error_vs_kappa(cbs_gpu, cases, maths=(math_,), strategies=("auto",), time=False)
    assert (df["choice"] == "inplace").all(), df[["case", "choice", "guard_predicted", "guard_allowed"]]
    if math_ == "fp32":  # in place by FFMA (math="3xtf32" puts it on the tensor cores too)
        assert df["f32_accurate"].all(), df[["case", "rel_err", "eager_rel_err"]]


@pytest.mark.gpu
@pytest.mark.parametrize("offset", [0.1, 1.0])
def test_inplace_statistics_on_a_smooth_field(cbs_gpu, offset):
    """The in-place path's Welford states are summed about a per-channel pivot (the input's pivots through the
    filter): on a smooth field through difference filters (σ ≈ 10⁻³) the variance is float32-accurate (within
    twice eager PyTorch's error) whatever the bias ``offset`` puts the mean at. On the H200 it erred 2e-6 at both
    offsets, eager 2e-6 and 4.6e-5: the float32 convolution's own rounding, not the sums, sets that floor."""
    w, _ = gs.filter_sets(0)["difference"]
    x = kb.variance.smooth_field(1e-4, 0, n=2, c=8, h=40, w=70)
    case = gs.Case("smooth", x, w, torch.full((w.shape[0],), offset))
    df = gs.error_vs_kappa(cbs_gpu, [case], maths=("fp32",), strategies=("inplace",), time=False)
    assert (df["var_err"] <= 2 * df["eager_var_err"] + 16 * gs.U).all(), df[["var_err", "eager_var_err"]]
