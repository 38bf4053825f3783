"""A training step — forward and backward — through the capstones' fused ops, beside eager and torch.compile.

``FusedP73`` and ``FusedP27`` are the reference modules' submodules with the fused ops as their forward
(``autograd_ops.p73_forward``, ``autograd_ops.p27_module_forward``: the same code the benchmark submissions
run). ``step`` turns a module into one training step — gradients cleared, forward, backward from a fixed
output gradient — and ``step_variants`` declares the chapter's timed steps; ``phases`` sorts the kernels of
our step by what they do.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from ..harness.measure import Variant
from . import autograd_ops


class FusedP73(nn.Module):
    """P73 (``s·bn(conv(x))``) with ``ref``'s parameters and statistics (copied), by the fused kernels."""

    def __init__(self, ext, ref: nn.Module, scale: float = 2.0, **kw):
        super().__init__()
        self.ext, self.scale, self.kw = getattr(ext, "raw", ext), float(scale), kw
        self.conv, self.bn = copy.deepcopy(ref.conv), copy.deepcopy(ref.bn)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return autograd_ops.p73_forward(self.ext, self.conv, self.bn, self.scale, x, **self.kw)


class FusedP27(nn.Module):
    """P27 with ``ref``'s parameters (copied), by the fused kernel (``math``: "fp32" or "3xtf32")."""

    def __init__(self, ext, ref: nn.Module, math: str = "fp32"):
        super().__init__()
        self.ext, self.math = getattr(ext, "raw", ext), math
        self.conv, self.group_norm = copy.deepcopy(ref.conv), copy.deepcopy(ref.group_norm)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return autograd_ops.p27_module_forward(self.ext, self.conv, self.group_norm, x, math=self.math)


def step(module: nn.Module, x: torch.Tensor, dy: torch.Tensor):
    """One training step of ``module`` as a function: gradients cleared, forward with grad mode on, backward
    from ``dy`` into every parameter's ``.grad`` (x needs no gradient, as for a first layer)."""
    def run():
        module.zero_grad(set_to_none=True)
        with torch.enable_grad():
            module(x).backward(dy)
    return run


def step_variants(fused: nn.Module, model: nn.Module, x: torch.Tensor, counts: dict, seed: int = 0,
                  compile: bool = True) -> dict[str, Variant]:
    """The timed training steps of one problem: ours (``fused``: the fused forward and its backward), eager
    PyTorch with its defaults (cuDNN may use TF32) and with TF32 off, and, if ``compile``, ``torch.compile`` of
    the module (AOTAutograd: forward and backward compiled together), each on its own copy of ``model``."""
    from ..harness import check, precision

    with torch.no_grad():
        shape = model(x[:1]).shape[1:]
    dy = check.rand((x.shape[0], *shape), seed=seed, device=x.device, low=-1.0, high=1.0)
    eager = copy.deepcopy(model)
    tr = {"mode": "step", "counts": counts}
    out = {"ours_step": Variant(step(fused, x, dy), "ours", role="headline", **tr),
           "eager_step": Variant(step(eager, x, dy), "eager", tf32=True, **tr),
           "eager_step_fp32": Variant(step(eager, x, dy), "eager", tf32=False, **tr)}
    if compile:
        compiled = torch.compile(copy.deepcopy(model))
        with precision.tf32(True):
            step(compiled, x, dy)()  # compile forward and backward once, outside the timing
        out["compile_step"] = Variant(step(compiled, x, dy), "compile", tf32=True, **tr)
    return out


def backward_checks(make_fused, models: dict[str, nn.Module], x: torch.Tensor, seed: int = 0) -> dict[str, dict]:
    """``kb.check.backward_reports`` of the fused module ``make_fused(m)`` for each ``{label: m}`` (its mode as
    ``m`` has it), against copies of ``m`` in float32 (eager) and float64; named ``backward_<label> d<param>``.
    A convolution's bias before training-mode BatchNorm has gradient exactly 0, and is checked as such."""
    from ..harness import check

    out = {}
    for label, m in models.items():
        bn = getattr(m, "bn", None)
        zero = {"conv.bias"} if bn is not None and (bn.training or bn.running_mean is None) else set()
        out.update(check.backward_reports(make_fused(m), copy.deepcopy(m), copy.deepcopy(m).double(), x, seed=seed,
                                          what=f"backward_{label}", zero=zero))
    return out


def backward_table(rec: dict):
    """The record's backward checks as a table, with each error's ratio to eager float32's."""
    import pandas as pd

    bw = pd.DataFrame(rec["checks"]).T.filter(like="backward_", axis=0)
    return bw.assign(**{"ratio to eager": bw["rel_err"].astype(float) / bw["eager_rel_err"].astype(float)})


PHASES = (  # (phase, substrings of the kernel names that belong to it), first match wins
    ("the moments and the guard (forward)", ("moments",)),
    ("the 3×3 convolution (forward, and again in the backward)", ("conv3x3", "channel_stats", "apply_inplace")),
    ("BatchNorm's backward", ("batch_norm", "bn_bw")),
    ("the convolution's backward (cuDNN)", ("dgrad", "wgrad", "xmma", "implicit", "cudnn", "conv")),
)


def phases(kernel_rows) -> dict[str, float]:
    """µs per phase of our step, from ``kb.profile.kernels`` rows of the variant (unmatched: "other")."""
    out: dict[str, float] = {}
    for r in kernel_rows:
        name = r["kernel"]
        phase = next((p for p, keys in PHASES if any(k in name for k in keys)), "other")
        out[phase] = out.get(phase, 0.0) + r["total_us"]
    return out


def step_glue(step_ms, forward_ms: float | None = None, phase_us=None) -> dict:
    """The numbers the prose quotes about the timed steps (medians by variant name): each step's time, each
    baseline's time over ours (``<variant>_x``), eager's with TF32 off over eager's; given our forward's time,
    our backward's; given ``phases``, our step's largest phase, its share and time, and the convolution's
    backward's share."""
    out: dict = {f"{v.replace('ours_', '')}_ms": float(step_ms[v]) for v in step_ms.index}
    for base in ("eager_step", "eager_step_fp32", "compile_step"):
        if base in step_ms.index:
            out[f"{base}_x"] = float(step_ms[base] / step_ms["ours_step"])
    out["fp32_over_default"] = float(step_ms["eager_step_fp32"] / step_ms["eager_step"])
    if forward_ms is not None:
        out["step_bw_ms"] = float(step_ms["ours_step"] - forward_ms)
    if phase_us is not None:
        total, top = sum(phase_us.values()), max(phase_us, key=phase_us.get)
        out.update({"step_top": top, "step_top_pct": 100 * phase_us[top] / total,
                    "step_top_ms": phase_us[top] / 1e3,
                    "step_convbw_pct": 100 * sum(v for k, v in phase_us.items() if "(cuDNN)" in k) / total})
    return out

