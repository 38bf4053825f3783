import math

import pytest
import torch

from kernelbook import check


def test_exact_output_has_zero_error():
    x = check.rand([1000], seed=1)
    r = check.report(x, x.double(), tol=0.0)
    assert r == {"rel_err": 0.0, "max_abs_err": 0.0, "tol": 0.0, "unwritten": 0, "passed": True}


def test_one_rounding_is_within_unit_roundoff():
    x = check.rand([10_000], seed=2, low=-3, high=3)
    out = x * 1.7  # one float32 rounding per element
    r = check.report(out, x.double() * 1.7, tol=check.FP32_UNIT_ROUNDOFF)
    assert r["passed"] and 0 < r["rel_err"] <= check.FP32_UNIT_ROUNDOFF


def test_poisoned_buffer_reveals_unwritten_elements():
    x = check.rand([257], seed=3)
    out = check.poisoned(x.shape)
    out[:-3] = x[:-3]
    r = check.report(out, x.double(), tol=1.0)
    assert r["unwritten"] == 3 and not r["passed"]
    assert math.isinf(r["rel_err"])


def test_assert_close_raises_with_the_numbers():
    ref = torch.ones(10, dtype=torch.float64)
    with pytest.raises(AssertionError, match=r"relative error 1\.000e-01"):
        check.assert_close(ref.float() * 1.1, ref, tol=1e-3, what="demo")
    assert check.assert_close(ref.float(), ref, tol=0.0)["passed"]


def test_norm_wise_error_does_not_explode_near_zero():
    ref = torch.tensor([1.0, 2.0, 1e-12], dtype=torch.float64)
    out = ref.float().double() + torch.tensor([0.0, 0.0, 1e-9], dtype=torch.float64)
    assert check.report(out, ref, tol=1e-6)["passed"]


def test_shape_mismatch_is_an_error():
    with pytest.raises(ValueError, match="shape mismatch"):
        check.report(torch.zeros(3), torch.zeros(4, dtype=torch.float64), tol=1.0)


def test_rand_is_seeded_and_fresh():
    a, b, c = check.rand([64], seed=5), check.rand([64], seed=5), check.rand([64], seed=6)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert a.dtype == torch.float32 and 0 <= a.min() and a.max() < 1


def test_empty_tensors_compare_equal():
    assert check.report(torch.zeros(0), torch.zeros(0, dtype=torch.float64), tol=0.0)["passed"]


def test_sweep_asserts_every_case():
    def run(n):
        x = check.rand([n], seed=n)
        out = x.clone()
        if n == 7:
            out[0] += 1
        return out, x.double()

    ok = check.sweep(run, [1, 5, 9], tol=1e-7)
    assert list(ok["case"]) == ["1", "5", "9"] and ok["passed"].all()
    with pytest.raises(AssertionError, match="1 of 3 cases failed"):
        check.sweep(run, [1, 7, 9], tol=1e-7)


def test_normalisation_tol_grows_with_mean_over_spread():
    x = check.rand([4, 3, 8, 8], seed=1)
    base = check.normalisation_tol(x, (0, 2, 3))
    assert 1e-6 <= base < 2e-6  # U[0,1): |μ|/σ ≈ 1.7, so 8u(1 + 1.7) ≈ 1.3e-6
    shifted = check.normalisation_tol(x + 1000, (0, 2, 3))
    assert shifted > 1e-4  # |μ|/σ ≈ 3500


def test_the_pivoted_tolerance_does_not_grow_with_the_mean():
    """Statistics summed about a pivot err by u·|μ − p|: the same tolerance for x and x + 1000."""
    x = check.rand([4, 3, 8, 8], seed=1)
    p = check.batchnorm_pivots(x)
    spread = range(0, 4 * 64, 8)  # the 32 positions: every 8th of a channel's 256 values
    assert torch.allclose(p, x.double().permute(1, 0, 2, 3).reshape(3, -1)[:, list(spread)].mean(dim=1))
    base, shifted = check.pivoted_normalisation_tol(x), check.pivoted_normalisation_tol(x + 1000)
    assert 1e-6 <= base < 2e-6 and abs(shifted / base - 1) < 1e-3
    tiny = torch.tensor([[[[3.0]], [[5.0]]], [[[4.0]], [[7.0]]]])  # (2, 2, 1, 1): the pivot is each channel's mean
    assert torch.allclose(check.batchnorm_pivots(tiny), torch.tensor([3.5, 6.0], dtype=torch.float64))


def test_special_values_in_the_reference_must_be_matched():
    ref = torch.tensor([1.0, float("nan"), float("inf")], dtype=torch.float64)
    assert check.report(torch.tensor([1.0, float("nan"), float("inf")]), ref, tol=0.0)["passed"]
    assert not check.report(torch.tensor([1.0, 0.0, float("inf")]), ref, tol=0.0)["passed"]
    assert not check.report(torch.tensor([1.0, float("nan"), -float("inf")]), ref, tol=0.0)["passed"]


def test_error_message_names_the_error_or_says_accepted():
    def bad():
        raise RuntimeError("scale: x must be float32, got float64\nmore detail")

    assert check.error_message(bad) == "scale: x must be float32, got float64"
    assert check.error_message(lambda: None) == "accepted"


def test_dot_tol_bounds_a_float32_dot_product_and_grows_with_cancellation():
    g = torch.Generator().manual_seed(0)
    x, w = torch.rand(1000, 72, generator=g, dtype=torch.float64), torch.randn(72, generator=g, dtype=torch.float64)
    ref, abs_ref = x @ w, x.abs() @ w.abs()
    tol = check.dot_tol(72, abs_ref, ref)
    assert check.report((x.float() @ w.float()), ref, tol)["passed"]
    assert tol < 72 * check.FP32_UNIT_ROUNDOFF * 100  # not vacuous for this data
    assert check.dot_tol(72, abs_ref, ref * 1e-3) > 100 * tol  # cancellation (small result) loosens it
    assert check.dot_tol(1, torch.ones(3), torch.ones(3)) == 1e-6  # the floor


def test_element_wise_error_explodes_where_norm_wise_does_not():
    # The method chapter's exercise 1: order-1 data with entries near zero, off by one ulp of 1.0
    # everywhere. Element-wise relative error is huge at the near-zero entries; norm-wise stays ~u.
    r = check.rand([1000], seed=7, low=-1, high=1).double()
    r[::100] = 1e-9
    o = r + 2.0**-23
    elementwise = ((o - r).abs() / r.abs()).max().item()
    normwise = check.report(o, r, tol=1e-6)["rel_err"]
    assert normwise < 1e-6 and elementwise > 1e2
