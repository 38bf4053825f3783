"""Chapter 8's own models: P27 (Conv3d → HardSwish → GroupNorm → mean) as the fused kernel sees it.

The reference in float64, the calls of the two kernels of ``kernels/conv3d_gn_mean``, the work
decomposition of the fused kernel (from its constants, read from the built module), the float32
model of its pivot-shifted statistics, the Nsight Compute request for it, and its version ladder
(``LADDER``) and figures.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
from collections.abc import Mapping

import numpy as np
import torch
import torch.nn.functional as F

from .problems import P27, P27_CONV3D_GN_MEAN

TOL = 1e-5  # the chapter's bound on an fp32 result's relative error against float64

# Shapes the kernel was not tuned for: (N, C_in, D, H, W, C_out, groups).
SHAPES = [(1, 3, 16, 32, 32, 16, 4), (2, 3, 9, 17, 23, 16, 4), (3, 3, 9, 17, 23, 8, 2),
          (2, 3, 9, 17, 23, 24, 3), (2, 5, 7, 11, 13, 32, 8), (1, 3, 16, 32, 33, 16, 1),
          (2, 2, 6, 9, 130, 64, 16), (2, 3, 20, 40, 36, 16, 4)]

# Opt-in shared memory per block (bytes), CUDA C++ Programming Guide, compute capabilities table.
SMEM_LIMITS = {"H100/H200 (sm_90)": 232448, "A100 (sm_80)": 166912,
               "RTX 30/40 (sm_86/89)": 101376, "T4 (sm_75)": 65536}


def model(c_in: int = 3, c_out: int = 16, groups: int = 4, seed: int = 0, device: str = "cuda",
          k: int = 4) -> P27:
    """A P27 module whose GroupNorm affine parameters matter: γ of both signs, β ≠ 0."""
    torch.manual_seed(seed)
    m = P27(c_in, c_out, k, num_groups=groups).to(device)
    with torch.no_grad():
        m.group_norm.weight.uniform_(-2, 2)
        m.group_norm.bias.uniform_(-1, 1)
    return m


def reference64(m: torch.nn.Module, x: torch.Tensor, tol: float = TOL) -> tuple[torch.Tensor, float]:
    """The module in float64 on x, and the tolerance for a float32 computation of it: ``tol``,
    widened only where a group's |μ|/σ makes any float32 statistics lose digits."""
    from ..harness.check import normalisation_tol

    m64 = copy.deepcopy(m).double()
    with torch.no_grad():
        h = F.hardswish(m64.conv(x.double()))
        ref = m64.group_norm(h).mean(dim=[2, 3, 4])
        by_group = h.reshape(h.shape[0], m64.group_norm.num_groups, -1)
        return ref, max(tol, normalisation_tol(by_group, (2,), k=64.0))


def check_cases(m: torch.nn.Module, device: str = "cuda") -> dict[str, tuple]:
    """(module, input, smem_limit) per check of the fused kernel beyond P27 itself: the shapes in
    ``SHAPES``, P27 planned as on GPUs with less shared memory, and P27 inputs shifted by ±1000."""
    from ..harness.check import rand

    p = P27_CONV3D_GN_MEAN
    cases = {f"ours {s}": (model(s[1], s[5], s[6], seed=sum(s), device=device),
                           rand(s[:5], seed=sum(s), device=device), 0) for s in SHAPES}
    x8 = p.inputs(seed=9, batch=8, device=device)
    cases |= {f"ours P27 planned as on {g}": (m, x8, b) for g, b in list(SMEM_LIMITS.items())[1:]}
    cases |= {f"ours P27 inputs {s:+g}": (m, p.inputs(seed=5, batch=8, device=device) + s, 0)
              for s in (1e3, -1e3)}
    return cases


def checks(ext) -> dict[str, dict]:
    """Chapter 8's checks against float64 (convolutions in float32) on NaN-poisoned outputs, as reports
    (``kb.check.report``): the fused kernel by FFMA (``ours``) and on the tensor cores (``ours_tc``) on
    P27's full batch (samples 0–63 and the last 64) and on ``check_cases`` — the tensor-core path where it
    runs (at most 16 output channels, one output depth in shared memory) —, the tail kernel on P27."""
    from ..harness import check, precision

    p, res = P27_CONV3D_GN_MEAN, {}
    n, c_out = p.input_shape[0], p.init_args[1]
    with torch.no_grad(), precision.tf32(False):  # the tail's conv in fp32 too
        m, x = model(seed=1), p.inputs(seed=0, device="cuda")
        idx = torch.cat([torch.arange(64), torch.arange(n - 64, n)]).cuda()
        ref, _ = reference64(m, x[idx])
        for name, math in (("ours", "fp32"), ("ours_tc", "3xtf32")):
            out = fused(ext, m, x, check.poisoned((n, c_out), device="cuda"), math=math)
            res[f"{name} P27 full batch (samples 0-63, {n - 64}-{n - 1})"] = check.report(out[idx], ref, TOL)
        out = tail(ext, m, x[:64], check.poisoned((64, c_out), device="cuda"))
        res["tail_fused P27 (samples 0-63)"] = check.report(out, ref[:64], TOL)
        for name, (mm, xx, limit) in check_cases(m).items():
            r, tol = reference64(mm, xx)
            co = mm.conv.out_channels
            tc_runs = co <= 16 and ext.plan(*xx.shape[1:], co, limit or max(SMEM_LIMITS.values()),
                                            math="3xtf32")["depths_per_slab"] > 0
            for prefix, math in (("ours", "fp32"), ("ours_tc", "3xtf32"))[:1 + tc_runs]:
                out = fused(ext, mm, xx, check.poisoned(r.shape, device="cuda"), limit, math=math)
                res[prefix + name[len("ours"):]] = check.report(out, r, tol)
    return res


def bad_inputs(ext) -> dict[str, str]:
    """What the fused kernel says to inputs it does not support (``kb.check.error_message``; "accepted"
    if it took one): the chapter's table of refusals."""
    from ..harness.check import error_message, run_double_backward

    x, m = torch.rand(2, 3, 6, 7, 8, device="cuda"), model(seed=0)
    w, b = m.conv.weight.detach(), m.conv.bias.detach()
    gn = (None, None, 4, 1e-5)  # no GroupNorm affine; 4 groups; eps
    calls = {"3×3×3 filter": ((x, w[:, :, :3, :3, :3].contiguous(), b, *gn), {}),
             "16 channels in 5 groups": ((x, w, b, None, None, 5, 1e-5), {}),
             "input planes too large for shared memory": ((torch.ones(1, 3, 5, 400, 400, device="cuda"), w, b,
                                                           *gn), {}),
             "non-contiguous input": ((x.transpose(3, 4), w, b, *gn), {}),
             "tensor cores, 24 output channels": ((x, torch.ones(24, 3, 4, 4, 4, device="cuda"), None, *gn),
                                                  {"math": "3xtf32"}),
             "an unknown math": ((x, w, b, *gn), {"math": "tf32"})}
    out = {k: error_message(lambda a=a, kw=kw: ext.p27_forward(*a, **kw)) for k, (a, kw) in calls.items()}
    wg = w.clone().requires_grad_()
    out["a second derivative (create_graph=True)"] = error_message(
        lambda: run_double_backward(lambda: ext.p27_forward(x, wg, b, *gn), wg))
    return out


def fused(ext, m: torch.nn.Module, x: torch.Tensor, out: torch.Tensor | None = None,
          smem_limit: int = 0, math: str = "fp32") -> torch.Tensor:
    """P27 by the fused kernel (differentiable with grad mode on: kernelbook/models/autograd_ops.py); ``math``:
    ``"fp32"`` (FFMA) or ``"3xtf32"`` (tensor cores)."""
    gn = m.group_norm
    return ext.p27_forward(x, m.conv.weight, m.conv.bias, gn.weight, gn.bias, gn.num_groups, gn.eps,
                           out, smem_limit=smem_limit, math=math)


def tail(ext, m: torch.nn.Module, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """P27 by cuDNN's materialised convolution, then our one tail kernel."""
    gn = m.group_norm
    y = F.conv3d(x, m.conv.weight, m.conv.bias)
    return ext.p27_tail(y, gn.weight, gn.bias, gn.num_groups, gn.eps, out)


# ---- the Measure section's variants

CONV_ALONE = ("conv_only", "cutlass_conv3d")  # the convolution alone: its error is against float64's convolution


@contextlib.contextmanager
def cudnn_benchmark():
    """``torch.backends.cudnn.benchmark`` on inside the block: cuDNN times its algorithms for each new shape
    and keeps the fastest (the first call pays for the search); the setting comes back on exit."""
    before = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = True
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = before


def cutlass_operands(m: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """P27's convolution as CUTLASS's 3xTF32 conv3d takes it (kernels/cutlass_conv): input and filter in
    channels_last_3d (NDHWC), input channels padded with zeros to a multiple of 4 (CUTLASS copies 16 bytes at a
    time; the zero channel adds nothing to the sums), and the bias."""
    pad, cl = -x.shape[1] % 4, torch.channels_last_3d
    w = m.conv.weight.detach()
    xp, wp = (F.pad(t, (0, 0, 0, 0, 0, 0, 0, pad)).contiguous(memory_format=cl) for t in (x, w))
    return xp, wp, m.conv.bias.detach()


def peers(ext, kd: Mapping[int, object], cutlass, m: torch.nn.Module, x: torch.Tensor, whole: Mapping,
          conv_counts: Mapping, row: str) -> dict:
    """The variants the Measure section times after ``eager`` and ``conv_only``, as ``kb.measure.Variant``s:
    eager with TF32 off and with ``cudnn.benchmark`` (TF32 off), ``torch.compile`` (default and max-autotune),
    the module in channels_last_3d, the tail-only design, ours by FFMA and on the tensor cores, ours with the
    filter-depth loop unrolled (``kd``: unroll → built module), and CUTLASS's 3xTF32 conv3d of P27's
    convolution alone (``cutlass``: the cutlass_conv module; input prepared by ``cutlass_operands``, untimed).
    ``whole`` and ``conv_counts``: the FLOP and bytes of the problem and of its convolution."""
    from ..harness.measure import Variant as V

    compiled = torch.compile(m)
    compiled_max = torch.compile(copy.deepcopy(m), mode="max-autotune")
    cl3d = torch.channels_last_3d  # the layout cuDNN's fast 3-D convolutions want
    m_cl, x_cl = (t.to(memory_format=cl3d) for t in (copy.deepcopy(m), x))
    xp, wp, bias = cutlass_operands(m, x)

    def bench() -> torch.Tensor:
        with cudnn_benchmark():
            return m(x)

    return {"eager_fp32": V(lambda: m(x), "eager", counts=whole, tf32=False),
            "cudnn_bench": V(bench, "eager", "cudnn.benchmark", counts=whole, tf32=False),
            "compile": V(lambda: compiled(x), "compile", counts=whole, tf32=True, row=row),
            "compile_fp32": V(lambda: compiled(x), "compile", counts=whole, tf32=False),
            "compile_max": V(lambda: compiled_max(x), "compile", "max-autotune", counts=whole, tf32=True),
            "eager_cl3d": V(lambda: m_cl(x_cl), "eager", "channels_last_3d", counts=whole, tf32=True),
            "eager_cl3d_fp32": V(lambda: m_cl(x_cl), "eager", "channels_last_3d", counts=whole, tf32=False),
            "tail_fused": V(lambda: tail(ext, m, x), "ours", "cuDNN conv, our tail", counts=whole, tf32=True),
            "ours": V(lambda: fused(ext, m, x), "ours", counts=whole, role="headline", row=row),
            "ours_tc": V(lambda: fused(ext, m, x, math="3xtf32"), "ours", math="3xtf32", counts=whole,
                         role="control"),
            **{f"ours_kd{u}": V(lambda e=e: fused(e, m, x), "ours", counts=whole, role="control")
               for u, e in kd.items()},
            "cutlass_conv3d": V(lambda: cutlass.cutlass_conv3d(xp, wp, bias), "cutlass",
                                "conv3d alone, C padded to 4, channels_last_3d", "3xtf32", dict(conv_counts))}


def variant_errors(variants: Mapping, m: torch.nn.Module, x: torch.Tensor, n: int = 32) -> dict[str, dict]:
    """Each variant's error against float64 on the first ``n`` samples of the input it is timed on
    (``kb.check.report``), under its TF32 setting: of the whole problem, or, for the variants in ``CONV_ALONE``,
    of the convolution (bias included) against float64's."""
    from ..harness import check, precision

    ref, _ = reference64(m, x[:n])
    w, b = m.conv.weight.detach().double(), m.conv.bias.detach().double()
    out = {}
    with torch.no_grad():
        conv64 = F.conv3d(x[:n].double(), w, b)
        for name, v in variants.items():
            with precision.tf32(bool(v.tf32)):
                out[name] = check.report(v.fn()[:n], conv64 if name in CONV_ALONE else ref, TOL)
    return out


def peer_said(rec: dict) -> dict[str, str]:
    """What the Measure section says of the two library peers, as Markdown from the record, each its own
    sentence: ``cudnn_bench`` (the module with ``cudnn.benchmark``, TF32 off) against eager in float32, and
    CUTLASS's 3xTF32 conv3d against cuDNN's float32 convolution alone; either says it is not in this record
    where the record lacks its time."""
    t, e = rec["timings_ms"], rec.get("variant_errors", {})
    ms = {k: v["median"] for k, v in t.items()}
    said = {"bench_said": "`cudnn.benchmark` (cuDNN timing its algorithms first, TF32 off): not in this record.",
            "cutlass_said": "CUTLASS's 3xTF32 conv3d on P27's convolution alone: not in this record."}
    if "cudnn_bench" in ms:
        b, e32 = ms["cudnn_bench"], ms["eager_fp32"]
        rows = rec.get("kernels", [])
        conv = {v: max((r for r in rows if r["variant"] == v), key=lambda r: r["total_us"],
                       default={}).get("kernel") for v in ("eager", "cudnn_bench")}
        same = conv["eager"] is not None and conv["eager"] == conv["cudnn_bench"]
        why = ", picks the same convolution kernel as eager without it (both profiles)" if same else ""
        what = ("the time does not change" if abs(b / e32 - 1) < 0.005 else
                f"the time changes by {100 * (b / e32 - 1):+.1f} %")
        said["bench_said"] = (f"With `cudnn.benchmark` on (TF32 off), cuDNN times its algorithms for this shape"
                              f"{why}, so {what}: {b:.2f} ms, against {e32:.2f} ms.")
    if "cutlass_conv3d" in ms:
        err = e.get("cutlass_conv3d", {}).get("rel_err", float("nan"))
        cudnn = e.get("conv_only", {}).get("rel_err", float("nan"))
        said["cutlass_said"] = (
            f"CUTLASS's float32-accurate tensor-core convolution, its 3xTF32 conv3d (input channels padded to "
            f"4, channels_last_3d, prepared untimed), computes P27's convolution alone in "
            f"{ms['cutlass_conv3d']:.2f} ms at an error of {err:.1e}, bias included; cuDNN's conv3d and its bias "
            f"pass take {ms['conv_only']:.2f} ms ({cudnn:.1e}), and ours the whole problem {ms['ours']:.2f} ms.")
    return said


# Every pass eager P27 runs, by the kernel that runs it: (pass, regex for the kernel's name); the first match
# names a kernel. cuDNN's convolution kernel writes the output without its bias; PyTorch adds it in a pass of its
# own (read from the profile: the add kernel is there).
EAGER_PASSES = [("conv3d (cuDNN), no bias", r"^(?!triton)(?=.*(?:conv(?!ert)|implicit|xmma|cutlass|fprop|gemm))"),
                ("bias add", r"Functor_add"), ("HardSwish", r"hardswish"),
                ("GroupNorm: statistics", r"RowwiseMoments"),
                ("GroupNorm: scale, shift per channel", r"ComputeFusedParams"),
                ("GroupNorm: the map", r"GroupNorm"), ("mean over (D, H, W)", r"MeanOps|reduce_kernel")]


def pass_counts(name: str, problem=P27_CONV3D_GN_MEAN):
    """The FLOP and least DRAM bytes (``roofline.Counts``) of one of ``EAGER_PASSES``, from P27's shapes: each
    pass reads its inputs and writes its outputs once."""
    from . import roofline as rl

    p = rl.p27_parts(problem)
    y, (n, c) = p["y"], p["y"][:2]
    numel, g = math.prod(y), p["groups"]
    return {"conv3d (cuDNN), no bias": rl.conv(p["x"], c, p["k"], bias=False),
            "bias add": rl.Counts(numel, rl.F32 * (numel + c), rl.F32 * numel),
            "HardSwish": rl.elementwise(numel, 3),
            "GroupNorm: statistics": rl.statistics(y, g),
            "GroupNorm: scale, shift per channel":  # mean, rstd per group; γ, β → a, b per channel
            rl.Counts(3 * n * c, rl.F32 * (2 * n * g + 2 * c), rl.F32 * 2 * n * c),
            "GroupNorm: the map": rl.Counts(2 * numel, rl.F32 * (numel + 2 * n * c), rl.F32 * numel),
            "mean over (D, H, W)": rl.reduce_mean(y)}[name]


def eager_passes(prof, fused_counts, variant: str = "eager"):
    """Every kernel ``variant`` launched (``kb.profile.kernels``' table ``prof``), as the pass of
    ``EAGER_PASSES`` it runs, with its FLOP and bytes and its measured µs; then eager's total and the fused
    kernel's counts (``fused_counts``). A kernel no pattern names is listed too, with its time and "(not
    modelled)": the table lists every kernel eager ran."""
    import re

    import pandas as pd

    from ..harness.show import kernel_name
    from . import roofline as rl

    mine = prof[prof.variant == variant]
    us: dict[str, float] = {}
    for k, t in mine[["kernel", "total_us"]].itertuples(index=False):
        name = next((n for n, pat in EAGER_PASSES if re.search(pat, k, re.I)), None)
        name = name or f"{kernel_name(k, 40)} (not modelled)"  # listed with its time, no counts
        us[name] = us.get(name, 0.0) + t
    known = [n for n, _ in EAGER_PASSES if n in us]  # in the order eager runs them
    rows = {n: {**pass_counts(n).row(), "µs": us[n]} for n in known}
    rows |= {n: {"µs": t} for n, t in us.items() if n not in rows}
    rows["eager, all kernels"] = {**rl.total(pass_counts(n) for n in known).row(), "µs": sum(us.values())}
    rows["fused (statistics on chip)"] = fused_counts.row()
    cols = ["µs", "FLOP", "bytes read", "bytes written", "FLOP/byte"]
    return pd.DataFrame.from_dict(rows, orient="index")[cols].rename_axis("pass")


def design(cfg: Mapping[str, int], c_out: int, out_shape: tuple[int, int, int]) -> dict:
    """The fused kernel's decomposition of one sample, from its constants (``ext.config()``):
    channel tiles (``groups``: the sets of channels one thread computes, not GroupNorm's groups), work
    items, rounds of lanes, and the useful fraction of the FFMAs it issues."""
    do, ho, wo = out_shape
    co_t, cols, threads = cfg["channels_per_thread"], cfg["columns_per_thread"], cfg["threads"]
    g8 = 1 << (math.ceil(c_out / co_t) - 1).bit_length()  # channel tiles, a power of 2
    lanes = threads // g8                                  # lanes per channel tile
    col_blocks = math.ceil(wo / cols)
    items = do * ho * col_blocks                           # work items per sample and tile
    rounds = math.ceil(items / lanes)
    useful = wo / (col_blocks * cols) * items / (rounds * lanes)
    return {"co_t": co_t, "cols": cols, "threads": threads, "groups": g8,
            "warps_per_group": threads // 32 // g8, "col_blocks": col_blocks, "items": items,
            "rounds": rounds, "lanes_per_group": lanes, "useful": useful}


def shifted_variances(h32: np.ndarray) -> dict[str, np.ndarray]:
    """Per-row variances of float32 data two ways, in float32 arithmetic: E[h²] − E[h]², and the
    kernel's sums of d = 6h − 6h[0] (a pivot from the data); a model of its numerics, not a replay."""
    n = np.float32(h32.shape[1])
    out = {}
    for name, v, scale in [("E[h²] − E[h]²", h32, 0), ("pivot-shifted sums (kernel)",
                                                       6 * h32 - 6 * h32[:, :1], 36)]:
        s1, s2 = v.sum(axis=1, dtype=np.float32), (v * v).sum(axis=1, dtype=np.float32)
        out[name] = (s2 - s1 * s1 / n) / n / scale if scale else s2 / n - (s1 / n) ** 2
    return out


# Nsight Compute: the basic counters, shared-memory wavefronts and conflicts, and stall reasons.
STALLS = ["short_scoreboard", "mio_throttle", "barrier", "long_scoreboard", "not_selected", "wait",
          "math_pipe_throttle", "dispatch_stall", "no_instruction", "lg_throttle"]
STALL = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"
NCU_BASIC = ["smsp__inst_executed.sum", "smsp__sass_thread_inst_executed_op_ffma_pred_on.sum",
             "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active",
             "smsp__issue_active.avg.pct_of_peak_sustained_active",
             "sm__warps_active.avg.pct_of_peak_sustained_active", "dram__bytes_read.sum"]
NCU_SMEM = ["l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum",
            "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum"]
NCU_ALL = NCU_BASIC + NCU_SMEM + [STALL.format(s) for s in STALLS]
HMMA = "sm__inst_executed_pipe_tensor_op_hmma.sum"  # tensor-core instructions (mma.sync)
# Both paths, FFMA and tensor cores: NCU_ALL and the tensor pipe (tensorcore.PATH_NCU_METRICS, all of them).
NCU_PATHS = NCU_ALL + ["sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active", HMMA]


def ncu_target(chapter: str, paths: Mapping[str, str] | None = None) -> str:
    """A script that runs the fused kernel once on P27 per path (variant → math; default ``ours`` by
    FFMA), each inside the NVTX range ``chapter/variant``."""
    paths = dict(paths or {"ours": "fp32"})
    return f"""
import torch, kernelbook as kb
from kernelbook import gn_mean
torch.set_grad_enabled(False)  # forward passes only: nothing for autograd to record
p27 = kb.problems.P27_CONV3D_GN_MEAN
ext, m = kb.build.load("conv3d_gn_mean"), p27.model(seed=0).cuda()
x = p27.inputs(seed=0, device="cuda")
for variant, math in {paths!r}.items():
    gn_mean.fused(ext, m, x, math=math)  # the first launch (opt-in attribute, first touch) stays outside
    with kb.timing.nvtx_range("{chapter}", variant):
        gn_mean.fused(ext, m, x, math=math)
torch.cuda.synchronize()
"""


def stalls(nc: Mapping[str, float]) -> dict[str, float]:
    """Warps stalled per issued instruction, by reason, largest first (those recorded)."""
    found = {s: float(nc[STALL.format(s)]) for s in STALLS if STALL.format(s) in nc}
    return dict(sorted(found.items(), key=lambda kv: -kv[1]))


# The kernel's versions, in the order they were built: each row says what changed, why, and what the
# measurement (or the compiler's report) said next; the variant that times it (None: a version that was not
# timed, for the reason given). An "optional" peer is shown where the record has it. In "changed", {vs_eager}
# and {vs_ours} become the version's speed-up over eager and its time over the default kernel's, from the record.
LADDER = [
    {"version": "eager PyTorch", "variant": "eager",
     "changed": "The start: cuDNN's conv3d writes its output, then a bias pass, HardSwish, GroupNorm "
                "(statistics, then the map) and the mean each read it again. Its profile says the "
                "convolution kernel alone is most of the time, so fusing the rest can win little."},
    {"version": "torch.compile", "variant": "compile",
     "changed": "Inductor fuses the bias, HardSwish, GroupNorm and the mean into two Triton kernels; the "
                "convolution stays cuDNN's. {vs_eager}× eager: the same convolution kernel still dominates."},
    {"version": "torch.compile, max-autotune", "variant": "compile_max",
     "changed": "The same graph with Inductor's autotuned configurations: {vs_eager}× eager, since the "
                "convolution is not Inductor's to tune."},
    {"version": "eager, channels_last_3d (TF32)", "variant": "eager_cl3d", "optional": True,
     "changed": "The module and its input in channels_last_3d, TF32 allowed: cuDNN's fastest convolution "
                "for P27, {vs_eager}× eager, but in TF32, with TF32's error."},
    {"version": "eager, cudnn.benchmark (float32)", "variant": "cudnn_bench", "optional": True,
     "changed": "cudnn.benchmark on, TF32 off: cuDNN times its algorithms for this shape and keeps the "
                "fastest: {vs_eager}× eager."},
    {"version": "tail fused", "variant": "tail_fused",
     "changed": "Keep cuDNN's conv3d and its bias pass; one tail kernel of ours does the rest from channel "
                "statistics: {vs_eager}× eager, close to its floor. The convolution has to come on chip."},
    {"version": "v1: the convolution on chip", "variant": None,
     "changed": "One block per sample, sample and weights in shared memory, 8 channels × 8 columns per "
                "thread. Its 16 running sums per thread spill at the 128 registers a 512-thread block "
                "allows: not timed."},
    {"version": "v2: warp reduce-scatter", "variant": None,
     "changed": "The 16 sums reduce-scattered over the warp, one per lane: no spills. Staging keeps one "
                "load in flight per thread, one DRAM round trip after another: not timed."},
    {"version": "v3: 8 loads in flight while staging", "variant": "ours",
     "changed": "8 loads per thread issued before their stores hide DRAM's latency: the default, "
                "{vs_eager}× eager. Its counters point at issue slots and built-in waste."},
    {"version": "v3, filter depths unrolled 2×", "variant": "ours_kd2",
     "changed": "Fewer address and loop instructions per FFMA, but {vs_ours}× v3's time: the loop stays "
                "rolled."},
    {"version": "v3, filter depths unrolled 4×", "variant": "ours_kd4",
     "changed": "The whole filter in one body: {vs_ours}× v3's time."},
    {"version": "v3 on the tensor cores (3xTF32)", "variant": "ours_tc",
     "changed": "mma.sync with the 3xTF32 split: {vs_ours}× v3's time, with more error than FFMA: an "
                "option, not the default."},
]


def ladder(rec: dict, floor_ms: float, path=None, floors: Mapping[str, float] | None = None) -> list[dict]:
    """The kernel's versions (``LADDER``, or a JSON list of the same at ``path``) with this record's
    times, where a version was timed, the share of the FFMA floor ``floor_ms`` each reached, the share
    of its own floor (``floors``: variant → ms, for a path on other units; else the FFMA floor), and what
    changed, its ``{vs_eager}`` and ``{vs_ours}`` filled in from the record; ``provider`` as the record
    declares the variant (a version that was not timed is ours)."""
    steps = json.loads(path.read_text()) if path else LADDER
    rows = []
    for s in steps:
        v = s.get("variant") or ""
        if s.get("optional") and v not in rec["timings_ms"]:
            continue
        ms = rec["timings_ms"][v]["median"] if v else float("nan")
        own = (floors or {}).get(v, floor_ms)
        said = s["changed"]
        for token, ref in (("{vs_eager}", "eager"), ("{vs_ours}", "ours")):
            if token in said and ref in rec["timings_ms"]:
                t = rec["timings_ms"][ref]["median"]
                said = said.replace(token, f"{(t / ms if ref == 'eager' else ms / t):.2f}")
        rows.append({"version": s["version"], "variant": v, "time (ms)": ms,
                     "% of FFMA peak": 100 * floor_ms / ms, "% of its floor": 100 * own / ms,
                     "floor (ms)": own, "what changed": said,
                     "provider": rec.get("variants", {}).get(v, {}).get("provider", "ours")})
    return rows


def ladder_table(steps: list[dict]):
    """Our kernel's versions from ``ladder`` (the library paths left to the figure and the variants
    table): each one's time and share of its own floor where it was timed, and what changed."""
    import pandas as pd

    ours = [s for s in steps if s["provider"] == "ours"]
    cols = ["version", "time (ms)", "% of its floor", "what changed"]
    return pd.DataFrame(ours)[cols].set_index("version")


def floors(rec: dict, flop: float, dz: Mapping, n: int, tail_ms: float, mma3: float) -> dict[str, float]:
    """Every floor the chapter sets a time against, in ms (and the rates behind them, in FLOP/s):
    ``ffma``, the convolution's ``flop`` at the nominal FFMA peak (SMs × lanes × 2 × the SM clock the
    record measured); ``measured``, the whole problem at the roofline chapter's measured FFMA rate (the
    intro's "% of floor"; NaN without that record); ``design``, the FFMAs this decomposition ``dz``
    issues for ``n`` samples, waste and the partly empty last wave included, at the peak; ``tc``, the
    convolution at ``mma3``, the 3xTF32 rate (``kb.tensorcore.mma3_rate``); ``tail``, ``tail_ms``: cuDNN's
    convolution kernel alone, the least a design that keeps it can take."""
    from ..harness.device import slug
    from ..site import summary
    from .roofline import fp32_peak

    prov = rec["provenance"]
    peak = fp32_peak(prov["sm_count"], rec["sm_clock_mhz"] * 1e6, prov["capability"])
    waves = n / prov["sm_count"]  # one block per SM
    ceil = summary.ceilings(slug(prov["gpu"]))
    measured = summary.floor_ms(rec, "ours", ceil) if ceil else None
    return {"ffma": 1e3 * flop / peak, "measured": measured or float("nan"),
            "design": 1e3 * flop / peak / dz["useful"] * math.ceil(waves) / waves,
            "tc": 1e3 * flop / mma3, "tail": tail_ms, "peak": peak,
            "measured_rate": ceil[0] if ceil else float("nan"), "mma3": mma3, "useful": dz["useful"]}


def floor_table(f: Mapping[str, float]):
    """``floors`` as the chapter's one table of floors: each one's time, what it is, what it is for."""
    import pandas as pd

    tf = lambda r: f"{r / 1e12:.1f} TFLOP/s"  # noqa: E731
    rows = [("FFMA peak", f["ffma"], f"the convolution's FLOP at SMs × lanes × 2 × the SM clock: "
             f"{tf(f['peak'])}", "“% of FFMA peak” in the table and the figure below, every path"),
            ("this design", f["design"], f"its issued FFMAs ({100 * f['useful']:.0f} % useful, the last "
             "wave partly empty) at the FFMA peak", "how near ours comes to its own plan"),
            ("3xTF32", f["tc"], f"the convolution's FLOP at {tf(f['mma3'])}: a third of the tensor-core "
             "chapter's mma.sync TF32 rate", "ours_tc's share of its own floor"),
            ("tail-only", f["tail"], "cuDNN's convolution kernel alone (eager's profile)",
             "tail_fused's share of its own floor (Amdahl)")]
    return pd.DataFrame(rows, columns=["floor", "ms", "what it is", "what it is for"]).set_index("floor")


def variants_table(rec: dict, names: list[str], flop: float, floor_ms: float):
    """Every variant in ``names`` (``kb.measure.results``): its math, median, × eager, the share of the FFMA
    peak's floor ``floor_ms`` (for every path), whether TF32 was allowed as the record declares it, and
    error vs float64 (for ``CONV_ALONE``, of the convolution); a variant the record lacks keeps its row, its
    math "not in this record", its numbers empty. ``flop`` is kept for callers; the chapter quotes TFLOP/s
    in its prose."""
    import pandas as pd

    from ..harness.measure import results

    have = [n for n in names if n in rec["timings_ms"]]
    t = results(rec, have).drop(columns=["GB/s", "TFLOP/s", "q20 ms", "q80 ms"], errors="ignore")
    ms = t["median ms"]
    t["× eager"] = ms["eager"] / ms
    t["% of FFMA peak"] = 100 * floor_ms / ms  # every path, 3xTF32 ones too: one floor
    tf32 = {True: "allowed", False: "off"}
    t["TF32"] = pd.Series({k: tf32.get(v.get("tf32_allowed"), "—")
                           for k, v in rec.get("variants", {}).items()})
    t["error vs float64"] = pd.Series({k: e["rel_err"] for k, e in rec["variant_errors"].items()})
    t = t.drop(columns="provider", errors="ignore").reindex(names)
    t.loc[[n for n in names if n not in have], "math"] = "not in this record"
    return t


COUNTERS = {"ffma_share": "FFMA share of warp instructions, %",
            "ffma_per_mac": "thread FFMAs per useful multiply-add",
            "ffma_pred": "thread FFMAs per useful multiply-add, predicted: 32/29 columns × (1 + 2/192)",
            "fma_pipe": "FMA pipe busy, % of peak", "issue_pct": "issue slots used, %",
            "warps_pct": "warps active, % of the SM's maximum",
            "dram_read_ratio": "DRAM bytes read ÷ input bytes"}


def draw_block(dz: Mapping, plan: Mapping, out_shape: tuple[int, int, int], c_in: int, h: int,
               k: int, smem_limit: int):
    """The fused kernel's decomposition of one sample, from its constants and launch plan: which warp
    of the first channel tile computes each output value of depth 0 (left: a warp takes 32
    consecutive items, each a row's block of columns, so whole output rows), and what one block
    stages in shared memory (right)."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    from ..harness import plots

    _, ho, wo = out_shape
    cols, groups = dz["cols"], dz["groups"]
    # 6.3 in at the style's 110 dpi is the page's text column: shown unscaled, every label stays ≥ 9 pt
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(6.3, 3.5), width_ratios=[1.3, 1])
    slot = np.arange(ho * dz["col_blocks"]) // 32  # items of depth 0, 32 per warp slot, in order
    grid = np.repeat(slot.reshape(ho, -1), cols, axis=1).astype(float)
    grid[:, wo:] = np.nan                          # computed, then masked out
    colours = ["#2980b9", "#16a085", "#e67e22", "#8e44ad", "#c0392b", "#7f8c8d"]
    cmap = plt.matplotlib.colors.ListedColormap(colours[: int(slot.max()) + 1])
    ax.imshow(grid, cmap=cmap, aspect="auto", interpolation="nearest")
    ax.add_patch(plt.Rectangle((wo - 0.5, -0.5), grid.shape[1] - wo, ho, hatch="///", fill=False,
                               color=plots.CEILING))
    for q in range(1, dz["col_blocks"]):
        ax.axvline(q * cols - 0.5, color="white", lw=1)
    handles = []
    for s_ in range(int(slot.max()) + 1):  # warp = slot × groups + group (the kernel's mapping)
        rows = np.flatnonzero((slot.reshape(ho, -1) == s_).any(axis=1))
        handles.append(Patch(color=colours[s_], label=f"warp {s_ * groups}: rows {rows[0]}–{rows[-1]}"))
    handles.append(Patch(fill=False, hatch="///", color=plots.CEILING, label="computed, discarded"))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.45, -0.2), ncol=2, fontsize=9,
              handlelength=1.2)
    ax.set(xlabel=f"output column ({cols} per item)", ylabel="output row")
    ax.set_title(f"Depth 0, channels 0–{dz['co_t'] - 1}: which warp", fontsize=10)
    planes, pitch = plan["depths_per_slab"] + 3, plan["row_pitch"]
    wt = c_in * k**3 * dz["co_t"] * groups * 4
    inp = c_in * planes * h * pitch * 4
    parts = [("weights", wt, plots.BASELINE), (f"input {c_in}×{planes}×{h}×{pitch}", inp, plots.OURS),
             ("statistics", plan["smem_bytes"] - wt - inp, plots.CEILING)]
    left, handles = 0, []
    for label, size, colour in parts:
        bx.barh(0, size / 1024, left=left / 1024, height=0.6, color=colour, edgecolor="white")
        thin = ", a sliver" if size < 0.02 * plan["smem_bytes"] else ""
        handles.append(Patch(color=colour, label=f"{label}: {size / 1024:,.1f} KiB{thin}"))
        left += size
    bx.axvline(smem_limit / 1024, color="black", ls=":")
    handles.append(plt.Line2D([], [], color="black", ls=":", label=f"limit: {smem_limit / 1024:,.0f} KiB"))
    bx.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.2), fontsize=9,
              handlelength=1.2)
    bx.set(ylim=(-0.6, 0.6), yticks=[], xlabel="shared memory (KiB)")
    bx.set_title("What one block stages", fontsize=10)
    for a in (ax, bx):
        a.tick_params(labelsize=9)
        a.xaxis.label.set_size(9), a.yaxis.label.set_size(9)
    fig.tight_layout()
    fig.subplots_adjust(bottom=0.38, wspace=0.12)  # room for the legends below the axes
    return fig


def plot_ladder(steps, floor_ms: float, rec: Mapping, floors: Mapping[str, float] | None = None,
                marks: Mapping[str, str] | None = None):
    """A dot per timed version (``ladder`` rows with a variant), log time, each labelled with its time
    and its share of the FFMA floor ``floor_ms`` (one floor for every path); that floor dotted, other
    floors (``floors``: name → ms) dash-dotted, and a floor one variant has alone (``marks``: variant →
    name) as a solid mark on its row; coloured by the provider each variant declares in ``rec``."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    from ..harness import plots

    timed = [s for s in steps if s["variant"]]
    ms = [s["time (ms)"] for s in timed]
    # 6.3 in at the style's 110 dpi is the page's text column: shown unscaled, 9 pt stays 9 pt
    fig, ax = plt.subplots(figsize=(6.3, 0.3 * len(timed) + 1.5), layout="constrained")
    ys = range(len(timed))  # dots, not bars: on a log axis a bar's length means nothing
    left = min([floor_ms, *(floors or {}).values()]) * 0.8  # the axis' left edge
    ax.hlines(ys, left, ms, color="0.85", lw=0.8, zorder=1)  # guides from that edge
    ax.scatter(ms, ys, s=36, zorder=3,
               color=[plots.colour(rec["variants"][s["variant"]]["provider"]) for s in timed])
    ax.set_yticks(list(ys), [s["version"] for s in timed])
    for y, (s, t) in enumerate(zip(timed, ms, strict=True)):
        ax.text(t * 1.1, y, f"{t:.{2 if t < 10 else 1}f} ms, {s['% of FFMA peak']:.0f} %",
                va="center", fontsize=9)
    ax.tick_params(labelsize=9)
    lines = [(floor_ms, ":", "FFMA floor")] + [(x, "-.", name) for name, x in (floors or {}).items()]
    for x, ls, label in lines:
        ax.axvline(x, color=plots.CEILING, ls=ls, lw=1, label=f"{label}: {x:.2f} ms")
    for y, s in enumerate(timed):
        if s["variant"] in (marks or {}):
            x = s["floor (ms)"]
            ax.plot([x, x], [y - 0.42, y + 0.42], color="black", lw=2,
                    label=f"{marks[s['variant']]}: {x:.2f} ms")
    ax.set(xscale="log", xlim=(left, max(ms) * 3),
           xlabel="median time (ms, log scale); beside each dot: time, % of the FFMA floor",
           title="P27, version by version")
    ax.xaxis.label.set_size(9)
    first = lambda v: round(v / 10 ** math.floor(math.log10(v)))  # noqa: E731  leading digit
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}" if first(v) in (2, 5) else ""))
    fig.legend(loc="outside lower center", ncol=3, fontsize=9, handlelength=1.6, columnspacing=1.2)
    ax.invert_yaxis()
    return fig


def design_rows(dz: Mapping, n: int, sms: int):
    """The decomposition from ``design`` as a named column of a table, for one block per SM."""
    import pandas as pd

    return pd.Series({"channels × columns per thread": f"{dz['co_t']} × {dz['cols']}",
                      "threads per block (one block per sample)": dz["threads"],
                      "channel tiles × warps per tile": f"{dz['groups']} × {dz['warps_per_group']}",
                      "work items per sample and tile": dz["items"],
                      f"rounds (one item to each of a tile's {dz['lanes_per_group']} lanes)":
                      dz["rounds"],
                      "useful fraction of issued FFMAs": f"{dz['useful']:.3f}",
                      f"waves of {n} blocks on {sms} SMs": f"{n / sms:.2f}"},
                     name="value").rename_axis("quantity")


def counter_table(counters: Mapping[str, float], stalls: Mapping[str, float]):
    """``counters`` (keys of ``COUNTERS``) and ``stalls`` (reason → warps per issue) as one named
    column of a table."""
    import pandas as pd

    rows = {COUNTERS[k]: counters[k] for k in COUNTERS if k in counters}  # each prediction under its count
    rows |= {f"warps stalled per issue: {s}": v for s, v in stalls.items()}
    return pd.Series(rows, name="value").rename_axis("counter")


def counters(nc: Mapping[str, float], macs: int, input_bytes: int) -> dict[str, float]:
    """The fused kernel's Nsight Compute counters as the chapter reads them (keys of ``COUNTERS``)."""
    ffma = nc["smsp__sass_thread_inst_executed_op_ffma_pred_on.sum"]
    return {"ffma_share": 100 * ffma / 32 / nc["smsp__inst_executed.sum"],
            "ffma_per_mac": ffma / macs,
            "fma_pipe": nc["sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active"],
            "issue_pct": nc["smsp__issue_active.avg.pct_of_peak_sustained_active"],
            "warps_pct": nc["sm__warps_active.avg.pct_of_peak_sustained_active"],
            "dram_read_ratio": nc["dram__bytes_read.sum"] / input_bytes}
