"""Roofline arithmetic: exact FLOP and minimum DRAM byte counts, the ceilings they are held against,
and every recorded kernel of the book placed by its counts and its measured time.

Conventions, one per line, so that every number can be re-derived by hand:

* a multiply-add (MAC) is 2 FLOP; a convolution's bias initialises its accumulator (0 FLOP);
* per-channel set-up (γ/√(σ²+ε) and the like, O(C) work) is not counted: it is under 10⁻⁶ of the total;
* batch-norm in eval mode and the apply step of any normalisation: one FMA per element (2 FLOP), with
  the per-channel scale and shift folded in beforehand; a statistics pass: an add and an FMA per
  element (sum and sum of squares, 3 FLOP); a multiply by a constant: 1 FLOP; hardswish
  x·clamp(x + 3, 0, 6)/6: an add, a multiply and a divide (3 FLOP, clamps are comparisons);
* minimum DRAM bytes: every input read once and every output written once, float32 (4 bytes);
  a tensor that is read twice counts twice only where the algorithm must read it twice (a
  training-mode normalisation of a tensor far larger than the L2 cache reads it for its statistics
  and again to apply them).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from .problems import P27_CONV3D_GN_MEAN, P73_CONV_BN_SCALE, Problem

F32 = 4  # bytes per float32


class _LanesByCapability(dict):
    """FP32 FMA lanes per SM by compute capability; a capability not in the table falls back by major version
    (see ``fp32_lanes_per_sm``) instead of raising a bare KeyError on a GPU newer than the table."""

    def __missing__(self, capability: str) -> int:
        return fp32_lanes_per_sm(capability)


# FP32 FMA lanes per SM (CUDA programming guide, "arithmetic instructions" throughput table)
FP32_LANES_PER_SM = _LanesByCapability({
    "6.0": 64, "6.1": 128, "6.2": 128, "7.0": 64, "7.2": 64, "7.5": 64, "8.0": 64, "8.6": 128, "8.7": 128,
    "8.9": 128, "9.0": 128, "10.0": 128, "10.3": 128, "11.0": 128, "12.0": 128, "12.1": 128})


def fp32_lanes_per_sm(capability: str) -> int:
    """FP32 FMA lanes per SM of a compute capability ("9.0"): the programming guide's table, and for a
    capability it does not list yet, 128 if its major version is 9 or newer (every listed capability since
    8.6 has 128); older unknown capabilities raise ValueError, since their lane counts vary (64 or 128)."""
    if capability in FP32_LANES_PER_SM:  # membership does not call __missing__
        return FP32_LANES_PER_SM[capability]
    try:
        major = int(str(capability).split(".")[0])
    except ValueError:
        raise ValueError(f"compute capability must look like '9.0', got {capability!r}") from None
    if major >= 9:
        return 128
    raise ValueError(f"FP32 lanes per SM unknown for compute capability {capability}: add it to "
                     f"kernelbook.roofline.FP32_LANES_PER_SM from the CUDA programming guide")


@dataclass(frozen=True)
class Counts:
    """FLOP and minimum DRAM bytes (read and written) of one operation; MACs where it has any."""

    flop: int
    read: int
    write: int
    macs: int = 0

    @property
    def bytes(self) -> int:
        return self.read + self.write

    @property
    def intensity(self) -> float:
        """FLOP per byte of DRAM traffic: where the operation sits on the roofline's x axis."""
        return self.flop / self.bytes if self.bytes else math.inf

    def __add__(self, other: Counts) -> Counts:
        return Counts(self.flop + other.flop, self.read + other.read, self.write + other.write,
                      self.macs + other.macs)

    def row(self) -> dict:
        return {"MACs": self.macs, "FLOP": self.flop, "bytes read": self.read, "bytes written": self.write,
                "bytes": self.bytes, "FLOP/byte": self.intensity}


def total(parts: Iterable[Counts]) -> Counts:
    """The sum of a sequence of kernels' counts (each reads its inputs and writes its outputs in DRAM)."""
    out = Counts(0, 0, 0)
    for p in parts:
        out = out + p
    return out


def conv(shape_in: Sequence[int], c_out: int, k: int, bias: bool = True) -> Counts:
    """Convolution, stride 1, no padding, of an (N, C_in, *spatial) float32 input with a k^d kernel."""
    n, c_in, *spatial = shape_in
    out_spatial = [s - k + 1 for s in spatial]
    positions = n * c_out * math.prod(out_spatial)
    macs = positions * c_in * k ** len(spatial)
    weights = c_out * c_in * k ** len(spatial) + (c_out if bias else 0)
    return Counts(2 * macs, F32 * (math.prod(shape_in) + weights), F32 * positions, macs)


def conv_out_shape(shape_in: Sequence[int], c_out: int, k: int) -> tuple[int, ...]:
    n, _, *spatial = shape_in
    return (n, c_out, *(s - k + 1 for s in spatial))


def elementwise(numel: int, flop_per_element: int, inputs: int = 1, outputs: int = 1) -> Counts:
    """A map over ``numel`` elements: each input tensor read once, each output written once."""
    return Counts(flop_per_element * numel, F32 * inputs * numel, F32 * outputs * numel)


def copy(numel: int) -> Counts:
    return elementwise(numel, 0)


def batchnorm(shape: Sequence[int], train: bool) -> Counts:
    """BatchNorm over (N, C, ...): eval is one FMA pass; train adds a statistics pass (a second read)
    and updates the running mean and variance (read and written) and ``num_batches_tracked`` (int64)."""
    numel, c = math.prod(shape), shape[1]
    params = F32 * 4 * c  # γ, β, running mean, running variance
    if not train:
        return Counts(2 * numel, F32 * numel + params, F32 * numel)
    return Counts(5 * numel, 2 * F32 * numel + params + 8, F32 * numel + F32 * 2 * c + 8)


def groupnorm(shape: Sequence[int]) -> Counts:
    """GroupNorm (training and eval alike: statistics of each sample): statistics pass, then apply."""
    numel, c = math.prod(shape), shape[1]
    return Counts(5 * numel, 2 * F32 * numel + F32 * 2 * c, F32 * numel)


def statistics(shape: Sequence[int], groups: int) -> Counts:
    """Mean and variance of each (sample, group) of an (N, C, ...) tensor: the tensor read once, a sum and a
    sum of squares per element (an add and an FMA, 3 FLOP), two floats written per group. Every algorithm
    (one-pass, Welford, two-pass) computes this; a second read is the algorithm's, not the operation's."""
    numel = math.prod(shape)
    return Counts(3 * numel, F32 * numel, F32 * 2 * shape[0] * groups)


def affine_per_channel(shape: Sequence[int]) -> Counts:
    """y = x·a_c + b_c over an (N, C, ...) tensor: one FMA (2 FLOP) per element, x and the C-vectors a and b
    read once, y written once."""
    numel, c = math.prod(shape), shape[1]
    return Counts(2 * numel, F32 * (numel + 2 * c), F32 * numel)


def reduce_mean(shape: Sequence[int], keep: int = 2) -> Counts:
    """Mean over every dimension after the first ``keep``: one add per element read."""
    numel, out = math.prod(shape), math.prod(shape[:keep])
    return Counts(numel, F32 * numel, F32 * out)


def matmul(m: int, n: int, k: int) -> Counts:
    """(m × k) @ (k × n) in float32: 2·m·n·k FLOP, each matrix read once and the product written once."""
    return Counts(2 * m * n * k, F32 * (m * k + k * n), F32 * m * n, m * n * k)


@cache
def _modules(problem: Problem):
    return problem.model(seed=0)


def p73_parts(problem: Problem = P73_CONV_BN_SCALE) -> dict:
    """P73's shapes, read from its module and input shape (never typed): input, conv output, k, C_out."""
    m = _modules(problem)
    x = tuple(problem.input_shape)
    k = m.conv.kernel_size[0]
    return {"x": x, "y": conv_out_shape(x, m.conv.out_channels, k), "k": k, "c_out": m.conv.out_channels,
            "bias": m.conv.bias is not None}


def p73_conv(problem: Problem = P73_CONV_BN_SCALE) -> Counts:
    p = p73_parts(problem)
    return conv(p["x"], p["c_out"], p["k"], p["bias"])


def p73_eager(problem: Problem = P73_CONV_BN_SCALE, train: bool = False,
              separate_bias: bool = False) -> dict[str, Counts]:
    """Eager P73 kernel by kernel: conv, BN, then the multiply by s (each a full pass over DRAM).
    ``separate_bias``: the conv's bias added by a kernel of its own (one more read and write)."""
    p = p73_parts(problem)
    numel = math.prod(p["y"])
    parts = {"conv": p73_conv(problem) if not separate_bias else conv(p["x"], p["c_out"], p["k"], bias=False)}
    if separate_bias:
        parts["bias add"] = Counts(numel, F32 * (numel + p["c_out"]), F32 * numel)
    parts["batch-norm"] = batchnorm(p["y"], train)
    parts["· s"] = elementwise(numel, 1)
    return parts


def bias_added_separately(kernel_names: Iterable[str]) -> bool:
    """Whether a profiled eager convolution added its bias in a kernel of its own (ATen's elementwise add,
    ``CUDAFunctor_add``) rather than in the convolution's epilogue."""
    return any("CUDAFunctor_add" in k for k in kernel_names)


def p73_fused_eval(problem: Problem = P73_CONV_BN_SCALE) -> Counts:
    """Eval mode, BN and s folded into the weights: exactly the conv's counts (folding is O(C) work)."""
    return p73_conv(problem)


def patch_moments(shape_in: Sequence[int], k: int) -> Counts:
    """First and second moments of the k×k×C_in patches of an (N, C_in, H, W) float32 input: what the batch
    mean and variance of *any* linear map of the patches (a convolution's output channels) follow from.

    The second moments are lag products x_i(r, s)·x_j(r + d1, s + d2) summed over the plane, for lags
    |d1|, |d2| ≤ k − 1: by symmetry (C_ij(d) = C_ji(−d)) only d1 = 0 … k − 1 are accumulated, for every j and
    each of the 2k − 1 values of d2, so each input value takes part in C_in·k·(2k − 1) multiply-adds (P73:
    8·3·5 = 120); the first moments add one add per value. The border corrections (≤ k − 1 rows and columns
    per lag) and the (C_in·k²)² matrix written at the end are O(plane edge) and O(C_in²k⁴), not counted.
    The input is read once.
    """
    n, c_in, *spatial = shape_in
    numel = n * c_in * math.prod(spatial)
    macs = numel * c_in * k * (2 * k - 1)
    m = c_in * k ** len(spatial)
    return Counts(2 * macs + numel, F32 * numel, F32 * (m + m * m), macs)


P73_TRAIN_STRATEGIES = ("materialise", "recompute", "moments")


def p73_train_phases(problem: Problem = P73_CONV_BN_SCALE, strategy: str = "materialise") -> list[Counts]:
    """Training mode, fused as far as the batch statistics allow, as the phases a grid-wide dependency
    separates: no output can be normalised before every value of its channel has been seen, so a phase's
    work cannot overlap the next one's, and the bounds of the phases add.

    ``materialise``: the conv writes its output and accumulates the statistics on the way, then an apply
    pass reads it back and writes y (in place). ``recompute``: a first conv pass only accumulates statistics, a
    second recomputes the conv and writes y — twice the FLOP, but the input (8× smaller) is read twice
    instead of the output. ``moments``: the batch mean and variance of each output channel follow from the
    input patches' mean and covariance (``patch_moments``: one read of the input, no conv), then one conv with
    BN and the scale folded in writes y. All update the running statistics (in the last phase).
    """
    p = p73_parts(problem)
    c, numel = p["c_out"], math.prod(p["y"])
    conv_ = p73_conv(problem)
    stats_flop, apply_flop = 3 * numel, 2 * numel
    running = Counts(0, F32 * 4 * c + 8, F32 * 2 * c + 8)  # γ, β, running stats; running stats + count
    if strategy == "materialise":
        return [conv_ + Counts(stats_flop, 0, 0), Counts(apply_flop, F32 * numel, F32 * numel) + running]
    if strategy == "recompute":
        return [Counts(conv_.flop + stats_flop, conv_.read, 0, conv_.macs), conv_ + Counts(apply_flop, 0, 0) + running]
    if strategy == "moments":
        return [patch_moments(p["x"], p["k"]), conv_ + running]
    raise ValueError(f"strategy must be one of {', '.join(map(repr, P73_TRAIN_STRATEGIES))}, got {strategy!r}")


def p73_fused_train(problem: Problem = P73_CONV_BN_SCALE, strategy: str = "materialise") -> Counts:
    """Training mode's total counts under ``strategy`` (``p73_train_phases`` summed)."""
    return total(p73_train_phases(problem, strategy))


def p73_train_counts(strategy: str, problem: Problem = P73_CONV_BN_SCALE) -> dict:
    """A training variant's declared counts: the problem's FLOP (a convolution, the statistics and the
    normalisation — what every variant is credited with, whatever extra work its design chooses), the
    design's DRAM bytes, and the design's phases, whose bounds add (``phased_bound_ms``)."""
    phases = p73_train_phases(problem, strategy)
    return {"flop": p73_fused_train(problem, "materialise").flop, "bytes": total(phases).bytes,
            "phases": [{"flop": c.flop, "bytes": c.bytes} for c in phases]}


def p27_parts(problem: Problem = P27_CONV3D_GN_MEAN) -> dict:
    """P27's shapes, read from its module and input shape: input, conv output, k, C_out, groups."""
    m = _modules(problem)
    x = tuple(problem.input_shape)
    k = m.conv.kernel_size[0]
    return {"x": x, "y": conv_out_shape(x, m.conv.out_channels, k), "k": k, "c_out": m.conv.out_channels,
            "bias": m.conv.bias is not None, "groups": m.group_norm.num_groups}


def p27_conv(problem: Problem = P27_CONV3D_GN_MEAN) -> Counts:
    p = p27_parts(problem)
    return conv(p["x"], p["c_out"], p["k"], p["bias"])


def p27_eager(problem: Problem = P27_CONV3D_GN_MEAN) -> dict[str, Counts]:
    """Eager P27 kernel by kernel: conv3d, hardswish, group-norm, mean over (D, H, W)."""
    p = p27_parts(problem)
    numel = math.prod(p["y"])
    return {"conv3d": p27_conv(problem), "hardswish": elementwise(numel, 3), "group-norm": groupnorm(p["y"]),
            "mean": reduce_mean(p["y"])}


def p27_fused(problem: Problem = P27_CONV3D_GN_MEAN) -> Counts:
    """P27 in one kernel: conv3d, hardswish, and per-(sample, channel) sums and sums of
    squares; the mean of GroupNorm follows from those sums, so the conv output never reaches DRAM."""
    p = p27_parts(problem)
    numel, (n, c) = math.prod(p["y"]), p["y"][:2]
    conv_ = p27_conv(problem)
    return Counts(conv_.flop + 3 * numel + 3 * numel, conv_.read + F32 * 2 * c, F32 * n * c, conv_.macs)


# ----------------------------------------------------------------------------------------------------------
# Ceilings


def fp32_peak(sm_count: int, clock_hz: float, capability: str) -> float:
    """FP32 FLOP/s if every FMA lane retires one FMA (2 FLOP) per clock: SMs × lanes × 2 × clock."""
    return sm_count * fp32_lanes_per_sm(capability) * 2 * clock_hz


def dram_peak(memory_clock_hz: float, bus_bits: int) -> float:
    """Bytes/s the memory pins signal: double data rate × bus width / 8 (the datasheet's bandwidth)."""
    return 2 * memory_clock_hz * bus_bits / 8


def ridge(peak_flops: float, bandwidth: float) -> float:
    """The intensity (FLOP/byte) at which the compute and bandwidth ceilings meet."""
    return peak_flops / bandwidth


def bound_ms(c: Counts, peak_flops: float, bandwidth: float) -> float:
    """The roofline's lower bound on the time of ``c``: max(FLOP / peak, bytes / bandwidth), in ms."""
    return 1e3 * max(c.flop / peak_flops, c.bytes / bandwidth)


def phased_bound_ms(phases: Iterable[Counts], peak_flops: float, bandwidth: float) -> float:
    """The lower bound of work done in phases that cannot overlap (a grid-wide dependency between them):
    the sum of each phase's roofline bound, in ms — never less than the bound of their sum."""
    return sum(bound_ms(c, peak_flops, bandwidth) for c in phases)


# ----------------------------------------------------------------------------------------------------------
# Every recorded variant, placed by its counts


@dataclass(frozen=True)
class Placed:
    """A recorded variant as its chapter declared it: counts, the arithmetic it ran in (corrected from
    its profile when it was recorded) and who provides it."""

    counts: Counts
    math: str
    provider: str
    role: str = ""
    phases: tuple[Counts, ...] = ()  # where the chapter declared them: work that cannot overlap


def placed(rec: dict) -> dict[str, Placed]:
    """The timed variants of one record that declare both FLOP and bytes (``variants[v]["counts"]``;
    bytes as a total or as read and write): nothing is inferred from a variant's name or chapter. A training
    step (mode "step": a forward and a backward, each several kernels, one after the other) is not a point on
    a roofline and is left out."""
    out = {}
    for v, d in rec.get("variants", {}).items():
        c = d.get("counts", {})
        if v not in rec.get("timings_ms", {}) or d.get("mode") == "step" or "flop" not in c \
                or not {"bytes", "read"} & set(c):
            continue
        write = int(c.get("write", 0))
        read = int(c["read"]) if "read" in c else int(c["bytes"]) - write
        phases = tuple(Counts(int(q["flop"]), int(q["bytes"]), 0) for q in c.get("phases", ()))
        out[v] = Placed(Counts(int(c["flop"]), read, write), d.get("math", "fp32"), d["provider"],
                        d.get("role", ""), phases)
    return out


def recorded(paths: Iterable[Path] | None = None, gpu_slug: str | None = None,
             exclude: Sequence[str] = ()) -> list[dict]:
    """The records of ``gpu_slug`` (or those at ``paths``), minus the chapters in ``exclude``; a missing
    or unreadable file is skipped, so the list grows as chapters are recorded."""
    from ..harness.records import on_gpu, read

    if paths is None:
        recs = on_gpu(gpu_slug)
    else:
        recs = []
        for p in paths:
            try:
                recs.append(read(p))
            except (OSError, ValueError):
                continue
    return [r for r in recs if isinstance(r, dict) and r.get("chapter") not in exclude]


def points(records: Iterable[dict] | None = None):
    """One row per recorded variant whose counts are known (default: every H200 record): chapter,
    variant, provider, math, role, FLOP, bytes, intensity, median ms, achieved TFLOP/s and GB/s. A
    variant that moves no DRAM bytes (a registers-only rate kernel) has no place on the intensity
    axis and is left out."""
    import pandas as pd

    rows = []
    for rec in recorded() if records is None else records:
        for v, pl in placed(rec).items():
            t = rec["timings_ms"][v]["median"]
            c = pl.counts
            if c.bytes == 0:
                continue
            rows.append({"chapter": rec["chapter"], "variant": v, "provider": pl.provider,
                         "math": pl.math, "role": pl.role, "FLOP": c.flop, "bytes": c.bytes,
                         "FLOP/byte": c.intensity, "median_ms": t, "TFLOP/s": c.flop / (t * 1e-3) / 1e12,
                         "GB/s": c.bytes / (t * 1e-3) / 1e9, "phases": pl.phases or (c,)})
    cols = ["chapter", "variant", "provider", "math", "role", "FLOP", "bytes", "FLOP/byte", "median_ms",
            "TFLOP/s", "GB/s", "phases"]
    return pd.DataFrame(rows, columns=cols)


def with_bounds(df, peak: dict[str, float], bandwidth: float):
    """``points`` plus the roofline's lower bound per row (compute ceiling chosen by its ``math``; summed over
    the phases a variant declares) and measured / bound: 1.0 would be a kernel on the roof."""
    out = df.copy()
    peak = {"3xtf32": peak["tf32"] / 3, **peak} if "tf32" in peak else dict(peak)  # three TF32 products
    rates = [peak.get(m, peak["fp32"]) for m in out["math"]]  # an arithmetic without a rate: FP32's
    out["bound_ms"] = [phased_bound_ms(ph, p, bandwidth) for ph, p in zip(out["phases"], rates, strict=True)]
    out["bound"] = [", then ".join(bound_by(c, p / bandwidth).removesuffix("-bound") for c in ph)  # per phase
                    for ph, p in zip(out["phases"], rates, strict=True)]
    out["measured / bound"] = out["median_ms"] / out["bound_ms"]
    return out


@dataclass(frozen=True)
class Roof:
    """One roofline: a compute ceiling (FLOP/s) over a bandwidth ceiling (bytes/s); dashed if not measured."""

    label: str
    peak: float
    bandwidth: float
    dashed: bool = False


PROVIDER_COLOURS = {"ours": "#c0392b", "eager": "#7f8c8d", "compile": "#2e86c1", "cudnn": "#8e44ad",
                    "cublas": "#d68910", "cutlass": "#76b900",
                    "torch": "#17a589"}  # ours: kb.plots.OURS; eager: kb.plots.BASELINE
MATH_MARKERS = {"fp32": "o", "tf32": "^", "3xtf32": "s", "fp64": "D"}


def _place_numbers(anchors, obstacles, lines, box, radius=(15, 22, 30)):
    """Offsets (display points) for a numbered label beside each anchor (display points), chosen in turn
    from rings of candidates around it: the first clear of every point in ``obstacles``, of every segment
    of ``lines``, of the labels already placed and inside ``box`` (x0, y0, x1, y1); failing that, the
    candidate with the most room."""
    import numpy as np

    def seg_dist(c, a, b):
        ab, ac = b - a, c - a
        t = np.clip(np.dot(ac, ab) / max(np.dot(ab, ab), 1e-9), 0, 1)
        return float(np.linalg.norm(c - (a + t * ab)))

    angles = np.radians([0, 30, -30, 60, -60, 150, -150, 180, 90, -90, 120, -120])
    placed, offsets = [], []
    for px, py in anchors:
        p, best, best_room = np.array([px, py]), (px + radius[0], py), -np.inf
        for r, a in ((r, a) for r in radius for a in angles):
            c = np.array([px + r * np.cos(a), py + r * np.sin(a)])
            inside = min(c[0] - box[0], box[2] - c[0], c[1] - box[1], box[3] - c[1]) - 8
            room = min([inside] + [np.linalg.norm(c - o) - 11 for o in obstacles]  # marker + label radius
                       + [np.linalg.norm(c - q) - 15 for q, _ in placed]
                       + [seg_dist(q, p, c) - 9 for q, _ in placed]  # its leader clear of other labels
                       + [seg_dist(c, q0, q) - 9 for q, q0 in placed]  # and it clear of their leaders
                       + [seg_dist(c, a_, b_) - 8 for a_, b_ in lines] + [99.0])
            if room > best_room:
                best, best_room = c, room
            if room > 0:
                break
        placed.append((np.asarray(best), p))
        offsets.append((best[0] - px, best[1] - py))
    return offsets


def plot(df, roofs: Sequence[Roof], ax=None, title: str = "", labels: Mapping[tuple[str, str], str] | None = None):
    """Log-log roofline: every roof (the first solid, the other measured ones dash-dotted, datasheet ones
    dashed), the ridge of the first one, and every row of ``df`` with FLOP > 0 as a point, coloured by
    provider and shaped by the arithmetic it ran in. Only the points named in ``labels``
    ({(chapter, variant): text}) are numbered, each number placed clear of every point, line and other
    number; the legends (provider, arithmetic, numbered points, roofs) sit outside the plotting area."""
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.lines import Line2D

    from ..harness.plots import CEILING, OURS

    if ax is None:  # room for the legends: a column right of the plot, the roofs' key below it
        fig, ax = plt.subplots(figsize=(8.2, 5.9))
        fig.subplots_adjust(left=0.1, right=0.73, top=0.94, bottom=0.3)
    pts = df[df["FLOP"] > 0]
    lo = min([0.05, *(pts["FLOP/byte"] / 3)])
    hi = max([1e4, *(pts["FLOP/byte"] * 3)])
    x = np.logspace(np.log10(lo), np.log10(hi), 400)
    styles = iter(["-", "-.", (0, (5, 1, 1, 1, 1, 1))])
    roof_handles, drawn = [], []
    for roof in roofs:
        ls = "--" if roof.dashed else next(styles)
        y = np.minimum(roof.peak, roof.bandwidth * x) / 1e12
        ax.plot(x, y, color=CEILING, lw=0.9 if roof.dashed else 1.3, ls=ls, alpha=0.6 if roof.dashed else 0.9)
        drawn.append((x, y))
        roof_handles.append(Line2D([], [], color=CEILING, ls=ls, lw=1.3, label=f"{roof.label}: "
                                   f"{roof.peak / 1e12:.1f} TFLOP/s, {roof.bandwidth / 1e12:.2f} TB/s"))
    first = roofs[0]
    r = ridge(first.peak, first.bandwidth)
    ax.axvline(r, color=CEILING, lw=0.7, ls=":")
    roof_handles.append(Line2D([], [], color=CEILING, lw=0.7, ls=":", label=f"ridge of the first: {r:.1f} FLOP/byte"))
    for (prov, maths), grp in pts.groupby(["provider", "math"], sort=True):
        ax.scatter(grp["FLOP/byte"], grp["TFLOP/s"], c=PROVIDER_COLOURS.get(prov, CEILING),
                   marker=MATH_MARKERS.get(maths, "X"), s=34, edgecolors="black", linewidths=0.4, zorder=3,
                   alpha=0.85)
    ax.set_xscale("log")
    ax.set_yscale("log")
    top = max([ro.peak / 1e12 for ro in roofs] + list(pts["TFLOP/s"]))
    ax.set(xlim=(lo / 1.5, hi * 1.5), ylim=(min([*pts["TFLOP/s"], top / 1e3]) / 2, top * 2.5))
    ax.set_xlabel("arithmetic intensity (FLOP per DRAM byte, from the counts)")
    ax.set_ylabel("TFLOP/s (counted FLOP / median time)")
    ax.set_title(title)
    chosen = []  # (x, y, text) of each labelled point that is on the plot
    for (ch, v), text in (labels or {}).items():
        row = pts[(pts["chapter"] == ch) & (pts["variant"] == v)]
        if len(row):
            chosen.append((row["FLOP/byte"].iloc[0], row["TFLOP/s"].iloc[0], text))
    # Numbers beside the labelled points, clear of every point, roof, the ridge and each other: placed in
    # display points (the figure's layout is fixed by now: the legends below sit outside the axes).
    to_pt = 72 / ax.figure.dpi
    disp = lambda xs, ys: ax.transData.transform(np.column_stack([xs, ys])) * to_pt  # noqa: E731
    anchors = disp([c[0] for c in chosen], [c[1] for c in chosen]) if chosen else []
    obstacles = list(disp(pts["FLOP/byte"], pts["TFLOP/s"]))
    lines = []
    for xs, ys in drawn:
        d = disp(xs[::8], ys[::8])
        lines += list(zip(d[:-1], d[1:], strict=True))
    ylo, yhi = ax.get_ylim()
    lines.append(tuple(disp([r, r], [ylo, yhi])))
    (x0, y0), (x1, y1) = ax.transAxes.transform([(0, 0), (1, 1)]) * to_pt
    for k, ((x0_, y0_, _), off) in enumerate(zip(chosen, _place_numbers(anchors, obstacles, lines, (x0, y0, x1, y1)),
                                                strict=True)):
        ax.annotate(f"{k + 1}", (x0_, y0_), xytext=off, textcoords="offset points", ha="center",
                    va="center", fontsize=9, fontweight="bold", color=OURS, zorder=5,
                    bbox={"boxstyle": "circle,pad=0.15", "fc": "white", "ec": OURS, "lw": 0.6},
                    arrowprops={"arrowstyle": "-", "lw": 0.6, "color": OURS, "shrinkA": 0, "shrinkB": 3})
    names = {"3xtf32": "3xTF32"}
    by_provider = [Line2D([], [], ls="", marker="o", color=PROVIDER_COLOURS.get(p, CEILING), label=p)
                   for p in sorted(set(pts["provider"]))]
    by_math = [Line2D([], [], ls="", marker=MATH_MARKERS.get(m, "X"), color="white", markeredgecolor="black",
                      label=names.get(m, m.upper())) for m in sorted(set(pts["math"]))]
    side = {"fontsize": 9, "title_fontsize": 9, "loc": "upper left", "alignment": "left"}
    keyed = [Line2D([], [], ls="", marker=f"${k + 1}$", color=OURS, label=text)
             for k, (_, _, text) in enumerate(chosen)]
    renderer, inv = ax.figure.canvas.get_renderer(), ax.transAxes.inverted()
    below = -42 / (ax.get_window_extent(renderer).height * to_pt)  # the roofs' key: 42 pt below, under the
    ax.add_artist(ax.legend(handles=roof_handles, title="roofs (measured rates; dashed: datasheet)",  # axis title
                            bbox_to_anchor=(0.0, below), **side))
    y = 1.0  # the column right of the plot, each legend below the one before; the last stays ax.get_legend()
    column = [c for c in ((by_provider, "provider"), (by_math, "arithmetic that ran"), (keyed, "numbered points"))
              if c[0]]
    for k, (handles, name) in enumerate(column):
        leg = ax.legend(handles=handles, title=name, bbox_to_anchor=(1.02, y), **side)
        if k < len(column) - 1:
            ax.add_artist(leg)
        y = inv.transform(leg.get_window_extent(renderer))[0][1] - 0.03
    return ax


# ----------------------------------------------------------------------------------------------------------
# Chapter 3's helpers: an independent FLOP count, the FFMA kernel's closed form, a non-trivial eval P73


def torch_flop_count(fn: Callable, *shapes: Sequence[int]) -> int:
    """FLOP of ``fn`` on float32 tensors of ``shapes`` by PyTorch's own counter, on the meta device
    (shapes only, nothing computed): an independent check of this module's counts."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as fc:
        fn(*(torch.empty(s, device="meta") for s in shapes))
    return fc.get_total_flops()


def ffma_closed_form(n_threads: int, iters: int, m: float, c: float, chains: int):
    """The FFMA kernel's output in float64: Σ_j a_j(iters) for a_j ← a_j·m + c·(j + 1) from a_j = (t mod 64) + j."""
    import torch

    t = torch.arange(n_threads, dtype=torch.float64)
    out = torch.zeros_like(t)
    for j in range(chains):
        a0, cj = (t % 64) + j, c * (j + 1)
        out += a0 + iters * cj if m == 1.0 else m**iters * a0 + cj * (1 - m**iters) / (1 - m)
    return out


def p73_eval_model(seed: int = 0, problem: Problem = P73_CONV_BN_SCALE):
    """P73 in eval mode with non-trivial running statistics and affine parameters (seeded)."""
    import torch

    model = problem.model(seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    c = model.bn.num_features
    with torch.no_grad():
        model.bn.running_mean.copy_(torch.randn(c, generator=g) * 0.1)
        model.bn.running_var.copy_(torch.rand(c, generator=g) + 0.5)
        model.bn.weight.copy_(torch.rand(c, generator=g) + 0.5)
        model.bn.bias.copy_(torch.randn(c, generator=g) * 0.1)
    return model.eval()


SUBPARTITIONS_PER_SM = 4  # warp schedulers per SM since Volta (sm_70 … sm_120): CUDA programming guide


def warps_per_subpartition(threads_per_sm: int, warp_size: int = 32) -> float:
    """Warps one SM sub-partition (one warp scheduler) can hold: threads per SM / warp size / 4."""
    return threads_per_sm / warp_size / SUBPARTITIONS_PER_SM


def chapter_operations() -> dict[str, Counts]:
    """Chapter 3's table of counts: P73's and P27's operations one by one, eager and fused."""
    p73p, p27p = p73_parts(), p27_parts()
    n73, n27 = math.prod(p73p["y"]), math.prod(p27p["y"])
    return {
        "P73 conv2d": p73_conv(),
        "P73 batch-norm, eval": batchnorm(p73p["y"], train=False),
        "P73 batch-norm, train": batchnorm(p73p["y"], train=True),
        "P73 · s": elementwise(n73, 1),
        "P73 eager eval (conv with bias, BN, · s)": total(p73_eager().values()),
        "P73 eager eval (conv, bias add, BN, · s)": total(p73_eager(separate_bias=True).values()),
        "P73 eager train (conv, BN, · s)": total(p73_eager(train=True).values()),
        "P73 fused eval (BN, s folded)": p73_fused_eval(),
        "P73 fused train, conv output written": p73_fused_train(strategy="materialise"),
        "P73 fused train, conv recomputed": p73_fused_train(strategy="recompute"),
        "P27 conv3d": p27_conv(),
        "P27 hardswish": elementwise(n27, 3),
        "P27 group-norm": groupnorm(p27p["y"]),
        "P27 mean over D, H, W": reduce_mean(p27p["y"]),
        "P27 eager (4 kernels)": total(p27_eager().values()),
        "P27 fused (GN mean from sums)": p27_fused(),
    }


GH100_FULL_DIE_SMS = 144  # GH100 as designed: 8 GPCs × 9 TPCs × 2 SMs; products enable fewer


def classic_slips(device: dict, capability: str):
    """Chapter 3's slips, each as (slip, quantity, wrong, right, wrong / right), from P73's counts and the
    device's attributes (SM count, warp size, threads per SM). Peaks in FLOP per clock: no clock assumed."""
    import pandas as pd

    conv73, x_elems = p73_conv(), math.prod(p73_parts()["x"])
    warp, sms, tpsm = device["warp_size"], device["sm_count"], device["max_threads_per_sm"]
    per_clock = sms * fp32_lanes_per_sm(capability) * 2
    df = pd.DataFrame([
        ("MACs reported as FLOP", "P73 conv, GFLOP", conv73.macs / 1e9, conv73.flop / 1e9),
        ("elements reported as bytes", "P73 input, MB", x_elems / 1e6, F32 * x_elems / 1e6),
        ("MiB and MB mixed up", "P73 conv output, MB", conv73.write / 2**20, conv73.write / 1e6),
        ("128 threads per warp", "warps in a 256-thread block", 256 / 128, 256 / warp),
        ("128 threads per warp", "warps per SM sub-partition", warps_per_subpartition(tpsm, 128),
         warps_per_subpartition(tpsm, warp)),
        (f"{GH100_FULL_DIE_SMS} SMs (the full die), not {sms}", "FP32 FLOP per clock",
         per_clock * GH100_FULL_DIE_SMS / sms, per_clock),
        ("an FMA counted as 1 FLOP", "FP32 FLOP per clock", per_clock / 2, per_clock),
    ], columns=["slip", "quantity", "wrong", "right"])
    df["wrong / right"] = df["wrong"] / df["right"]
    return df


# The script chapter 3 runs under Nsight Compute: eager eval P73 and the folded kernel, each once inside
# its NVTX range (warmed up outside them), so that ncu profiles exactly those kernels.
NCU_TARGET_P73_EVAL = """
import torch, kernelbook as kb
from kernelbook import roofline as rl
p73 = kb.problems.P73_CONV_BN_SCALE
model = rl.p73_eval_model().cuda()
w, b = kb.folding.fold(model.conv, model.bn, p73.init_args[3])
conv = kb.build.load("conv2d_folded")
x = p73.inputs(seed=1, device="cuda")
with torch.no_grad():
    y = torch.empty_like(model.conv(x))
    runs = {"eager_p73_eval": lambda: model(x),
            "ours_p73_eval": lambda: conv.conv2d_folded(x, w, b, y)}
    for fn in runs.values():
        fn()
    torch.cuda.synchronize()
    for variant, fn in runs.items():
        with kb.timing.nvtx_range("03_roofline", variant):
            fn()
    torch.cuda.synchronize()
"""


# ----------------------------------------------------------------------------------------------------------
# Chapter 3's notebook plumbing: the check cases, the bad inputs, the tables derived from its record

COPY_SIZES = (0, 1, 3, 4, 5, 1023, 4096 + 3, 8192 * 5 + 4 * 7 + 3, 8192 * 1100 + 5, (1 << 24) + 1)
COPY_VARIANTS = {  # name: (grid, float4 per thread, cache hints)
    f"copy_{g}_u{u}{'_cs' if c == 'streaming' else ''}": (g, u, c)
    for g in ("resident", "tiles") for u in (1, 4, 8) for c in ("default", "streaming")}
FFMA_CASES = ((0, 1.0, 1.0, 2), (37, 1.0, 3.0, 5), (4096, 1.0, 1.0, 0),
              (100, 0.999, 0.5, 3))  # iters, m, c, blocks (0: as many as fit)
HEADLINE = {("03_roofline", "ours_p73_eval"): "P73 eval, ours",
            ("03_roofline", "eager_p73_eval"): "P73 eval, eager",
            ("07_capstone_conv_bn_scale", "ours_train"): "P73 train, ours",
            ("08_capstone_conv3d_groupnorm_mean", "ours"): "P27, ours",
            ("03_roofline", "eager_p27"): "P27, eager", ("03_roofline", "ffma_ours"): "FFMA kernel"}


def counts_dict(c: Counts) -> dict:
    """``c`` as the ``counts`` a ``kb.measure.Variant`` declares."""
    return {"flop": c.flop, "read": c.read, "write": c.write, "bytes": c.bytes}


def bad_inputs(mod) -> dict[str, str]:
    """Each bad input of the ``ceilings`` bindings and the error message it raises ('accepted' if none)."""
    import torch

    from ..harness.check import error_message as msg

    xg = torch.zeros(64, device="cuda")
    return {
        "misaligned view x[1:]": msg(lambda: mod.copy(xg[1:])),
        "float64 input": msg(lambda: mod.copy(xg.double())),
        "CPU input": msg(lambda: mod.copy(xg.cpu())),
        "out of another shape": msg(lambda: mod.copy(xg, xg[:63].clone())),
        "unknown grid": msg(lambda: mod.copy(xg, None, "fastest")),
        "unsupported unroll": msg(lambda: mod.copy(xg, None, "tiles", 6)),
        "unknown cache hint": msg(lambda: mod.copy(xg, None, "tiles", 4, "l2")),
        "negative iteration count": msg(lambda: mod.ffma(-1)),
    }


def conv_flops_by_torch() -> dict[str, int]:
    """P73's conv2d and P27's conv3d counted by ``torch.utils.flop_counter`` (shapes only)."""
    import torch.nn.functional as F  # noqa: N812

    m73, m27 = P73_CONV_BN_SCALE.model(), P27_CONV3D_GN_MEAN.model()
    return {"P73 conv2d": torch_flop_count(F.conv2d, p73_parts()["x"], m73.conv.weight.shape,
                                           m73.conv.bias.shape),
            "P27 conv3d": torch_flop_count(F.conv3d, p27_parts()["x"], m27.conv.weight.shape,
                                           m27.conv.bias.shape)}


def ceilings_resources():
    """Registers per thread of each ``ceilings`` kernel for sm_75/80/90 (asserting no spills or stack)."""
    import pandas as pd

    from ..harness import build
    from ..harness.show import kernel_name

    res = pd.DataFrame([r for a in ("75", "80", "90") for r in build.resources("ceilings", a)])
    spills = res[["spill_store_bytes", "spill_load_bytes", "stack_bytes"]]
    assert (spills == 0).all().all(), res
    regs = res.pivot(index="kernel", columns="arch", values="registers")
    regs.index = regs.index.map(kernel_name)
    return regs.add_prefix("registers, ")


def ffma_flop(config: dict) -> int:
    """FLOP of one FFMA launch of ``config`` (blocks, threads, chains, iters): 2 per FMA."""
    return 2 * config["blocks"] * config["threads"] * config["chains"] * config["iters"]


@dataclass
class Rates:
    """Chapter 3's reference rates from its record: median ms per variant, FLOP/s, copy bytes/s."""

    t: object  # pandas Series: median ms per variant
    rate: dict[str, float]  # FLOP/s: ffma_ours, sgemm_torch, gemm_tf32_torch
    bw: dict[str, float]  # bytes/s of every copy variant (copy_ours included)
    per_clock: float  # FP32 FLOP per SM clock cycle, whole GPU
    ran_hz: float  # the clock the FFMA kernel ran at, by its own counters
    bw_datasheet: float

    @property
    def peak_ran(self) -> float:
        return self.per_clock * self.ran_hz

    @property
    def bw_best(self) -> float:
        return max(self.bw.values())

    @property
    def ffma_pct(self) -> float:  # our FFMA kernel, % of the FP32 peak at the clock it ran at
        return 100 * self.rate["ffma_ours"] / self.peak_ran

    @property
    def copy_pct(self) -> float:  # our fastest copy, % of PyTorch's
        return 100 * self.bw["copy_ours"] / self.bw["copy_torch"]

    @property
    def peaks(self) -> dict[str, float]:  # the compute rate of each arithmetic
        return {"fp32": self.rate["ffma_ours"], "tf32": self.rate["gemm_tf32_torch"]}

    @property
    def ours_bw(self) -> dict[str, float]:
        return {v: self.bw[v] for v in COPY_VARIANTS}

    def table(self):
        import pandas as pd

        return pd.DataFrame({"median ms": self.t[[*self.rate, *self.bw]],
                             "TFLOP/s": pd.Series(self.rate) / 1e12, "GB/s": pd.Series(self.bw) / 1e9})


def reference_rates(rec: dict, n_copy: int, gemm: int) -> Rates:
    """The rates of chapter 3's reference variants, from ``rec`` (copies of ``n_copy`` floats, GEMMs of
    ``gemm``³), the FP32 peak per clock from the device's attributes and the FFMA kernel's own clock."""
    import pandas as pd

    t = pd.DataFrame(rec["timings_ms"]).T["median"]
    dev, cap = rec["device"], rec["provenance"]["capability"]
    gflop = matmul(gemm, gemm, gemm).flop
    rate = {"ffma_ours": ffma_flop(rec["ffma_config"]) / (t["ffma_ours"] * 1e-3),
            **{v: gflop / (t[v] * 1e-3) for v in ("sgemm_torch", "gemm_tf32_torch")}}
    copies = ["copy_torch", *COPY_VARIANTS, "copy_torch_again", "copy_ours"]
    bw = {v: copy(n_copy).bytes / (t[v] * 1e-3) for v in copies}
    return Rates(t, rate, bw, dev["sm_count"] * fp32_lanes_per_sm(cap) * 2,
                 rec["ffma_clock"]["kernel GHz (median over blocks)"] * 1e9,
                 dram_peak(dev["memory_clock_khz"] * 1e3, dev["memory_bus_bits"]))


def copy_configurations(bw: Mapping[str, float]):
    """Each copy configuration as % of PyTorch's copy, a table (float4 per thread × grid and hints), and
    what the prose needs: the best resident-grid %, the tiles-minus-resident gains, the hints' effects."""
    import pandas as pd

    pct = {v: 100 * bw[v] / bw["copy_torch"] for v in COPY_VARIANTS}
    hints = {"default": "no hints", "streaming": "evict first"}
    configs = pd.DataFrame([{"float4 per thread": u, "column": f"{g}, {hints[c]}", "%": pct[v]}
                            for v, (g, u, c) in COPY_VARIANTS.items()])
    grid = configs.pivot(index="float4 per thread", columns="column", values="%")
    gain = [pct[f"copy_tiles_u{u}"] - pct[f"copy_resident_u{u}"] for u in (1, 4, 8)]
    hint = [pct[f"{v}_cs"] - pct[v] for v in COPY_VARIANTS if not v.endswith("_cs")]
    resident_best = max(pct[f"copy_resident_u{u}"] for u in (1, 4, 8))
    return grid, resident_best, gain, hint


def math_verdict(math_of: Mapping[str, str | None]) -> str:
    """One Markdown clause: which of the timed variants ran TF32 tensor-core kernels, if any."""
    tf32_ran = [v for v, m in math_of.items() if m == "tf32"]
    if not tf32_ran:
        return "every convolution here ran as an FP32 FFMA kernel, held to the FP32 rate"
    return "TF32 tensor-core kernels ran for " + ", ".join(f"`{v}`" for v in tf32_ran) + ", held to the TF32 rate"


def bound_by(c: Counts, ridge_point: float) -> str:
    """'compute-bound' if ``c``'s intensity is past the ridge point, else 'memory-bound'."""
    return "compute-bound" if c.intensity > ridge_point else "memory-bound"


def closest_to_bound(bounded, chapter: str, defining: Iterable[str]):
    """The rows of ``with_bounds`` less the rate-defining variants — ``chapter``'s ``defining`` ones and
    every variant declared with the role "reference-rate" — asserting none is below 0.9× its bound,
    and the one closest to its bound."""
    defining = (bounded["variant"].isin(list(defining)) & (bounded["chapter"] == chapter)) | (
        bounded["role"] == "reference-rate")
    checked = bounded[~defining]
    assert (checked["measured / bound"] >= 0.9).all(), checked.nsmallest(3, "measured / bound")
    return checked.loc[checked["measured / bound"].idxmin()]


NCU_DRAM = ["dram__bytes_read.sum", "dram__bytes_write.sum", "gpu__time_duration.sum"]


def ncu_tables(ncu_records: list[dict]):
    """Nsight Compute's DRAM counters per kernel (MB read and written, ns) and summed per variant (bytes)."""
    import pandas as pd

    from ..harness.show import kernel_name

    ncu = pd.DataFrame(ncu_records)
    per_kernel = ncu.pivot_table(index=["variant", "kernel"], columns="metric", values="value",
                                 aggfunc="sum", sort=False).reset_index()
    per_kernel["kernel"] = per_kernel["kernel"].map(kernel_name)
    per_kernel[NCU_DRAM[:2]] /= 1e6
    per_kernel = per_kernel.rename(columns=dict(zip(NCU_DRAM, ["read MB", "written MB", "ns"], strict=True)))
    tot = ncu.pivot_table(index="variant", columns="metric", values="value", aggfunc="sum")
    tot = tot.rename(columns={NCU_DRAM[0]: "read", NCU_DRAM[1]: "write"})
    tot["moved"] = tot["read"] + tot["write"]
    return per_kernel, tot


def predicted_vs_measured(pred: Mapping[str, Counts], tot):
    """Each variant's predicted minimum DRAM MB against the MB Nsight Compute measured (``ncu_tables``)."""
    import pandas as pd

    return pd.DataFrame({v: {"predicted MB": c.bytes / 1e6, "measured MB": tot.loc[v, "moved"] / 1e6,
                             "measured / predicted": tot.loc[v, "moved"] / c.bytes}
                         for v, c in pred.items()}).T


def ffma_counts(config: dict) -> dict:
    """The counts one FFMA launch of ``config`` declares: its FLOP, nothing read, one float per thread written."""
    return {"flop": ffma_flop(config), "read": 0, "write": F32 * config["blocks"] * config["threads"]}


def ffma_clock(mod, iters: int) -> dict:
    """The SM clock one more FFMA launch (``iters`` steps, every resident block) ran at, by its own counters:
    each block's ``clock64`` cycles over its ``%globaltimer`` nanoseconds around the loop, in GHz."""
    import statistics

    ghz = [c / ns for c, ns in mod.ffma(iters)[1].double().cpu().tolist()]
    return {"blocks": len(ghz), "kernel GHz (median over blocks)": float(statistics.median(ghz)),
            "kernel GHz (min)": min(ghz), "kernel GHz (max)": max(ghz)}


BOUND_COLUMNS = ["chapter", "variant", "provider", "math", "FLOP/byte", "bound", "bound_ms", "median_ms",
                 "measured / bound"]


def bias_verdict(separate_bias: bool) -> str:
    """One Markdown clause: how eager eval P73 added the convolution's bias, from its profile."""
    if separate_bias:
        return ("cuDNN's convolution wrote its output without the bias, and ATen's `CUDAFunctor_add` "
                "kernel read and wrote it again to add it")
    return "the convolution added its bias itself"


def ncu_installed() -> bool:
    """Whether Nsight Compute's ``ncu`` is on the PATH."""
    import shutil

    return shutil.which("ncu") is not None
