"""A training step — forward and backward — through the capstones' fused ops, beside eager and torch.compile.

``FusedP73`` and ``FusedP27`` are the reference modules' submodules with the fused ops as their forward
(``autograd_ops.p73_forward``, ``autograd_ops.p27_module_forward``: the same code the benchmark submissions
run). ``step`` turns a module into one training step — gradients cleared, forward, backward from a fixed
output gradient — and ``step_variants`` declares the chapter's timed steps; ``phases`` sorts the kernels of
our step by what they do. Chapter 7's pictures of the training-mode forward are drawn here too: what the
moments strategy sums (``draw_lag_sums``), one call of each strategy by phase (``draw_call_phases``) and the
version ladder (``draw_version_ladder``).
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
    """The record's backward checks as a table, with each error's ratio to eager float32's. A gradient that is
    exactly 0 (checked with tolerance 0, where a relative error means nothing) shows its largest absolute value
    in the error columns, ours and eager's, and says so in its label."""
    import pandas as pd

    bw = pd.DataFrame(rec["checks"]).T.filter(like="backward_", axis=0)
    if "eager_max_abs" in bw:
        zero = bw["eager_max_abs"].notna() & bw["tol"].astype(float).eq(0)
        bw.loc[zero, "rel_err"] = bw.loc[zero, "max_abs_err"]
        bw.loc[zero, "eager_rel_err"] = bw.loc[zero, "eager_max_abs"]
        bw = bw.rename(index={k: f"{k} (exactly 0: max abs)" for k in bw.index[zero]})
    return bw.assign(**{"ratio to eager": bw["rel_err"].astype(float) / bw["eager_rel_err"].astype(float)})


PHASES = (  # (phase, substrings of the kernel names that belong to it), first match wins
    ("the moments and the guard (forward)", ("moments",)),
    ("the 3×3 convolution (forward, and again in the backward)",
     ("conv3x3", "pivots_kernel", "channel_stats", "apply_inplace")),
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



# ----------------------------------------------------------------------------------------------------------
# Chapter 7's pictures: the moments' lag sums, one training-mode call by phase, the version ladder


def draw_lag_sums(c_in: int = 8, k: int = 3, hw: int = 7, tap: tuple[int, int] = (1, 0),
                  lag: tuple[int, int] = (1, 1), at: tuple[int, int] = (1, 1)):
    """What the moments strategy sums (``kernels/conv_moments.cuh``), on a small ``hw``×``hw`` plane: the taps
    a and b = a + d of a k×k filter, the (2k − 1)² lags d between two taps (those with d₁ ≥ 0 summed, the rest
    by symmetry), and, for tap ``tap`` and lag ``lag``, the full-plane lag sum Σ_q x_i(q)·x_j(q + d) beside
    the window of q that one entry of Σ needs — the plane less two border rows and two border columns, plus
    the four corners they both removed. ``at``: the output position o whose patch is drawn. Returns the figure."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, Rectangle

    from ..harness import plots

    a1, a2 = tap  # (row, column), row 0 at the top
    d1, d2 = lag
    b1, b2 = a1 + d1, a2 + d2
    assert 0 <= b1 < k and 0 <= b2 < k, "tap + lag must be a tap"
    out = hw - k + 1
    win, strip, corner, kept_c, sym_c = "#5dade2", "#f5b041", "#c0392b", "#58d68d", "#d5d8dc"
    fig, (ax_t, ax_l, ax_p) = plt.subplots(1, 3, figsize=(8.2, 3.7), width_ratios=(k, 2 * k - 1, hw),
                                           layout="constrained")

    def grid(ax, n, m, x0=0, y0=0):
        for r in range(n):
            for c in range(m):
                ax.add_patch(Rectangle((x0 + c, y0 + r), 1, 1, fill=False, ec="#7f8c8d", lw=0.6))

    def arrow(ax, src, dst, shrink=9):
        ax.add_patch(FancyArrowPatch(src, dst, arrowstyle="-|>", mutation_scale=12, lw=1.6,
                                     color="black", shrinkA=shrink, shrinkB=shrink))

    grid(ax_t, k, k)  # (a) the filter's taps, (row, column) = (y, x), row 0 at the top
    for (r, c), name in (((a1, a2), "a"), ((b1, b2), "b")):
        ax_t.add_patch(Rectangle((c, r), 1, 1, color="#7d3c98" if name == "a" else plots.CEILING))
        ax_t.text(c + 0.5, r + 0.5, name, ha="center", va="center", color="white", fontsize=12)
    arrow(ax_t, (a2 + 0.5, a1 + 0.5), (b2 + 0.5, b1 + 0.5))
    ax_t.set_title(f"taps a, b of the\n{k}×{k} filter; d = b − a", fontsize=10)

    n_lag = 2 * k - 1  # (b) every lag between two taps; d₁ < 0 is the pair (j, i) at −d
    for r in range(n_lag):
        for c in range(n_lag):
            kept = r >= k - 1
            ax_l.add_patch(Rectangle((c, r), 1, 1, color=kept_c if kept else sym_c, ec="white", lw=1))
    ax_l.add_patch(Rectangle((d2 + k - 1, d1 + k - 1), 1, 1, fill=False, ec="black", lw=2))
    ax_l.text(d2 + k - 0.5, d1 + k - 0.5, "d", ha="center", va="center", fontsize=11)
    ax_l.set_title(f"all {n_lag}×{n_lag} lags d: {k * n_lag} summed\n"
                   f"per pair (i, j) of {c_in} channels", fontsize=10)
    ax_l.set_xticks([c + 0.5 for c in range(n_lag)], [str(c - k + 1) for c in range(n_lag)], fontsize=9)
    ax_l.set_yticks([r + 0.5 for r in range(n_lag)], [str(r - k + 1) for r in range(n_lag)], fontsize=9)
    ax_l.set(xlabel="d₂ (columns)", ylabel="d₁ (rows)")

    rows_out = [r for r in range(hw) if not a1 <= r < a1 + out]  # (c) the plane, q = o + a
    cols_out = [c for c in range(hw) if not a2 <= c < a2 + out]
    for r in range(hw):
        for c in range(hw):
            n_out = (r in rows_out) + (c in cols_out)
            ax_p.add_patch(Rectangle((c, r), 1, 1, color=(win, strip, corner)[n_out], ec="white", lw=1))
            if not (0 <= r + d1 < hw and 0 <= c + d2 < hw):  # the partner lies outside: a product of 0
                ax_p.add_patch(Rectangle((c, r), 1, 1, fill=False, hatch="///", ec="#566573", lw=0))
    ax_p.add_patch(Rectangle((a2, a1), out, out, fill=False, ec="black", lw=2))
    p1, p2 = at
    ax_p.add_patch(Rectangle((p2, p1), k, k, fill=False, ec="black", lw=1.3, ls="--"))
    q, qd = (p2 + a2 + 0.5, p1 + a1 + 0.5), (p2 + b2 + 0.5, p1 + b1 + 0.5)
    ax_p.text(*q, "$x_i$", ha="center", va="center", fontsize=10)
    ax_p.text(*qd, "$x_j$", ha="center", va="center", fontsize=10)
    arrow(ax_p, q, qd, shrink=6)
    ax_p.set_title("the full-plane lag sum:\nx_i(q)·x_j(q + d) at every q", fontsize=10)
    handles = [Rectangle((0, 0), 1, 1, color=kept_c, label="lag summed (d₁ ≥ 0)"),
               Rectangle((0, 0), 1, 1, color=sym_c, label="lag by symmetry: pair (j, i) at −d"),
               Rectangle((0, 0), 1, 1, color=win, label="in tap a's window: summed into Σ"),
               Rectangle((0, 0), 1, 1, color=strip, label="border row or column: subtracted"),
               Rectangle((0, 0), 1, 1, color=corner, label="corner: subtracted twice, added once"),
               Rectangle((0, 0), 1, 1, fill=False, hatch="///", ec="#566573",
                         label="product 0: x_j(q+d) off the plane"),
               Rectangle((0, 0), 1, 1, fill=False, ec="black", lw=2, label="window: q = o + a for every output o"),
               Rectangle((0, 0), 1, 1, fill=False, ec="black", lw=1.3, ls="--", label="the patch of one output o")]
    fig.legend(handles=handles, loc="outside lower center", ncol=2, fontsize=9, handlelength=1.6)
    for ax, n in ((ax_t, k), (ax_l, n_lag), (ax_p, hw)):
        ax.set(xlim=(-0.05, n + 0.05), ylim=(n + 0.05, -0.05), aspect="equal")
        ax.grid(False)
        for side in ax.spines.values():
            side.set_visible(False)
        if ax is not ax_l:
            ax.set(xticks=[], yticks=[])
    return fig


# Chapter 7's kernel files, less the shared headers chapters 1 and 6 show (bn_stats.cuh, welford.cuh, tf32.cuh)
P73_OWN_SOURCES = ("conv_bn_scale.cu", "conv_bn_scale.cpp", "conv_bn_scale.h", "tc_rates.h", "conv_moments.cuh",
                   "conv_tf32.cuh", "conv_wgmma.cuh")


CALL_PHASES = (  # (phase of one training-mode forward, colour, substrings of its kernels' names), in launch order
    ("memsets", "#bdc3c7", ("Memset", "FillFunctor")),
    ("lag sums", "#2e86c1", ("moments_tc", "moments_main")),
    ("border sums", "#85c1e9", ("moments_edge",)),
    ("Σ, guard, fold", "#1b4f72", ("moments_cov", "moments_fold", "moments_commit")),
    ("pivots of y", "#a04000", ("pivots_kernel",)),
    ("conv writes y", "#c0392b", ("conv3x3_3xtf32", "conv3x3_wgmma", "conv3x3_kernel<false")),
    ("conv + epilogue sums", "#e67e22", ("conv3x3_kernel<true",)),
    ("sums over y (own pass)", "#f4d03f", ("channel_stats",)),
    ("normalise y in place", "#27ae60", ("apply_inplace",)),
)
P73_CALL_ROWS = {  # variant → how the timeline names it
    "ours_train": "moments, 3xTF32\n(the default)", "ours_train_ffma": "moments, FFMA",
    "ours_train_inplace": "in place, FFMA", "ours_train_inplace_tc": "in place, 3xTF32"}


def call_phases(kernel_rows, variant: str) -> list[tuple[str, float]]:
    """(phase, µs) of each kernel ``variant`` launched (``kb.profile.kernels`` rows), in ``CALL_PHASES``' order,
    which is the order the launcher issues them; a kernel no phase names is an error."""
    out = []
    for r in (r for r in kernel_rows if r["variant"] == variant):
        i = next((i for i, (_, _, keys) in enumerate(CALL_PHASES) if any(k in r["kernel"] for k in keys)), None)
        if i is None:
            raise ValueError(f"no phase of CALL_PHASES names the kernel {r['kernel']!r}")
        out.append((i, r["total_us"]))
    return [(CALL_PHASES[i][0], us) for i, us in sorted(out, key=lambda e: e[0])]


def draw_call_phases(kernel_rows, timings_ms, rows: dict[str, str] = P73_CALL_ROWS):
    """One training-mode forward of each strategy as a timeline: a bar per kernel, its length the profiled
    kernel time, coloured by phase, in launch order; a tick at the call's median time (the kernels and the
    gaps between them). The legend names the phases wide enough to see, each with its time in the first row's
    call (the default) where that is visible, and the others with their largest time in one call. Returns the figure."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    colours = {p: c for p, c, _ in CALL_PHASES}
    fig, ax = plt.subplots(figsize=(7.6, 0.5 * len(rows) + 1.5), layout="constrained")
    seen: dict[str, float] = {}  # phase → its largest time in one call
    for y, variant in enumerate(rows):
        t, per_call = 0.0, {}
        for phase, us in call_phases(kernel_rows, variant):
            ax.barh(y, us, left=t, height=0.62, color=colours[phase], ec="white", lw=0.5)
            if us > 60:  # room for its time inside the bar
                dark = colours[phase] in ("#1b4f72", "#2e86c1", "#c0392b", "#27ae60")
                ax.text(t + us / 2, y, f"{us:.0f}", ha="center", va="center", fontsize=9,
                        color="white" if dark else "black")
            t += us
            per_call[phase] = per_call.get(phase, 0.0) + us
        for phase, us in per_call.items():
            seen[phase] = max(seen.get(phase, 0.0), us)
        ax.plot([1e3 * timings_ms[variant]["median"]] * 2, [y - 0.42, y + 0.42], color="black", lw=2)
    ax.set_yticks(range(len(rows)), list(rows.values()), fontsize=9)
    ax.invert_yaxis()
    ax.set(xlabel="kernel times end to end, in launch order (µs)", xlim=(0, None))
    ax.grid(axis="y", visible=False)
    xmax = ax.get_xlim()[1]
    shown = {p for p, us in seen.items() if us >= 0.008 * xmax}  # at least ~1 % of the axis: visible
    first: dict[str, float] = {}  # the first row's (the default's) time per phase, µs
    for phase, us in call_phases(kernel_rows, next(iter(rows))):
        first[phase] = first.get(phase, 0.0) + us
    big = {p for p, us in first.items() if us >= 0.008 * xmax}  # the default's visible phases
    handles = [Rectangle((0, 0), 1, 1, color=c, label=p + (f" ({first[p]:.0f} µs)" if p in big else ""))
               for p, c, _ in CALL_PHASES if p in shown]
    handles.append(plt.Line2D([], [], color="black", lw=2, label="the call's median"))
    tiny = [f"{p} (≤ {seen[p]:.0f} µs)" for p, _, _ in CALL_PHASES if p in seen and p not in shown]
    if tiny:
        handles.append(Rectangle((0, 0), 0, 0, fill=False, lw=0, label="too short to see: " + ", ".join(tiny)))
    fig.legend(handles=handles, loc="outside lower center", ncol=3, fontsize=9)
    return fig


def phases_bound_ms(phases, rates, bandwidth: float) -> float:
    """The least time of work in phases that cannot overlap, each phase at its own FLOP rate (the arithmetic
    it runs in): the sum of the phases' roofline bounds, in ms."""
    from . import roofline

    return sum(roofline.bound_ms(c, r, bandwidth) for c, r in zip(phases, rates, strict=True))


def conv_bounds_ms(phases: dict, sums_rate: float, conv_rate: float, bandwidth: float) -> tuple[float, float]:
    """(eval mode's bound, the moments strategy's bound) in ms with the convolution at ``conv_rate`` and the
    moments' sums at ``sums_rate``: chapter 7's 3xTF32 bounds where the two run on different instructions."""
    return (phases_bound_ms(phases["eval mode (folded conv)"], (conv_rate,), bandwidth),
            phases_bound_ms(phases["moments, then one conv"], (sums_rate, conv_rate), bandwidth))


def draw_version_ladder(training_ms, bounds_ms):
    """The version ladder: each version's training-mode time (a Series indexed by version) beside the bound of
    its own strategy at the arithmetic it ran (``bounds_ms``, one per version, drawn as a bar), each point
    labelled with its % of that bound (bound ÷ time). Returns the figure."""
    import textwrap

    import matplotlib.pyplot as plt

    from ..harness import plots

    x, t = range(len(training_ms)), list(training_ms)
    fig, ax = plt.subplots(figsize=(7.2, 2.2), layout="constrained")  # ≈ the text column: no shrinking
    ax.bar(x, bounds_ms, width=0.5, color=plots.CEILING, alpha=0.35, label="its strategy's bound")
    ax.plot(x, t, "o-", color=plots.OURS, label="training-mode time")
    for i, (t_v, b_v) in enumerate(zip(t, bounds_ms, strict=True)):
        ax.annotate(f"{100 * b_v / t_v:.0f} %", (i, t_v), xytext=(0, 6), textcoords="offset points",
                    ha="center", va="bottom", fontsize=9)
    names = [textwrap.fill(v, 10) for v in training_ms.index]  # two lines where a name is long
    ax.set(xticks=x, xticklabels=names, xlabel="version", ylabel="training-mode time (ms)",
           ylim=(0, 1.2 * max(t)), title="training mode by version, with each one's % of its own bound")
    ax.legend(loc="upper right", ncol=2, fontsize=9)
    return fig


def problem_glue(problem, tol: float) -> dict:
    """The capstone's opening numbers: input size in MB, output channels, the tolerance, and the shapes in words."""
    n, c, h, w = problem.input_shape
    c_out, k = problem.init_args[1:3]
    return {"x_mb": n * c * h * w * 4e-6, "c_out": c_out, "target_err": tol,
            "shape_x": f"({n}, {c}, {h}, {w})", "shape_w": f"({c_out}, {c}, {k}, {k})",
            "shape_y": f"({n}, {c_out}, {h - k + 1}, {w - k + 1})",
            "y_mb": n * c_out * (h - k + 1) * (w - k + 1) * 4e-6}


def main_kernels(prof, share: float = 0.02):
    """A profile's kernels per variant that take at least ``share`` of that variant's kernel time (the rest are
    launches of a few microseconds), as the chapter's table shows them."""
    big = prof[prof["total_us"] >= share * prof.groupby("variant")["total_us"].transform("sum")]
    return big.set_index("variant")[["kernel", "launches", "total_us"]]


SIGMA_ERR = {"moments": "σ² rel. error, moments", "in place": "σ² rel. error, in place"}


def emulation_table(caveat) -> dict:
    """The CPU emulation's rows (offset, η the noise's amplitude, filter, κ, the moments' and the in-place σ²
    errors) as ``kb.show.table``'s arguments: named columns, one number format per kind."""
    data = caveat.drop(columns="offset").rename(columns=lambda s: SIGMA_ERR.get(s, s))
    return {"data": data, "formats": {"η": "sci", "κ": "sci", **dict.fromkeys(SIGMA_ERR.values(), "err")},
            "title": "σ²'s relative error, emulated on the CPU", "collapse": True}


def check_grid(checks):
    """The chapter's checks against float64, named "P73 <path>: <what>" (``kb.check.assert_close`` reports), as
    one row per path and one column per quantity checked, each its norm-wise relative error."""
    import pandas as pd

    rows: dict = {}
    for name, r in checks.iterrows():
        path, what = name.removeprefix("P73 ").split(": ", 1)
        rows.setdefault(path, {})[what] = r["rel_err"]
    return pd.DataFrame(rows).T


MODE_TITLES = {"train": "Training mode", "eval": "Eval mode (BatchNorm and the scale folded into the weights)"}


def mode_tables(t, cols=("provider", "math", "median ms", "error", "TFLOP/s"),
                formats: dict | None = None) -> list:
    """The timings table ``t`` (``kb.measure.run``'s, with ``mode`` and ``error`` columns) as one table of
    ``cols`` per mode of ``MODE_TITLES``: ours first, marked ▸, in declared order, then the baselines fastest
    first; times to 3 significant figures, errors as 1.2e-07 unless ``formats`` says otherwise."""
    import pandas as pd

    from ..harness import show

    formats = {"median ms": "time", "error": "err", **(formats or {})}
    out = []
    for mode, title in MODE_TITLES.items():
        m = t.loc[t["mode"] == mode, list(cols)]
        ours = m["provider"] == "ours"
        m = pd.concat([m[ours], m[~ours].sort_values("median ms")])
        m = m.rename(index={v: f"▸ {v}" for v in m.index[m["provider"] == "ours"]})
        out.append(show.table(m, formats=formats, title=title, collapse=False, index="variant"))
    return out


F32_LIBRARY = {"train": "compile_train_fp32", "eval": "cudnn_folded_fp32"}  # TF32 off: the float32 library path


def glue_baselines(base: dict, ours: dict, err) -> None:
    """Glue, per mode, the fastest baseline (``{mode}_fastest``, ``{mode}_margin``) and the fastest one that is
    float32-accurate by the book's definition — within twice the float32 library path's error
    (``{mode}_fastest_f32``, ``{mode}_margin_f32``)."""
    import kernelbook as kb

    for m, times in base.items():
        accurate = times[err[times.index] <= 2 * err[F32_LIBRARY[m]]]
        for suffix, t in (("", times), ("_f32", accurate)):
            kb.glue_md(f"{m}_fastest{suffix}", f"`{t.idxmin()}` ({t.min():.3f} ms, error {err[t.idxmin()]:.0e})")
            kb.glue(f"{m}_margin{suffix}", t.min() / ours[m])
