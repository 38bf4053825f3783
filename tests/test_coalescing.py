"""Chapter 4: the coalescing model on hand-checkable cases, and the affine kernels of kernels/mappings.cu.

Model tests run anywhere; kernel tests are marked ``gpu`` (and ``compile`` for the no-GPU argument checks).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import kernelbook as kb
from kernelbook import check
from kernelbook import coalescing as co

P73_OUT = (128, 64, 126, 126)
MAPPINGS = list(co.affine_schemes((1, 4, 4, 4)))
VEC4 = ("flat_vec4", "flat_vec4_x4", "flat_vec4_x4_i32")  # float4 over the flat index: numel % 4 == 0, 16-byte aligned


# --- one warp, by hand ---------------------------------------------------------------------------------

def test_32_aligned_floats_touch_4_sectors_1_line():
    r = co.warp_request(np.arange(32) * 4)
    assert (r["sectors"], r["lines"], r["bytes_used"], r["bytes_fetched"]) == (4, 1, 128, 128)
    assert r["efficiency"] == 1.0


def test_stride_2_touches_8_sectors():
    r = co.warp_request(np.arange(32) * 8)
    assert (r["sectors"], r["lines"], r["efficiency"]) == (8, 2, 0.5)


def test_misaligned_start_touches_5_sectors():
    r = co.warp_request(np.arange(32) * 4 + 4)  # one float past a 128-byte boundary
    assert (r["sectors"], r["lines"], r["bytes_fetched"]) == (5, 2, 160)


def test_float4_per_lane_touches_16_sectors():
    r = co.warp_request(np.arange(32) * 16, elem_bytes=16)
    assert (r["sectors"], r["lines"], r["bytes_used"], r["efficiency"]) == (16, 4, 512, 1.0)


def test_partial_warp_and_inactive_lanes():
    r = co.warp_request(np.arange(24) * 4)  # a 24-lane warp: 96 bytes, 3 sectors
    assert (r["lanes"], r["sectors"], r["lines"]) == (24, 3, 1)
    act = np.arange(32) % 2 == 0  # every other lane masked off: still 4 sectors for 64 bytes used
    r = co.warp_request(np.arange(32) * 4, active=act)
    assert (r["lanes"], r["sectors"], r["bytes_used"], r["efficiency"]) == (16, 4, 64, 0.5)


def test_broadcast_and_scattered():
    assert co.warp_request(np.zeros(32, dtype=int))["sectors"] == 1  # every lane reads the same float
    assert co.warp_request(np.arange(32) * 4096)["sectors"] == 32    # one sector per lane


def test_an_element_straddling_a_sector_counts_both():
    assert co.warp_request([30], elem_bytes=4)["sectors"] == 2
    assert co.warp_request([120], elem_bytes=16)["lines"] == 2
    with pytest.raises(ValueError, match="1 to 32 bytes"):
        co.warp_request([0], elem_bytes=64)


# --- launches ------------------------------------------------------------------------------------------

def test_warps_are_formed_x_fastest_with_a_partial_last_warp():
    launch = co.Launch(1, (18, 7, 4))
    assert (launch.threads_per_block, launch.warps_per_block) == (504, 16)
    t = co.threads(launch)
    assert t.tid.shape == (16, 32)
    assert t.exists[-1].sum() == 24 and t.exists[:-1].all()
    assert (t.tx[0, :20] == np.r_[np.arange(18), 0, 1]).all() and t.ty[0, 18] == 1


def test_analyse_exact_counts_for_a_contiguous_copy():
    def copy(t):
        i = t.gid
        return [co.Access("x", "ld", i, i < 1000), co.Access("y", "st", i, i < 1000)]

    a = co.analyse(copy, co.Launch(4, 256))  # 1024 threads, 1000 active: the last warp has 8 lanes
    tot = a.totals()
    assert tot.loc["ld", "requests"] == 32 and tot.loc["ld", "sectors"] == 31 * 4 + 1
    assert tot.loc["st", "bytes_used"] == 4000 and not a.sampled


def test_warps_with_no_active_lane_send_no_request():
    a = co.analyse(lambda t: [co.Access("x", "ld", t.gid, t.gid < 40)], co.Launch(1, 256))
    assert a.totals().loc["ld", "requests"] == 2


def test_p73_mappings_per_request():
    s = co.affine_schemes((4, 64, 126, 126))
    got = {k: co.analyse(v.mapping, v.launch).summary() for k, v in s.items()}
    assert got["flat"]["ld_sectors_per_request"] == 4.0
    assert got["flat_vec4"]["ld_sectors_per_request"] == 16.0
    assert got["channel_fastest"]["ld_sectors_per_request"] == 32.0
    for k, g in got.items():  # every element is loaded and stored exactly once
        assert g["ld_sectors"] == g["st_sectors"], k
    # A plane is 126·126·4 = 63,504 bytes = 496 lines + 16 bytes: contiguous warps start off-boundary.
    assert 4.0 < got["pixel_loop"]["ld_sectors_per_request"] < 5.0
    assert got["tile_8x8x8"]["ld_sectors_per_request"] > got["tile_7x18x4"]["ld_sectors_per_request"] > 5
    # The controls: the same sectors as the mapping they control, per request of the same width.
    assert got["channel_fastest_smem"]["ld_sectors_per_request"] == 32.0
    assert got["flat_x4"]["ld_sectors_per_request"] == 4.0
    assert got["flat_x4"]["ld_requests"] == got["flat"]["ld_requests"]
    assert got["flat_vec4_x4"]["ld_sectors_per_request"] == 16.0
    assert got["flat_vec4_x4"]["ld_requests"] == got["flat_vec4"]["ld_requests"]
    assert 16.0 < got["planes_vec4_x4"]["ld_sectors_per_request"] < 17.0  # planes start off the line grid


def test_planes_on_aligned_planes_are_perfect():
    s = co.affine_schemes((2, 4, 32, 32))["planes_vec4_x4"]  # a plane of 4 KiB: 32 whole lines
    got = co.analyse(s.mapping, s.launch).summary()
    assert got["ld_sectors_per_request"] == 16.0 and got["efficiency"] == 1.0
    s = co.affine_schemes((2, 4, 5, 7))["planes_vec4_x4"]  # H·W % 4 != 0: scalar floats
    assert co.analyse(s.mapping, s.launch).table()["elem_bytes"].eq(4).all()
    s = co.affine_schemes((2, 4, 32, 32), base=4)["planes_vec4_x4"]  # misaligned: scalar floats too
    assert co.analyse(s.mapping, s.launch).table()["elem_bytes"].eq(4).all()


def test_model_tables_cover_every_mapping():
    assert list(co.KERNELS) == MAPPINGS and list(co.LOADED_AHEAD) == MAPPINGS


def test_lane_sectors():
    sectors, touch = co.lane_sectors(np.arange(32) * 4)
    assert len(sectors) == 4 and (touch.sum(axis=1) == 1).all() and (touch.sum(axis=0) == 8).all()
    sectors, touch = co.lane_sectors(np.arange(32) * 16, elem_bytes=16)
    assert len(sectors) == 16 and (touch.sum(axis=0) == 2).all()
    sectors, touch = co.lane_sectors([30, 64], active=[True, False])  # straddles; second lane off
    assert sectors.tolist() == [0, 1] and touch.tolist() == [[True, True], [False, False]]


def test_resident_threads_and_littles_law():
    assert co.resident_threads(256, 18) == 2048
    assert co.resident_threads(256, 40) == 1536  # 40 × 32 = 1,280 registers per warp: 6 blocks
    assert co.resident_threads(504, 18) == 2016  # 4 blocks of 504 threads
    launch = co.affine_schemes((1, 1, 1, 4))["flat"].launch
    t = co.in_flight({"flat": launch}, {"flat_kernel": 18}, {"flat": 1.0}, read_bytes=1e9, sms=2)
    # 2 SMs × 2,048 threads × 4 bytes in flight, 1 GB read in 1 ms: 16,384 B / 1e12 B/s = 16.4 ns
    assert t.loc["flat", "latency µs"] == pytest.approx(2 * 2048 * 4 / 1e12 * 1e6)


def test_sampling_agrees_with_the_exact_count():
    s = co.affine_schemes((4, 64, 126, 126))["tile_8x8x8"]
    exact = co.analyse(s.mapping, s.launch).summary()
    sampled = co.analyse(s.mapping, s.launch, budget=1 << 18, seed=1)
    assert sampled.sampled
    assert abs(sampled.summary()["ld_sectors_per_request"] / exact["ld_sectors_per_request"] - 1) < 0.01
    assert abs(sampled.summary()["ld_requests"] / exact["ld_requests"] - 1) < 0.02


def test_composition_of_the_7x18x4_block():
    s = co.affine_schemes(P73_OUT)["tile_7x18x4"]
    comp = co.composition(s.launch, s.coords)
    assert len(comp) == 16 and comp["lanes"].iloc[-1] == 24
    assert comp.index[comp["c_distinct"] > 1].tolist() == [3, 7, 11]  # 126 threads per channel slice


def test_8x8x8_idles_3_percent():
    s = co.affine_schemes((1, 64, 126, 126))["tile_8x8x8"]
    comp = co.composition(s.launch, s.coords, blocks=range(s.launch.blocks))
    idle = 1 - comp["active"].sum() / comp["lanes"].sum()
    assert idle == pytest.approx(1 - 126**2 / 128**2)


def test_mapping_covers_every_element_once():
    shape = (2, 5, 13, 37)
    numel = int(np.prod(shape))
    for name, s in co.affine_schemes(shape).items():
        if name in VEC4:
            continue  # needs numel % 4 == 0
        t = co.threads(s.launch)
        hits = np.zeros(numel, dtype=int)
        for acc in s.mapping(t):
            if acc.kind == "st":
                act = t.exists & np.broadcast_to(acc.active, t.tid.shape)
                np.add.at(hits, np.broadcast_to(acc.index, t.tid.shape)[act], 1)
        assert (hits == 1).all(), name


def test_footprint_plot_draws():
    import matplotlib

    matplotlib.use("Agg")
    ax = co.plot_footprint(np.arange(32) * 4 + 16)
    assert "5 sectors" in ax.get_title()


# --- the kernels ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def mod():
    return kb.build.load("mappings", arch=None if kb.gpu() else "90")


def _coeffs(c, seed):
    return (check.rand([c], seed=seed, low=-2, high=2), check.rand([c], seed=seed + 1, low=-1, high=1))


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(3, 5, 7, 9), (2, 64, 126, 126), (1, 1, 1, 1), (2, 3, 13, 37), (1, 9, 130, 250),
                                   (4, 3, 5, 7), (0, 3, 4, 4)])
@pytest.mark.parametrize("mapping", MAPPINGS)
def test_every_mapping_matches_float64(mod, shape, mapping):
    numel = int(np.prod(shape))
    if mapping in VEC4 and numel % 4:
        pytest.skip(f"{mapping} needs numel % 4 == 0 (checked in test_bad_input_is_named)")
    c = shape[1]
    x = check.rand(shape, seed=sum(shape), device="cuda", low=-1, high=1)
    a, b = _coeffs(c, seed=c)
    out = check.poisoned(shape, device="cuda")
    y = mod.affine(x, a, b, mapping, out)
    assert y.data_ptr() == out.data_ptr()
    ref = x.double() * a.double().cuda().view(1, c, 1, 1) + b.double().cuda().view(1, c, 1, 1)
    check.assert_close(out, ref, tol=check.FP32_UNIT_ROUNDOFF, what=f"{mapping} {shape}")


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(2, 3, 8, 8), (2, 3, 5, 7), (1, 2, 64, 128)])  # H·W % 4: 0, 3, 0
@pytest.mark.parametrize("offset", [1, 2, 3])
@pytest.mark.parametrize("mapping", [m for m in MAPPINGS if m not in VEC4])
def test_misaligned_input_and_output(mod, shape, offset, mapping):
    """Views that start off the 16-byte grid: planes_vec4_x4 must take its scalar path."""
    c = shape[1]
    x = check.rand_at_offset(shape, offset, seed=offset, device="cuda", low=-1)
    out = torch.full((int(np.prod(shape)) + 4 - offset,), float("nan"), device="cuda")
    out = out[4 - offset:].view(shape)
    a, b = _coeffs(c, seed=c)
    mod.affine(x, a, b, mapping, out)
    ref = x.double() * a.double().cuda().view(1, c, 1, 1) + b.double().cuda().view(1, c, 1, 1)
    check.assert_close(out, ref, tol=check.FP32_UNIT_ROUNDOFF, what=f"{mapping} offset {offset}")


@pytest.mark.gpu
def test_runs_on_the_current_stream(mod):
    x = check.rand((2, 8, 33, 35), seed=3, device="cuda")
    a, b = _coeffs(8, seed=4)
    out = torch.empty_like(x)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        mod.affine(x, a, b, "tile_7x18x4", out)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        mod.affine(x, a, b, "tile_7x18x4", out)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    ref = x.double() * a.double().cuda().view(1, 8, 1, 1) + b.double().cuda().view(1, 8, 1, 1)
    check.assert_close(out, ref, tol=check.FP32_UNIT_ROUNDOFF)


@pytest.mark.gpu
@pytest.mark.parametrize("call, message", [
    (lambda m, x, a, b: m.affine(x, a, b, "diagonal"), "unknown mapping 'diagonal'"),
    (lambda m, x, a, b: m.affine(x[0], a, b, "flat"), "x must be 4-D"),
    (lambda m, x, a, b: m.affine(x.double(), a, b, "flat"), "x must be float32"),
    (lambda m, x, a, b: m.affine(x.transpose(2, 3), a, b, "flat"), "x must be contiguous"),
    (lambda m, x, a, b: m.affine(x.cpu(), a, b, "flat"), "x must be a CUDA tensor"),
    (lambda m, x, a, b: m.affine(x, a.cuda(), b, "flat"), "a must be a CPU tensor"),
    (lambda m, x, a, b: m.affine(x, a, b[:2], "flat"), r"b must have shape \[4\]"),
    (lambda m, x, a, b: m.affine(x, a, b, "flat", torch.empty(3, device="cuda")), "out must have shape"),
    (lambda m, x, a, b: m.affine(x, a, b, "flat", x), "must not overlap"),
    (lambda m, x, a, b: m.affine(torch.rand(1, 3, 3, 3, device="cuda"), a[:3], b[:3], "flat_vec4"), "divisible by 4"),
    (lambda m, x, a, b: m.affine(torch.rand(1, 3, 3, 3, device="cuda"), a[:3], b[:3], "flat_vec4_x4"),
     "flat_vec4_x4 needs a number of elements divisible by 4"),
    (lambda m, x, a, b: m.affine(torch.empty(1, 300, 2, 2, device="cuda"), torch.ones(300), torch.ones(300), "flat"),
     "1 to 256 channels"),
    (lambda m, x, a, b: m.affine(torch.empty(1, 1, 1, 300, device="cuda"), torch.ones(1), torch.ones(1),
                                 "rows_w_x4"), "W must be at most 256"),
])
def test_bad_input_is_named(mod, call, message):
    x = torch.rand(2, 4, 5, 6, device="cuda")
    a, b = torch.ones(4), torch.zeros(4)
    with pytest.raises(RuntimeError, match=message):
        call(mod, x, a, b)


@pytest.mark.gpu
def test_32_bit_indexing_refuses_a_tensor_of_2_to_the_31_elements(mod):
    free, _ = torch.cuda.mem_get_info()
    if free < 9 * 2**30:
        pytest.skip("needs 8 GiB of free GPU memory for a tensor of 2^31 floats")
    x = torch.empty(1, 1, 1, 2**31, device="cuda")
    with pytest.raises(RuntimeError, match="fewer than 2\\^31 elements"):
        mod.affine(x, torch.ones(1), torch.zeros(1), "flat_vec4_x4_i32")
    del x
    torch.cuda.empty_cache()


@pytest.mark.gpu
@pytest.mark.parametrize("mapping", VEC4)
def test_vec4_rejects_a_misaligned_view(mod, mapping):
    buf = torch.rand(1 + 2 * 4 * 4 * 4, device="cuda")
    x = buf[1:].view(2, 4, 4, 4)
    with pytest.raises(RuntimeError, match="16-byte boundaries"):
        mod.affine(x, torch.ones(4), torch.zeros(4), mapping)


@pytest.mark.compile
def test_bad_input_without_a_gpu(mod):
    with pytest.raises(RuntimeError, match="x must be a CUDA tensor"):
        mod.affine(torch.ones(2, 3, 4, 4), torch.ones(3), torch.ones(3), "flat")
    assert mod.mappings() == MAPPINGS


@pytest.mark.compile
def test_config_is_the_models(mod):
    cfg = mod.config()
    assert (cfg["flat_threads"], cfg["unroll"], cfg["max_channels"]) == (co.FLAT_THREADS, co.UNROLL, 256)
    assert co.PLANE_CHUNK == cfg["flat_threads"] * cfg["unroll"] * 4
