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


def test_float64_sums_hold_up_to_the_limit_and_not_beyond():
    x = V.shifted_normal([1e4, 1e6], P27_GROUP, trials=8, seed=9)
    _, ref = V.reference(x)
    _, var = V.onepass_f64(x)
    err = V.rel_error(var, ref)
    assert var.dtype == np.float32 and 1e4 < V.onepass_f64_limit() < 1e6
    assert err[0].max() < 1e-6 and np.median(err[1]) > 1e-6


def test_fp64_cost_table_from_the_programming_guide():
    t = V.fp64_cost_table()
    assert t.loc["H200 SXM", "double / float time"] == 1.0
    assert t.loc["T4", "double / float time"] > 1.5
    assert V.values_per_sm_clock("7.5")["fp64 : fp32"] == 1 / 32


def test_cancellation_picture_counts_the_bits():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    bits = V.cancellation_picture(ax, V.shifted_normal([1e3], 4096, 1, seed=0)[0, 0])
    plt.close(fig)
    assert bits["cancelled_bits"] >= 12 and bits["bits_left"] <= 6  # log2(1e6) ≈ 20 bits gone


def test_sweep_table():
    df = V.sweep([1.0, 1e4], 1000, trials=4, seed=0)
    assert set(df["method"]) == set(V.METHODS)
    assert (df["trials"] == 4).all() and len(df) == 2 * len(V.METHODS)


def test_stats_tolerance_scales_with_the_ratio():
    x = torch.rand(2, 4, 100, dtype=torch.float64) + 1e3
    assert V.stats_tol(x, 2, "onepass") > 1e3 * V.stats_tol(x, 2, "welford_noshift")
    assert V.stats_tol(x, 2, "welford") == 1e-6


# ---------------------------------------------------------------- GPU: kernels/group_stats

ALGOS = ["onepass", "onepass_f64", "twopass", "welford", "welford_noshift"]
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
    assert err["welford"] <= 1e-5 and err["twopass"] <= 1e-5 and err["onepass_f64"] <= 1e-5, err
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
    w = gn.weight.detach().float() if affine else None  # the kernels are forward-only
    b = gn.bias.detach().float() if affine else None
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


# ---------------------------------------------------------------- CPU: the chapter's bookkeeping

class _TorchStandIn:
    """group_stats' interface in float64 PyTorch on any device: runs the chapter's GPU-path helpers on the
    CPU, so their plumbing (shapes, keys, outputs written in place) is tested before a GPU sees them."""

    def group_stats(self, x, groups, algo, mean=None, var=None):
        if groups < 1 or x.shape[1] % groups or x.dtype != torch.float32:
            raise RuntimeError("group_stats: bad input")
        if algo not in ALGOS or not x.is_contiguous() or (x.shape[0] and x[0].numel() == 0):
            raise RuntimeError("group_stats: bad input")
        n = x.shape[0]
        v = x.double().reshape(n, groups, x[0].numel() // groups if n else 1)
        var_, mean_ = torch.var_mean(v, dim=-1, correction=0) if n else (v.sum(-1), v.sum(-1))
        mean = torch.empty(n, groups, device=x.device) if mean is None else mean
        var = torch.empty(n, groups, device=x.device) if var is None else var
        mean.copy_(mean_)
        var.copy_(var_)
        return mean, var

    def group_norm(self, x, groups, weight, bias, eps, out=None):
        if weight is not None and weight.numel() != x.shape[1]:
            raise RuntimeError("group_norm: bad weight")
        y = torch.nn.functional.group_norm(x.double(), groups, weight.double(), bias.double(), eps)
        out = torch.empty_like(x) if out is None else out
        out.copy_(y)
        return (out, *self.group_stats(x, groups, "welford"))


def test_chapter_gpu_helpers_run_on_a_cpu_stand_in():
    gs = _TorchStandIn()
    small = [c for c in V.check_cases(10933) if np.prod(c[0]) < 1e6]
    checks = V.run_checks(gs, ALGOS, small, device="cpu", gn_cases=[((3, 6, 7), 3, 1)])
    assert len(checks) == 2 * len(ALGOS) * len(small) + 1 and all(c["passed"] for c in checks.values())
    acc = V.accuracy_p27_sized(gs, torch.rand(2, 16, 5, 6, 7), 4, ALGOS)
    assert set(acc) == {"P27 real", "P27 real + 1000", "N(0,1) + 1e4"}
    assert set(acc["P27 real"]) == {"max μ/σ", "onepass negatives", *ALGOS}
    bad, empty_shape = V.bad_inputs(gs, device="cpu")
    assert empty_shape == [0, 2] and bad["groups = 0"] != "accepted"
    fns = V.timed_fns(gs, torch.rand(2, 16, 5, 6, 7), 4, ALGOS)
    assert set(fns) == {*V.PASSES, "welford_n1"}
    for fn in fns.values():
        fn()


def test_sweep_summary_quotes_what_the_chapter_says():
    ratios = 10 ** np.arange(0, 6.01, 0.25)
    methods = dict(V.METHODS, onepass_compensated=lambda x: V.onepass(x, compensated=True))
    df = V.sweep(ratios, 2000, 4, seed=0, methods=methods)
    med, worst, glued, table = V.sweep_summary(df, ratios, 4)
    assert glued["neg_total"] > 0 and 0.5 < glued["noshift_slope"] < 1.5
    assert len(table) == len(ratios[::4]) and "one-pass < 0" in table
    assert V.ratio_quantiles(np.array([1.0, 2.0, 3.0]))["median"] == 2.0
