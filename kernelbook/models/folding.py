"""Folding an eval-mode BatchNorm and a scale factor into the convolution before them (chapter 2).

With inv = γ·s / sqrt(running_var + eps), conv → BN(eval) → ·s is one convolution with
W' = W·inv (per output channel) and b' = (b − running_mean)·inv + β·s (b = 0 without a conv bias).
``fold`` computes W' and b' at call time from the modules' current parameters, so they can never be
stale; ``FoldedConvBNScale`` is the module built on it.
"""

from __future__ import annotations

import re

import torch
from torch import nn


def fold(conv: nn.Conv2d, bn: nn.BatchNorm2d, scale: float = 1.0,
         dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(W', b') such that conv2d(x, W', b') == bn(conv(x)) * scale with ``bn`` in eval mode.

    Computed in ``dtype`` (default: the weights' own) and returned in the weights' dtype; pass
    ``torch.float64`` to fold exactly and round once at the end.
    """
    if not bn.track_running_stats or bn.running_mean is None:
        raise ValueError("fold: BatchNorm without running statistics normalises with batch statistics in every "
                         "mode, so it cannot be folded into the convolution")
    if conv.out_channels != bn.num_features:
        raise ValueError(f"fold: conv has {conv.out_channels} output channels but BatchNorm has "
                         f"{bn.num_features} features")
    out_dtype = conv.weight.dtype
    dt = dtype or out_dtype
    with torch.no_grad():
        w = conv.weight.to(dt)
        c = w.shape[0]
        gamma = bn.weight.to(dt) if bn.affine else torch.ones(c, dtype=dt, device=w.device)
        beta = bn.bias.to(dt) if bn.affine else torch.zeros(c, dtype=dt, device=w.device)
        bias = conv.bias.to(dt) if conv.bias is not None else torch.zeros(c, dtype=dt, device=w.device)
        inv = gamma * scale / torch.sqrt(bn.running_var.to(dt) + bn.eps)
        w_folded = w * inv.view(-1, *([1] * (w.dim() - 1)))
        b_folded = (bias - bn.running_mean.to(dt)) * inv + beta * scale
    return w_folded.to(out_dtype).contiguous(), b_folded.to(out_dtype).contiguous()


class FoldedConvBNScale(nn.Module):
    """conv → BN → ·scale as one folded convolution in eval mode; refuses to run in training mode.

    It keeps the original ``conv`` and ``bn`` submodules (so ``state_dict`` keys are unchanged) and
    folds at every call (so an update to weights or running statistics is always seen). ``conv_fn``
    runs the folded convolution: ``F.conv2d`` by default, or a custom kernel with the same signature.
    """

    def __init__(self, conv: nn.Conv2d, bn: nn.BatchNorm2d, scale: float, conv_fn=None):
        super().__init__()
        if conv_fn is not None and (conv.stride, conv.padding, conv.dilation, conv.groups) != ((1, 1), (0, 0),
                                                                                              (1, 1), 1):
            raise ValueError("FoldedConvBNScale: a custom conv_fn computes a plain convolution (stride 1, no padding, "
                             f"no dilation, one group); this conv has stride {conv.stride}, padding {conv.padding}, "
                             f"dilation {conv.dilation}, groups {conv.groups}")
        self.conv, self.bn, self.scale = conv, bn, float(scale)
        self.conv_fn = conv_fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training or self.bn.training:
            raise RuntimeError("FoldedConvBNScale: folding BatchNorm is exact only in eval mode; in training mode "
                               "BatchNorm normalises with batch statistics (call .eval(), or use an unfolded "
                               "training-mode kernel)")
        w, b = fold(self.conv, self.bn, self.scale)
        if self.conv_fn is not None:
            return self.conv_fn(x, w, b)
        return nn.functional.conv2d(x, w, b, self.conv.stride, self.conv.padding, self.conv.dilation,
                                    self.conv.groups)


# ------------------------------------------------------------------------------ chapter 2's experiments

TF32_SIZED = 1e-5  # fp32 accumulation of P73's 73 terms errs ~1e-7; a 10-bit TF32 mantissa errs ~1e-4

EDGE_CASES = ("γ = 0 in half the channels", "negative γ everywhere", "negative scale s = −0.7",
              "variance 0 (ε dominates)", "variance 1e8", "conv without bias")


def perturbed(model: nn.Module, case: str, scale: float) -> tuple[nn.Module, float]:
    """A copy of the conv → BN model with one edge case of ``EDGE_CASES`` applied, and its scale."""
    import copy

    m = copy.deepcopy(model)
    with torch.no_grad():
        if case == "γ = 0 in half the channels":
            m.bn.weight[::2] = 0
        elif case == "negative γ everywhere":
            m.bn.weight.copy_(-m.bn.weight.abs())
        elif case == "negative scale s = −0.7":
            scale = -0.7
        elif case == "variance 0 (ε dominates)":
            m.bn.running_var.zero_()
        elif case == "variance 1e8":
            m.bn.running_var.fill_(1e8)
        elif case == "conv without bias":
            m.conv.bias = None
        else:
            raise ValueError(f"unknown edge case {case!r}; known: {', '.join(EDGE_CASES)}")
    return m, scale


def eval_reference(model: nn.Module, scale: float, x: torch.Tensor) -> tuple[torch.Tensor, float]:
    """(float64 output of eval-mode conv → BN → ·scale, the fp32 error bound ``kb.check.dot_tol``).

    The bound counts the patch's products and the bias, plus the unfolded path's own roundings
    (BN's subtract, divide, multiply, add, and the ·s); the folded float64 weights' |W'|, |b'| bound
    how much the products cancel."""
    import copy

    from ..harness.check import dot_tol

    m64 = copy.deepcopy(model).double()
    w64, b64 = fold(m64.conv, m64.bn, scale)
    x64 = x.double()
    ref = nn.functional.conv2d(x64, w64, b64)
    terms = w64[0].numel() + 1 + 4
    return ref, dot_tol(terms, nn.functional.conv2d(x64.abs(), w64.abs(), b64.abs()), ref)


def conv_case(shape, seed: int, device: str = "cuda", k: int = 3):
    """x, W, b of a convolution check (shape = N, C_in, H, W, C_out), its float64 output and tolerance."""
    from ..harness.check import dot_tol, rand

    n, c_in, h, w, c_out = shape
    x = rand((n, c_in, h, w), seed=seed, device=device)
    wt = rand((c_out, c_in, k, k), seed=seed + 1, device=device, low=-0.3, high=0.3)
    b = rand((c_out,), seed=seed + 2, device=device, low=-1, high=1)
    ref = nn.functional.conv2d(x.double(), wt.double(), b.double())
    abs_ref = nn.functional.conv2d(x.double(), wt.double().abs(), b.double().abs())
    return x, wt, b, ref, dot_tol(c_in * k * k + 1, abs_ref, ref)


def pinned(fn, tf32: bool | None):
    """``fn`` run under ``torch.no_grad()`` and, unless ``tf32`` is None, with cuDNN's TF32 switch set
    (``kb.precision``) at every call, so a variant's precision never depends on the one before."""
    from ..harness import precision

    def run():
        with torch.no_grad():
            if tf32 is None:
                return fn()
            with precision.tf32(tf32):
                return fn()

    return run


# The torch.compile baselines of the eval-mode module: name → how it is compiled.
COMPILED = {
    "compile_eval": {"tf32": True},
    "compile_eval_fp32": {"tf32": False},
    "compile_max_autotune_eval": {"tf32": True, "mode": "max-autotune"},
    "compile_max_autotune_eval_fp32": {"tf32": False, "mode": "max-autotune"},
    "compile_freezing_eval": {"tf32": True, "freezing": True},
    "compile_freezing_eval_fp32": {"tf32": False, "freezing": True},
}


def compiled(module: nn.Module, x: torch.Tensor, tf32: bool, mode: str | None = None,
             freezing: bool = False):
    """``torch.compile`` of a copy of ``module``, compiled once now (no_grad, under its TF32 setting,
    with Inductor's ``freezing`` if asked) and returned ``pinned`` to the same setting; None, with
    the reason printed, where compilation fails on this machine."""
    import copy

    import torch._inductor.config as inductor_config

    fn = torch.compile(copy.deepcopy(module).eval(), mode=mode)
    run = pinned(lambda: fn(x), tf32)
    try:
        with inductor_config.patch(freezing=freezing):
            run()
    except Exception as e:  # shown, not hidden: the table then has no row for it
        what = f"mode={mode!r}" + (", freezing" if freezing else "")
        print(f"torch.compile({what}) failed here: {type(e).__name__}: {str(e)[:300]}")
        return None
    return run


def plot_fold(model: nn.Module, scale: float):
    """The fold as arrays: W (C_out × taps) → ×ι per output channel → W′, and b → b′, drawn from
    the model's real weights and BatchNorm parameters. Returns the figure."""
    import matplotlib.pyplot as plt
    import numpy as np

    from ..harness import plots

    bn, conv = model.bn, model.conv
    with torch.no_grad():
        iota = (bn.weight * scale / torch.sqrt(bn.running_var + bn.eps)).numpy()
        w_f, b_f = fold(conv, bn, scale)
        w, b = conv.weight.detach(), conv.bias.detach()
        assert torch.allclose(w * torch.from_numpy(iota).view(-1, 1, 1, 1), w_f, rtol=1e-6, atol=0)
    fig, axs = plt.subplots(1, 4, figsize=(9.6, 4.4), width_ratios=[4, 1.2, 4, 1.6], sharey=True)
    for ax, arr, name in ((axs[0], w, "W"), (axs[2], w_f, "W′ = W·ι")):
        lim = float(arr.abs().max())  # each panel on its own scale: ι changes the magnitudes
        im = ax.imshow(arr.flatten(1).numpy(), cmap="RdBu_r", vmin=-lim, vmax=lim, aspect="auto")
        ax.set_title(f"{name}   {tuple(arr.shape)}", fontsize=10)
        ax.set_xlabel(f"tap (c_in, kh, kw): {arr[0].numel()}")
        fig.colorbar(im, ax=ax, shrink=0.5, pad=0.02)  # red positive, blue negative
    ch = np.arange(w.shape[0])
    axs[1].barh(ch, iota, color=plots.OURS)
    axs[1].set_title("× ι", fontsize=10)
    axs[1].set_xlabel("ι per channel")
    axs[3].barh(ch - 0.2, b.numpy(), height=0.4, color=plots.BASELINE, label="b")
    axs[3].barh(ch + 0.2, b_f.numpy(), height=0.4, color=plots.OURS, label="b′")
    axs[3].set_title("b → b′", fontsize=10)
    axs[3].set_xlabel("bias")
    axs[3].legend(fontsize=10, loc="upper left", bbox_to_anchor=(1.0, 1.0))  # clear of the bars
    axs[0].set_ylabel("output channel c")
    fig.subplots_adjust(wspace=0.45)
    fig.suptitle("The fold as arrays: one factor per output channel, for weights of shape "
                 f"{tuple(w.shape)}", fontsize=11)
    return fig


SWEEP_KEYS = ("CO_T", "GROUPS", "ROWS", "MIN_BLOCKS")


def run_sweep(shapes, x, w, b, y, chapter: str) -> list[dict]:
    """Compile the tiled kernel at each shape (dicts of KB_CONV_* defines, in parallel), check it
    against float64 and time it (GPU only). Rows: the shape, rel_err, median ms."""
    from concurrent.futures import ThreadPoolExecutor

    from ..harness import build, check, progress, timing

    with ThreadPoolExecutor(len(shapes)) as pool:
        mods = list(pool.map(lambda d: build.load("conv2d_folded", defines=d), shapes))
    ref = nn.functional.conv2d(x.double(), w.double(), b.double())
    rows = []
    def shape_name(dm) -> str:
        return ", ".join(f"{k.removeprefix('KB_CONV_')}={v}" for k, v in dm[0].items())

    for d, m in progress.track(list(zip(shapes, mods, strict=True)), f"sweep, {chapter}", "tile shapes",
                               name=shape_name):
        out = check.poisoned(y.shape, device="cuda")
        m.conv2d_folded(x, w, b, out)
        ok = check.assert_close(out, ref, 1e-5, what=f"sweep {d}")
        t = timing.bench(lambda m=m: m.conv2d_folded(x, w, b, y), chapter, "ours_fast_sweep")
        rows.append({**{k.removeprefix("KB_CONV_"): v for k, v in d.items()},
                     "rel_err": ok["rel_err"], "median": t["median"]})
    return rows


def sweep_table(rows: list[dict], capability: str, flop: float):
    """The sweep's rows with what the compiler and the SM make of each shape: threads, registers,
    spilled bytes, resident blocks and warps per SM, TFLOP/s."""
    import pandas as pd

    from ..harness import build, device, timing

    sweep = pd.DataFrame(rows)
    arch = capability.replace(".", "")
    usage = [next(u for u in build.resources("conv2d_folded", arch,
                                             {f"KB_CONV_{k}": int(r[k]) for k in SWEEP_KEYS})
                  if u["kernel"] == "conv2d_tiled_kernel") for _, r in sweep.iterrows()]
    sweep["threads/block"] = 32 * sweep["GROUPS"] * sweep["ROWS"]
    sweep["registers"] = [u["registers"] for u in usage]
    sweep["spilled bytes"] = [u["spill_store_bytes"] + u["spill_load_bytes"] for u in usage]
    sweep["blocks/SM"] = [device.resident_blocks(capability, th, u["registers"], u["smem_bytes"])
                          for th, u in zip(sweep["threads/block"], usage, strict=True)]
    sweep["warps/SM"] = sweep["threads/block"] // 32 * sweep["blocks/SM"]
    sweep["TFLOP/s"] = [timing.tflops(flop, ms) for ms in sweep["median"]]
    return sweep


def shape_name(r) -> str:
    return "(" + ", ".join(str(int(r[k])) for k in SWEEP_KEYS) + ")"


def sweep_verdicts(sweep, config: dict) -> dict:
    """What the sweep says, for the prose: the default shape (from the module's ``config``), how it
    ranks among the spill-free shapes, which shapes spill, and whether warps per SM order them."""
    is_default = True
    for k in SWEEP_KEYS:
        is_default = is_default & (sweep[k] == config[k])
    default = sweep[is_default].iloc[0]
    no_spill = sweep[sweep["spilled bytes"] == 0]
    behind = 100 * (default["median"] / no_spill["median"].min() - 1)
    out = {"default_shape": shape_name(default), "default_warps": int(default["warps/SM"]),
           "sweep_default_ms": float(default["median"]), "sweep_best_ms": float(sweep["median"].min()),
           "sweep_worst_ms": float(sweep["median"].max()), "default_behind_pct": float(behind),
           "default_rank": "the fastest shape that does not spill in this run" if behind <= 0 else
           f"{behind:.1f} % behind the fastest shape that does not spill in this run"}
    spilling = sweep[sweep["spilled bytes"] > 0]
    out["spill_verdict"] = "no shape spilled" if spilling.empty else "; ".join(
        f"{shape_name(r)} spills {int(r['spilled bytes'])} bytes and took {r['median']:.3f} ms"
        for _, r in spilling.iterrows())
    inv = [(a, b) for _, a in sweep.iterrows() for _, b in sweep.iterrows()
           if a["warps/SM"] > b["warps/SM"] and a["median"] > b["median"]]
    if inv:
        a, b = max(inv, key=lambda ab: ab[0]["median"] - ab[1]["median"])
        out["warps_verdict"] = (
            f"the number of resident warps alone does not order the shapes: {shape_name(a)} with "
            f"{int(a['warps/SM'])} warps per SM took {a['median']:.3f} ms, slower than {shape_name(b)} "
            f"with {int(b['warps/SM'])} ({b['median']:.3f} ms) — the work per thread and the staging "
            "per tile count as much as the warps that hide latency")
    else:
        out["warps_verdict"] = "more resident warps were faster throughout"
    return out


NCU_METRICS = ["smsp__inst_executed.sum", "smsp__sass_thread_inst_executed_op_ffma_pred_on.sum",
               "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum",
               "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active",
               "smsp__issue_active.avg.pct_of_peak_sustained_active", "dram__bytes_write.sum"]

# The script Nsight Compute runs: both kernels on P73's shape, each inside its NVTX range.
NCU_TARGET = """
import torch, kernelbook as kb
mod = kb.build.load("conv2d_folded")
x = kb.problems.P73_CONV_BN_SCALE.inputs(seed=7, device="cuda")
w = torch.rand(64, 8, 3, 3, device="cuda") - 0.5; b = torch.rand(64, device="cuda")
y = torch.empty(128, 64, 126, 126, device="cuda")
for variant, fn in {"ours_simple": lambda: mod.conv2d_simple(x, w, b, y),
                    "ours_fast": lambda: mod.conv2d_folded(x, w, b, y)}.items():
    with kb.timing.nvtx_range("02_bn_folding", variant):
        fn()
torch.cuda.synchronize()
"""


def ncu_summary(rows: list[dict]):
    """Nsight Compute's rows as variant × metric, plus the FFMA share of the warp instructions and
    the global load requests per FFMA warp instruction."""
    import pandas as pd

    ncu = pd.DataFrame(rows).pivot_table(index="variant", columns="metric", values="value",
                                         aggfunc="sum")
    ffma_warp = ncu["smsp__sass_thread_inst_executed_op_ffma_pred_on.sum"] / 32
    ncu["FFMA share of instructions"] = ffma_warp / ncu["smsp__inst_executed.sum"]
    ncu["global load requests per FFMA"] = ncu["l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum"] / ffma_warp
    return ncu


def baseline_summary(t, rec: dict, ours: str = "ours_fast") -> dict:
    """What the timing table says about the baselines, for the prose: the fastest baseline and our
    ratio to it, the baselines that computed in TF32 (declared from the profile, or with an error of
    TF32 size) and the fastest one that stayed in fp32."""
    med, err = t["median ms"], t["error vs float64"]
    base = [v for v in t.index if not v.startswith("ours")]
    declared = rec.get("variants", {})
    tf32 = [v for v in base if declared.get(v, {}).get("math") == "tf32" or err[v] >= TF32_SIZED]
    best = med[base].idxmin()
    fp32 = [v for v in base if v not in tf32]
    best_fp32 = med[fp32].idxmin() if fp32 else best
    r = med[best] / med[ours]
    return {"best": best, "best_ms": float(med[best]), "ratio_best": float(r),
            "vs_best": f"{r:.2f}× faster than" if r >= 1 else f"{1 / r:.2f}× slower than",
            "tf32": tf32, "best_fp32": best_fp32, "ratio_best_fp32": float(med[best_fp32] / med[ours])}


# ------------------------------------------------------------------------------ the notebook's plumbing

def demo_model(problem, seed: int = 0) -> nn.Module:
    """P73's eval-mode module with BatchNorm statistics and affine parameters that are not the defaults
    (so that folding has something to fold)."""
    torch.manual_seed(seed)
    model = problem.model(seed=seed)
    with torch.no_grad():
        model.bn.running_mean.uniform_(-0.3, 0.3)
        model.bn.running_var.uniform_(0.01, 0.2)
        model.bn.weight.uniform_(-2, 2)
        model.bn.bias.uniform_(-1, 1)
    return model.eval()


def rounding(model: nn.Module, scale: float, x: torch.Tensor):
    """Three fp32 ways to compute eval-mode conv → BN → ·s (unfolded; folded in fp32; folded in
    float64 and rounded once), each checked against float64: (table, tolerance)."""
    import pandas as pd

    from ..harness.check import assert_close

    F = nn.functional
    with torch.no_grad():
        ref, tol = eval_reference(model, scale, x)
        outputs = {"unfolded fp32 (conv → BN → ·s)": model(x),
                   "folded in fp32": F.conv2d(x, *fold(model.conv, model.bn, scale)),
                   "folded in float64, rounded once":
                       F.conv2d(x, *fold(model.conv, model.bn, scale, dtype=torch.float64))}
    rows = {k: assert_close(v, ref, tol, what=k) for k, v in outputs.items()}
    return pd.DataFrame(rows).T[["rel_err", "max_abs_err", "tol", "passed"]], tol


def edge_errors(model: nn.Module, scale: float, x: torch.Tensor) -> dict:
    """Each of ``EDGE_CASES``: the unfolded and the folded path's errors against float64 (asserted)."""
    from ..harness.check import assert_close

    out = {}
    for case in EDGE_CASES:
        m, s = perturbed(model, case, scale)
        with torch.no_grad():
            r, t = eval_reference(m, s, x)
            unf = m.bn(m.conv(x)) * s
            fol = nn.functional.conv2d(x, *fold(m.conv, m.bn, s))
        out[case] = {"unfolded rel_err": assert_close(unf, r, t, case)["rel_err"],
                     "folded rel_err": assert_close(fol, r, t, case)["rel_err"], "tol": t}
    return out


def per_load(cfg: dict):
    """FFMAs per load instruction of the two kernels, from the tiled kernel's ``config()``."""
    import pandas as pd

    co_t = cfg["CO_T"]
    t = pd.DataFrame({"FFMA": [1, co_t * 4 * 3], "shared loads": [0, 4 + 3 * co_t // 4],
                      "global loads": [2, 0]},
                     index=["simple: per output and weight", "tiled: per thread, input channel, filter row"])
    t["FFMA per load"] = t["FFMA"] / (t["shared loads"] + t["global loads"])
    return t


def resources(archs=("75", "80", "90")):
    """Registers and shared memory of both kernels per architecture; asserts nothing spills."""
    import pandas as pd

    from ..harness import build, show

    res = pd.DataFrame([r for a in archs for r in build.resources("conv2d_folded", a)])
    spills = res[["spill_store_bytes", "spill_load_bytes", "stack_bytes"]]
    assert (spills == 0).all().all(), res
    res["kernel"] = res["kernel"].map(show.kernel_name)
    return res.set_index("kernel")[["arch", "registers", "smem_bytes"]]


# (N, C_in, H, W, C_out): shapes chosen to break tiling assumptions (P73's own shape is checked first).
CHECK_SHAPES = [(1, 3, 5, 97, 16), (1, 3, 5, 97, 64), (1, 8, 128, 128, 64),
                (2, 19, 9, 130, 5), (2, 8, 17, 300, 100), (3, 2, 33, 66, 80), (512, 8, 3, 10, 72)]


def gpu_checks(mod, model: nn.Module, scale: float, problem, device: str = "cuda") -> dict:
    """Both kernels on ``CHECK_SHAPES`` (NaN-poisoned outputs) and the eval-mode module folded at
    call time around the tiled kernel, each against float64 (asserted). GPU only."""
    import copy

    from ..harness import check

    out = {}
    shapes = [(*problem.input_shape, problem.init_args[1]), *CHECK_SHAPES]
    for i, shape in enumerate(shapes):
        x, wt, bias, ref, tol = conv_case(shape, seed=10 * i, device=device)
        for fn in ("conv2d_simple", "conv2d_folded"):
            y = check.poisoned(ref.shape, device=device)
            with torch.no_grad():
                getattr(mod, fn)(x, wt, bias, y)
            out[f"{fn} {shape}"] = check.assert_close(y, ref, tol, f"{fn} {shape}")
        del x, ref, y
    m_cuda = copy.deepcopy(model).to(device).eval()
    ours = FoldedConvBNScale(m_cuda.conv, m_cuda.bn, scale, conv_fn=mod.conv2d_folded).eval()
    x = problem.inputs(seed=3, device=device)
    with torch.no_grad():
        ref = copy.deepcopy(m_cuda).double()(x.double())
        out["P73 eval module, folded, ours"] = check.assert_close(ours(x), ref, 1e-5, "P73 eval module")
    return out


def bad_inputs(mod, device: str = "cuda") -> dict:
    """The tiled kernel's binding on inputs it must refuse: case → the first line of its message."""
    from ..harness.check import error_message, run_backward

    x, w, b = (torch.rand(*s, device=device) for s in ((2, 3, 6, 7), (5, 3, 3, 3), (5,)))
    w5, out_bad = torch.rand(5, 3, 5, 5, device=device), torch.empty(2, 5, 4, 4, device=device)
    f = mod.conv2d_folded
    cases = {
        "CPU input": lambda: f(x.cpu(), w, b, None),
        "float64 input": lambda: f(x.double(), w, b, None),
        "channels-last input": lambda: f(x.to(memory_format=torch.channels_last), w, b, None),
        "weight for 2 input channels": lambda: f(x, w[:, :2].contiguous(), b, None),
        "5×5 filter (tiled kernel)": lambda: f(x, w5, b, None),
        "bias of the wrong length": lambda: f(x, w, b[:3], None),
        "input smaller than the filter": lambda: f(x[..., :2].contiguous(), w, b, None),
        "out of the wrong shape": lambda: f(x, w, b, out_bad),
        "a backward through it": lambda: run_backward(lambda: f(x, w.clone().requires_grad_(), b, None)),
    }
    return {k: error_message(fn) for k, fn in cases.items()}


ROLES = {"ours_fast": "headline", "ours_simple": "control", "ours_fold_at_call": "ours"}
# The book's results table: eager's module, torch.compile's and ours, in one row
ROW = "P73 | conv + BN · 2.0 folded, eval"
IN_ROW = ("eager_eval", "compile_eval", "ours_fast")


def eval_variants(mod, model: nn.Module, scale: float, problem, counts: dict, device: str = "cuda"):
    """Every eval-mode P73 variant as ``kb.measure.Variant``s (the torch.compile ones compiled once,
    here), plus the inputs they share: (variants, (x, W', b', y)). GPU only."""
    import copy

    from ..harness import measure

    F = nn.functional
    torch.backends.cudnn.benchmark = True  # let cuDNN pick its fastest algorithm per shape
    x = problem.inputs(seed=7, device=device)
    m = copy.deepcopy(model).to(device).eval()
    w, b = fold(m.conv, m.bn, scale)
    x_cl, w_cl = x.to(memory_format=torch.channels_last), w.to(memory_format=torch.channels_last)
    n, _, h, wd = x.shape
    y = torch.empty(n, w.shape[0], h - w.shape[2] + 1, wd - w.shape[3] + 1, device=device)
    ours_module = FoldedConvBNScale(m.conv, m.bn, scale, conv_fn=mod.conv2d_folded).eval()
    runs = {  # name: (function, provider, TF32 allowed; None for ours: fp32 always)
        "eager_eval": (lambda: m(x), "eager", True),
        "cudnn_folded_tf32": (lambda: F.conv2d(x, w, b), "cudnn", True),
        "cudnn_folded_fp32": (lambda: F.conv2d(x, w, b), "cudnn", False),
        "cudnn_cl_tf32": (lambda: F.conv2d(x_cl, w_cl, b), "cudnn", True),
        "cudnn_cl_fp32": (lambda: F.conv2d(x_cl, w_cl, b), "cudnn", False),
        "ours_simple": (lambda: mod.conv2d_simple(x, w, b, y), "ours", None),
        "ours_fast": (lambda: mod.conv2d_folded(x, w, b, y), "ours", None),
        "ours_fold_at_call": (lambda: ours_module(x), "ours", None),
    }
    for name, how in COMPILED.items():  # each compiled once, here
        fn = compiled(m, x, **how)
        if fn is not None:
            runs[name] = (fn, "compile", how["tf32"])
    variants = {name: measure.Variant(pinned(fn, tf32), provider=p, mode="eval", counts=counts,
                                      role=ROLES.get(name, "baseline"), tf32=tf32,
                                      row=ROW if name in IN_ROW else "")
                for name, (fn, p, tf32) in runs.items()}
    return variants, (x, w, b, y)


def measure_eval(rec: dict, variants: dict, model: nn.Module, x: torch.Tensor, chapter: str):
    """Check each variant against float64 (reported, not asserted: a TF32 baseline errs by design),
    time them (``kb.measure.run``), profile their kernels, declare each one's math from the kernels
    that ran (and from its error, for Triton kernels that do not name their arithmetic), and read the
    SM clock right after the runs. Fills ``rec``; returns the timing table. GPU only."""
    import copy

    from ..harness import check, measure, profile

    with torch.no_grad():
        ref = copy.deepcopy(model).to(x.device).double().eval()(x.double())
        rec["variant_errors"] = {n: check.report(v.fn(), ref, 1e-5) for n, v in variants.items()}
    del ref
    t = measure.run(rec, variants)
    rec["kernels"] = profile.kernels({n: v.fn for n, v in variants.items()}, chapter).to_dict("records")
    measure.math_from_profile(rec, rec["kernels"])
    for n, e in rec["variant_errors"].items():
        if e["rel_err"] >= TF32_SIZED:
            rec["variants"][n]["math"] = "tf32"
    rec["sm_clock_mhz"] = measure.sm_clock_mhz()  # right after the runs: the clock they ran at
    if rec["sm_clock_mhz"] is None:
        raise RuntimeError("the SM clock for the FFMA peak could not be measured (no GPU?)")
    return t


def timing_table(t, rec: dict, flop: float, ours: str = "ours_fast"):
    """The timing table with each variant's error against float64, % of the FFMA peak (at the SM
    clock the runs saw) and time relative to ours, fastest first; and the peak in TFLOP/s."""
    from . import roofline

    p = rec["provenance"]
    peak = roofline.fp32_peak(p["sm_count"], rec["sm_clock_mhz"] * 1e6, p["capability"]) / 1e12
    t = t.copy()
    t["error vs float64"] = [rec["variant_errors"][v]["rel_err"] for v in t.index]
    t["% of FFMA peak"] = 100 * t["TFLOP/s"] / peak
    t["× ours_fast"] = t["median ms"] / t.loc[ours, "median ms"]
    assert t.loc[ours, "error vs float64"] <= 1e-5
    return t.sort_values("median ms"), peak


def measure_numbers(t, rec: dict, peak: float) -> dict:
    """The numbers the Measure section's prose states (Markdown strings for the names of variants)."""
    from . import roofline

    med, err = t["median ms"], t["error vs float64"]
    ours_ms = med["ours_fast"]
    from ..harness.records import made_on

    if made_on(rec, "h200"):  # the book's claim, for the GPU it was made on
        assert ours_ms < med["cudnn_folded_fp32"], "the tiled kernel should beat cuDNN's fp32 convolution"
    bs = baseline_summary(t, rec)
    out = {"best_baseline": f"`{bs['best']}`", "best_fp32": f"`{bs['best_fp32']}`",
           "tf32_list": ", ".join(f"`{v}` ({err[v]:.1e})" for v in bs["tf32"]) or "none"}
    for v in ("eager_eval", "cudnn_folded_fp32", "ours_simple", "compile_eval",
              "compile_max_autotune_eval", "compile_freezing_eval"):
        out[f"{v}_ms"] = float(med.get(v, float("nan")))
    out.update({"best_baseline_ms": bs["best_ms"], "vs_best": bs["vs_best"],
                "best_fp32_ratio": bs["ratio_best_fp32"], "ours_fast_ms": float(ours_ms),
                "ours_fast_tflops": float(t.loc["ours_fast", "TFLOP/s"]),
                "ours_fast_pct": float(t.loc["ours_fast", "% of FFMA peak"]), "peak_tflops": peak,
                "sm_clock": rec["sm_clock_mhz"], "speedup_eager": float(med["eager_eval"] / ours_ms),
                "speedup_cudnn": float(med["cudnn_folded_fp32"] / ours_ms),
                "simple_to_fast": float(med["ours_simple"] / ours_ms),
                "fold_overhead_us": float(1e3 * (med["ours_fold_at_call"] - ours_ms)),
                "lanes": roofline.fp32_lanes_per_sm(rec["provenance"]["capability"])})
    return out


# The tile shapes the chapter compiles, checks and times: (CO_T, GROUPS, ROWS, MIN_BLOCKS).
SWEEP = [dict(KB_CONV_CO_T=c, KB_CONV_GROUPS=g, KB_CONV_ROWS=r, KB_CONV_MIN_BLOCKS=b)
         for c, g, r, b in [(8, 8, 1, 3), (8, 8, 2, 2), (8, 8, 2, 1), (16, 4, 1, 3), (16, 4, 2, 2),
                            (8, 4, 2, 3)]]


CONV_KERNELS = "fprop|convolve|implicit|xmma|cutlass|gemm|conv"  # what convolution kernels' names contain


def _breakable(name: str) -> str:
    """A long kernel name as Markdown text (not code: code does not wrap) with zero-width spaces after
    its underscores, so it wraps in prose."""
    return re.sub(r"([_*<>\[\]`\\])", r"\\\1", name).replace("\\_", "\\_\u200b")


def profile_numbers(prof) -> dict:
    """What the profile table (``rec["kernels"]``, names shortened) says, for the prose: eager's
    kernels and their times (Markdown), cuDNN's convolution and other kernels on the folded weights, ours."""
    from ..harness import profile

    eager = prof[prof.variant == "eager_eval"]
    ours_us = profile.kernel_us(prof, "ours_fast", "conv2d_tiled")
    conv_us = profile.kernel_us(prof, "cudnn_folded_fp32", CONV_KERNELS)
    names = [_breakable(k) if len(k) > 40 and " " not in k else f"`{k}`" for k in eager["kernel"]]
    times = eager["total_us"]
    return {"eager_launches": int(eager["launches"].sum()),
            "eager_kernel_list": "; ".join(f"{k} ({us:.0f} µs)" for k, us in zip(names, times, strict=True)),
            "cudnn_conv_us": conv_us,
            "cudnn_other_us": profile.kernel_us(prof, "cudnn_folded_fp32", ".") - conv_us,
            "ours_us": ours_us, "ours_vs_cudnn_conv": conv_us / ours_us}


def ncu_numbers(ncu, ncu_rec: dict, out_bytes: int, macs: int) -> dict:
    """What Nsight Compute's counters (``ncu_summary``) say about the two kernels, for the prose."""
    fast, simple = ncu.loc["ours_fast"], ncu.loc["ours_simple"]
    inst, ffma = NCU_METRICS[0], NCU_METRICS[1]
    pct = ".avg.pct_of_peak_sustained_active"
    assert fast[inst] < simple[inst], "the tiled kernel should issue fewer instructions"
    return {"ffma_share_fast": 100 * fast["FFMA share of instructions"],
            "ffma_share_simple": 100 * simple["FFMA share of instructions"],
            "inst_ratio": simple[inst] / fast[inst],
            "fma_pipe_fast": fast["sm__pipe_fma_cycles_active" + pct],
            "issue_fast": fast["smsp__issue_active" + pct],
            "write_ratio": fast["dram__bytes_write.sum"] / out_bytes,
            "write_short_mb": (out_bytes - fast["dram__bytes_write.sum"]) / 1e6,
            "l2_mib": ncu_rec["provenance"]["l2_mib"],
            "ffma_waste_pct": 100 * (fast[ffma] / macs - 1)}


def draw_p73_tile(config, out_hw: tuple[int, int], k: int = 3):
    """Chapter 7's FFMA convolution tile, from its build's ``config()`` (RPT, CO_T, GROUPS, WROWS, …,
    shared-memory bytes of the eval kernel, of the training kernel): above, which warp of a block owns which
    channels; below, one warp zoomed in, which lane owns which columns. The tile's width follows from the eval
    kernel's shared memory (two input buffers of 8 channels × (rows + k − 1) × (width + 4) floats, then the
    weights). Returns the figure."""
    import matplotlib.pyplot as plt

    from ..harness import plots

    rpt, co_t, groups, wrows, *_, smem_eval, _ = config
    tile_h = rpt * wrows
    tile_w = (smem_eval // 4 - 8 * k * k * co_t * groups) // (16 * (tile_h + k - 1)) - 4
    half, wo = tile_w // 2, out_hw[1]
    tiles = -(-wo // tile_w)  # tiles across a row of the plane
    idle = tiles * tile_w - wo  # columns of the last tile past the plane's edge
    fig, (top, low) = plt.subplots(2, 1, figsize=(8.5, 3.9), height_ratios=(groups, 5.5),
                                   layout="constrained")
    hatch = dict(fill=False, hatch="///", lw=0, ec=plots.CEILING)
    for g in range(groups):  # above: warp g owns channels co_t·g … for every column of the tile
        top.add_patch(plt.Rectangle((0, g), tile_w, 0.86, lw=0,
                                    color=plots.OURS if g == 0 else plots.BASELINE, alpha=0.85))
    top.add_patch(plt.Rectangle((tile_w - idle, 0), idle, groups, **hatch))
    top.axvline(half, color="black", lw=1)
    top.set(xlim=(0, tile_w), ylim=(groups, 0), yticks=[g + 0.43 for g in range(groups)],
            yticklabels=[f"warp {g}: ch {g * co_t}–{g * co_t + co_t - 1}" for g in range(groups)],
            xticks=range(0, tile_w + 1, 16), xlabel="column in the tile")
    top.tick_params(labelsize=9)
    top.set_title(f"a block's {tile_h}×{tile_w} tile: the whole width of a {out_hw[0]}×{wo} plane "
                  f"({tiles} tile per row), {co_t * groups} channels", fontsize=10)
    for r in range(2):  # below: warp 0 zoomed, lane l owns 2l, 2l + 1 in each half (row r)
        for lane in range(half // 2):
            colour = plots.OURS if lane % 2 == 0 else "#f1948a"
            low.add_patch(plt.Rectangle((2 * lane, r), 2, 0.8, color=colour, ec="white", lw=0.8))
            low.text(2 * lane + 1, r + 0.4, str(lane), ha="center", va="center", fontsize=9,
                     color="white" if lane % 2 == 0 else "black")
        low.add_patch(plt.Rectangle((2, r), 2, 0.8, fill=False, lw=1.8, ec="black"))
    if idle:
        low.add_patch(plt.Rectangle((half - idle, 1), idle, 0.8, **hatch))
    low.set(xlim=(0, half), ylim=(1.85, -0.05), yticks=[0.4, 1.4],
            yticklabels=[f"columns 0–{half - 1}", f"columns {half}–{tile_w - 1}"],
            xticks=range(0, half + 1, 8),
            xlabel="column within the half: lane l owns 2l and 2l + 1 (the numbers are lanes)")
    low.tick_params(labelsize=9)
    low.set_title(f"warp 0 zoomed in, lanes 0–31: each lane computes 4 columns × {rpt} rows × {co_t} "
                  f"channels = {4 * rpt * co_t} outputs", fontsize=10)
    for ax in (top, low):
        ax.grid(False)
    handles = [plt.Rectangle((0, 0), 1, 1, fill=False, lw=1.8, ec="black",
                             label=f"lane 1: columns 2, 3, {half + 2}, {half + 3}")]
    if idle:
        handles.append(plt.Rectangle((0, 0), 1, 1, **hatch,
                                     label=f"past the plane's {wo} columns: idle in every tile"))
    fig.legend(handles=handles, loc="outside lower center", ncol=2, frameon=False, fontsize=9)
    return fig
