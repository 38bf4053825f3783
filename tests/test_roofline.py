"""Roofline counts pinned to the integers of the problems (derived in kernelbook.roofline from the
problems' shapes, never pasted there), the placement of recorded variants, and the ceilings kernels."""

from __future__ import annotations

import json
import math

import pytest
import torch

import kernelbook as kb
from kernelbook import build, check, roofline


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


def test_p73_eager_eval_both_models():
    """Eager eval P73 as a three-kernel model has it (3 kernels, the bias in the conv) and as the recorded profile
    shows it ran on the H200 (4 kernels: cuDNN's conv without bias, ATen's bias add, BN, · s)."""
    out = 520_224_768
    three = roofline.p73_eager(train=False)
    assert list(three) == ["conv", "batch-norm", "· s"]
    total3 = roofline.total(three.values())
    assert round(total3.bytes / 1e9, 2) == 2.67
    assert total3.bytes - roofline.p73_fused_eval().bytes == 4 * out + 64 * 4 * 4  # BN and ·s: read + write each
    four = roofline.p73_eager(train=False, separate_bias=True)
    assert list(four) == ["conv", "bias add", "batch-norm", "· s"]
    total4 = roofline.total(four.values())
    assert total4.bytes - total3.bytes == 2 * out  # the bias add reads and writes the output once more
    assert round(total4.bytes / 1e9, 2) == 3.71
    assert total4.flop - total3.flop == out // 4  # one add per element (the conv's bias initialised it for free)


def test_bias_and_math_from_kernel_names():
    rec = json.loads((kb.paths.ROOT / "results" / "h200" / "03_roofline.json").read_text())
    names = {}
    for k in rec["kernels"]:
        names.setdefault(k["variant"], []).append(k["kernel"])
    assert roofline.bias_added_separately(names["eager_p73_eval"])
    assert not roofline.bias_added_separately(names["ours_p73_eval"])
    math_of = kb.measure.math_from_kernels
    for v in ("eager_p73_eval", "eager_p27", "eager_p27_conv3d", "ours_p73_eval"):
        assert math_of(names[v]) == "fp32", v  # cuDNN's FFMA implicit GEMM and implicit sgemm
    assert math_of(["sm90_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc"]) == "tf32"
    assert math_of(["sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32_warpgroupsize1x1x1_gmma"]) == "tf32"
    assert math_of(["ampere_sgemm_128x64_nn"]) == "fp32"


def test_placement_reads_declarations_only():
    t = {"median": 1.0, "q20": 1.0, "q80": 1.0}
    rec = {"chapter": "09_new", "timings_ms": {"ours_x": t, "no_flop": t, "untimed_is_skipped": t},
           "variants": {"ours_x": {"provider": "cudnn", "math": "tf32", "counts": {"flop": 10, "bytes": 5}},
                        "no_flop": {"provider": "ours", "math": "fp32", "counts": {"bytes": 5}},
                        "split": {"provider": "eager", "counts": {"flop": 1, "read": 3, "write": 2}}}}
    placed = roofline.placed(rec)
    assert placed == {"ours_x": roofline.Placed(roofline.Counts(10, 5, 0), "tf32", "cudnn")}  # the name says nothing
    rec["timings_ms"]["split"] = t
    assert roofline.placed(rec)["split"] == roofline.Placed(roofline.Counts(1, 3, 2), "fp32", "eager")


def test_every_recorded_variant_declares_its_counts():
    """The roofline, the intro's table and the plots read declarations: every timed variant of every H200
    record declares its provider, arithmetic, FLOP and bytes — but a training step, which no roofline places."""
    for rec in kb.records.on_gpu("h200"):
        steps = {v for v, d in rec.get("variants", {}).items() if d.get("mode") == "step"}
        missing = set(rec["timings_ms"]) - set(roofline.placed(rec)) - steps
        assert not missing, f"{rec['chapter']}: {sorted(missing)} declare no FLOP or bytes: re-record the chapter"


def test_recorded_counts_match_the_models():
    recs = {r["chapter"]: roofline.placed(r) for r in kb.records.on_gpu("h200")}
    y73, p27 = roofline.p73_parts()["y"], roofline.p27_parts()
    n73, n27 = math.prod(y73), math.prod(p27["y"])
    ch4, ch5, ch6 = recs["04_coalescing"], recs["05_variance"], recs["07_capstone_conv_bn_scale"]
    assert ch4["flat"].counts.flop == ch4["addcmul_torch"].counts.flop == 2 * n73 and ch4["copy_torch"].counts.flop == 0
    assert ch5["welford"].counts.flop == roofline.statistics(p27["y"], p27["groups"]).flop == 3 * n27
    assert ch5["ours_groupnorm"].counts.flop == roofline.groupnorm(p27["y"]).flop
    # every training variant is credited with the problem's FLOP; the moments' extra work is in its phases
    assert ch6["ours_train"].counts.flop == roofline.p73_fused_train(strategy="materialise").flop
    assert [c.flop for c in ch6["ours_train"].phases] == [c.flop for c in roofline.p73_train_phases(strategy="moments")]
    assert ch6["ours_train_inplace"].counts.flop == roofline.p73_fused_train(strategy="materialise").flop
    assert ch6["ours_eval"].counts.flop == roofline.p73_conv().flop
    assert ch6["compile_train"].math == "tf32" and ch6["compile_train_fp32"].math == "fp32"


def test_warps_per_subpartition():
    assert roofline.warps_per_subpartition(2048) == 16  # H100/H200: 64 warps per SM over 4 schedulers
    assert roofline.warps_per_subpartition(1024) == 8   # T4


def test_fp32_lanes_per_sm():
    assert roofline.fp32_lanes_per_sm("9.0") == 128 and roofline.fp32_lanes_per_sm("7.5") == 64
    for cap in ("10.3", "11.0", "12.1", "13.0"):  # listed, or newer than the table: 128 by major version
        assert roofline.fp32_lanes_per_sm(cap) == 128 == roofline.FP32_LANES_PER_SM[cap]
    with pytest.raises(ValueError, match="5.0"):
        roofline.fp32_lanes_per_sm("5.0")
    with pytest.raises(ValueError, match="look like"):
        roofline.fp32_lanes_per_sm("sm_90")
    assert roofline.fp32_peak(132, 1e9, "13.0") == 132 * 128 * 2 * 1e9


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
    def decl(provider, math, flop, nbytes):
        return {"provider": provider, "math": math, "counts": {"flop": flop, "bytes": nbytes}}

    fused = roofline.p73_fused_eval()
    (tmp_path / "02_bn_folding.json").write_text(json.dumps(_record(
        "02_bn_folding", {"eager_eval": 1.6, "ours_fast": 0.5, "something_new": 1.0},
        variants={"eager_eval": decl("eager", "tf32", fused.flop, fused.bytes),
                  "ours_fast": decl("ours", "fp32", fused.flop, fused.bytes)})))
    (tmp_path / "04_coalescing.json").write_text(json.dumps(_record("04_coalescing", {"x": 1.0})))  # undeclared
    (tmp_path / "05_broken.json").write_text("{not json")
    (tmp_path / "03_roofline.json").write_text(json.dumps(_record(
        "03_roofline", {"ffma_ours": 4.0, "untimed": 1.0},
        variants={"ffma_ours": decl("ours", "fp32", 4 * 10**9, 10**6), "not_timed": decl("ours", "fp32", 1, 1)})))
    recs = roofline.recorded(sorted(tmp_path.glob("*.json")) + [tmp_path / "missing.json"])
    assert sorted(r["chapter"] for r in recs) == ["02_bn_folding", "03_roofline", "04_coalescing"]
    assert len(roofline.recorded(tmp_path.glob("*.json"), exclude=["03_roofline"])) == 2
    df = roofline.points(recs)
    assert set(zip(df.chapter, df.variant, strict=True)) == {
        ("02_bn_folding", "eager_eval"), ("02_bn_folding", "ours_fast"), ("03_roofline", "ffma_ours")}
    ours = df[df.variant == "ours_fast"].iloc[0]
    assert ours.FLOP == fused.flop and ours.math == "fp32"
    assert df[df.variant == "eager_eval"].iloc[0].math == "tf32"  # declared, not guessed from the name
    assert df[df.variant == "eager_eval"].iloc[0].provider == "eager"
    assert df[df.variant == "ffma_ours"].iloc[0]["TFLOP/s"] == pytest.approx(1.0)
    bounded = roofline.with_bounds(df, {"fp32": 60e12, "tf32": 300e12}, 4e12)
    assert (bounded["measured / bound"] > 0).all() and set(bounded["bound"]) <= {"compute", "memory"}


def test_points_from_the_recorded_chapters():
    df = roofline.points()
    have = {p.stem for p in kb.records.all_records() if p.parent.name == "h200"}
    if "01_bn_modes" in have:
        assert {"ours_bn_scale_train", "eager_bn_scale"} <= set(df[df.chapter == "01_bn_modes"].variant)
    if "04_coalescing" in have:
        assert {"flat", "pixel_loop", "addcmul_torch"} <= set(df[df.chapter == "04_coalescing"].variant)
    if "05_variance" in have:
        assert {"welford", "ours_groupnorm", "torch_groupnorm"} <= set(df[df.chapter == "05_variance"].variant)
    assert (df["median_ms"] > 0).all() and not df.duplicated(["chapter", "variant"]).any()


def test_chapter_tables_from_the_stored_record():
    """The chapter's display helpers on its stored record: rates, copy grid, bounds, Nsight counters."""
    try:
        rec = kb.records.load("03_roofline", "h200")
    except FileNotFoundError:
        pytest.skip("chapter 3 not recorded")
    rec.setdefault("ffma_config", {"blocks": 1056, "iters": 1 << 16, "threads": 256, "chains": 8})
    r = roofline.reference_rates(rec, 1 << 28, 8192)
    assert set(r.ours_bw) == set(roofline.COPY_VARIANTS) and r.bw_best < r.bw_datasheet
    assert 0 < r.ffma_pct <= 100.5 and r.copy_pct > 50 and list(r.peaks) == ["fp32", "tf32"]
    assert r.table().loc["copy_ours", "GB/s"] > 0
    grid, best, gain, hint = roofline.copy_configurations(r.bw)
    assert grid.shape == (3, 4) and len(gain) == 3 and len(hint) == 6 and 0 < best < 200
    per_kernel, tot = roofline.ncu_tables(rec["ncu"])
    assert {"read MB", "written MB", "ns"} <= set(per_kernel.columns)
    pred = {"ours_p73_eval": roofline.p73_fused_eval()}
    assert 0.5 < roofline.predicted_vs_measured(pred, tot).loc["ours_p73_eval", "measured / predicted"] < 2
    assert "TF32" in roofline.math_verdict({"a": "tf32"}) and "FP32" in roofline.math_verdict({"a": "fp32"})
    assert roofline.bound_by(roofline.p73_conv(), 1.0) == "compute-bound"
    assert roofline.counts_dict(roofline.copy(4)) == {"flop": 0, "read": 16, "write": 16, "bytes": 32}
    assert roofline.ffma_counts(rec["ffma_config"])["flop"] == roofline.ffma_flop(rec["ffma_config"])


def test_plot_labels_only_the_headline_points():
    import matplotlib

    matplotlib.use("Agg")
    pts = roofline.points([
        {"chapter": "03_roofline", "timings_ms": {"eager_p73_eval": {"median": 1.01},
                                                  "ours_p73_eval": {"median": 1.0}},
         "variants": {v: {"provider": v.split("_")[0], "math": "fp32",
                          "counts": {"flop": 1e12, "bytes": 1e9}} for v in ("eager_p73_eval", "ours_p73_eval")}}])
    ax = roofline.plot(pts, [roofline.Roof("r", 60e12, 4e12)], labels=roofline.HEADLINE)
    import numpy as np

    to_pt = 72 / ax.figure.dpi
    numbers = {t.get_text(): ax.transData.transform(t.xy) * to_pt + t.xyann for t in ax.texts
               if t.get_text().isdigit()}  # each number's centre, in display points
    keyed = [t.get_text() for t in ax.get_legend().get_texts()]
    assert keyed == ["P73 eval, ours", "P73 eval, eager"] and set(numbers) == {"1", "2"}
    # nearly level points: the two numbers stand apart, and clear of both points
    assert np.linalg.norm(numbers["1"] - numbers["2"]) >= 15
    marks = ax.transData.transform(pts[["FLOP/byte", "TFLOP/s"]].to_numpy()) * to_pt
    assert all(np.linalg.norm(n - m) >= 11 for n in numbers.values() for m in marks)
    # the legends sit outside the plotting area
    box = ax.get_window_extent(ax.figure.canvas.get_renderer())
    legends = [a for a in ax.get_children() if isinstance(a, matplotlib.legend.Legend)]
    assert len(legends) == 4 and not any(box.overlaps(lg.get_window_extent()) for lg in legends)


# ---------------------------------------------------------------------------------------------- GPU


@pytest.fixture(scope="module")
def ceilings():
    return kb.build.load("ceilings")


# (grid, unroll, cache): every compiled copy kernel, on both grids
COPY_VARIANTS = [(g, u, c) for g in ("tiles", "resident") for u in (1, 4, 8) for c in ("default", "streaming")]


@pytest.mark.compile
def test_copy_kernels_keep_no_state_and_carry_the_hints_asked_for():
    """Without a GPU, from the PTX: no copy kernel touches an atomic or a counter (nothing is shared between
    launches, so any stream or graph may run them), none spills, only the streaming ones carry evict-first hints."""
    cpp = (kb.paths.KERNELS / "ceilings.cpp").read_text()
    assert "torch::zeros" not in cpp and "cudaMalloc" not in cpp and "cudaMemset" not in cpp
    for unroll in (1, 4, 8):
        for streaming in (False, True):
            mangled = f"copy_vec4_kernelILi{unroll}ELb{int(streaming)}E"
            ops = build.ptx_instructions("ceilings", mangled)
            assert ops, mangled
            assert not any(op.startswith(("atom.", "red.")) for op in ops), mangled
            assert ("ld.global.cs.v4.f32" in ops) == streaming == ("st.global.cs.v4.f32" in ops), mangled
            assert not any(op.startswith("ld.local") or op.startswith("st.local") for op in ops), mangled


@pytest.mark.compile
@pytest.mark.parametrize("args, message", [
    (("fast", 4, "default"), "grid must be"),
    (("tiles", 2, "default"), "unroll must be 1, 4 or 8"),
    (("tiles", 4, "l2"), "cache must be"),
    (("tiles", 4, "default"), "x must be a CUDA tensor"),
])
def test_copy_rejects_bad_arguments_without_a_gpu(args, message):
    mod = kb.build.load("ceilings", arch="90")
    with pytest.raises(RuntimeError, match=message):
        mod.copy(torch.zeros(8), None, *args)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [0, 1, 3, 4, 5, 1023, 4096 + 3, 8192 * 5 + 4 * 7 + 3, 8192 * 1100 + 5, (1 << 23) + 2])
@pytest.mark.parametrize("grid, unroll, cache", COPY_VARIANTS)
def test_copy_matches(ceilings, n, grid, unroll, cache):
    x = check.rand([n], seed=n, device="cuda", low=-3, high=3)
    out = check.poisoned([n], device="cuda")
    ceilings.copy(x, out, grid, unroll, cache)
    assert torch.equal(out, x)


@pytest.mark.gpu
def test_copy_default_is_one_float4_per_thread_on_the_tiles_grid(ceilings):
    """The defaults are chapter 3's fastest configuration; resident_blocks("copy") sizes its resident grid."""
    x = check.rand([4099], seed=3, device="cuda")
    assert torch.equal(ceilings.copy(x), x)
    props = torch.cuda.get_device_properties(0)
    per_sm = props.max_threads_per_multi_processor // 256  # 256-thread blocks, few registers: threads limit
    assert ceilings.resident_blocks("copy") == props.multi_processor_count * per_sm


@pytest.mark.gpu
def test_copy_on_concurrent_streams(ceilings):
    """Nothing is shared between launches: copies queued on four streams at once stay exact."""
    streams = [torch.cuda.Stream() for _ in range(4)]
    n = (1 << 24) + 3
    xs = [check.rand([n], seed=s, device="cuda") for s in range(len(streams))]
    outs = [[check.poisoned([n], device="cuda") for _ in range(5)] for _ in streams]
    torch.cuda.synchronize()
    for _ in range(5):
        for s, x, row in zip(streams, xs, outs, strict=True):
            with torch.cuda.stream(s):
                for out in row:
                    ceilings.copy(x, out, "resident", 4)
    torch.cuda.synchronize()
    for x, row in zip(xs, outs, strict=True):
        assert all(torch.equal(out, x) for out in row)


@pytest.mark.gpu
@pytest.mark.parametrize("grid", ["tiles", "resident"])
def test_copy_in_a_cuda_graph(ceilings, grid):
    """Captured without allocating, replayed with fresh data between ordinary calls on the same streams."""
    n = 8192 * 300 + 5
    x, y = check.rand([n], seed=1, device="cuda"), torch.empty(n, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up on the capture stream, as torch.cuda.graph asks
        ceilings.copy(x, y, grid)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        ceilings.copy(x, y, grid)
    for i in range(4):
        x.copy_(check.rand([n], seed=10 + i, device="cuda"))
        y.fill_(float("nan"))
        graph.replay()
        assert torch.equal(y, x), i
        z = check.poisoned([n], device="cuda")
        side.wait_stream(torch.cuda.current_stream())  # z's poison and x's data were written on the current stream
        with torch.cuda.stream(side):
            ceilings.copy(x, z, grid)
        torch.cuda.synchronize()
        assert torch.equal(z, x), i


@pytest.mark.gpu
def test_copy_rejects_misaligned_and_bad_grid(ceilings):
    x = torch.zeros(33, device="cuda")
    with pytest.raises(RuntimeError, match="16-byte boundary"):
        ceilings.copy(x[1:])
    with pytest.raises(RuntimeError, match="grid must be"):
        ceilings.copy(x, None, "fast")
    with pytest.raises(RuntimeError, match="unroll must be 1, 4 or 8"):
        ceilings.copy(x, None, "tiles", 2)
    with pytest.raises(RuntimeError, match="cache must be"):
        ceilings.copy(x, None, "tiles", 4, "evict")


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
