"""The book's two benchmark problems (KernelBench level 2), as their reference modules and inputs.

P73: y = BatchNorm2d(Conv2d(x)) * 2.0, in training mode (the benchmark never calls .eval()).
P27: y = mean over (D, H, W) of GroupNorm(hardswish(Conv3d(x))).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


class P73(nn.Module):
    """Conv2d → BatchNorm2d → multiply by a Python float (KernelBench level 2, problem 73)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, scaling_factor: float):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.bn = nn.BatchNorm2d(out_channels)
        self.scaling_factor = scaling_factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.conv(x)) * self.scaling_factor


class P27(nn.Module):
    """Conv3d → HardSwish → GroupNorm → mean over D, H, W (KernelBench level 2, problem 27)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, num_groups: int = 4,
                 bias: bool = True):
        super().__init__()
        self.conv = nn.Conv3d(in_channels, out_channels, kernel_size, bias=bias)
        self.group_norm = nn.GroupNorm(num_groups, out_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.hardswish(self.conv(x))
        return self.group_norm(x).mean(dim=[2, 3, 4])


@dataclass(frozen=True)
class Problem:
    name: str
    module: type[nn.Module]
    init_args: tuple
    input_shape: tuple[int, ...]

    def model(self, seed: int = 0) -> nn.Module:
        """The reference module, initialised under ``seed`` as the benchmark does (training mode)."""
        torch.manual_seed(seed)
        return self.module(*self.init_args)

    def inputs(self, seed: int, batch: int | None = None, device: str | torch.device = "cpu") -> torch.Tensor:
        """``torch.rand`` of the benchmark's shape (or a smaller ``batch``), seeded."""
        shape = (batch or self.input_shape[0], *self.input_shape[1:])
        g = torch.Generator(device="cpu").manual_seed(seed)
        return torch.rand(shape, generator=g).to(device)


P73_CONV_BN_SCALE = Problem("73_Conv2d_BatchNorm_Scaling", P73, (8, 64, 3, 2.0), (128, 8, 128, 128))
P27_CONV3D_GN_MEAN = Problem("27_Conv3d_HardSwish_GroupNorm_Mean", P27, (3, 16, 4), (1024, 3, 16, 32, 32))


def load_solution(problem: Problem):
    """Import ``solutions/<problem.name>.py``, the stand-alone submission (its extension compiles on
    first use)."""
    import importlib.util

    from ..harness.paths import ROOT

    path = ROOT / "solutions" / f"{problem.name}.py"
    spec = importlib.util.spec_from_file_location(f"solution_{problem.name.split('_')[0]}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def kernelbench_check(problem: Problem, make_new, device: str = "cuda", batch: int | None = None,
                      trials: int = 5, tol: float = 1e-2) -> tuple[list[dict], nn.Module, nn.Module]:
    """The benchmark's own check: reference and candidate built after the same seed, ``trials`` seeded
    ``torch.rand`` inputs, both modules reused across trials in training mode under ``no_grad``, with
    PyTorch's default precision settings, compared by ``torch.allclose(atol=rtol=tol)``.

    Returns one row per trial and the two modules (for comparing their state afterwards).
    """
    from ..harness import precision

    precision.defaults()
    torch.manual_seed(42)
    ref = problem.module(*problem.init_args).to(device)
    torch.manual_seed(42)
    new = make_new().to(device)
    shape = (batch or problem.input_shape[0], *problem.input_shape[1:])
    rows = []
    with torch.no_grad():
        for trial in range(trials):
            torch.manual_seed(trial)
            x = torch.rand(shape, device=device)
            a, b = ref(x), new(x)
            rows.append({"trial": trial, "same shape": a.shape == b.shape,
                         "allclose": a.shape == b.shape and bool(torch.allclose(b, a, atol=tol, rtol=tol)),
                         "max abs diff": float((a - b).abs().max()) if a.shape == b.shape else float("inf")})
    return rows, ref, new


def kernelbench_timing(problem: Problem, make_new, device: str = "cuda", batch: int | None = None,
                       warmup: int = 3, trials: int = 100, tol: float = 1e-2) -> dict:
    """The benchmark's timing step, as its evaluation source runs it: reference and candidate built after the
    same seed and moved with ``.to(device=device, dtype=torch.float32)``, one seeded ``torch.rand`` input,
    autograd **on** with every parameter requiring grad, ``model(x)`` called ``warmup`` times and then
    ``trials`` times, each after an L2 flush and between its own pair of CUDA events; the mean in ms.

    Returns both means, whether the last outputs agree (``torch.allclose(atol=rtol=tol)``), and whether ours
    carried a ``grad_fn`` (a drop-in module joins the autograd graph as the reference does).
    """
    from ..harness import precision

    precision.defaults()
    torch.manual_seed(42)
    ref = problem.module(*problem.init_args).to(device=device, dtype=torch.float32)
    torch.manual_seed(42)
    new = make_new().to(device=device, dtype=torch.float32)
    shape = (batch or problem.input_shape[0], *problem.input_shape[1:])
    torch.manual_seed(0)
    x = torch.rand(shape, device=device)
    flush = torch.empty(256 * 2**20, dtype=torch.int8, device=device)  # larger than any L2 today
    out, last = {}, {}
    with torch.enable_grad():
        assert all(p.requires_grad for m in (ref, new) for p in m.parameters())
        for name, m in (("reference", ref), ("ModelNew", new)):
            for _ in range(warmup):
                m(x)
            times = []
            for _ in range(trials):
                flush.zero_()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                y = m(x)
                end.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(end))
            out[f"{name}_ms"] = sum(times) / len(times)
            last[name] = y
    a, b = last["reference"], last["ModelNew"]
    out["allclose"] = a.shape == b.shape and bool(torch.allclose(b, a, atol=tol, rtol=tol))
    out["max_abs_diff"] = float((a - b).abs().max()) if a.shape == b.shape else float("inf")
    out["grad_fn"] = b.grad_fn is not None
    return out
