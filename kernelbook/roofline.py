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

import json
import math
from collections.abc import Callable, Iterable, Sequence
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


def kernel_math(kernel_names: Iterable[str]) -> str:
    """The arithmetic a variant's profiled kernels used: 'tf32' if any name marks a tensor-core kernel
    (tf32, hmma, s1688/s16816, gmma), else 'fp32' (FFMA kernels: cuDNN's ``…_ffma_…``, ``…sgemm…``)."""
    import re

    tensor_core = re.compile(r"tf32|hmma|s1688|s16816|gmma|tensorop", re.IGNORECASE)
    return "tf32" if any(tensor_core.search(k) for k in kernel_names) else "fp32"


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


def p73_fused_train(problem: Problem = P73_CONV_BN_SCALE, strategy: str = "materialise") -> Counts:
    """Training mode, fused as far as the batch statistics allow (rationale 1).

    ``materialise``: the conv writes its output and accumulates the statistics on the way, then an apply
    pass reads it back and writes y (in place). ``recompute``: a first conv pass only accumulates statistics, a
    second recomputes the conv and writes y — twice the FLOP, but the input (8× smaller) is read twice
    instead of the output. ``moments``: the batch mean and variance of each output channel follow from the
    input patches' mean and covariance (``patch_moments``: one read of the input, no conv), then one conv with
    BN and the scale folded in writes y. All update the running statistics.
    """
    p = p73_parts(problem)
    c, numel = p["c_out"], math.prod(p["y"])
    conv_ = p73_conv(problem)
    stats_flop, apply_flop = 3 * numel, 2 * numel
    running = Counts(0, F32 * 4 * c + 8, F32 * 2 * c + 8)  # γ, β, running stats; running stats + count
    if strategy == "materialise":
        return conv_ + Counts(stats_flop + apply_flop, F32 * numel, F32 * numel) + running
    if strategy == "recompute":
        return conv_ + Counts(conv_.flop + stats_flop + apply_flop, conv_.read, 0, conv_.macs) + running
    if strategy == "moments":
        return conv_ + patch_moments(p["x"], p["k"]) + running
    raise ValueError(f"strategy must be one of {', '.join(map(repr, P73_TRAIN_STRATEGIES))}, got {strategy!r}")


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
    """P27 in one kernel (rationale 6): conv3d, hardswish, and per-(sample, channel) sums and sums of
    squares; the mean of GroupNorm follows from those sums, so the conv output never reaches DRAM."""
    p = p27_parts(problem)
    numel, (n, c) = math.prod(p["y"]), p["y"][:2]
    conv_ = p27_conv(problem)
    return Counts(conv_.flop + 3 * numel + 3 * numel, conv_.read + F32 * 2 * c, F32 * n * c, conv_.macs)


def ptx_instructions(name: str, kernel: str, arch: str = "90") -> list[str]:
    """The PTX opcodes of one kernel (``kb.build.ptx_instructions``, which records them for builds without nvcc)."""
    from .build import ptx_instructions as _ptx

    return _ptx(name, kernel, arch)


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


# ----------------------------------------------------------------------------------------------------------
# Every recorded variant, placed by its counts


@dataclass(frozen=True)
class Placed:
    """A recorded variant's counts and the arithmetic it may use: 'fp32', or 'tf32' (tensor cores)."""

    counts: Counts
    math: str = "fp32"


def _method(rec: dict) -> dict[str, Placed]:
    """00_method: y = s·x and the copy over the size its ``timings_ms`` were taken at (from its sweep)."""
    out = {}
    for v, t in rec.get("timings_ms", {}).items():
        mib = next((r["MiB"] for r in rec.get("sweep", []) if r["variant"] == v and r["median"] == t["median"]),
                   None)
        if mib is None:
            continue
        n = mib * 2**20 // F32
        if v in ("scale_ours", "scale_torch"):
            out[v] = Placed(elementwise(n, 1))
        elif v == "copy_torch":
            out[v] = Placed(copy(n))
    return out


def _bn_modes(rec: dict) -> dict[str, Placed]:
    """01_bn_modes: BN·s on P73's conv output; training variants compute BN-train·s, eval ones BN-eval·s
    (the scale folded into the per-channel affine map: no extra FLOP for the fused kernels' count)."""
    y = p73_parts()["y"]
    train, evl = Placed(batchnorm(y, True)), Placed(batchnorm(y, False))
    table = {"eager_bn_scale": train, "compile_bn_scale": train, "ours_bn_scale_train": train,
             "eager_bn_scale_eval": evl, "ours_bn_scale_eval": evl, "copy_torch": Placed(copy(math.prod(y)))}
    return {v: table[v] for v in rec.get("timings_ms", {}) if v in table}


def _bn_folding(rec: dict) -> dict[str, Placed]:
    """02_bn_folding: every variant computes eval-mode P73; eager and compile may run the conv in TF32
    (cuDNN's default), the ``*_tf32`` variants do."""
    c = p73_fused_eval()
    maths = {"eager_eval": "tf32", "cudnn_folded_fp32": "fp32", "cudnn_folded_tf32": "tf32", "compile_eval": "tf32",
             "ours_simple": "fp32", "ours_fast": "fp32"}
    return {v: Placed(c, maths[v]) for v in rec.get("timings_ms", {}) if v in maths}


P73_MOMENTS_VARIANTS = ("ours_train", "solution_train")  # chapter 6's default training strategy: moments


def _capstone_p73(rec: dict) -> dict[str, Placed]:
    """06_capstone_conv_bn_scale: eval variants count as fused eval P73, the rest as training mode
    (the benchmark's mode): from the input's moments for ours by default, in place otherwise; eager and
    compile baselines may use TF32 unless named ``*_fp32``."""
    out = {}
    for v in rec.get("timings_ms", {}):
        strategy = "moments" if v in P73_MOMENTS_VARIANTS else "materialise"
        c = p73_fused_eval() if "eval" in v else p73_fused_train(strategy=strategy)
        tf32 = (v.startswith(("eager", "compile")) and not v.endswith("_fp32")) or "tf32" in v
        out[v] = Placed(c, "tf32" if tf32 else "fp32")
    return out


def _capstone_p27(rec: dict) -> dict[str, Placed]:
    """07_capstone_conv3d_groupnorm_mean: every variant computes P27."""
    return {v: Placed(p27_fused(), "tf32" if v.startswith(("eager", "compile")) or "tf32" in v else "fp32")
            for v in rec.get("timings_ms", {})}


def _coalescing(rec: dict) -> dict[str, Placed]:
    """04_coalescing: every mapping (and PyTorch's ``addcmul``) computes y = x·a_c + b_c on P73's conv output
    shape; the copy moves the same tensor."""
    y = p73_parts()["y"]
    out = {}
    for v in rec.get("timings_ms", {}):
        if v == "copy_torch":
            out[v] = Placed(copy(math.prod(y)))
        elif v in MAPPINGS or v == "addcmul_torch":
            out[v] = Placed(affine_per_channel(y))
    return out


MAPPINGS = ("flat", "flat_vec4", "channel_fastest", "pixel_loop", "tile_7x18x4", "tile_8x8x8", "rows_w_x4")
STATS_VARIANTS = ("onepass", "twopass", "welford", "welford_noshift", "torch_var_mean")


def _variance(rec: dict) -> dict[str, Placed]:
    """05_variance: statistics of P27's GroupNorm groups on its (hardswished) conv output, the whole GroupNorm
    forward (statistics, then a read and a write: the tensor is far larger than L2, so read twice), the
    Welford kernel on a batch of one (``welford_n1``), and the copy."""
    p = p27_parts()
    y, groups = p["y"], p["groups"]
    table = {v: Placed(statistics(y, groups)) for v in STATS_VARIANTS}
    table.update({"torch_groupnorm": Placed(groupnorm(y)), "ours_groupnorm": Placed(groupnorm(y)),
                  "welford_n1": Placed(statistics((1, *y[1:]), groups)), "copy_torch": Placed(copy(math.prod(y)))})
    return {v: table[v] for v in rec.get("timings_ms", {}) if v in table}


def _stored(rec: dict) -> dict[str, Placed]:
    """A record that carries its own counts (``counts``: {variant: {flop, read, write, math}}); where the record
    also profiled the variant's kernels, its math is read from their names (``kernel_math``), not the label."""
    ran: dict[str, list[str]] = {}
    for k in rec.get("kernels", []):
        ran.setdefault(k.get("variant", ""), []).append(k.get("kernel", ""))
    return {v: Placed(Counts(int(c["flop"]), int(c["read"]), int(c["write"]), int(c.get("macs", 0))),
                      kernel_math(ran[v]) if v in ran else c.get("math", "fp32"))
            for v, c in rec.get("counts", {}).items() if v in rec.get("timings_ms", {})}


PLACERS: dict[str, Callable[[dict], dict[str, Placed]]] = {
    "00_method": _method,
    "01_bn_modes": _bn_modes,
    "02_bn_folding": _bn_folding,
    "04_coalescing": _coalescing,
    "05_variance": _variance,
    "06_capstone_conv_bn_scale": _capstone_p73,
    "07_capstone_conv3d_groupnorm_mean": _capstone_p27,
}


def placed(rec: dict) -> dict[str, Placed]:
    """The variants of one record whose counts are known (a record's own ``counts`` win)."""
    try:
        out = PLACERS.get(rec.get("chapter", ""), lambda r: {})(rec)
    except (KeyError, TypeError, ValueError):  # a record of an older or newer shape: place what it stores itself
        out = {}
    out.update(_stored(rec))
    return out


def recorded(paths: Iterable[Path] | None = None, gpu_slug: str = "h200", exclude: Sequence[str] = ()) -> list[dict]:
    """The records of ``gpu_slug`` (or those at ``paths``), minus the chapters in ``exclude``; a missing
    or unreadable file is skipped, so the list grows as chapters are recorded."""
    from .records import all_records

    if paths is None:
        paths = [p for p in all_records() if p.parent.name == gpu_slug]
    out = []
    for p in paths:
        try:
            rec = json.loads(Path(p).read_text())
        except (OSError, ValueError):
            continue
        if isinstance(rec, dict) and rec.get("chapter") not in exclude:
            out.append(rec)
    return out


def points(records: Iterable[dict] | None = None):
    """One row per recorded variant whose counts are known (default: every H200 record): chapter,
    variant, math, FLOP, bytes, intensity, median ms, achieved TFLOP/s and GB/s."""
    import pandas as pd

    rows = []
    for rec in recorded() if records is None else records:
        for v, pl in placed(rec).items():
            t = rec["timings_ms"][v]["median"]
            c = pl.counts
            rows.append({"chapter": rec["chapter"], "variant": v, "math": pl.math, "FLOP": c.flop, "bytes": c.bytes,
                         "FLOP/byte": c.intensity, "median_ms": t, "TFLOP/s": c.flop / (t * 1e-3) / 1e12,
                         "GB/s": c.bytes / (t * 1e-3) / 1e9})
    cols = ["chapter", "variant", "math", "FLOP", "bytes", "FLOP/byte", "median_ms", "TFLOP/s", "GB/s"]
    return pd.DataFrame(rows, columns=cols)


def with_bounds(df, peak: dict[str, float], bandwidth: float):
    """``points`` plus the roofline's lower bound per row (compute ceiling chosen by its ``math``) and
    measured / bound: 1.0 would be a kernel on the roof."""
    out = df.copy()
    out["bound_ms"] = [1e3 * max(f / peak[m], b / bandwidth)
                       for f, b, m in zip(out["FLOP"], out["bytes"], out["math"], strict=True)]
    out["bound"] = ["compute" if f / peak[m] > b / bandwidth else "memory"
                    for f, b, m in zip(out["FLOP"], out["bytes"], out["math"], strict=True)]
    out["measured / bound"] = out["median_ms"] / out["bound_ms"]
    return out


@dataclass(frozen=True)
class Roof:
    """One roofline: a compute ceiling (FLOP/s) over a bandwidth ceiling (bytes/s); dashed if not measured."""

    label: str
    peak: float
    bandwidth: float
    dashed: bool = False


def plot(df, roofs: Sequence[Roof], ax=None, title: str = ""):
    """Log-log roofline: every roof (measured solid, datasheet dashed), the ridge of the first one, and
    every row of ``df`` with FLOP > 0 as a point (ours in the book's colour, baselines grey; one marker
    per chapter)."""
    import matplotlib.pyplot as plt
    import numpy as np

    from .plots import CEILING, colour

    if ax is None:
        _, ax = plt.subplots(figsize=(8.5, 5.5))
    pts = df[df["FLOP"] > 0]
    lo = min([0.05, *(pts["FLOP/byte"] / 3)])
    hi = max([1e4, *(pts["FLOP/byte"] * 3)])
    x = np.logspace(np.log10(lo), np.log10(hi), 400)
    labelled: list[float] = []
    for roof in roofs:
        ax.plot(x, np.minimum(roof.peak, roof.bandwidth * x) / 1e12, color=CEILING, lw=0.9 if roof.dashed else 1.3,
                ls="--" if roof.dashed else "-", alpha=0.6 if roof.dashed else 0.9)
        text = f"{roof.label}: {roof.peak / 1e12:.1f} TFLOP/s"
        if roof.dashed:  # datasheet roofs: labelled at their ridge, left of the measured ones' labels
            ax.annotate(text, (ridge(roof.peak, roof.bandwidth), roof.peak / 1e12), xytext=(-4, 4),
                        textcoords="offset points", ha="right", fontsize=7, color=CEILING, alpha=0.8)
            continue
        crowded = any(max(roof.peak, p) / min(roof.peak, p) < 1.35 for p in labelled)  # label below the line
        ax.annotate(text, (hi, roof.peak / 1e12), xytext=(-4, -10 if crowded else 3), textcoords="offset points",
                    ha="right", fontsize=7, color=CEILING)
        labelled.append(roof.peak)
    for bw, dashed in {(r.bandwidth, r.dashed) for r in roofs}:
        ax.annotate(f"{bw / 1e12:.2f} TB/s{' (datasheet)' if dashed else ''}", (lo, bw * lo / 1e12),
                    xytext=(6, 6 if dashed else -12), textcoords="offset points", fontsize=7, color=CEILING)
    first = roofs[0]
    r = ridge(first.peak, first.bandwidth)
    ax.axvline(r, color=CEILING, lw=0.7, ls=":")
    ax.annotate(f"ridge {r:.1f} FLOP/B", (r, first.peak / 1e12), xytext=(4, -12), textcoords="offset points",
                fontsize=7)
    markers = ["o", "s", "^", "D", "v", "P", "X", "*"]
    for (ch, grp), mk in zip(pts.groupby("chapter", sort=True), markers * 4, strict=False):
        ax.scatter(grp["FLOP/byte"], grp["TFLOP/s"], c=[colour(v) for v in grp["variant"]], marker=mk, s=30,
                   edgecolors="black", linewidths=0.4, label=ch, zorder=3)
        for _, row in grp.iterrows():
            ax.annotate(row["variant"], (row["FLOP/byte"], row["TFLOP/s"]), xytext=(4, -3), textcoords="offset points",
                        fontsize=6)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP per DRAM byte, from the counts)")
    ax.set_ylabel("TFLOP/s (counted FLOP / median time)")
    ax.legend(title="chapter (red: ours, grey: baselines)", fontsize=7, title_fontsize=7, loc="lower right")
    ax.set_title(title)
    return ax
