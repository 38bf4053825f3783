"""The book's one plot style and the few plot shapes every chapter uses."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import matplotlib as mpl
import matplotlib.pyplot as plt

OURS = "#c0392b"      # our kernels: one colour across the book
BASELINE = "#7f8c8d"  # what a user would otherwise pick
CEILING = "#2c3e50"   # measured ceilings and floors


def style() -> None:
    """Apply the book's plot style (readable on the rendered page and in Jupyter)."""
    mpl.rcParams.update({
        "figure.figsize": (7.5, 3.8), "figure.dpi": 110, "savefig.dpi": 110,
        "axes.spines.top": False, "axes.spines.right": False, "axes.grid": True,
        "grid.alpha": 0.3, "axes.titlesize": 11, "axes.labelsize": 10, "legend.fontsize": 9,
        "legend.frameon": False,
    })


def colour(provider: str) -> str:
    """The colour of a variant from who provides it (its declared ``provider``): ours, or a baseline."""
    return OURS if provider == "ours" else BASELINE


def bars(rec: Mapping, variants: Sequence[str] | None = None, title: str = "", ax=None):
    """Horizontal bars of a record's median time per variant, whiskers from the 20th to the 80th
    percentile, coloured by each variant's declared provider."""
    timings, declared = rec["timings_ms"], rec.get("variants", {})
    variants = list(variants or timings)
    if ax is None:
        _, ax = plt.subplots(figsize=(7.5, 0.34 * len(variants) + 1.2))
    med = [timings[v]["median"] for v in variants]
    lo = [timings[v]["median"] - timings[v]["q20"] for v in variants]
    hi = [timings[v]["q80"] - timings[v]["median"] for v in variants]
    y = range(len(variants))
    ax.barh(y, med, xerr=[lo, hi], color=[colour(declared.get(v, {}).get("provider", "")) for v in variants], capsize=3)
    ax.set_yticks(list(y), variants)
    ax.invert_yaxis()
    ax.set(xlabel="median time (ms), whiskers q20–q80", ylabel="variant")
    for yi, m, h in zip(y, med, hi, strict=True):  # 3 significant figures, trailing zeros kept
        ax.annotate(f"{m:#.3g}".rstrip("."), (m + h, yi), xytext=(4, 0), textcoords="offset points",
                    va="center", fontsize=9)
    ax.set_xlim(0, 1.12 * max(m + h for m, h in zip(med, hi, strict=True)))  # room for the labels
    ax.set_title(title)
    return ax
