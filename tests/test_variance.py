"""Chapter 5: the float32 variance models of kernelbook.variance (CPU), and kernels/group_stats on the GPU.

CPU tests pin the numerics the chapter teaches; GPU tests (marked ``gpu``) check every algorithm of the kernel
against float64 on awkward shapes and alignments, and its GroupNorm against nn.GroupNorm in float64.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import kernelbook as kb
from kernelbook import check
from kernelbook import variance as V

U32 = 2.0**-24
P27_GROUP = 4 * 10933  # values per (sample, group) of P27's GroupNorm


# ---------------------------------------------------------------- CPU: the numerics


def test_chan_merge_of_two_halves_is_the_whole_in_float64():
    x = np.random.default_rng(1).standard_normal(10001) * 3.0 + 7.0
    a, b = V.state_of(x[:4000], np.float64), V.state_of(x[4000:], np.float64)
    whole = V.state_of(x, np.float64)
    m = V.chan_merge(a, b)
    assert m.n == whole.n
    assert abs(m.mean - whole.mean) <= 1e-12 * abs(whole.mean)
    assert abs(m.m2 - whole.m2) <= 1e-12 * whole.m2


def test_chan_merge_with_an_empty_side_changes_nothing():
    s = V.state_of(np.array([1.0, 2.0, 4.0]), np.float64)
    empty = V.State(np.float64(0), np.float64(0), np.float64(0))
    for m in (V.chan_merge(s, empty), V.chan_merge(empty, s)):
        assert (m.n, m.mean, m.m2) == (s.n, s.mean, s.m2)


def test_merge_tree_pads_to_a_power_of_two_and_agrees_with_sequential():
    x = np.random.default_rng(2).standard_normal((7, 13, 5))
    states = V.state_of(x, np.float64)  # 13 states per row, of 5 values each
    t, s = V.merge_tree(states), V.merge_sequential(states)
    ref = V.state_of(x.reshape(7, -1), np.float64)
    for got in (t, s):
        np.testing.assert_allclose(got.mean, ref.mean, rtol=1e-12)
        np.testing.assert_allclose(got.m2, ref.m2, rtol=1e-12)


def test_onepass_goes_negative_at_mu_over_sigma_1e4():
    x = V.shifted_normal([1e4], P27_GROUP, trials=16, seed=0)
    _, var = V.onepass(x)
    assert (var < 0).sum() >= 1  # a negative variance: NaN after rsqrt unless clamped
    _, ref = V.reference(x)
    assert np.median(V.rel_error(var, ref)) > 0.1


def test_onepass_error_follows_the_theory_line():
    ratios = [1e1, 1e2, 1e3]
    x = V.shifted_normal(ratios, P27_GROUP, trials=32, seed=3)
    _, ref = V.reference(x)
    _, var = V.onepass(x)
    med = np.median(V.rel_error(var, ref), axis=-1)
    theory = U32 * np.square(ratios)
    assert np.all(med > theory / 10) and np.all(med < theory * 10), (med, theory)


def test_compensated_sums_do_not_save_the_subtraction():
    x = V.shifted_normal([1e3], 4096, trials=8, seed=4)
    _, ref = V.reference(x)
    _, var = V.onepass(x, compensated=True, strands=256)
    assert np.median(V.rel_error(var, ref)) > 1e-3


@pytest.mark.parametrize("fn", [V.twopass, lambda x: V.gpu_welford(x, shift=True),
                                lambda x: V.gpu_welford(x, blocks=5, shift=True), lambda x: V.welford(x, shift=True)])
def test_stable_methods_stay_near_the_unit_roundoff_at_1e4(fn):
    x = V.shifted_normal([1.0, 1e4], P27_GROUP, trials=8, seed=5)
    mean_ref, ref = V.reference(x)
    mean, var = fn(x)
    assert V.rel_error(var, ref).max() < 1e-6
    np.testing.assert_allclose(mean, mean_ref, rtol=1e-6, atol=1e-6)


def test_unshifted_welford_error_grows_linearly():
    x = V.shifted_normal([1e2, 1e4], P27_GROUP, trials=16, seed=6)
    _, ref = V.reference(x)
    _, var = V.gpu_welford(x)
    med = np.median(V.rel_error(var, ref), axis=-1)
    assert med[1] > 10 * med[0]            # grows with μ/σ ...
    assert med[1] < 1e-3 * U32 * 1e8       # ... far below the one-pass u·(μ/σ)²


def test_gpu_welford_blocks_match_float64_on_odd_lengths():
    x = np.random.default_rng(7).random((3, 4097 * 5 + 3)).astype(np.float32)
    m, v = V.gpu_welford(x, blocks=7)
    mr, vr = V.reference(x)
    np.testing.assert_allclose(v, vr, rtol=1e-6)
    np.testing.assert_allclose(m, mr, rtol=1e-6)


def test_group_variance_from_channel_states_is_exact_and_averaging_is_not():
    rng = np.random.default_rng(8)
    x = rng.standard_normal((4, 1000)) + np.array([[0.0], [1.0], [3.0], [-2.0]])  # 4 channels, different means
    chans = V.state_of(x, np.float64)
    g = V.group_state(chans)
    direct = x.reshape(-1).var()
    assert abs(V.variance(g) - direct) <= 1e-12 * direct
    assert abs(V.variance(chans).mean() - direct) > 0.5 * direct  # the between-channel part is missing


def test_sweep_table():
    df = V.sweep([1.0, 1e4], 1000, trials=4, seed=0)
    assert set(df["method"]) == set(V.METHODS)
    assert (df["trials"] == 4).all() and len(df) == 2 * len(V.METHODS)


def test_stats_tolerance_scales_with_the_ratio():
    x = torch.rand(2, 4, 100, dtype=torch.float64) + 1e3
    assert V.stats_tol(x, 2, "onepass") > 1e3 * V.stats_tol(x, 2, "welford_noshift")
    assert V.stats_tol(x, 2, "welford") == 1e-6


# ---------------------------------------------------------------- GPU: kernels/group_stats

ALGOS = ["onepass", "twopass", "welford", "welford_noshift"]
SHAPES = [  # (shape, groups, offset of x's data in floats)
    ((2, 16, 10933), 4, 0), ((1, 16, 10933), 4, 0), ((1, 16, 10933), 4, 3), ((3, 6, 7), 3, 0), ((5, 4, 1), 2, 1),
    ((2, 8, 1023), 8, 2), ((1, 4, (1 << 20) + 3), 1, 1), ((7, 12, 5, 6, 7), 3, 0), ((1, 1, 1), 1, 0),
    ((64, 32, 33), 32, 0),
]


@pytest.fixture(scope="module")
def gs():
    return kb.build.load("group_stats", arch=None if kb.gpu() else "90")


def _x(shape, offset, seed, low=-1.0, high=3.0):
    numel = int(np.prod(shape))
    buf = check.rand([numel + offset], seed=seed, device="cuda", low=low, high=high)
    return buf[offset:].view(shape)


def _ref(x, groups):
    v = x.double().reshape(x.shape[0], groups, -1)
    var, mean = torch.var_mean(v, dim=-1, correction=0)
    return mean, var


@pytest.mark.gpu
@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("shape, groups, offset", SHAPES)
def test_stats_match_float64(gs, algo, shape, groups, offset):
    x = _x(shape, offset, seed=sum(shape) + offset)
    mean, var = check.poisoned((shape[0], groups), "cuda"), check.poisoned((shape[0], groups), "cuda")
    gs.group_stats(x, groups, algo, mean, var)
    mr, vr = _ref(x, groups)
    tol = V.stats_tol(x, groups, algo)
    check.assert_close(var, vr, tol, what=f"{algo} variance {shape}")
    check.assert_close(mean, mr, check.normalisation_tol(x.reshape(shape[0], groups, -1), (2,)),
                       what=f"{algo} mean {shape}")


@pytest.mark.gpu
@pytest.mark.parametrize("shift", [1e2, 1e4])
def test_shifted_data_on_the_p27_sized_tensor(gs, shift):
    x = torch.randn(1024, 16, 10933, device="cuda", generator=torch.Generator("cuda").manual_seed(1)) + shift
    _, vr = _ref(x, 4)
    err = {a: check.report(gs.group_stats(x, 4, a)[1], vr, 1.0)["rel_err"] for a in ALGOS}
    assert err["welford"] <= 1e-5 and err["twopass"] <= 1e-5, err
    assert err["onepass"] > 0.1 * U32 * shift**2, err  # the one-pass formula loses ≈ log10(shift²) digits


@pytest.mark.gpu
def test_empty_batch(gs):
    mean, var = gs.group_stats(torch.empty(0, 4, 5, device="cuda"), 2, "welford")
    assert mean.shape == var.shape == (0, 2)
    y, _, _ = gs.group_norm(torch.empty(0, 4, 5, device="cuda"), 2, None, None, 1e-5)
    assert y.shape == (0, 4, 5)


@pytest.mark.gpu
@pytest.mark.parametrize("shape, groups, offset", [((2, 16, 13, 29, 29), 4, 0), ((3, 6, 7), 3, 1), ((1, 8, 9999), 2, 0),
                                                    ((4, 4, 1), 4, 0), ((1, 2, 1 << 20), 1, 0)])
@pytest.mark.parametrize("affine", [True, False])
def test_group_norm_matches_nn_group_norm_in_float64(gs, shape, groups, offset, affine):
    x = _x(shape, offset, seed=11 + offset, low=-2.0, high=5.0)
    gn = nn.GroupNorm(groups, shape[1], affine=affine).double().cuda()
    if affine:
        g = torch.Generator().manual_seed(3)
        with torch.no_grad():
            gn.weight.copy_(torch.rand(shape[1], generator=g, dtype=torch.float64) * 2 - 0.5)
            gn.bias.copy_(torch.randn(shape[1], generator=g, dtype=torch.float64))
    w = gn.weight.float() if affine else None
    b = gn.bias.float() if affine else None
    out = check.poisoned(shape, "cuda")
    y, _, _ = gs.group_norm(x, groups, w, b, gn.eps, out)
    assert y.data_ptr() == out.data_ptr()
    with torch.no_grad():
        ref = gn(x.double())
    check.assert_close(out, ref, check.normalisation_tol(x.reshape(shape[0], groups, -1), (2,)), what="group norm")


@pytest.mark.gpu
@pytest.mark.parametrize("call, message", [
    (lambda m, x: m.group_stats(x, 3, "welford"), "C = 4 must be a positive multiple of groups = 3"),
    (lambda m, x: m.group_stats(x, 0, "welford"), "groups must be at least 1"),
    (lambda m, x: m.group_stats(x.cpu(), 2, "welford"), "x must be a CUDA tensor"),
    (lambda m, x: m.group_stats(x.double(), 2, "welford"), "x must be float32"),
    (lambda m, x: m.group_stats(x.transpose(1, 2), 2, "welford"), "x must be contiguous"),
    (lambda m, x: m.group_stats(x[0, 0], 1, "welford"), "at least 2 dimensions"),
    (lambda m, x: m.group_stats(x, 2, "fast"), "algo must be one of"),
    (lambda m, x: m.group_stats(x[:, :, :0].contiguous(), 2, "welford"), "at least one value"),
    (lambda m, x: m.group_stats(x, 2, "welford", torch.empty(2, 3, device="cuda")),
     r"mean_out must have shape \[2, 2\]"),
    (lambda m, x: m.group_norm(x, 2, torch.ones(3, device="cuda"), None, 1e-5), r"weight must have shape \[4\]"),
    (lambda m, x: m.group_norm(x, 2, None, None, -1.0), "eps must be non-negative"),
])
def test_bad_input_is_named(gs, call, message):
    x = torch.rand(2, 4, 5, device="cuda")
    with pytest.raises(RuntimeError, match=message):
        call(gs, x)


@pytest.mark.compile
@pytest.mark.parametrize("x, groups, message", [
    (torch.ones(2, 3, 4), 2, "x must be a CUDA tensor"),
    (torch.ones(2, 3, 4, dtype=torch.float64), 3, "x must be float32, got float64"),
])
def test_bad_input_without_a_gpu(gs, x, groups, message):
    with pytest.raises(RuntimeError, match=message):
        gs.group_stats(x, groups, "welford")


def test_grouped_reference_and_offset_input():
    """The float64 reference of the checks and the sanitizer's workload: per (sample, group), empty batch too."""
    x = check.rand_at_offset((2, 6, 5), 3, seed=4, low=-1.0, high=3.0)
    assert x.is_contiguous() and x.storage_offset() == 3
    assert torch.equal(x, check.rand([2 * 6 * 5 + 3], seed=4, low=-1.0, high=3.0)[3:].view(2, 6, 5))
    mean, var = V.grouped_reference(x, 3)
    groups = x.double().reshape(2, 3, 10)
    assert torch.allclose(mean, groups.mean(-1)) and torch.allclose(var, groups.var(-1, correction=0))
    assert mean.dtype == torch.float64 and mean.shape == (2, 3)
    empty_mean, empty_var = V.grouped_reference(torch.zeros(0, 4, 5), 2)
    assert empty_mean.shape == empty_var.shape == (0, 2)
