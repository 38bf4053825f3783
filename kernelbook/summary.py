"""The book's results at a glance: one row per fused operation, read from the chapters' records.

The intro page shows ``markdown_table()``, built when the book is built, so the table grows as
chapters record results and never holds a typed number. Each row names the record variants it
reads: eager PyTorch, ``torch.compile`` (if the chapter timed it), ours, and the floor, the least
time the operation can take on that GPU:

* for a memory-bound operation, its ``floor_passes`` passes over the tensor at the device-to-device
  copy rate measured in the same run (a copy is two passes);
* otherwise the value the chapter stored as ``record["floor_ms"][<ours variant>]``, if any;
* otherwise the roofline bound, max(FLOP / FP32 rate, bytes / copy rate), of the operation's counts
  (``kernelbook.roofline``) with the ceilings the roofline chapter measured (03_roofline: its FFMA
  kernel and its copy), for variants that compute in FP32. The FP32 rate is that *measured* FFMA
  rate, not the nominal peak (SMs × lanes × 2 × clock) a chapter may divide by, so a chapter's
  "% of the FFMA peak" and this table's "% of floor" can differ by a little.

It also says how the page was built (``built_on``) and whether the repository's address is still the
placeholder (``repository_url``), so the front matter states neither as a typed fact.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from .paths import RESULTS, ROOT
from .records import DEFAULT_GPU

COPY = "copy_torch"  # the device-to-device copy every memory-bound chapter times beside its kernels
ROOFLINE = "03_roofline"  # the chapter that measures the ceilings: FP32 FMA throughput and copy bandwidth
FFMA = "ffma_ours"  # its FMA-throughput kernel


@dataclass(frozen=True)
class Row:
    """One fused operation: which problem, which chapter's record, which variants, which floor."""

    problem: str
    what: str
    chapter: str
    eager: str
    ours: str
    compiled: str | None = None
    floor_passes: float | None = None  # passes over the tensor at the copy rate (None: record["floor_ms"])


ROWS: list[Row] = [
    Row("P73", "`· 2.0` alone, 1 GiB", "00_method", "scale_torch", "scale_ours", floor_passes=2),
    Row("P73", "BN · 2.0, training", "01_bn_modes", "eager_bn_scale", "ours_bn_scale_train",
        compiled="compile_bn_scale", floor_passes=3),
    Row("P73", "BN · 2.0, eval", "01_bn_modes", "eager_bn_scale_eval", "ours_bn_scale_eval", floor_passes=2),
    Row("P73", "conv + BN · 2.0 folded, eval", "02_bn_folding", "eager_eval", "ours_fast", compiled="compile_eval"),
    Row("P73", "whole problem, training", "06_capstone_conv_bn_scale", "eager_train", "ours_train",
        compiled="compile_train"),
    Row("P73", "whole problem, eval", "06_capstone_conv_bn_scale", "eager_eval", "ours_eval", compiled="compile_eval"),
    Row("P27", "whole problem", "07_capstone_conv3d_groupnorm_mean", "eager", "ours", compiled="compile"),
]

COLUMNS = ["problem", "operation", "ch.", "eager ms", "compile ms", "ours ms", "× eager", "× compile",
           "% of floor"]


def _load(chapter: str, gpu_slug: str, root: Path) -> dict | None:
    p = root / gpu_slug / f"{chapter}.json"
    return json.loads(p.read_text()) if p.is_file() else None


def _median(rec: dict, variant: str | None) -> float | None:
    t = rec.get("timings_ms", {}).get(variant) if variant else None
    return None if t is None else float(t["median"])


def ceilings(gpu_slug: str | None = None, root: Path = RESULTS) -> tuple[float, float] | None:
    """FP32 FLOP/s and copy bytes/s as the roofline chapter measured them on ``gpu_slug`` (None if not)."""
    rec = _load(ROOFLINE, gpu_slug or os.environ.get("KERNELBOOK_RESULTS_GPU", DEFAULT_GPU), root)
    try:
        counts, t = rec["counts"], rec["timings_ms"]
        peak = counts[FFMA]["flop"] / (t[FFMA]["median"] * 1e-3)
        bandwidth = (counts[COPY]["read"] + counts[COPY]["write"]) / (t[COPY]["median"] * 1e-3)
    except (KeyError, TypeError, ZeroDivisionError):
        return None
    return peak, bandwidth


def _floor(row: Row, rec: dict, ceil: tuple[float, float] | None) -> tuple[float | None, str | None]:
    """The row's floor in ms and how it was found: "copy", "stored" or "roofline" (None, None: unknown)."""
    if row.floor_passes is not None:
        copy = _median(rec, COPY)
        return (None, None) if copy is None else (copy * row.floor_passes / 2, "copy")
    stored = rec.get("floor_ms", {})
    if isinstance(stored, dict) and row.ours in stored:
        return float(stored[row.ours]), "stored"
    if ceil is None:
        return None, None
    from . import roofline

    placed = roofline.placed(rec).get(row.ours)
    if placed is None or placed.math != "fp32":
        return None, None
    return roofline.bound_ms(placed.counts, *ceil), "roofline"


def floor_ms(row: Row, rec: dict, ceil: tuple[float, float] | None = None) -> float | None:
    """The row's floor in ms (see the module's docstring for the three ways it is found)."""
    return _floor(row, rec, ceil)[0]


def rows(gpu_slug: str | None = None, root: Path = RESULTS) -> list[dict]:
    """The table's rows (numbers, not text) for every row whose chapter has a record on ``gpu_slug``."""
    slug = gpu_slug or os.environ.get("KERNELBOOK_RESULTS_GPU", DEFAULT_GPU)
    ceil = ceilings(slug, root)
    out = []
    for row in ROWS:
        rec = _load(row.chapter, slug, root)
        if rec is None:
            continue
        eager, comp, ours = _median(rec, row.eager), _median(rec, row.compiled), _median(rec, row.ours)
        floor, basis = _floor(row, rec, ceil)
        out.append({
            "problem": row.problem, "operation": row.what, "chapter": row.chapter,
            "eager ms": eager, "compile ms": comp, "ours ms": ours,
            "× eager": eager / ours if eager and ours else None,
            "× compile": comp / ours if comp and ours else None,
            "% of floor": 100 * floor / ours if floor and ours else None,
            "floor": basis if floor and ours else None,
            "gpu": rec["provenance"]["gpu"], "torch": rec["provenance"]["torch"], "date": rec["provenance"]["date"],
        })
    return out


def missing(gpu_slug: str | None = None, root: Path = RESULTS) -> list[str]:
    """Variants a row names that its (existing) record lacks: the table and the record disagree."""
    slug = gpu_slug or os.environ.get("KERNELBOOK_RESULTS_GPU", DEFAULT_GPU)
    out = []
    for row in ROWS:
        rec = _load(row.chapter, slug, root)
        if rec is None:
            continue
        for v in (row.eager, row.ours, row.compiled) + ((COPY,) if row.floor_passes else ()):
            if v and _median(rec, v) is None:
                out.append(f"{row.chapter}: {v}")
    return out


def _in_toc(chapter: str) -> bool:
    toc = ROOT / "_toc.yml"
    return toc.is_file() and f"notebooks/{chapter}" in toc.read_text()


def _fmt(value: float | None, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def markdown_table(gpu_slug: str | None = None, root: Path = RESULTS) -> str:
    """The results table as MyST Markdown, chapters linked when the book contains them."""
    rs = rows(gpu_slug, root)
    if not rs:
        return "*No chapter has recorded results yet.*"
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * 3 + "--:|" * (len(COLUMNS) - 3)]
    for r in rs:
        ch = f"{{doc}}`{r['chapter'][:2]} <notebooks/{r['chapter']}>`" if _in_toc(r["chapter"]) else r["chapter"][:2]
        cells = [r["problem"], r["operation"], ch, _fmt(r["eager ms"], ".3f"), _fmt(r["compile ms"], ".3f"),
                 _fmt(r["ours ms"], ".3f"), _fmt(r["× eager"], ".2f"), _fmt(r["× compile"], ".2f"),
                 _fmt(r["% of floor"], ".0f")]
        lines.append("| " + " | ".join(cells) + " |")
    gpus = sorted({f"{r['gpu']} (torch {r['torch']})" for r in rs})
    dates = sorted(r["date"] for r in rs)
    lines.append("")
    lines.append(f"Medians of CUDA-event timings with L2 flushed, recorded on {', '.join(gpus)} between "
                 f"{dates[0]} and {dates[-1]}. *compile* is `torch.compile` of the same PyTorch code; speed-ups "
                 f"are eager's (or compile's) time over ours. The baselines run with PyTorch's defaults, which let "
                 f"cuDNN use TF32 for convolutions; ours compute in FP32. — where a chapter did not time that "
                 f"variant or no floor is known.")
    lines.append("")
    lines.append(_floor_note(rs, gpu_slug, root))
    return "\n".join(lines)


def _floor_note(rs: list[dict], gpu_slug: str | None, root: Path) -> str:
    """What "% of floor" divides by, per kind of row, with the measured ceilings where a row uses them."""
    kinds = {r["floor"] for r in rs}
    parts = []
    if "copy" in kinds:
        parts.append("for a memory-bound row, the operation's unavoidable passes over its tensor at the "
                     "device-to-device copy rate the same chapter measured in the same run")
    if "roofline" in kinds:
        chapters = sorted({int(r["chapter"][:2]) for r in rs if r["floor"] == "roofline"})
        peak, bandwidth = ceilings(gpu_slug, root) or (float("nan"), float("nan"))
        parts.append(f"for a row with real arithmetic (chapter{'s' * (len(chapters) > 1)} "
                     f"{', '.join(map(str, chapters))}), the roofline bound with the "
                     f"ceilings the roofline chapter (3) measured: {peak / 1e12:.1f} TFLOP/s from its own FFMA "
                     f"kernel and {bandwidth / 1e9:,.0f} GB/s from its copy. That measured FFMA rate is not the "
                     f"nominal FFMA peak (SMs × FP32 lanes × 2 FLOP × clock) that a chapter's \"% of the FFMA "
                     f"peak\" divides by, so the two percentages of the same kernel can differ by a little")
    if "stored" in kinds:
        parts.append("for a row whose chapter derives its own floor, the one stored with its record")
    if not parts:
        return "*% of floor*: 100 % is as fast as the hardware allows."
    return "*% of floor* is the floor's time over ours (100 % is as fast as the hardware allows): " + "; ".join(
        parts) + "."


def built_on() -> str:
    """How this build runs the chapters, in one sentence: live on a GPU, or from records without one."""
    from .device import gpu

    g = gpu()
    if g is None:
        return ("This copy of the book was built on a machine without a GPU: every cell that can run on a CPU "
                "ran live when the page was built, and the GPU measurements come from records made on a GPU")
    return (f"This copy of the book was built on a machine with a GPU ({g['gpu']}): every chapter's cells ran "
            f"live on it when the page was built (the results table on the intro still reads the records)")


PLACEHOLDER = "REPLACE-ME"  # in _config.yml's repository.url until whoever publishes the book sets the address


def repository_url(root: Path = ROOT) -> str:
    """The repository's address as _config.yml writes it (``repository.url``: the one place it is set)."""
    import yaml

    return yaml.safe_load((root / "_config.yml").read_text())["repository"]["url"]


def torch_versions(gpu_slug: str | None = None, root: Path = RESULTS) -> list[str]:
    """The PyTorch versions the records on ``gpu_slug`` were made with (the GPU machine's own torch)."""
    slug = gpu_slug or os.environ.get("KERNELBOOK_RESULTS_GPU", DEFAULT_GPU)
    return sorted({json.loads(p.read_text())["provenance"]["torch"] for p in (root / slug).glob("*.json")})


def pinned(package: str, root: Path = ROOT) -> str | None:
    """The version constraints.txt pins ``package`` to (the build's and the tests' environment), if any."""
    path = root / "constraints.txt"
    if not path.is_file():
        return None
    for line in path.read_text().splitlines():
        name, sep, version = line.split("#")[0].strip().partition("==")
        if sep and name.strip().lower() == package.lower():
            return version.strip()
    return None


def show(gpu_slug: str | None = None) -> None:
    """Display the table in a notebook (the intro page's one code cell)."""
    from IPython.display import Markdown, display

    display(Markdown(markdown_table(gpu_slug)))
