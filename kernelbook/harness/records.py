"""Recorded GPU results: one JSON per chapter and GPU, ``results/<gpu-slug>/<chapter>.json``.

On a GPU a chapter measures live and, with ``KERNELBOOK_RECORD=1``, writes its record. Without a GPU
it loads the record and shows a note that names where and when it was measured. Every record
stores the SHA-256 of the kernel sources it measured; ``stale`` lists the ones changed since.
"""

from __future__ import annotations

import datetime as dt
import html
import json
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
    return sorted(p for p in root.glob("*/*.json") if p.parent.name != "compiler" and p.stem != EVIDENCE)


EVIDENCE = "gpu_evidence"  # results/<gpu>/gpu_evidence.json: what the GPU tests and compute-sanitizer passed on


def made_on(rec: dict, gpu_slug: str) -> bool:
    """Whether ``rec`` (a chapter record or GPU evidence) was made on the GPU ``gpu_slug`` names ('h200')."""
    from .device import slug

    return slug(rec["provenance"]["gpu"]) == gpu_slug
