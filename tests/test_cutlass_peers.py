"""CUTLASS's TF32/3xTF32 GEMM and 3xTF32 convolutions (the yardsticks) and the mma.sync probe: each checked
against float64, each bad input refused by name. The build-side facts run without a GPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kernelbook as kb
from kernelbook import check
from kernelbook.harness import build

CL, CL3 = torch.channels_last, torch.channels_last_3d


def test_cutlass_kernels_find_cutlass_headers():
    assert build.uses_cutlass("cutlass_gemm") and build.uses_cutlass("cutlass_conv")
    assert not build.uses_cutlass("gemm_3xtf32")
    folder, version = build.cutlass_include()
    assert folder in build.include_paths("cutlass_gemm") and folder not in build.include_paths("scale")
    assert version.count(".") >= 2


@pytest.fixture(scope="module")
def mods():
    if torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("TF32 tensor cores need sm_80 or newer")
    return {n: kb.build.load(n).raw for n in ("cutlass_gemm", "cutlass_conv", "mma_probe")}


@pytest.mark.gpu
@pytest.mark.parametrize("m, k, n", [(1, 4, 4), (37, 20, 12), (129, 68, 260), (513, 1028, 132), (300, 4, 8),
                                     (5, 0, 8)])
def test_cutlass_gemm_every_tile(mods, m, k, n):
    g = mods["cutlass_gemm"]
    a = check.rand([m, k], seed=m + k, device="cuda", low=-1, high=1)
    b = check.rand([k, n], seed=n + 3 * k, device="cuda", low=-1, high=1)
    ref = a.double() @ b.double()
    tol = check.dot_tol(max(k, 1), a.abs().double() @ b.abs().double(), ref) if k else 1e-30
    for i in range(len(g.tiles(3))):
        check.assert_close(g.cutlass_gemm(a, b, 3, i), ref, tol=max(tol, 1e-7), what=f"CUTLASS 3xTF32 tile {i}")
    for i in range(len(g.tiles(1))):
        out = g.cutlass_gemm(a, b, 1, i)
        e = check.report(out, ref, tol=1.0)["rel_err"]
        assert (k == 0 and e == 0) or 1e-6 < e < 1e-2, (i, e)  # TF32's rounding, and no more


@pytest.mark.gpu
@pytest.mark.parametrize("make, message", [
    (lambda: (torch.ones(8, 6, device="cuda"), torch.ones(6, 8, device="cuda")), "multiples of 4"),
    (lambda: (torch.ones(8, 8, device="cuda"), torch.ones(4, 8, device="cuda")), "inner sizes differ"),
    (lambda: (torch.ones(8, 8, device="cuda", dtype=torch.float64), torch.ones(8, 8, device="cuda")),
     "a must be float32"),
    (lambda: (torch.ones(8, 8), torch.ones(8, 8)), "a must be a CUDA tensor"),
    (lambda: (torch.ones(65, device="cuda")[1:].view(8, 8), torch.ones(8, 8, device="cuda")), "16-byte boundary"),
    (lambda: (torch.ones(8, 12, device="cuda").t(), torch.ones(12, 8, device="cuda")), "a must be contiguous"),
])
def test_cutlass_gemm_refuses_bad_input(mods, make, message):
    with pytest.raises(RuntimeError, match=message):
        mods["cutlass_gemm"].cutlass_gemm(*make())
    with pytest.raises(RuntimeError, match="tile must be"):
        mods["cutlass_gemm"].cutlass_gemm(torch.ones(8, 8, device="cuda"), torch.ones(8, 8, device="cuda"), 3, 9)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(2, 8, 20, 24, 64, 3), (3, 4, 9, 7, 8, 3), (1, 12, 5, 5, 4, 5)])
def test_cutlass_conv2d_matches_float64(mods, shape):
    n, c, h, w, k, r = shape
    x = check.rand([n, c, h, w], seed=h, device="cuda", low=-1, high=1)
    wt = check.rand([k, c, r, r], seed=w, device="cuda", low=-1, high=1)
    bias = check.rand([k], seed=k, device="cuda", low=-1, high=1)
    ref = F.conv2d(x.double(), wt.double(), bias.double())
    tol = check.dot_tol(c * r * r, F.conv2d(x.abs().double(), wt.abs().double(), bias.abs().double()), ref)
    for it in (0, 1):
        out = mods["cutlass_conv"].cutlass_conv2d(x.contiguous(memory_format=CL), wt.contiguous(memory_format=CL),
                                                  bias, it)
        assert out.is_contiguous(memory_format=CL)
        check.assert_close(out, ref, tol=max(tol, 1e-7), what=f"CUTLASS conv2d iterator {it}")


@pytest.mark.gpu
def test_cutlass_conv3d_matches_float64(mods):
    x = check.rand([2, 4, 9, 10, 11], seed=1, device="cuda", low=-1, high=1)
    wt = check.rand([16, 4, 3, 4, 2], seed=2, device="cuda", low=-1, high=1)
    bias = check.rand([16], seed=3, device="cuda", low=-1, high=1)
    ref = F.conv3d(x.double(), wt.double(), bias.double())
    tol = check.dot_tol(4 * 24, F.conv3d(x.abs().double(), wt.abs().double(), bias.abs().double()), ref)
    out = mods["cutlass_conv"].cutlass_conv3d(x.contiguous(memory_format=CL3), wt.contiguous(memory_format=CL3),
                                              bias)
    check.assert_close(out, ref, tol=max(tol, 1e-7), what="CUTLASS conv3d")


@pytest.mark.gpu
def test_cutlass_conv_refuses_bad_input(mods):
    cv = mods["cutlass_conv"]
    x = torch.ones(1, 8, 6, 6, device="cuda").contiguous(memory_format=CL)
    w = torch.ones(8, 8, 3, 3, device="cuda").contiguous(memory_format=CL)
    b = torch.ones(8, device="cuda")
    with pytest.raises(RuntimeError, match="x must be channels-last"):
        cv.cutlass_conv2d(x.contiguous(), w, b)
    with pytest.raises(RuntimeError, match="multiples of 4"):
        cv.cutlass_conv2d(torch.ones(1, 3, 6, 6, device="cuda").contiguous(memory_format=CL),
                          torch.ones(8, 3, 3, 3, device="cuda").contiguous(memory_format=CL), b)
    with pytest.raises(RuntimeError, match="bias must have shape"):
        cv.cutlass_conv2d(x, w, torch.ones(4, device="cuda"))
    with pytest.raises(RuntimeError, match="larger than x"):
        cv.cutlass_conv2d(torch.ones(1, 8, 2, 2, device="cuda").contiguous(memory_format=CL), w, b)
    with pytest.raises(RuntimeError, match="iterator must be"):
        cv.cutlass_conv2d(x, w, b, 2)
    with pytest.raises(RuntimeError, match="must be 5-D"):
        cv.cutlass_conv3d(x, w, b)


@pytest.mark.gpu
def test_mma_probe_is_exact_on_tf32_values_and_refuses_bad_shapes(mods):
    pr = mods["mma_probe"]
    a = torch.randint(-8, 8, (16, 8), device="cuda").float()
    b = torch.randint(-8, 8, (8, 8), device="cuda").float()
    c = torch.randint(-64, 64, (16, 8), device="cuda").float()
    for rnd in (False, True):
        assert torch.equal(pr.mma_probe(a, b, c, rnd), a @ b + c)  # small integers: every step exact
    with pytest.raises(RuntimeError, match=r"b must have shape \[8, 8\]"):
        pr.mma_probe(a, c, c)


@pytest.mark.gpu
def test_mma_ceiling_runs_and_reports_its_clock(mods):
    pr = mods["mma_probe"]
    cfg = pr.ceiling_config()
    seeds = torch.randint(0, 2**31 - 1, (6 * cfg["threads"],), dtype=torch.int32, device="cuda")
    out, clocks = pr.mma_ceiling(seeds, 4, 64)
    assert torch.isfinite(out).all() and out.numel() == 4 * cfg["threads"]
    ghz = clocks[:, 0].double() / clocks[:, 1].double()
    assert ((ghz > 0.3) & (ghz < 4.0)).all(), ghz
    with pytest.raises(RuntimeError, match="seeds must have shape"):
        pr.mma_ceiling(seeds[:6], 4, 64)


def test_definition_inputs_and_the_words_said_about_them():
    ins = kb.tensorcore.definition_inputs(device="cpu")
    m, n, k = kb.tensorcore.DEFINITION_SHAPE
    for a, b in ins.values():
        assert a.shape == (m, k) and b.shape == (k, n) and torch.isfinite(a @ b).all()
    a, _ = ins["magnitudes 2^-60 … 2^60"]
    e = torch.log2(a.abs())
    assert e.min() < -55 and e.max() > 55
    a, b = ins["products that cancel"]
    ab = (a.double() @ b.double()).abs()
    assert (ab < 0.05 * (a.abs().double() @ b.abs().double())).all()  # Σab ≪ Σ|ab|
    rows = [{"input": "products that cancel", "path": p, "ratio": r} for p, r in (("v2", 3.0), ("v5", 4.0))]
    rows += [{"input": "a shifted by +1000", "path": "CUTLASS 3xTF32", "ratio": 1.5}]
    assert kb.tensorcore.definition_glue(rows) == {"def_v_cancel": 4.0, "def_cut_shift": 1.5}  # the worst of each
