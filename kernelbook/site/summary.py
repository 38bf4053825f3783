"""The book's results at a glance: one row per fused operation, read from the chapters' records.

The intro page shows ``markdown_table()``, built when the book is built, so the table never holds a
typed number. A chapter puts a variant in the table by declaring it with ``row="<problem> |
<operation>"`` (``kb.measure.Variant(..., row=...)``): its eager baseline, its ``torch.compile``
baseline if it has one, and its own kernel (provider ``ours``) — one of each per row. Nothing here
names a variant.

The floor of a row is the least time its operation can take on that GPU: the roofline bound of the
counts the chapter declared for its kernel, max(FLOP / FP32 rate, bytes / copy rate). The FP32 rate is
the fastest FP32 reference rate the roofline chapter (03_roofline) measured (its FFMA kernel); the copy
rate is the record's own reference-rate copy when the chapter timed one in the same run, else the
roofline chapter's. Those are measured rates, not datasheet peaks, so a chapter's "% of the FFMA peak"
(SMs × lanes × 2 × clock) and this table's "% of floor" can differ by a little.

Where ``results/<gpu>/spread.json`` holds at least ``MIN_RUNS`` runs of the table's variants, each made in a
separate process (``kb.records`` describes the file), the table adds the least and greatest of those runs'
medians of our kernel beside the record's median, and quotes each speed-up only to the figures that the
ranges of both of its times allow (``kb.records.ratio_text``). A range counts only runs that measured
today's kernels of its chapter: a chapter whose kernels changed since shows no range, and the note says so.
Without the file (another GPU) the table is as it would be without spread.

It also says how the page was built (``built_on``) and whether the repository's address is still the
placeholder (``repository_url``), so the front matter states neither as a typed fact.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..harness.paths import RESULTS, ROOT
from ..harness.records import fresh_for, on_gpu, ratio_text, results_gpu, spread_path, spread_runs

ROOFLINE = "03_roofline"  # the chapter that measures the ceilings: FP32 FMA throughput and copy bandwidth

COLUMNS = ["problem", "operation", "ch.", "eager ms", "compile ms", "ours ms", "× eager", "× compile",
           "% of floor"]
RANGE_COLUMN = "ours min–max"  # after "ours ms", where the spread between processes was measured
MIN_RUNS = 3  # separate processes a range needs before the table shows it
CAPSTONES = ("07_capstone_conv_bn_scale", "08_capstone_conv3d_groupnorm_mean")  # whose peers are timed too


def _median(rec: dict, variant: str | None) -> float | None:
    t = rec.get("timings_ms", {}).get(variant) if variant else None
    return None if t is None else float(t["median"])


def reference_rates(rec: dict | None) -> dict[str, float]:
    """The fastest FP32 FLOP rate ("flop", FLOP/s) and copy bandwidth ("bytes", bytes/s) among the record's
    variants declared with role "reference-rate" (a copy moves bytes and no FLOP; an FFMA kernel, FLOPs)."""
    out: dict[str, float] = {}
    for v, d in (rec or {}).get("variants", {}).items():
        ms, counts = _median(rec, v), d.get("counts", {})
        if d.get("role") != "reference-rate" or not ms:
            continue
        kind = "flop" if counts.get("flop") else "bytes" if counts.get("bytes") else None  # a copy: no FLOP
        if kind is None or (kind == "flop" and d.get("math") != "fp32"):
            continue
        out[kind] = max(out.get(kind, 0.0), counts[kind] / (ms * 1e-3))
    return out


def ceilings(gpu_slug: str | None = None, root: Path = RESULTS) -> tuple[float, float] | None:
    """FP32 FLOP/s and copy bytes/s as the roofline chapter measured them on ``gpu_slug`` (None if not)."""
    rec = next((r for r in on_gpu(gpu_slug, root) if r["chapter"] == ROOFLINE), None)
    rates = reference_rates(rec)
    return (rates["flop"], rates["bytes"]) if {"flop", "bytes"} <= rates.keys() else None


def table_rows(rec: dict) -> dict[tuple[str, str], dict[str, str]]:
    """{(problem, operation): {provider: variant}} for the variants ``rec`` declares with a row."""
    out: dict[tuple[str, str], dict[str, str]] = {}
    for v, d in rec.get("variants", {}).items():
        if d.get("row"):
            problem, _, operation = d["row"].partition(" | ")
            out.setdefault((problem.strip(), operation.strip()), {})[d["provider"]] = v
    return out


TENSOR_CORES = "06_tensor_cores"  # the chapter that measures the tensor cores' rates (its ceiling kernels)
# The tensor-core chapter's ceiling variant for each instruction (older records: mma_peak, constant operands)
TC_CEILINGS = {"mma.sync": ("mma_ceiling", "mma_peak"), "wgmma": ("wgmma_ceiling",)}


def tensor_core_rate(gpu_slug: str | None = None, root: Path = RESULTS, instruction: str = "mma.sync") -> float | None:
    """FLOP/s of 3xTF32 products on ``gpu_slug`` through ``instruction`` ("mma.sync", or "wgmma" on sm_90): a third
    of the TF32 ceiling the tensor-core chapter measured for it with varying operands (None where not recorded)."""
    rec = next((r for r in on_gpu(gpu_slug, root) if r["chapter"] == TENSOR_CORES), None)
    name = next((n for n in TC_CEILINGS[instruction] if n in (rec or {}).get("timings_ms", {})), None)
    if name is None:
        return None
    return 1e3 * rec["variants"][name]["counts"]["flop"] / rec["timings_ms"][name]["median"] / 3


def floor_ms(rec: dict, variant: str, ceil: tuple[float, float] | None,
             tc_rate: float | Mapping[str, float | None] | None = None) -> float | None:
    """The roofline bound of ``variant``'s declared counts (module docstring), in ms, at the rate of the
    arithmetic it ran in: the FP32 rate, or for 3xTF32 the rate of the instruction it issues (``tc_rate``:
    instruction → ``tensor_core_rate``, or one rate for mma.sync); None if unknown."""
    d = rec.get("variants", {}).get(variant, {})
    counts, math = d.get("counts", {}), d.get("math", "fp32")
    rates = tc_rate if isinstance(tc_rate, Mapping) else {"mma.sync": tc_rate}
    tc = rates.get(d.get("instruction") or "mma.sync")
    if ceil is None or not counts or math not in ("fp32", "3xtf32") or (math == "3xtf32" and not tc):
        return None
    peak, bandwidth = ceil
    peak = tc if math == "3xtf32" else peak
    bandwidth = reference_rates(rec).get("bytes", bandwidth)
    return 1e3 * max(counts.get("flop", 0.0) / peak, counts.get("bytes", 0.0) / bandwidth)


def spread_variants(gpu_slug: str | None = None, root: Path = RESULTS) -> dict[str, list[str]]:
    """{chapter: variants} that the spread between processes is measured for: every variant in the table's
    rows, and the capstones' peers — their forward-pass baselines (role "baseline", not a training step). A
    torch.compile peer counts only where it is a row's compiled module, or that one run with TF32 off: other
    settings (max-autotune, freezing) compile a module of their own, which would add minutes to every process."""
    out = {}
    for rec in sorted(on_gpu(gpu_slug, root), key=lambda r: r["chapter"]):
        decl = rec.get("variants", {})
        in_rows = {v for by in table_rows(rec).values() for v in by.values()}
        compiled = {decl[v].get("mode", "") for v in in_rows if decl[v]["provider"] == "compile"}
        names = [v for v, d in decl.items() if v in in_rows or (
            rec["chapter"] in CAPSTONES and d.get("role") == "baseline" and d.get("mode") != "step"
            and (d["provider"] != "compile" or (d.get("mode", "") in compiled and d.get("tf32_allowed") is False)))]
        if names:
            out[rec["chapter"]] = names
    return out


@dataclass(frozen=True)
class Spread:
    """The spread between processes on one GPU: ``ranges`` maps "<chapter>/<variant>" to the least and
    greatest of the runs' medians and how many runs timed it (only where ≥ ``MIN_RUNS`` did); ``dates``
    are the days those runs were made on, ``stale`` the chapters whose kernels changed after every run."""

    ranges: dict[str, tuple[float, float, int]]
    dates: tuple[str, ...]
    stale: tuple[str, ...]


def spread(gpu_slug: str | None = None, root: Path = RESULTS) -> Spread:
    """The spread between processes of ``gpu_slug``'s variants, from its spread file (empty where it has none)."""
    slug = results_gpu(gpu_slug)
    recs = {r["chapter"]: r for r in on_gpu(slug, root)}
    medians: dict[str, list[float]] = {}
    dates: dict[str, set[str]] = {}
    stale = set()
    for run in spread_runs(spread_path(slug, root)):
        for key, t in run["timings_ms"].items():
            chapter = key.partition("/")[0]
            if chapter not in recs:
                continue
            if not fresh_for(run, recs[chapter]):
                stale.add(chapter)
                continue
            medians.setdefault(key, []).append(float(t["median"]))
            dates.setdefault(key, set()).add(run["provenance"]["date"][:10])
    ranges = {k: (min(ms), max(ms), len(ms)) for k, ms in medians.items() if len(ms) >= MIN_RUNS}
    shown = {k.partition("/")[0] for k in ranges}
    return Spread(ranges, tuple(sorted({d for k in ranges for d in dates[k]})), tuple(sorted(stale - shown)))


def rows(gpu_slug: str | None = None, root: Path = RESULTS) -> list[dict]:
    """The table's rows (numbers, not text), chapter by chapter, in the order the chapters declared them; each
    time's range between processes under "<provider> range" ((least, greatest, runs), or None)."""
    slug = results_gpu(gpu_slug)
    ceil, ranges = ceilings(slug, root), spread(slug, root).ranges
    tc = {i: tensor_core_rate(slug, root, i) for i in TC_CEILINGS}
    out = []
    for rec in sorted(on_gpu(slug, root), key=lambda r: r["chapter"]):
        for (problem, operation), by in table_rows(rec).items():
            eager, comp, ours = (_median(rec, by.get(p)) for p in ("eager", "compile", "ours"))
            floor = floor_ms(rec, by["ours"], ceil, tc) if "ours" in by else None
            out.append({
                "problem": problem, "operation": operation, "chapter": rec["chapter"],
                "math": rec["variants"][by["ours"]].get("math", "fp32") if "ours" in by else None,
                "eager ms": eager, "compile ms": comp, "ours ms": ours,
                "× eager": eager / ours if eager and ours else None,
                "× compile": comp / ours if comp and ours else None,
                "% of floor": 100 * floor / ours if floor and ours else None,
                **{f"{p} range": ranges.get(f"{rec['chapter']}/{by[p]}") if p in by else None
                   for p in ("eager", "compile", "ours")},
                "gpu": rec["provenance"]["gpu"], "torch": rec["provenance"]["torch"],
                "date": rec["provenance"]["date"],
            })
    return out


def times_text(row: dict, provider: str, spec: str = ".2f") -> str:
    """A row's speed-up over ``provider`` ("eager", "compile") as text: to the figures the two times' ranges
    between processes allow where both have one (``kb.records.ratio_text``), else its value by ``spec``."""
    num, den = row[f"{provider} range"], row["ours range"]
    return ratio_text(num, den) if num and den else _fmt(row[f"× {provider}"], spec)


def ratio(chapter: str, num: str, den: str, spec: str = ".2f", gpu_slug: str | None = None,
          root: Path = RESULTS) -> str:
    """``num``'s median time over ``den``'s in ``chapter``'s record, as text for prose: to the figures the two
    variants' ranges between processes allow where both have one, else by ``spec``."""
    ranges = spread(gpu_slug, root).ranges
    a, b = ranges.get(f"{chapter}/{num}"), ranges.get(f"{chapter}/{den}")
    if a and b:
        return ratio_text(a, b)
    rec = next(r for r in on_gpu(gpu_slug, root) if r["chapter"] == chapter)
    return format(_median(rec, num) / _median(rec, den), spec)


def _range_text(r: tuple[float, float, int] | None) -> str:
    return "—" if r is None else f"{r[0]:.3f}–{r[1]:.3f}"


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
    cols = columns(rs)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * 3 + "--:|" * (len(cols) - 3)]
    for r in rs:
        ch = f"{{doc}}`{r['chapter'][:2]} <notebooks/{r['chapter']}>`" if _in_toc(r["chapter"]) else r["chapter"][:2]
        lines.append("| " + " | ".join([r["problem"], r["operation"], ch, *cells(r, RANGE_COLUMN in cols)[3:]]) + " |")
    gpus = sorted({f"{r['gpu']} (torch {r['torch']})" for r in rs})
    dates = sorted(r["date"] for r in rs)
    split = sorted({r["chapter"][:2] for r in rs if r["math"] == "3xtf32"})  # chapters whose rows use the split
    ours = "ours compute in FP32" + (f", except in the rows of chapter{'s' * (len(split) > 1)} "
                                     f"{' and '.join(split)}: 3xTF32 on the tensor cores, whose error against float64 "
                                     f"the chapter gives beside FP32's"
                                     if split else "") + "."
    lines.append("")
    lines.append(f"Medians of CUDA-event timings with L2 flushed, recorded on {', '.join(gpus)} between "
                 f"{dates[0]} and {dates[-1]}. *compile* is `torch.compile` of the same PyTorch code; speed-ups "
                 f"are eager's (or compile's) time over ours. The baselines run with PyTorch's defaults, which let "
                 f"cuDNN use TF32 for convolutions; {ours} A dash (—) marks a variant a chapter did not "
                 f"time, or an operation without a known floor.")
    lines.append("")
    lines.append(_floor_note(gpu_slug, root))
    note = _spread_note(spread(gpu_slug, root), RANGE_COLUMN in cols)
    return "\n".join(lines + (["", note] if note else []))


def columns(rs: list[dict]) -> list[str]:
    """The table's header: ``COLUMNS``, with ``RANGE_COLUMN`` after "ours ms" where a row has a range."""
    if not any(r["ours range"] for r in rs):
        return list(COLUMNS)
    at = COLUMNS.index("ours ms") + 1
    return [*COLUMNS[:at], RANGE_COLUMN, *COLUMNS[at:]]


def cells(r: dict, with_range: bool = False) -> list[str]:
    """One row's cells as plain text (the chapter as its number), in the order of ``columns``."""
    out = [r["problem"], r["operation"], r["chapter"][:2], _fmt(r["eager ms"], ".3f"), _fmt(r["compile ms"], ".3f"),
           _fmt(r["ours ms"], ".3f")]
    out += [_range_text(r["ours range"])] if with_range else []
    return out + [times_text(r, "eager"), times_text(r, "compile"), _fmt(r["% of floor"], ".0f")]


def _spread_note(sp: Spread, shown: bool) -> str:
    """What the range column is and how the speed-ups are rounded; which chapters lost their ranges, and why."""
    out = []
    if shown:
        n = sorted({k for _, _, k in sp.ranges.values()})
        runs = str(n[0]) if len(n) == 1 else f"{n[0]}–{n[-1]}"
        days = sp.dates[0] if len(sp.dates) == 1 else f"between {sp.dates[0]} and {sp.dates[-1]}"
        out.append(f"*{RANGE_COLUMN}* is the least and the greatest of the medians that {runs} separate processes "
                   f"measured on {days}, each timing this table's variants as their chapters do; a record's median "
                   "comes from another process still. Where both times of a speed-up have such a range, the "
                   "speed-up is given only to the figures the ranges allow — its last figure within one unit of "
                   "every ratio they permit — and as a range where they do not allow two figures.")
    if sp.stale:
        chs = " and ".join(c[:2] for c in sp.stale)
        out.append(f"Chapter{'s' * (len(sp.stale) > 1)} {chs} show{'s' * (len(sp.stale) == 1)} no range: "
                   f"{'their' if len(sp.stale) > 1 else 'its'} kernels changed after those processes ran.")
    return " ".join(out)


def _floor_note(gpu_slug: str | None, root: Path) -> str:
    """What "% of floor" divides by, with the measured ceilings it uses."""
    peak, bandwidth = ceilings(gpu_slug, root) or (float("nan"), float("nan"))
    tc, wg = (tensor_core_rate(gpu_slug, root, i) for i in TC_CEILINGS)
    tc_text = (f" A row computed in 3xTF32 is held to the tensor cores' rate instead: {tc / 1e12:.1f} TFLOP/s, a "
               "third of the TF32 rate of the tensor-core chapter's `mma.sync` ceiling kernel" if tc else "")
    tc_text += (f" ({wg / 1e12:.1f} TFLOP/s for a kernel that issues `wgmma`, a third of that chapter's `wgmma` "
                "ceiling)." if tc and wg else "." if tc else "")
    return ("*% of floor* is the floor's time over ours (100 % is as fast as the hardware allows). The floor is "
            "the operation's least FLOPs and DRAM bytes at measured rates — whichever takes longer: "
            f"{peak / 1e12:.1f} TFLOP/s from the roofline chapter's FFMA kernel, and the device-to-device copy "
            f"rate measured in the same chapter's run where it timed one, else the roofline chapter's "
            f"{bandwidth / 1e9:,.0f} GB/s.{tc_text} The FFMA rate is measured, not the nominal peak (SMs × FP32 "
            "lanes × 2 FLOP × clock) that a chapter's \"% of the FFMA peak\" divides by, so the two percentages "
            "of the same kernel can differ by a little.")


def built_on() -> str:
    """How this build runs the chapters, in one sentence: live on a GPU, or from records without one."""
    from ..harness.device import gpu

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
    return sorted({r["provenance"]["torch"] for r in on_gpu(gpu_slug, root)})


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
