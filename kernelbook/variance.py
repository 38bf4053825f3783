"""Mean and variance in float32, the ways a GPU kernel can compute them, simulated with NumPy on the CPU.

Every function reduces over the last axis of its input and works batched over the leading axes, so one
call evaluates thousands of independent groups. Arithmetic happens in ``dtype`` (float32 by default):
NumPy rounds each float32 operation correctly, as the GPU does, but never fuses a multiply and an add
(the GPU often does), and its ``sum`` adds pairwise — so these are models of the kernels' numerics, not
bit-exact replays. The reference is always float64 on the same float32 data.

* ``onepass``: Σx and Σx², then E[x²] − E[x]² — cancels catastrophically when |μ| ≫ σ.
* ``twopass``: the mean first, then Σ(x − mean)² (with the (Σd)²/n correction of Chan, Golub & LeVeque).
* ``welford``: the classic per-element update, run by many independent strands, merged with Chan's formula.
* ``gpu_welford``: the shape of ``kernels/group_stats.cu``'s Welford kernel — per-thread states of 16-value
  trips, merged across lanes (shuffle-down tree), warps, and blocks (in float64, as the kernel does).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

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
    growth = {"onepass": 1.0 + kappa**2, "welford_noshift": 1.0 + kappa}.get(algo, 1.0)
    return max(floor, k * UNIT_ROUNDOFF[np.dtype(np.float32)] * growth)


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
