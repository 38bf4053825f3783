"""Counts of P73's three training-mode strategies (chapter 7): in place, conv twice, and from the input's moments."""

from __future__ import annotations

import pytest

from kernelbook import roofline


def test_patch_moments_by_hand():
    # 1 image, 2 channels, 4×5 plane, 3×3 patches: every value takes part in C_in·k·(2k − 1) = 2·3·5 products
    c = roofline.patch_moments((1, 2, 4, 5), 3)
    assert c.macs == 40 * 2 * 3 * 5
    assert c.flop == 2 * c.macs + 40                   # one add per value for the first moments
    assert c.read == 4 * 40                            # the input, once
    assert c.write == 4 * (18 + 18 * 18)               # m and Σ of the 18-value patches


def test_p73_moments_counts():
    m = roofline.patch_moments((128, 8, 128, 128), 3)
    assert m.macs == 2_013_265_920                     # 24 (i, d1) work items × 40 accumulators per position
    assert m.read == 67_108_864
    moments = roofline.p73_fused_train(strategy="moments")
    conv = roofline.p73_conv()
    assert moments.flop == conv.flop + m.flop and moments.macs == conv.macs + m.macs
    assert moments.read - conv.read == 67_108_864 + 4 * 4 * 64 + 8  # the input once more; γ, β, running stats
    mat = roofline.p73_fused_train(strategy="materialise")
    rec = roofline.p73_fused_train(strategy="recompute")
    assert mat.bytes - moments.bytes == 2 * 520_224_768 - 67_108_864 - m.write  # y read + written vs x read again
    assert rec.flop - moments.flop == conv.flop + 5 * 130_056_192 - m.flop       # a second conv vs the moments
    assert moments.flop < rec.flop and moments.bytes < mat.bytes


def test_strategy_names():
    assert roofline.P73_TRAIN_STRATEGIES == ("materialise", "recompute", "moments")
    with pytest.raises(ValueError, match="moments"):
        roofline.p73_fused_train(strategy="welford")


def test_the_phases_bounds_add_and_never_undercut_the_totals():
    """A grid-wide dependency (statistics before normalisation) serialises a strategy's phases: its bound is the
    sum of theirs — in place: the convolution (compute-bound) plus a read and a write of the output."""
    peak, bw = 65e12, 4.28e12
    for s in roofline.P73_TRAIN_STRATEGIES:
        phases = roofline.p73_train_phases(strategy=s)
        assert roofline.total(phases) == roofline.p73_fused_train(strategy=s)
        assert roofline.phased_bound_ms(phases, peak, bw) >= roofline.bound_ms(roofline.total(phases), peak, bw)
    conv, apply = roofline.p73_train_phases(strategy="materialise")
    out_bytes = 4 * 128 * 64 * 126 * 126
    assert apply.bytes == 2 * out_bytes + 4 * 6 * 64 + 16
    expected = 1e3 * conv.flop / peak + 1e3 * apply.bytes / bw  # conv compute-bound, apply memory-bound
    assert abs(roofline.phased_bound_ms([conv, apply], peak, bw) - expected) < 1e-9
    c = roofline.p73_train_counts("moments")  # credited with the problem's FLOP, bounded by its own phases
    assert c["flop"] == roofline.p73_fused_train(strategy="materialise").flop
    assert c["bytes"] == roofline.p73_fused_train(strategy="moments").bytes and len(c["phases"]) == 2
