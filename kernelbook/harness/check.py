"""Checking a kernel against a float64 reference.

The error measure is norm-wise: ‖out − ref‖₂ / ‖ref‖₂, computed in float64. It does not explode
where single reference values are near zero (element-wise relative error does), and for fp32
arithmetic it lands near the unit roundoff times a modest growth factor. Beside it we report the
largest absolute error and the number of non-finite outputs where the reference is finite: with a
NaN-poisoned output buffer, those are the elements the kernel never wrote.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence

import torch

FP32_UNIT_ROUNDOFF = 2.0**-24  # half an ulp of 1.0 in float32: one correctly rounded op errs by at most this


def rand(shape: Sequence[int], seed: int, device: str | torch.device = "cpu", dtype=torch.float32,
         low: float = 0.0, high: float = 1.0) -> torch.Tensor:
    """Uniform [low, high) values from a seeded generator: fresh per seed, reproducible per seed."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    t = torch.rand(tuple(shape), generator=g, dtype=torch.float64) * (high - low) + low
    return t.to(device=device, dtype=dtype)


def rand_at_offset(shape: Sequence[int], offset: int, seed: int, device: str | torch.device = "cpu",
                   dtype=torch.float32, low: float = 0.0, high: float = 1.0) -> torch.Tensor:
    """``rand`` values in a contiguous tensor whose data starts ``offset`` elements into its buffer: a
    misaligned input (offset not a multiple of 4 floats: off the 16-byte grid) for checking vector paths."""
    numel = math.prod(shape)
    return rand([numel + offset], seed=seed, device=device, dtype=dtype, low=low, high=high)[offset:].view(*shape)


def poisoned(shape: Sequence[int], device: str | torch.device = "cpu", dtype=torch.float32) -> torch.Tensor:
    """An output buffer filled with NaN, so that any element a kernel fails to write is caught."""
    return torch.full(tuple(shape), float("nan"), device=device, dtype=dtype)


def report(out: torch.Tensor, ref: torch.Tensor, tol: float) -> dict:
    """Error of ``out`` against ``ref`` (both cast to float64, on ref's device), and pass/fail at ``tol``."""
    if out.shape != ref.shape:
        raise ValueError(f"shape mismatch: out {tuple(out.shape)} vs reference {tuple(ref.shape)}")
    r = ref.detach().to(torch.float64)
    o = out.detach().to(device=r.device, dtype=torch.float64)
    finite_ref = torch.isfinite(r)
    # Where the reference is finite, a non-finite output is an element the kernel never wrote (the
    # buffer was NaN-poisoned) or broke; where it is not, the output must be the same NaN or infinity.
    unwritten = int((~torch.isfinite(o) & finite_ref).sum())
    same_special = (torch.isnan(o) & torch.isnan(r)) | (o == r)
    unwritten += int((~finite_ref & ~same_special).sum())
    diff = torch.where(finite_ref, o - r, torch.zeros((), dtype=r.dtype, device=r.device))
    diff = torch.nan_to_num(diff, nan=float("inf"))
    ref_norm = float(torch.linalg.vector_norm(torch.where(finite_ref, r, 0.0)))
    err_norm = float(torch.linalg.vector_norm(diff))
    rel = err_norm / ref_norm if ref_norm > 0 else err_norm
    max_abs = float(diff.abs().max()) if diff.numel() else 0.0
    passed = unwritten == 0 and rel <= tol
    return {"rel_err": rel, "max_abs_err": max_abs, "tol": tol, "unwritten": unwritten, "passed": bool(passed)}


def normalisation_tol(x: torch.Tensor, dims: Sequence[int], k: float = 8.0, floor: float = 1e-6) -> float:
    """Tolerance for a float32 normalisation (batch, group or layer norm) of ``x`` over ``dims``.

    Its statistics are rounded values of size |μ|, so they err by about u·|μ|, and through
    (x − μ)/σ that becomes u·|μ|/σ of the output: the error scales with 1 + |μ|/σ. We allow k
    roundings of that size for the worst group, and never less than ``floor``.
    """
    x64 = x.detach().to(torch.float64)
    mu = x64.mean(dim=tuple(dims))
    sd = x64.std(dim=tuple(dims), unbiased=False).clamp_min(torch.finfo(torch.float64).tiny)
    return max(floor, k * FP32_UNIT_ROUNDOFF * (1.0 + float((mu.abs() / sd).max())))


def batchnorm_pivots(x: torch.Tensor, samples: int = 32) -> torch.Tensor:
    """The per-channel pivots the book's BatchNorm statistics kernel sums about (kernels/bn_stats.cuh): for an
    (N, C, H, W) tensor, the mean of min(32, N·H·W) values of each channel at evenly spaced positions."""
    n, c = x.shape[:2]
    hw = x[0, 0].numel()
    values = n * hw
    k = min(samples, values)
    t = torch.arange(k, device=x.device) * values // k  # position in the channel: sample t // hw, element t % hw
    flat = x.detach().reshape(n, c, hw).to(torch.float64)
    return flat[t // hw, :, t % hw].mean(dim=0)


def pivoted_normalisation_tol(x: torch.Tensor, k: float = 8.0, floor: float = 1e-6) -> float:
    """Tolerance for a batch norm (over N, H, W) whose statistics are summed about a pivot near each channel's
    mean and whose mean is applied as two floats (kernels/bn_stats.cuh): the statistics err by about
    u·|μ − p| rather than u·|μ|, so k roundings of u·(1 + |μ − p|/σ) for the worst channel — a tolerance
    that does not grow with the mean over the spread. Never less than ``floor``."""
    x64 = x.detach().to(torch.float64)
    mu = x64.mean(dim=(0, 2, 3))
    sd = x64.std(dim=(0, 2, 3), unbiased=False).clamp_min(torch.finfo(torch.float64).tiny)
    return max(floor, k * FP32_UNIT_ROUNDOFF * (1.0 + float(((mu - batchnorm_pivots(x)).abs() / sd).max())))


def dot_tol(terms: int, abs_ref: torch.Tensor, ref: torch.Tensor, floor: float = 1e-6) -> float:
    """Tolerance for float32 sums of ``terms`` products (a convolution, a matmul), from Higham's bound.

    Each output errs by at most about terms·u·Σ|xᵢwᵢ| (a recursive sum in any order), so norm-wise
    the error is at most terms·u·‖abs_ref‖/‖ref‖, where ``abs_ref`` is the same operation on |x| and
    |w|: the ratio grows when positive and negative products cancel. Never less than ``floor``.
    """
    ratio = float(torch.linalg.vector_norm(abs_ref.double())) / max(float(torch.linalg.vector_norm(ref.double())),
                                                                   torch.finfo(torch.float64).tiny)
    return max(floor, terms * FP32_UNIT_ROUNDOFF * ratio)


def assert_close(out: torch.Tensor, ref: torch.Tensor, tol: float, what: str = "output") -> dict:
    """``report`` as an assert: a failed check raises, so a broken claim breaks the build."""
    r = report(out, ref, tol)
    assert r["passed"], (
        f"{what}: relative error {r['rel_err']:.3e} (tolerance {tol:.1e}), max abs error "
        f"{r['max_abs_err']:.3e}, {r['unwritten']} unwritten/non-finite elements"
    )
    return r


def gradients(module: torch.nn.Module, x: torch.Tensor, dy: torch.Tensor) -> dict[str, torch.Tensor]:
    """The gradients of ⟨dy, module(x)⟩ with respect to x and every parameter of ``module`` (by name), with
    grad mode on for the call: what a training step's backward hands the optimiser."""
    x = x.detach().requires_grad_()
    names, leaves = ["x"], [x]
    for name, p in module.named_parameters():
        names.append(name)
        leaves.append(p)
    with torch.enable_grad():
        y = module(x)
        grads = torch.autograd.grad(y, leaves, dy.to(y.dtype))
    return dict(zip(names, grads, strict=True))


def backward_reports(ours: torch.nn.Module, eager: torch.nn.Module, ref64: torch.nn.Module, x: torch.Tensor,
                     seed: int = 0, what: str = "backward", zero: Iterable[str] = ()) -> dict[str, dict]:
    """Every gradient of ``ours`` against float64 (``ref64``: the same parameters in double), held to the book's
    rule for float32 accuracy: at most 2× the error of ``eager`` — the same module in float32 by PyTorch, TF32
    off — on the same input and output gradient (a seeded uniform dy in [-1, 1)). One asserted report per
    gradient (``"<what> d<name>"``), with eager's error beside ours. The gradients named in ``zero`` are 0 in
    exact arithmetic (float64 and eager show only their rounding there): ours must be exactly 0, and the report
    gives each one's largest magnitude instead of a relative error. No float32 result errs less than its own
    rounding, so where eager's error is below 2u (a gradient of a few values: an ulp either way) the tolerance
    is 2u."""
    from . import precision

    with torch.no_grad():
        shape = ref64(x.double()).shape
    dy = rand(shape, seed=seed, device=x.device, dtype=torch.float64, low=-1.0, high=1.0)
    ref = gradients(ref64, x.double(), dy)
    with precision.tf32(False, False):
        theirs = gradients(eager, x, dy)
    mine = gradients(ours, x, dy)
    out = {}
    for name, r in ref.items():
        if name in set(zero):
            biggest = float(mine[name].abs().max())
            assert biggest == 0.0, f"{what} d{name}: {biggest:.3e}, not exactly 0"
            out[f"{what} d{name}"] = {"rel_err": 0.0, "max_abs_err": 0.0, "tol": 0.0, "unwritten": 0, "passed": True,
                                      "eager_rel_err": float("nan"), "eager_max_abs": float(theirs[name].abs().max())}
            continue
        e = report(theirs[name], r, float("inf"))["rel_err"]
        rep = assert_close(mine[name], r, max(2.0 * e, 2.0 * FP32_UNIT_ROUNDOFF), what=f"{what} d{name}")
        out[f"{what} d{name}"] = {**rep, "eager_rel_err": e}
    return out


def error_message(fn: Callable[[], object]) -> str:
    """The first line of the RuntimeError ``fn()`` raises, or "accepted" when it raises nothing."""
    try:
        fn()
    except RuntimeError as e:
        return str(e).splitlines()[0]
    return "accepted"


def run_backward(fn: Callable[[], object]) -> None:
    """A backward from ``fn()``'s output (the first, where it returns several) with grad mode on: the sum's
    gradient taken back through every op that made it."""
    with torch.enable_grad():
        y = fn()
        (y[0] if isinstance(y, (list, tuple)) else y).sum().backward()


def run_double_backward(fn: Callable[[], torch.Tensor], x: torch.Tensor) -> None:
    """A second derivative through ``fn()``: the gradient of its squared sum with respect to ``x`` (which
    requires grad), asked for with ``create_graph=True``."""
    with torch.enable_grad():
        torch.autograd.grad(fn().square().sum(), x, create_graph=True)


def sweep(run: Callable[[object], tuple[torch.Tensor, torch.Tensor]], cases: Iterable, tol: float,
          what: str = "output"):
    """Check ``run(case) -> (out, ref)`` on every case; returns one row per case, asserts them all."""
    import pandas as pd

    rows = []
    for case in cases:
        out, ref = run(case)
        rows.append({"case": str(case), **report(out, ref, tol)})
    df = pd.DataFrame(rows)
    bad = df[~df["passed"]]
    assert bad.empty, f"{what}: {len(bad)} of {len(df)} cases failed:\n{bad.to_string(index=False)}"
    return df
