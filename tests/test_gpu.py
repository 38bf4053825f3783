"""GPU behaviour of the method chapter's kernel and of the toolkit's timing and profiling.

Marked ``gpu``: skipped without CUDA. Run on a GPU with ``pytest -m gpu``.
"""

from __future__ import annotations

import pytest
import torch

import kernelbook as kb
from kernelbook import check

pytestmark = pytest.mark.gpu

SIZES = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 31, 32, 33, 255, 256, 257, 1023, 1024, 1025, 4095, 4097,
         (1 << 20) - 1, (1 << 20) + 3, 3 * (1 << 22) + 2]


@pytest.fixture(scope="module")
def scale():
    return kb.build.load("scale")


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("x_off, out_off", [(0, 0), (1, 0), (0, 1), (2, 2), (3, 1)])
def test_scale_matches_float64(scale, n, x_off, out_off):
    x = check.rand([n + x_off], seed=n * 7 + x_off, device="cuda", low=-4, high=4)[x_off:]
    out = check.poisoned([n + out_off], device="cuda")[out_off:]
    s = -0.37
    scale.scale_out(x, s, out)
    s32 = torch.tensor(s, dtype=torch.float32).item()  # the kernel multiplies by s rounded to float32
    check.assert_close(out, x.double() * s32, tol=check.FP32_UNIT_ROUNDOFF, what=f"scale n={n}")


def test_scale_allocating_form_and_shapes(scale):
    x = check.rand([3, 5, 7], seed=11, device="cuda")
    y = scale.scale(x, 3.0)  # 3.0 and 5.0 below are exact in float32
    assert y.shape == x.shape and y.dtype == torch.float32
    check.assert_close(y, x.double() * 3.0, tol=check.FP32_UNIT_ROUNDOFF)


def test_scale_runs_on_the_current_stream(scale):
    """Graph capture happens on a side stream: a launch on the legacy default stream would break it."""
    x = check.rand([1 << 20], seed=12, device="cuda")
    out = torch.empty_like(x)
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        scale.scale_out(x, 2.0, out)  # warm-up on the side stream
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        scale.scale_out(x, 5.0, out)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    check.assert_close(out, x.double() * 5.0, tol=check.FP32_UNIT_ROUNDOFF)


@pytest.mark.parametrize("make, message", [
    (lambda: (torch.ones(8, device="cuda", dtype=torch.float64), None), "x must be float32"),
    (lambda: (torch.ones(4, 2, device="cuda").t(), None), "x must be contiguous"),
    (lambda: (torch.ones(8, device="cuda"), torch.empty(7, device="cuda")), r"out must have shape \[8\], got \[7\]"),
    (lambda: (torch.ones(8, device="cuda"), torch.empty(8)), "out must be a CUDA tensor"),
    (lambda: (torch.ones(8, device="cuda"), torch.empty(8, device="cuda", dtype=torch.half)),
     "out must be float32"),
])
def test_scale_bad_input(scale, make, message):
    x, out = make()
    with pytest.raises(RuntimeError, match=message):
        scale.scale(x, 2.0) if out is None else scale.scale_out(x, 2.0, out)


def test_scale_rejects_overlap(scale):
    buf = torch.zeros(100, device="cuda")
    with pytest.raises(RuntimeError, match="must not overlap"):
        scale.scale_out(buf[:60], 2.0, buf[40:])


def test_bench_and_profile_see_our_kernel(scale):
    x = torch.rand(1 << 24, device="cuda")
    t = kb.timing.bench(lambda: scale.scale(x, 2.0), "test", "scale_ours")
    assert 0 < t["q20"] <= t["median"] <= t["q80"]
    table = kb.profile.kernels({"scale_ours": lambda: scale.scale(x, 2.0), "scale_torch": lambda: x * 2.0}, "test")
    ours = table[table.variant == "scale_ours"]
    assert len(ours) == 1 and "scale_vec4_kernel" in ours.kernel.iloc[0] and ours.launches.iloc[0] == 1
    assert (table.variant == "scale_torch").sum() == 1


def test_live_record_has_provenance():
    rec = kb.records.new("00_method", ["scale"])
    assert rec["live"] and rec["provenance"]["gpu"] == torch.cuda.get_device_name()
    assert set(rec["provenance"]["kernels"]) == {"kernels/scale.cu", "kernels/scale.cpp", "kernels/scale.h",
                                                 "kernels/torch_checks.h"}


def test_kernels_run_in_grad_mode_and_refuse_a_backward_by_name(scale):
    """In grad mode a kernel without a backward runs (same values) and its output joins the graph with a
    backward that raises, naming the op; under no_grad nothing is recorded. Never silently detached."""
    x = torch.ones(8, device="cuda", requires_grad=True)
    y = scale.scale(x, 2.0)
    assert torch.equal(y.detach(), torch.full((8,), 2.0, device="cuda")) and y.grad_fn is not None
    with pytest.raises(RuntimeError, match="scale: this kernel has no backward"):
        y.sum().backward()
    out = torch.empty(8, device="cuda")
    assert scale.scale_out(x, 3.0, out) is out and out.grad_fn is not None  # out= filled in place
    with torch.no_grad():
        z = scale.scale(x, 2.0)
    assert z.grad_fn is None and not z.requires_grad and x.grad is None


def test_sm_clock_is_measured_on_the_gpu():
    mhz = kb.measure.sm_clock_mhz()
    assert 300 <= mhz <= 3500, f"{mhz} MHz is no SM clock"
