"""Recorded GPU results: one JSON per chapter and GPU, ``results/<gpu-slug>/<chapter>.json``.

On a GPU a chapter measures live and, with ``KERNELBOOK_RECORD=1``, writes its record. Without a GPU
it loads the record and shows a note that names where and when it was measured. Every record
stores the SHA-256 of the kernel sources it measured; ``stale`` lists the ones changed since.

Beside the chapter records, ``results/<gpu-slug>/spread.json`` holds the spread between processes: the
intro table's variants (and the capstones' peers) timed again, each run in a fresh Python process, so that
a median's process-to-process variation is measured rather than guessed. One run is appended per process::

    {"runs": [{"pid": 4242,
               "provenance": {<as a chapter record's: gpu, …, torch, date, commit, and the SHA-256 of
                               every kernel source the timed chapters' records name>},
               "timings_ms": {"<chapter>/<variant>": {"median": 0.678, "q20": 0.676, "q80": 0.680}}}]}

``spread_runs`` reads it, ``append_run`` adds a run, ``fresh_for`` says whether a run measured today's
kernels of a chapter, and ``ratio_text`` quotes a ratio of two timed ranges to the figures they allow.
"""

from __future__ import annotations

import datetime as dt
import html
import json
import math
import os
import subprocess
from collections.abc import Sequence
from pathlib import Path

from .build import file_sha256, source_hashes
from .device import gpu
from .paths import KERNELS, RESULTS, ROOT

DEFAULT_GPU = "h200"  # whose records a machine without a GPU shows (KERNELBOOK_RESULTS_GPU overrides)


def _commit() -> str:
    env = os.environ.get("KERNELBOOK_COMMIT")
    if env:
        return env
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "kernels", "kernelbook", "notebooks"],
                               cwd=ROOT, capture_output=True, text=True).stdout.strip()
        return sha + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def path_for(chapter: str, gpu_slug: str, root: Path = RESULTS) -> Path:
    return root / gpu_slug / f"{chapter}.json"


def new(chapter: str, kernels: list[str], solutions: Sequence[str] = ()) -> dict:
    """An empty record for ``chapter`` measured live now, with its provenance filled in: the SHA-256 of
    every source of ``kernels`` and of each submission ``solutions/<name>.py`` it measures."""
    g = gpu()
    if g is None:
        raise RuntimeError("records.new needs a CUDA GPU: without one, load a recorded result")
    hashes: dict[str, str] = {}
    for k in kernels:
        hashes.update(source_hashes(k))
    hashes.update({f"solutions/{s}.py": file_sha256(ROOT / "solutions" / f"{s}.py") for s in solutions})
    prov = {k: g[k] for k in ("gpu", "capability", "sm_count", "l2_mib", "driver", "cuda", "torch")}
    prov.update(date=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), commit=_commit(),
                kernels=hashes)
    return {"chapter": chapter, "provenance": prov, "checks": {}, "timings_ms": {}, "live": True}


def results_gpu(gpu_slug: str | None = None) -> str:
    """Whose records a build shows: ``gpu_slug``, else $KERNELBOOK_RESULTS_GPU, else the default (h200)."""
    return gpu_slug or os.environ.get("KERNELBOOK_RESULTS_GPU", DEFAULT_GPU)


def read(path: Path) -> dict:
    """One record file (the toolkit's and the book pages' one way to read a record)."""
    return json.loads(Path(path).read_text())


def on_gpu(gpu_slug: str | None = None, root: Path = RESULTS) -> list[dict]:
    """Every chapter record made on ``gpu_slug`` (see ``results_gpu``), in chapter order."""
    slug = results_gpu(gpu_slug)
    return [read(p) for p in all_records(root) if p.parent.name == slug]


def load(chapter: str, gpu_slug: str | None = None, root: Path = RESULTS) -> dict:
    """The recorded results of ``chapter`` on ``gpu_slug`` (default: $KERNELBOOK_RESULTS_GPU or h200)."""
    slug = results_gpu(gpu_slug)
    p = path_for(chapter, slug, root)
    if not p.is_file():
        have = sorted(q.parent.name for q in root.glob(f"*/{chapter}.json"))
        raise FileNotFoundError(f"no recorded results for {chapter!r} on {slug!r} ({p} is missing); "
                                f"recorded on: {have or 'no GPU yet'}. Run the chapter on a GPU with "
                                f"KERNELBOOK_RECORD=1 to record it.")
    rec = read(p)
    rec["live"] = False
    return rec


def start(chapter: str, kernels: list[str], solutions: Sequence[str] = ()) -> dict:
    """A chapter's record: new and live on a GPU, else the stored one (with its provenance shown)."""
    from IPython.display import HTML, display

    if gpu() is not None:
        return new(chapter, kernels, solutions)
    rec = load(chapter)
    display(HTML(note_html(rec)))
    return rec


def note_html(rec: dict) -> str:
    """The visible note under which recorded (not live) GPU results are shown."""
    p = rec["provenance"]
    esc = {k: html.escape(str(v)) for k, v in p.items()}
    commit = esc["commit"][:12] + (" (uncommitted changes)" if esc["commit"].endswith("+dirty") else "")
    stale_files = stale(rec)
    warn = (f"<p><strong>Warning:</strong> these kernel sources changed after recording: "
            f"{html.escape(', '.join(stale_files))}.</p>" if stale_files else "")
    return (
        '<div class="admonition note"><p class="admonition-title">Recorded GPU results</p>'
        f"<p>No GPU in this build, so the GPU measurements in this chapter were recorded on "
        f"<strong>{esc['gpu']}</strong> (compute capability {esc['capability']}), driver {esc['driver']}, "
        f"CUDA {esc['cuda']}, torch {esc['torch']}, on {esc['date']}, at commit <code>{commit}</code>. "
        f"Everything else on this page ran live when the page was built.</p>{warn}</div>"
    )


def save(rec: dict, root: Path = RESULTS) -> Path | None:
    """Write a live record when ``KERNELBOOK_RECORD=1``; otherwise do nothing and return None."""
    if not rec.get("live") or os.environ.get("KERNELBOOK_RECORD") != "1":
        return None
    from .device import slug

    p = path_for(rec["chapter"], slug(rec["provenance"]["gpu"]), root)
    p.parent.mkdir(parents=True, exist_ok=True)
    body = {k: v for k, v in rec.items() if k != "live"}
    p.write_text(json.dumps(body, indent=1, default=_plain) + "\n")
    return p


def _plain(o):
    """NumPy/torch scalars (from tables) as plain JSON numbers."""
    if hasattr(o, "item"):
        return o.item()
    raise TypeError(f"cannot store {type(o).__name__} in a record")


def stale(rec: dict, kernels_root: Path = KERNELS) -> list[str]:
    """Kernel files and submissions whose current SHA-256 differs from the one recorded (or that no
    longer exist)."""
    out = []
    for rel, sha in rec["provenance"].get("kernels", {}).items():
        p = ROOT / rel if rel.startswith("solutions/") else kernels_root / Path(rel).name
        if not p.is_file() or file_sha256(p) != sha:
            out.append(rel)
    return out


def all_records(root: Path = RESULTS) -> list[Path]:
    """Every chapter record of every GPU (not results/compiler/'s compiler reports, nor the GPU evidence)."""
    return sorted(p for p in root.glob("*/*.json") if p.parent.name != "compiler" and p.stem not in (EVIDENCE, SPREAD))


EVIDENCE = "gpu_evidence"  # results/<gpu>/gpu_evidence.json: what the GPU tests and compute-sanitizer passed on
SPREAD = "spread"  # results/<gpu>/spread.json: the same variants timed in separate processes (module docstring)


def made_on(rec: dict, gpu_slug: str) -> bool:
    """Whether ``rec`` (a chapter record or GPU evidence) was made on the GPU ``gpu_slug`` names ('h200')."""
    from .device import slug

    return slug(rec["provenance"]["gpu"]) == gpu_slug


def spread_path(gpu_slug: str, root: Path = RESULTS) -> Path:
    """Where the spread between processes of ``gpu_slug`` is kept (``results/<gpu-slug>/spread.json``)."""
    return root / gpu_slug / f"{SPREAD}.json"


def spread_runs(path: Path) -> list[dict]:
    """The runs of the spread file at ``path``, oldest first; none where there is no file."""
    return read(path)["runs"] if Path(path).is_file() else []


def append_run(run: dict, path: Path) -> int:
    """Add one process's run to the spread file at ``path`` (made if missing); returns how many runs it holds."""
    runs = [*spread_runs(path), run]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"runs": runs}, indent=1, default=_plain) + "\n")
    tmp.replace(path)  # a run stopped while writing leaves the file as it was
    return len(runs)


def fresh_for(run: dict, rec: dict, kernels_root: Path = KERNELS) -> bool:
    """Whether spread ``run`` measured today's source of every kernel file the chapter record ``rec`` names."""
    hashes = run["provenance"].get("kernels", {})
    files = {f: hashes.get(f, "not hashed") for f in rec["provenance"].get("kernels", {})}
    return not stale({"provenance": {"kernels": files}}, kernels_root)


def ratio_text(num: Sequence[float], den: Sequence[float]) -> str:
    """``num``/``den`` as text, each a (least, greatest) time, quoted to the figures their spread allows.

    The ratio lies between num[0]/den[1] and num[1]/den[0]. It is quoted as the middle of that interval to
    the most significant figures (at most 3) whose last unit exceeds the interval's width, so the quoted
    value is within one unit of its last figure of every ratio the times allow: 2.76–2.83 gives "2.8",
    2.841–2.846 gives "2.84". Where that leaves fewer than 2 figures, the interval itself is given, its ends
    to 2 figures: 2.76–2.93 gives "2.8–2.9".
    """
    if not (0 < num[0] <= num[1] and 0 < den[0] <= den[1]):
        raise ValueError(f"times must be positive (least, greatest) pairs: {num}, {den}")
    lo, hi = num[0] / den[1], num[1] / den[0]
    mid = (lo + hi) / 2
    figures = next((n for n in (3, 2) if hi - lo < 10 ** (math.floor(math.log10(mid)) - n + 1)), 1)
    if figures >= 2:
        return _figures(mid, figures)
    ends = _figures(lo, 2), _figures(hi, 2)
    return ends[0] if ends[0] == ends[1] else "–".join(ends)


def _figures(x: float, n: int) -> str:
    """``x`` (> 0) to ``n`` significant figures, trailing zeros kept: 0.75 to 3 is "0.750", 9.96 to 2 is "10"."""
    decimals = n - 1 - math.floor(math.log10(x))
    if math.floor(math.log10(round(x, decimals))) > math.floor(math.log10(x)):  # rounded up into the next decade
        decimals -= 1
    return f"{round(x, decimals):.{max(decimals, 0)}f}"
