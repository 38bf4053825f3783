"""Roofline counts pinned to the integers of RATIONALES.md (derived in kernelbook.roofline from the
problems' shapes, never pasted there), the placement of recorded variants, and the ceilings kernels."""

from __future__ import annotations

import json
import math

import pytest
import torch

import kernelbook as kb
from kernelbook import check, roofline


def test_p73_conv_counts():
    c = roofline.p73_conv()
    assert c.macs == 9_364_045_824
    assert c.flop == 18_728_091_648 == 2 * c.macs
    assert c.read == 67_108_864 + 18_432 + 256
    assert c.write == 520_224_768
    assert c.bytes == 587_352_320
    assert round(c.intensity, 1) == 31.9


def test_p27_conv_counts():
    c = roofline.p27_conv()
    assert c.macs == 34_392_244_224
    assert c.flop == 68_784_488_448
    assert roofline.p27_parts()["y"] == (1024, 16, 13, 29, 29)
    assert c.write == 179_126_272 * 4  # 716.5 MB of conv output
    assert c.read - (16 * 3 * 64 + 16) * 4 == 201_326_592  # the input: 201 MB


def test_p73_eager_eval_is_three_passes_more():
    parts = roofline.p73_eager(train=False)
    assert list(parts) == ["conv", "batch-norm", "· s"]
    total = roofline.total(parts.values())
    assert round(total.bytes / 1e9, 2) == 2.67
    out = 520_224_768
    assert total.bytes - roofline.p73_fused_eval().bytes == 4 * out + 64 * 4 * 4  # BN and ·s: read + write each
    with_bias = roofline.total(roofline.p73_eager(separate_bias=True).values())
    assert with_bias.bytes - total.bytes == 2 * out


def test_p73_train_strategies():
    conv = roofline.p73_conv()
    mat = roofline.p73_fused_train(strategy="materialise")
    rec = roofline.p73_fused_train(strategy="recompute")
    assert rec.flop - mat.flop == conv.flop                       # the conv computed twice
    assert mat.bytes - rec.bytes == 2 * 520_224_768 - 67_127_552  # output read+written vs input read again
    with pytest.raises(ValueError):
        roofline.p73_fused_train(strategy="both")


def test_p27_fused_and_eager():
    fused = roofline.p27_fused()
    assert fused.write == 1024 * 16 * 4
    assert fused.read == roofline.p27_conv().read + 2 * 16 * 4
    eager = roofline.total(roofline.p27_eager().values())
    assert eager.bytes > 7 * 716_505_088  # conv write, hardswish r+w, GN 2r+w, mean r


def test_small_counts_by_hand():
    assert roofline.conv((1, 1, 4, 4), 1, 3) == roofline.Counts(2 * 4 * 9, 4 * (16 + 9 + 1), 4 * 4, 4 * 9)
    assert roofline.batchnorm((2, 3, 4, 4), train=False) == roofline.Counts(2 * 96, 4 * 96 + 4 * 12, 4 * 96)
    assert roofline.matmul(2, 3, 4).flop == 48
    assert roofline.copy(10).flop == 0 and roofline.copy(10).intensity == 0
    assert roofline.groupnorm((2, 4, 3)).flop == 5 * 24


def test_peaks():
    assert roofline.fp32_peak(132, 1.98e9, "9.0") == pytest.approx(66.9e12, rel=1e-3)
    assert roofline.fp32_peak(108, 1.41e9, "8.0") == pytest.approx(19.5e12, rel=1e-2)  # A100: 64 lanes per SM
    assert roofline.dram_peak(2.619e9, 5120) == pytest.approx(3.35e12, rel=1e-2)     # H100 SXM
    assert roofline.ridge(60e12, 4e12) == 15
    assert roofline.bound_ms(roofline.Counts(10**9, 10**9, 0), 1e12, 1e12) == 1.0


def _record(chapter, timings, **extra):
    return {"chapter": chapter, "timings_ms": {v: {"median": t, "q20": t, "q80": t} for v, t in timings.items()},
            **extra}


def test_points_skip_unknown_and_missing(tmp_path):
    (tmp_path / "02_bn_folding.json").write_text(json.dumps(_record(
        "02_bn_folding", {"eager_eval": 1.6, "ours_fast": 0.5, "something_new": 1.0})))
    (tmp_path / "04_coalescing.json").write_text(json.dumps(_record("04_coalescing", {"x": 1.0})))
    (tmp_path / "05_broken.json").write_text("{not json")
    (tmp_path / "03_roofline.json").write_text(json.dumps(_record(
        "03_roofline", {"ffma_ours": 4.0, "untimed": 1.0},
        counts={"ffma_ours": {"flop": 4 * 10**9, "read": 0, "write": 10**6}, "not_timed_either": {"flop": 1}})))
    recs = roofline.recorded(sorted(tmp_path.glob("*.json")) + [tmp_path / "missing.json"])
    assert sorted(r["chapter"] for r in recs) == ["02_bn_folding", "03_roofline", "04_coalescing"]
    assert len(roofline.recorded(tmp_path.glob("*.json"), exclude=["03_roofline"])) == 2
    df = roofline.points(recs)
    assert set(zip(df.chapter, df.variant, strict=True)) == {
        ("02_bn_folding", "eager_eval"), ("02_bn_folding", "ours_fast"), ("03_roofline", "ffma_ours")}
    ours = df[df.variant == "ours_fast"].iloc[0]
    assert ours.FLOP == roofline.p73_fused_eval().flop and ours.math == "fp32"
    assert df[df.variant == "eager_eval"].iloc[0].math == "tf32"
    assert df[df.variant == "ffma_ours"].iloc[0]["TFLOP/s"] == pytest.approx(1.0)
    bounded = roofline.with_bounds(df, {"fp32": 60e12, "tf32": 300e12}, 4e12)
    assert (bounded["measured / bound"] > 0).all() and set(bounded["bound"]) <= {"compute", "memory"}


def test_points_from_the_recorded_chapters():
    df = roofline.points()
    have = {p.stem for p in kb.records.all_records() if p.parent.name == "h200"}
    if "01_bn_modes" in have:
        assert {"ours_bn_scale_train", "eager_bn_scale"} <= set(df[df.chapter == "01_bn_modes"].variant)
    assert (df["median_ms"] > 0).all() and not df.duplicated(["chapter", "variant"]).any()


# ---------------------------------------------------------------------------------------------- GPU


@pytest.fixture(scope="module")
def ceilings():
    return kb.build.load("ceilings")


@pytest.mark.gpu
@pytest.mark.parametrize("n", [0, 1, 3, 4, 5, 1023, 4096 + 3, 8192 * 5 + 4 * 7 + 3, 8192 * 1100 + 5, (1 << 23) + 2])
@pytest.mark.parametrize("schedule", ["dynamic", "static"])
@pytest.mark.parametrize("unroll", [4, 8])
def test_copy_matches(ceilings, n, schedule, unroll):
    x = check.rand([n], seed=n, device="cuda", low=-3, high=3)
    out = check.poisoned([n], device="cuda")
    ceilings.copy(x, out, schedule, unroll)
    assert torch.equal(out, x)


@pytest.mark.gpu
def test_copy_rejects_misaligned_and_bad_schedule(ceilings):
    x = torch.zeros(33, device="cuda")
    with pytest.raises(RuntimeError, match="16-byte boundary"):
        ceilings.copy(x[1:])
    with pytest.raises(RuntimeError, match="schedule must be"):
        ceilings.copy(x, None, "fast")
    with pytest.raises(RuntimeError, match="unroll must be 4 or 8"):
        ceilings.copy(x, None, "static", 2)


@pytest.mark.gpu
@pytest.mark.parametrize("iters, m, c, blocks", [(0, 1.0, 1.0, 3), (33, 1.0, 2.0, 5), (1000, 1.0, 1.0, 0),
                                                 (100, 0.5, 0.25, 2)])
def test_ffma_matches_the_closed_form(ceilings, iters, m, c, blocks):
    out, clocks = ceilings.ffma(iters, m, c, blocks)
    t = torch.arange(out.numel(), device="cuda", dtype=torch.float64)
    total = torch.zeros_like(t)
    for j in range(ceilings.FFMA_CHAINS):
        a0, cj = (t % 64) + j, c * (j + 1)
        total += a0 + iters * cj if m == 1.0 else m**iters * a0 + cj * (1 - m**iters) / (1 - m)
    check.assert_close(out, total, tol=check.FP32_UNIT_ROUNDOFF * max(1, math.log2(iters + 1)), what="ffma")
    assert clocks.shape == (out.numel() // ceilings.FFMA_THREADS, 2) and bool((clocks >= 0).all())
