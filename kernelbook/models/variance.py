"""Mean and variance in float32, the ways a GPU kernel can compute them, simulated with NumPy on the CPU.

Every function reduces over the last axis of its input and works batched over the leading axes, so one
call evaluates thousands of independent groups. Arithmetic happens in ``dtype`` (float32 by default):
NumPy rounds each float32 operation correctly, as the GPU does, but never fuses a multiply and an add
(the GPU often does), and its ``sum`` adds pairwise — so these are models of the kernels' numerics, not
bit-exact replays. The reference is always float64 on the same float32 data.

* ``onepass``: Σx and Σx², then E[x²] − E[x]² — cancels catastrophically when |μ| ≫ σ.
* ``onepass_f64``: the same sums accumulated in float64 (a float32's square is exact there), rounded to
  float32 at the end: the cancellation happens with double's 53 bits instead of float's 24.
* ``twopass``: the mean first, then Σ(x − mean)² (with the (Σd)²/n correction of Chan, Golub & LeVeque).
* ``welford``: the classic per-element update, run by many independent strands, merged with Chan's formula.
* ``gpu_welford``: the shape of ``kernels/group_stats.cu``'s Welford kernel — per-thread states of 16-value
  trips, merged across lanes (shuffle-down tree), warps, and blocks (in float64, as the kernel does).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch

UNIT_ROUNDOFF = {np.dtype(np.float32): 2.0**-24, np.dtype(np.float64): 2.0**-53}


class State(NamedTuple):
    """Welford/Chan summary of a set of values: count, mean and M2 = Σ(x − mean)² (arrays, broadcast)."""

    n: np.ndarray
    mean: np.ndarray
    m2: np.ndarray


def _as(x, dtype) -> np.ndarray:
    return np.asarray(x, dtype=dtype)


def onepass(x, dtype=np.float32, compensated: bool = False, strands: int = 1024) -> tuple[np.ndarray, np.ndarray]:
    """(mean, biased variance) by E[x²] − E[x]², accumulated in ``dtype``.

    ``compensated=True`` accumulates both sums with Neumaier's compensated summation, each of ``strands``
    strands over every ``strands``-th value, then across strands: the sums become accurate to a rounding
    or two, and the final subtraction still cancels.
    """
    x = _as(x, dtype)
    n = x.shape[-1]
    if compensated:
        s, q = _neumaier(x, strands), _neumaier(x * x, strands)
    else:
        s, q = x.sum(axis=-1, dtype=dtype), (x * x).sum(axis=-1, dtype=dtype)
    mean = s / dtype(n)
    return mean, q / dtype(n) - mean * mean


def onepass_f64(x) -> tuple[np.ndarray, np.ndarray]:
    """(mean, biased variance) by E[x²] − E[x]² on float32 data with float64 sums, rounded to float32."""
    mean, var = onepass(_as(x, np.float32).astype(np.float64), dtype=np.float64)
    return mean.astype(np.float32), var.astype(np.float32)


def onepass_f64_limit() -> float:
    """The μ/σ up to which float64 sums keep the one-pass variance at float32's rounding: u64·κ² = u32."""
    u32, u64 = UNIT_ROUNDOFF[np.dtype(np.float32)], UNIT_ROUNDOFF[np.dtype(np.float64)]
    return math.sqrt(u32 / u64)


def _neumaier(x: np.ndarray, strands: int) -> np.ndarray:
    """Compensated sum over the last axis: ``strands`` sequential strands, then a sequential sum across them."""
    dt = x.dtype.type
    n = x.shape[-1]
    steps = -(-n // strands)
    pad = np.zeros((*x.shape[:-1], steps * strands - n), dtype=x.dtype)
    v = np.concatenate([x, pad], axis=-1).reshape(*x.shape[:-1], steps, strands)

    def run(values: np.ndarray) -> np.ndarray:  # values (..., k): Neumaier over the last axis
        s = np.zeros(values.shape[:-1], dtype=values.dtype)
        c = np.zeros_like(s)
        for i in range(values.shape[-1]):
            xi = values[..., i]
            t = s + xi
            c += np.where(np.abs(s) >= np.abs(xi), (s - t) + xi, (xi - t) + s)
            s = t
        return s + c

    per_strand = run(np.moveaxis(v, -2, -1))  # (..., strands)
    return dt(1) * run(per_strand)


def twopass(x, dtype=np.float32) -> tuple[np.ndarray, np.ndarray]:
    """(mean, biased variance): the mean first, then Σd² − (Σd)²/n with d = x − mean (corrected two-pass)."""
    x = _as(x, dtype)
    n = dtype(x.shape[-1])
    mean = x.sum(axis=-1, dtype=dtype) / n
    d = x - mean[..., None]
    s1 = d.sum(axis=-1, dtype=dtype)
    return mean, (np.square(d).sum(axis=-1, dtype=dtype) - s1 * s1 / n) / n


def state_of(x, dtype=np.float32, mask: np.ndarray | None = None) -> State:
    """The exact state of the values on the last axis (where ``mask``), by two passes: what a thread does
    over the values it holds in registers."""
    x = _as(x, dtype)
    m = np.ones(x.shape, dtype=bool) if mask is None else mask
    k = m.sum(axis=-1).astype(dtype)
    s = np.where(m, x, dtype(0)).sum(axis=-1, dtype=dtype)
    mean = np.where(k > 0, s / np.maximum(k, dtype(1)), dtype(0)).astype(dtype)
    d = np.where(m, x - mean[..., None], dtype(0))
    return State(k, mean, np.square(d).sum(axis=-1, dtype=dtype))


def chan_merge(a: State, b: State) -> State:
    """Chan's pairwise merge of two states, elementwise; an empty side (n = 0) leaves the other unchanged."""
    n = a.n + b.n
    safe = np.where(n > 0, n, 1)
    delta = b.mean - a.mean
    wb = b.n / safe
    mean = a.mean + delta * wb
    m2 = a.m2 + b.m2 + delta * delta * a.n * wb
    a_empty, b_empty = a.n == 0, b.n == 0
    mean = np.where(b_empty, a.mean, np.where(a_empty, b.mean, mean))
    m2 = np.where(b_empty, a.m2, np.where(a_empty, b.m2, m2))
    return State(n, mean.astype(a.mean.dtype), m2.astype(a.m2.dtype))


def _take(s: State, sl) -> State:
    return State(s.n[sl], s.mean[sl], s.m2[sl])


def merge_tree(s: State) -> State:
    """Merge the states along the last axis as a warp's shuffle-down reduction does: lane i takes lane
    i + offset for offset = len/2, len/4, …, 1 (the axis padded with empty states to a power of two)."""
    size = s.n.shape[-1]
    width = 1 << max(0, (size - 1).bit_length())
    if width != size:
        pad = [(0, 0)] * (s.n.ndim - 1) + [(0, width - size)]
        s = State(*(np.pad(a, pad) for a in s))
    while width > 1:
        width //= 2
        s = chan_merge(_take(s, (..., slice(0, width))), _take(s, (..., slice(width, 2 * width))))
    return State(s.n[..., 0], s.mean[..., 0], s.m2[..., 0])


def merge_sequential(s: State) -> State:
    """Merge the states along the last axis one after another, left to right."""
    acc = _take(s, (..., 0))
    for i in range(1, s.n.shape[-1]):
        acc = chan_merge(acc, _take(s, (..., i)))
    return acc


def variance(s: State) -> np.ndarray:
    """The biased variance M2/n of a state (what GroupNorm and training-mode BatchNorm normalise with)."""
    return s.m2 / s.n


def _pivot(x: np.ndarray, shift: bool) -> tuple[np.ndarray, np.ndarray]:
    """(x − K, K) with K the first value of each row when ``shift``, else (x, 0)."""
    k = x[..., :1] if shift else np.zeros_like(x[..., :1])
    return (x - k if shift else x), k[..., 0]


def welford(x, dtype=np.float32, strands: int = 1024, shift: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(mean, biased variance) by the classic Welford update, one value at a time, in ``strands`` strands
    (strand j takes values j, j + strands, …: the per-element loop runs n/strands steps, vectorised over
    strands), then the strands' states merged by ``merge_tree``. ``shift`` subtracts each row's first value
    first (exact for values within a factor 2 of it) and adds it back to the mean."""
    x, pivot = _pivot(_as(x, dtype), shift)
    n = x.shape[-1]
    steps = -(-n // strands)
    v = np.concatenate([x, np.zeros((*x.shape[:-1], steps * strands - n), dtype=dtype)], axis=-1)
    v = v.reshape(*x.shape[:-1], steps, strands)
    valid = (np.arange(steps * strands).reshape(steps, strands) < n)
    cnt = np.zeros((*x.shape[:-1], strands), dtype=dtype)
    mean, m2 = np.zeros_like(cnt), np.zeros_like(cnt)
    for i in range(steps):
        xi, ok = v[..., i, :], valid[i]
        cnt = np.where(ok, cnt + dtype(1), cnt)
        delta = xi - mean
        mean = np.where(ok, mean + delta / np.maximum(cnt, dtype(1)), mean)
        m2 = np.where(ok, m2 + delta * (xi - mean), m2)
    s = merge_tree(State(cnt, mean, m2))
    return pivot + s.mean, variance(s)


def gpu_welford(x, dtype=np.float32, threads: int = 256, blocks: int = 1, trip: int = 16,
                shift: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(mean, biased variance) in the shape of group_stats.cu's Welford kernel, for an aligned row.

    Block b takes the b-th contiguous slice of the row's float4 items; in each trip a thread loads
    ``trip // 4`` float4 items ``threads`` apart, turns those values into an exact state (``state_of``) and
    merges it into its own; lanes merge by a shuffle-down tree, warps likewise; block states merge in
    float64 — one strand per lane over the blocks, then a tree — as the kernel's finalisation does.
    ``shift`` as in ``welford`` (the kernel's ``welford`` variant shifts; ``welford_noshift`` does not).
    """
    x, pivot = _pivot(_as(x, dtype), shift)
    lead, n = x.shape[:-1], x.shape[-1]
    unroll = trip // 4
    items = -(-n // 4)
    per_block = -(-items // blocks)
    trips = -(-per_block // (threads * unroll))
    total = blocks * trips * unroll * threads * 4
    v = np.concatenate([x, np.zeros((*lead, total - n), dtype=dtype)], axis=-1)
    ok = np.arange(total) < n
    # item index inside a block = trip·(unroll·threads) + u·threads + t; block b starts at b·per_block items
    item = (np.arange(blocks)[:, None, None, None] * per_block
            + np.arange(trips)[None, :, None, None] * unroll * threads
            + np.arange(unroll)[None, None, :, None] * threads + np.arange(threads)[None, None, None, :])
    in_block = (item - np.arange(blocks)[:, None, None, None] * per_block) < per_block
    idx = np.clip(item, 0, total // 4 - 1)[..., None] * 4 + np.arange(4)
    vals = v[..., idx]                                          # (..., blocks, trips, unroll, threads, 4)
    mask = (ok[idx] & in_block[..., None])
    vals = np.moveaxis(vals, -2, -3).reshape(*lead, blocks, trips, threads, trip)
    mask = np.broadcast_to(np.moveaxis(mask, -2, -3).reshape(blocks, trips, threads, trip), vals.shape)
    per_trip = state_of(vals, dtype, mask)                      # (..., blocks, trips, threads)
    thread = merge_sequential(State(*(np.moveaxis(a, -2, -1) for a in per_trip)))  # (..., blocks, threads)
    warps = threads // 32
    lanes = State(*(a.reshape(*lead, blocks, warps, 32) for a in thread))
    block = merge_tree(merge_tree(lanes))                         # lanes, then the block's warps (padded)
    if blocks == 1:
        return pivot + block.mean[..., 0], variance(State(*(a[..., 0] for a in block)))
    b64 = State(*(a.astype(np.float64) for a in block))
    strands = -(-blocks // 32) * 32
    pad = [(0, 0)] * len(lead) + [(0, strands - blocks)]
    b64 = State(*(np.pad(a, pad).reshape(*lead, strands // 32, 32) for a in b64))
    total_state = merge_tree(merge_sequential(State(*(np.moveaxis(a, -2, -1) for a in b64))))
    return pivot + total_state.mean.astype(dtype), variance(total_state).astype(dtype)


def reference(x) -> tuple[np.ndarray, np.ndarray]:
    """(mean, biased variance) in float64 of the values as stored (float32 data is converted exactly)."""
    x = np.asarray(x, dtype=np.float64)
    mean = x.mean(axis=-1)
    return mean, np.square(x - mean[..., None]).mean(axis=-1)


def grouped_reference(x, groups: int):
    """(mean, biased variance) in float64 of each (sample, group) of a torch tensor (N, C, ...), as
    (N, groups) tensors on x's device; an empty batch (N = 0) gives empty statistics."""
    import torch

    n = x.shape[0]
    per_group = math.prod(x.shape[1:]) // groups  # explicit: reshape cannot infer -1 for an empty batch
    if n == 0:  # var_mean warns on an empty reduction
        empty = torch.empty(0, groups, dtype=torch.float64, device=x.device)
        return empty, empty.clone()
    var, mean = torch.var_mean(x.double().reshape(n, groups, per_group), dim=-1, correction=0)
    return mean, var


def smooth_field(delta: float, seed: int, offset: float = 0.0, n: int = 4, c: int = 3, h: int = 34, w: int = 34,
                 device: str | torch.device = "cpu") -> torch.Tensor:
    """A slowly varying field per (image, channel) around ``offset``, plus uniform noise of amplitude
    ``delta``, in float32: neighbouring pixels nearly equal, so a difference filter cancels on it."""
    g = torch.Generator().manual_seed(seed)
    r, s = torch.arange(h, dtype=torch.float64)[:, None], torch.arange(w, dtype=torch.float64)[None, :]
    phase = torch.rand(n, c, 1, 1, generator=g, dtype=torch.float64) * 2 * torch.pi
    noise = delta * (torch.rand(n, c, h, w, generator=g, dtype=torch.float64) - 0.5)
    return (offset + 0.4 * torch.sin(0.01 * r + 0.007 * s + phase) + noise).float().to(device)


def rel_error(var, ref_var) -> np.ndarray:
    """|var − ref| / ref, elementwise, in float64."""
    ref = np.asarray(ref_var, dtype=np.float64)
    return np.abs(np.asarray(var, dtype=np.float64) - ref) / ref


def digits_lost(ratio) -> np.ndarray:
    """Decimal digits the one-pass formula loses at |μ|/σ = ratio: log10((μ/σ)²) (E[x²] ≈ μ², result σ²)."""
    return np.log10(np.square(np.asarray(ratio, dtype=np.float64)))


def shifted_normal(ratios, n: int, trials: int, seed: int, dtype=np.float32) -> np.ndarray:
    """Samples μ + z, z ~ N(0, 1), μ = ratio: shape (len(ratios), trials, n), rounded to ``dtype``."""
    rng = np.random.default_rng(seed)
    r = np.asarray(ratios, dtype=np.float64)[:, None, None]
    return (r + rng.standard_normal((len(r), trials, n))).astype(dtype)


def group_state(channel_states: State) -> State:
    """The state of a group from the states of its channels (last axis): within + between sums of squares."""
    return merge_sequential(channel_states)


METHODS = {
    "onepass": onepass,
    "onepass_f64": onepass_f64,
    "twopass": twopass,
    "welford": welford,
    "gpu_welford_noshift": gpu_welford,
    "gpu_welford": lambda x: gpu_welford(x, shift=True),
}


def group_ratio(x, groups: int):
    """|μ|/σ of every (sample, group) of an (N, C, *) torch tensor, in float64: what decides the one-pass error."""
    import torch

    per_group = math.prod(x.shape[1:]) // groups  # explicit: reshape cannot infer -1 for an empty batch
    v = x.detach().reshape(x.shape[0], groups, per_group).to(torch.float64)
    var, mean = torch.var_mean(v, dim=-1, correction=0)
    return mean.abs() / var.sqrt().clamp_min(torch.finfo(torch.float64).tiny)


def stats_tol(x, groups: int, algo: str, k: float = 16.0, floor: float = 1e-6) -> float:
    """Tolerance for the float32 variance of each (sample, group) of ``x`` computed by ``algo``.

    With κ = max |μ|/σ over the groups and u = 2⁻²⁴: the one-pass formula errs by about u·κ² (its two sums
    are rounded values of size μ², its result has size σ²); Welford states without a shift by about u·κ
    (each state's mean is a rounded float of size |μ|, entering Chan's merge at first order); two-pass and
    shifted Welford by a few u. We allow ``k`` roundings of that size, never less than ``floor``.
    """
    kappa = min(float(group_ratio(x, groups).max()), 1e100)  # a group of equal values has σ = 0: κ = ∞
    u32, u64 = UNIT_ROUNDOFF[np.dtype(np.float32)], UNIT_ROUNDOFF[np.dtype(np.float64)]
    if algo == "onepass_f64":  # the cancellation in double, then one rounding to float
        return max(floor, k * (u32 + u64 * (1.0 + kappa**2)))
    growth = {"onepass": 1.0 + kappa**2, "welford_noshift": 1.0 + kappa}.get(algo, 1.0)
    return max(floor, k * u32 * growth)


def sweep(ratios, n: int, trials: int, seed: int = 0, methods=None):
    """Relative variance error of each method against float64 as μ/σ sweeps ``ratios``: a long table with
    one row per (method, ratio) — median and max error over ``trials`` groups of ``n`` values, and the
    number of negative variances."""
    import pandas as pd

    methods = methods or METHODS
    x = shifted_normal(ratios, n, trials, seed)
    _, ref = reference(x)
    rows = []
    for name, fn in methods.items():
        _, var = fn(x)
        err = rel_error(var, ref)
        for i, r in enumerate(ratios):
            rows.append({"method": name, "ratio": float(r), "median_rel_err": float(np.median(err[i])),
                         "max_rel_err": float(err[i].max()), "negative": int((var[i] < 0).sum()),
                         "trials": trials})
    return pd.DataFrame(rows)


# Results per clock per SM of the arithmetic the one-pass kernels run per value, by compute capability:
# the CUDA C++ Programming Guide's table "Throughput of Native Arithmetic Instructions". The float
# kernel runs an FADD and an FFMA per value; the double one converts the value (F2F.F64.F32) and runs a
# DADD and a DFMA. T4 is sm_75, A100 sm_80, consumer Ampere/Ada and L4 sm_86/sm_89, H100/H200 sm_90.
THROUGHPUT_PER_SM_CLOCK = {
    "7.5": {"fp32": 64, "fp64": 2, "cvt64": 2},
    "8.0": {"fp32": 64, "fp64": 32, "cvt64": 16},
    "8.6": {"fp32": 128, "fp64": 2, "cvt64": 2},
    "8.9": {"fp32": 128, "fp64": 2, "cvt64": 2},
    "9.0": {"fp32": 128, "fp64": 64, "cvt64": 16},
}


def values_per_sm_clock(capability: str) -> dict[str, float]:
    """Values per clock per SM the arithmetic of each one-pass kernel can take on ``capability``:
    float sums 2 FP32 ops per value; double sums 2 FP64 ops and one conversion per value (issued
    separately, so their times add)."""
    t = THROUGHPUT_PER_SM_CLOCK[capability]
    return {"onepass": t["fp32"] / 2, "onepass_f64": 1.0 / (2 / t["fp64"] + 1 / t["cvt64"]),
            "fp64 : fp32": t["fp64"] / t["fp32"]}


def float_bits(v: float) -> tuple[int, str]:
    """(unbiased exponent, the 24 significand bits with the implicit 1) of a normal float32."""
    import struct

    b = struct.unpack("<I", struct.pack("<f", float(v)))[0]
    return ((b >> 23) & 0xFF) - 127, "1" + format(b & 0x7FFFFF, "023b")


def cancellation_picture(ax, x: np.ndarray) -> dict[str, float]:
    """Draw the float32 bits of E[x²] and E[x]² of the values ``x`` (one group), aligned by their
    weights (columns are powers of 2), with the bits the subtraction cancels grey and the bits left
    for the variance coloured; returns the numbers drawn."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch, Rectangle

    from ..harness.plots import BASELINE, CEILING, OURS

    x32 = np.asarray(x, dtype=np.float32)
    n = np.float32(x32.size)
    mean = x32.sum(dtype=np.float32) / n
    ex2, e2x = (x32 * x32).sum(dtype=np.float32) / n, mean * mean
    diff = ex2 - e2x
    true_var = float(reference(x32)[1])
    (ea, ba), (eb, bb) = float_bits(ex2), float_bits(e2x)
    top = max(ea, eb)
    rows = [("E[x²]", ea, ba), ("E[x]²", eb, bb)]
    same = 0
    while same < 24 and ea == eb and ba[same] == bb[same]:
        same += 1
    for r, (label, e, bits) in enumerate(rows):
        for i, bit in enumerate(bits):
            col = top - e + i
            face = BASELINE if i < same else OURS
            ax.add_patch(Rectangle((col, -r), 0.92, 0.8, color=face, alpha=0.25 + 0.6 * (bit == "1")))
        ax.text(-0.8, -r + 0.4, label, ha="right", va="center", fontsize=9)
    ev = math.floor(math.log2(true_var))
    ax.add_patch(Rectangle((top - ev, -2), 24 - 0.08, 0.8, fill=False, ec=CEILING, lw=1.2))
    ax.text(-0.8, -1.6, "true Var", ha="right", va="center", fontsize=9)
    ax.text(top - ev + 12, -1.6, "its 24 bits", ha="center", va="center", fontsize=8, color=CEILING)
    ax.axvline(same - 0.04, color=CEILING, ls=":", lw=1)
    ax.set_xlim(-7, max(24, top - ev + 24) + 1)
    ax.set_ylim(-2.3, 1.0)
    ax.set_yticks([])
    ax.set_xlabel("bit position (weight $2^k$, falling from left to right)")
    ax.grid(False)
    ax.legend(handles=[Patch(color=BASELINE, alpha=0.85, label="bit both share: cancels"),
                       Patch(color=OURS, alpha=0.85, label="bit left after the subtraction"),
                       Patch(color="none", label="dark: 1, light: 0"),
                       Line2D([], [], color=CEILING, ls=":", lw=1, label="first bit that differs")],
              loc="upper right", fontsize=8, handlelength=1.4)
    kept = max(0, 24 - (top - ev))
    return {"ex2": float(ex2), "e2x": float(e2x), "computed": float(diff), "true": true_var,
            "cancelled_bits": same, "bits_left": kept}


# Datasheet facts (NVIDIA's product pages and datasheets: SM count, boost clock, memory bandwidth) for
# the GPUs a reader is likely to run on, with their compute capability.
DATASHEETS = {
    "H200 SXM": {"capability": "9.0", "sms": 132, "boost_ghz": 1.98, "bandwidth_gbs": 4800},
    "A100 80GB": {"capability": "8.0", "sms": 108, "boost_ghz": 1.41, "bandwidth_gbs": 2039},
    "L4": {"capability": "8.9", "sms": 58, "boost_ghz": 2.04, "bandwidth_gbs": 300},
    "T4": {"capability": "7.5", "sms": 40, "boost_ghz": 1.59, "bandwidth_gbs": 320},
}


def fp64_cost_table():
    """Per GPU: the FP64 : FP32 rate, the values per clock per SM that the arithmetic of the float and
    the double one-pass kernels can take and that the memory delivers (4 bytes a value, at the datasheet
    bandwidth), and the predicted time of double sums over float sums (1.0 where memory limits both)."""
    import pandas as pd

    rows = {}
    for gpu, d in DATASHEETS.items():
        v = values_per_sm_clock(d["capability"])
        memory = d["bandwidth_gbs"] * 1e9 / (d["sms"] * d["boost_ghz"] * 1e9) / 4
        rows[gpu] = {"arch": "sm_" + d["capability"].replace(".", ""),
                     "FP64:FP32": f"1:{1 / v['fp64 : fp32']:.0f}",
                     "memory": memory, "float sums": v["onepass"], "double sums": v["onepass_f64"],
                     "double / float time":  # each runs at its slower limit
                         min(memory, v["onepass"]) / min(memory, v["onepass_f64"])}
    return pd.DataFrame(rows).T


def plot_sweep(ax, med, worst, ratios, styles: dict) -> None:
    """The sweep's median error per method (bars up to the worst) against μ/σ, with the one-pass theory
    line u·(μ/σ)² and the u·μ/σ shape of unshifted Welford; zero errors are drawn at 1e-9."""
    u = UNIT_ROUNDOFF[np.dtype(np.float32)]
    floor = 1e-9
    for m, (label, colour, marker) in styles.items():
        y = med[m].clip(lower=floor)
        ax.errorbar(ratios, y, yerr=[np.zeros(len(y)), worst[m].clip(lower=floor) - y], label=label,
                    color=colour, marker=marker, ms=4, lw=1, capsize=2)
    ax.plot(ratios, u * np.square(ratios), color="k", ls="--", lw=1, label="theory u·(μ/σ)²")
    ax.plot(ratios, u * np.asarray(ratios), color="k", ls=":", lw=1, label="u·μ/σ (∝ μ/σ)")
    ax.set(xscale="log", yscale="log", ylim=(floor / 2, 1e5), xlabel="μ/σ",
           ylabel="relative error of the variance\n(median, bar to max)")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2)  # below the axes


# ---- the chapter's bookkeeping: summaries of the experiments, and the GPU runs of the kernel ----

# How the tables name the methods and kernels.
LABELS = {"onepass": "one-pass", "onepass_f64": "double sums", "twopass": "two-pass",
          "gpu_welford_noshift": "Welford tree", "gpu_welford": "shifted Welford tree",
          "welford": "Welford per element", "onepass_compensated": "compensated"}

QUANTILES = {"min": 0.0, "median": 0.5, "q99": 0.99, "max": 1.0}


def sweep_summary(sweep_df, ratios, trials: int):
    """From ``sweep``'s long table: the (ratio × method) tables of median error, worst error and negative
    variances, the numbers the prose quotes (asserting each claim it makes), and the table shown."""
    import pandas as pd

    ratios = np.asarray(ratios, dtype=np.float64)
    med, worst, neg = (sweep_df.pivot(index="ratio", columns="method", values=v)
                       for v in ("median_rel_err", "max_rel_err", "negative"))
    u = UNIT_ROUNDOFF[np.dtype(np.float32)]
    theory = u * ratios**2
    mid = (ratios >= 10) & (ratios <= 1e3)  # where the one-pass error is neither ~u nor saturated
    fit = med["onepass"].to_numpy()[mid] / theory[mid]
    assert np.all((fit > 0.1) & (fit < 10)), fit
    assert worst["twopass"].max() < 1e-6 and worst["gpu_welford"].max() < 1e-6
    assert worst.loc[ratios <= 1e4, "onepass_f64"].max() < 1e-6
    assert neg.loc[ratios < 1e3, "onepass"].sum() == 0 < neg.loc[ratios >= 1e4, "onepass"].sum()
    assert neg.drop(columns=["onepass", "onepass_compensated"]).to_numpy().sum() == 0
    big = ratios >= 1e2  # unshifted Welford: the slope of log error against log μ/σ
    slope = np.polyfit(np.log10(ratios[big]), np.log10(med["gpu_welford_noshift"][big]), 1)[0]
    at = {r: np.isclose(ratios, float(r)) for r in ("1e3", "1e4", "1e6")}
    glued = {"digits_1e4": float(digits_lost(1e4)), "f64_limit": onepass_f64_limit(),
             "theory_fit_lo": fit.min(), "theory_fit_hi": fit.max(), "trials": trials,
             "neg_1e4": int(neg["onepass"][at["1e4"]].item()),
             "neg_total": int(neg["onepass"].sum()),
             "neg_from": float(neg.index[neg["onepass"] > 0].min()), "noshift_slope": slope,
             "noshift_below": u * 1e4 / med["gpu_welford_noshift"][at["1e4"]].item(),
             "shift_worst": worst["gpu_welford"].max(), "twopass_worst": worst["twopass"].max(),
             "f64_worst_1e4": worst.loc[ratios <= 1e4, "onepass_f64"].max()}
    for m, key in [("onepass", "onepass"), ("onepass_compensated", "compensated"),
                   ("gpu_welford_noshift", "noshift"), ("onepass_f64", "f64")]:
        for r, sel in at.items():
            glued[f"{key}_err_{r}"] = med[m][sel].item()
    table = med.iloc[::4].rename(columns=LABELS)
    table["theory u·(μ/σ)²"] = theory[::4]
    table["one-pass < 0"] = neg["onepass"].iloc[::4]
    table.index = pd.Index([f"{r:.0e}" for r in table.index], name="μ/σ")
    return med, worst, glued, table


def ratio_quantiles(r: np.ndarray) -> dict:
    """Count and quantiles of the |μ|/σ values ``r``."""
    r = np.asarray(r, dtype=np.float64).ravel()
    return {"groups": int(r.size), **{k: float(np.quantile(r, q)) for k, q in QUANTILES.items()}}


def offset_errors(x32: np.ndarray, offsets, groups: int,
                  methods=("onepass", "onepass_f64", "twopass", "gpu_welford")):
    """Norm-wise relative error of each method's variance on the float32 groups ``x32`` (N, G, L) plus
    each offset, with the largest μ/σ and the number of negative one-pass variances."""
    import pandas as pd
    import torch

    rows = {}
    for off in offsets:
        xs = (x32 + np.float32(off)).astype(np.float32)
        _, ref = reference(xs)
        row = {"max μ/σ": float(group_ratio(torch.from_numpy(xs), groups).max())}
        for m in methods:
            _, var = METHODS[m](xs)
            row[m] = float(np.sqrt(np.sum((var - ref) ** 2) / np.sum(ref**2)))
        row["one-pass < 0"] = int((onepass(xs)[1] < 0).sum())
        rows[off] = row
    return pd.DataFrame(rows).T.rename_axis("offset")


def check_cases(s: int) -> list:
    """(shape, groups, offset) of the statistics checks: P27's group size ``s`` per channel with N = 2 and
    N = 1 (one block per row, and several), a misaligned row start, tiny and odd groups, rows of 33 floats,
    a 4-million-value group, 5-D input."""
    return [((2, 16, s), 4, 0), ((1, 16, s), 4, 0), ((1, 16, s), 4, 3), ((3, 6, 7), 3, 0),
            ((5, 4, 1), 2, 1), ((2, 8, 1023), 8, 2), ((64, 32, 33), 32, 0),
            ((1, 4, (1 << 20) + 3), 1, 1), ((7, 12, 5, 6, 7), 3, 0)]


GN_CHECK_CASES = [((16, 16, 13, 29, 29), 4, 0), ((3, 6, 7), 3, 1), ((1, 8, 9999), 2, 0),
                  ((1, 2, 1 << 20), 1, 0)]


def run_checks(gs, algos, cases, device="cuda", gn_cases=None) -> dict:
    """Every algorithm of the module ``gs`` and its GroupNorm against float64 on (shape, groups, offset)
    cases: fresh inputs starting ``offset`` floats past a 16-byte boundary, NaN-poisoned outputs. Returns
    {name: check report}; raises on the first failure."""
    import torch
    from torch import nn

    from ..harness import check

    out = {}
    gn_cases = GN_CHECK_CASES if gn_cases is None else gn_cases
    with torch.no_grad():
        for i, (shape, groups, offset) in enumerate(cases):
            x = check.rand_at_offset(shape, offset, seed=i, device=device, low=-1.0, high=3.0)
            mr, vr = grouped_reference(x, groups)
            mean_tol = check.normalisation_tol(x.reshape(shape[0], groups, -1), (2,))
            for algo in algos:
                mean = check.poisoned((shape[0], groups), device=device)
                var = check.poisoned((shape[0], groups), device=device)
                gs.group_stats(x, groups, algo, mean, var)
                name = f"{algo} {shape} G={groups} +{offset}"
                out[f"{name} var"] = check.assert_close(var, vr, stats_tol(x, groups, algo), what=name)
                out[f"{name} mean"] = check.assert_close(mean, mr, mean_tol, what=name)
        for i, (shape, groups, offset) in enumerate(gn_cases):
            x = check.rand_at_offset(shape, offset, seed=50 + i, device=device, low=-2.0, high=5.0)
            gn = nn.GroupNorm(groups, shape[1]).double().to(device)
            gen = torch.Generator().manual_seed(i)
            w = torch.rand(shape[1], generator=gen, dtype=torch.float64) * 2 - 0.5
            gn.weight.copy_(w)
            gn.bias.copy_(torch.randn(shape[1], generator=gen, dtype=torch.float64))
            y = check.poisoned(shape, device=device)
            gs.group_norm(x, groups, gn.weight.float(), gn.bias.float(), gn.eps, y)
            tol = check.normalisation_tol(x.reshape(shape[0], groups, -1), (2,))
            out[f"group_norm {shape} G={groups} +{offset}"] = check.assert_close(
                y, gn(x.double()), tol, what=f"group_norm {shape}")
    return out


def accuracy_p27_sized(gs, h, groups: int, algos) -> dict:
    """Norm-wise relative error of each algorithm's variance on ``h`` (P27's conv output), on ``h`` + 1000
    and on N(0, 1) + 1e4 of the same shape, with the largest μ/σ and the negative one-pass variances."""
    import torch

    from ..harness import check

    gen = torch.Generator(device=h.device).manual_seed(1)
    datasets = {"P27 real": lambda: h, "P27 real + 1000": lambda: h + 1000.0,
                "N(0,1) + 1e4": lambda: torch.randn(h.shape, device=h.device, generator=gen) + 1e4}
    acc = {}
    with torch.no_grad():
        for name, make in datasets.items():
            x = make()
            _, vr = grouped_reference(x, groups)
            row = {"max μ/σ": float(group_ratio(x, groups).max())}
            for algo in algos:
                _, var = gs.group_stats(x, groups, algo)
                row[algo] = check.report(var, vr, 1.0)["rel_err"]
                if algo == "onepass":
                    row["onepass negatives"] = int((var < 0).sum())
            acc[name] = row
            del x, vr
    return acc


def bad_inputs(gs, device="cuda") -> tuple[dict, list]:
    """The error message of every bad input to ``gs`` ("accepted" where none), and the shape of the mean
    of an empty batch (N = 0 is not an error)."""
    import torch

    from ..harness.check import error_message as msg

    x = torch.rand(2, 4, 5, device=device)
    w = "welford"
    with torch.no_grad():
        bad = {
            "C not a multiple of groups": msg(lambda: gs.group_stats(x, 3, w)),
            "groups = 0": msg(lambda: gs.group_stats(x, 0, w)),
            "CPU input": msg(lambda: gs.group_stats(x.cpu(), 2, w)),
            "float64 input": msg(lambda: gs.group_stats(x.double(), 2, w)),
            "non-contiguous input": msg(lambda: gs.group_stats(x.transpose(1, 2), 2, w)),
            "empty groups (S = 0)": msg(lambda: gs.group_stats(x[:, :, :0].contiguous(), 2, w)),
            "unknown algorithm": msg(lambda: gs.group_stats(x, 2, "fast")),
            "γ of the wrong length": msg(
                lambda: gs.group_norm(x, 2, torch.ones(3, device=device), None, 1e-5)),
        }
        empty_mean, _ = gs.group_stats(torch.empty(0, 4, 5, device=device), 2, w)
    return bad, list(empty_mean.shape)


# Passes over the tensor each timed variant makes (read + write count as two).
PASSES = {"copy_torch": 2, "onepass": 1, "onepass_f64": 1, "twopass": 2, "welford": 1,
          "welford_noshift": 1, "torch_var_mean": 1, "torch_groupnorm": 3, "ours_groupnorm": 3}


def timed_fns(gs, x, groups: int, algos) -> dict:
    """The callables the chapter times on ``x`` (N, C, ...): the copy, each statistics algorithm into
    preallocated outputs, PyTorch's var_mean and GroupNorm, ours, and Welford on sample 0 alone."""
    import torch
    import torch.nn.functional as F  # noqa: N812
    from torch import nn

    n, c = x.shape[0], x.shape[1]
    y = torch.empty_like(x)
    mean_b, var_b = (torch.empty(n, groups, device=x.device) for _ in range(2))
    gn = nn.GroupNorm(groups, c).to(x.device).requires_grad_(False)
    x1 = x[:1]
    return {"copy_torch": lambda: y.copy_(x),
            **{a: (lambda a=a: gs.group_stats(x, groups, a, mean_b, var_b)) for a in algos},
            "torch_var_mean": lambda: torch.var_mean(x.view(n, groups, -1), dim=-1, correction=0),
            "torch_groupnorm": lambda: F.group_norm(x, groups, gn.weight, gn.bias, gn.eps),
            "ours_groupnorm": lambda: gs.group_norm(x, groups, gn.weight, gn.bias, gn.eps, y),
            "welford_n1": lambda: gs.group_stats(x1, groups, "welford")}


def profile_summary(prof, algos, plane: int) -> dict:
    """Checks the profile rows (kernel names already shortened) for what the prose says — one kernel per
    statistics variant (two-pass: two), no finalising kernel at the full batch — and returns the
    numbers it quotes."""
    for v, k in [("onepass", "pair_stats_kernel<0>"), ("welford", "welford_stats_kernel<3>"),
                 ("twopass", "pair_stats_kernel<2>"), ("welford_n1", "finalize_kernel<3>")]:
        rows = prof[prof.variant == v]
        assert len(rows) and rows.kernel.str.contains(k, regex=False).sum() == 1, v
    stats_rows = prof[prof.variant.isin(algos)]
    assert not stats_rows.kernel.str.contains("finalize_kernel", regex=False).any()
    launches = stats_rows.groupby("variant")["launches"].sum().to_dict()
    assert launches == {a: 2 if a == "twopass" else 1 for a in launches}, launches

    def listing(v, fmt):
        r = prof[prof.variant == v]
        return "; ".join(f"{k} ({us:{fmt}} µs)" for k, us in zip(r["kernel"], r["total_us"],
                                                                 strict=True))

    ogn = prof[prof.variant == "ours_groupnorm"]
    apply_row = ogn[ogn.kernel.str.contains("group_norm_apply_kernel", regex=False)]
    assert len(apply_row) == 1
    stats_us = ogn.loc[ogn.kernel.str.contains("welford_stats", regex=False), "total_us"].sum()
    return {"torch_gn_kernels": listing("torch_groupnorm", ".0f"),
            "n1_kernels": listing("welford_n1", ".1f"),
            "ours_apply_kernel": apply_row["kernel"].item(),
            "ours_apply_us": float(apply_row["total_us"].item()),
            "ours_gn_stats_us": float(stats_us), "plane_floats": plane}


def timing_summary(t, tensor_bytes: float, n: int) -> dict:
    """The numbers the Measure prose quotes, from the timing table ``t`` (median ms, GB/s, % of copy
    rate per variant) of a tensor of ``tensor_bytes`` and batch ``n``."""
    ms = t["median ms"]
    out = {f"ms_{v}": ms[v] for v in ("onepass", "twopass", "welford", "torch_var_mean",
                                      "torch_groupnorm", "ours_groupnorm")}
    out |= {f"pct_{v}": t.loc[v, "% of copy rate"] for v in ("onepass", "welford", "torch_var_mean")}
    out |= {"gbs_welford": t.loc["welford", "GB/s"], "gbs_onepass": t.loc["onepass", "GB/s"],
            "copy_rate": t.loc["copy_torch", "GB/s"],
            "welford_vs_onepass": (ms["welford"] / ms["onepass"] - 1) * 100,
            "us_n1": ms["welford_n1"] * 1e3, "n1_kb": tensor_bytes / n / 1e3,
            "gn_speedup": ms["torch_groupnorm"] / ms["ours_groupnorm"]}
    if "onepass_f64" in ms:  # a record from before the variant existed lacks it
        out |= {"ms_f64": ms["onepass_f64"],
                "f64_vs_onepass": (ms["onepass_f64"] / ms["onepass"] - 1) * 100}
    return out
