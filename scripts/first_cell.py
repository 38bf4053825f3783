#!/usr/bin/env python3
"""The one canonical first code cell of every chapter, and the script that puts it there.

The cell makes a notebook self-sufficient on Colab or a fresh machine: where the book's toolkit
(``kernelbook``) is not importable it finds the repository above the working directory or clones it,
pip-installs the few packages that are missing, and makes the toolkit importable. Where the toolkit
is installed (the build machine, a workstation set up with requirements.txt) it does nothing.

    python scripts/first_cell.py            # insert or update the cell in every notebooks/[0-9]*.ipynb
    python scripts/first_cell.py --check    # exit 1 if any chapter's first code cell differs

The repository's address comes from ``repository.url`` in _config.yml, the one place it is written.
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
MARKER = "# Self-sufficiency:"  # the first line of the cell starts with this; it is how the script finds it
TAGS = ["hide-input"]

TEMPLATE = '''\
# Self-sufficiency: on Colab or a fresh machine, fetch the book and what it needs;
# elsewhere a no-op. (Every chapter opens with this same cell.)
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

REPO_URL = "{repo_url}"
if importlib.util.find_spec("kernelbook") is None:
    up = [Path.cwd(), *Path.cwd().parents]
    root = next((p for p in up if (p / "kernelbook" / "__init__.py").is_file()), None)
    if root is None:  # opened on its own (Colab, a download): clone the book beside it
        root = Path.cwd() / Path(REPO_URL).name
        if not root.is_dir():
            git = ["git", "clone", "--depth", "1", REPO_URL, str(root)]
            subprocess.run(git, check=True)
    need = {{"ninja": "ninja", "nvtx": "nvtx", "myst_nb": "myst-nb", "sympy": "sympy"}}
    missing = [p for m, p in need.items() if importlib.util.find_spec(m) is None]
    if missing:  # Colab already has PyTorch, pandas and matplotlib
        pip = [sys.executable, "-m", "pip", "install", "-q", *missing]
        subprocess.run(pip, check=True)
    sys.path.insert(0, str(root))
    os.chdir(root / "notebooks")
    importlib.invalidate_caches()
    import torch

    if torch.cuda.is_available() and torch.cuda.get_device_capability() < (8, 0):
        print("A GPU older than sm_80 (a T4 is sm_75) has no TF32, so TF32 baselines "
              "run in float32, and less shared memory, so kernels take smaller plans.")'''


def repo_url(root: Path = ROOT) -> str:
    """The repository's address, from _config.yml (``repository.url``)."""
    return yaml.safe_load((root / "_config.yml").read_text())["repository"]["url"]


def text(root: Path = ROOT) -> str:
    """The canonical source of the first code cell."""
    return TEMPLATE.format(repo_url=repo_url(root))


def chapters(root: Path = ROOT) -> list[Path]:
    """Every chapter notebook: notebooks/[0-9]*.ipynb."""
    return sorted((root / "notebooks").glob("[0-9]*.ipynb"))


def first_code_cell(nb: dict) -> dict | None:
    return next((c for c in nb["cells"] if c["cell_type"] == "code"), None)


def _lines(src: str) -> list[str]:
    """A cell's source as notebooks store it: lines that keep their newline, the last one without."""
    return src.splitlines(keepends=True)


def apply(path: Path, source: str) -> bool:
    """Insert the cell before the first code cell of ``path``, or update it there; True if the file changed."""
    raw = path.read_text()
    nb = json.loads(raw)
    cells = nb["cells"]
    ours = [i for i, c in enumerate(cells) if c["cell_type"] == "code" and "".join(c["source"]).startswith(MARKER)]
    for i in reversed(ours):  # one copy, at the right place
        del cells[i]
    first = next((i for i, c in enumerate(cells) if c["cell_type"] == "code"), len(cells))
    cells.insert(first, {"cell_type": "code", "execution_count": None, "id": uuid.uuid4().hex[:8],
                         "metadata": {"tags": list(TAGS)}, "outputs": [], "source": _lines(source)})
    if ours and first == ours[0] and len(ours) == 1:  # keep the old id when nothing moved
        old = json.loads(raw)["cells"][ours[0]]
        cells[first]["id"] = old.get("id", cells[first]["id"])
    # Colab opens the chapter on a GPU runtime
    nb.setdefault("metadata", {})["accelerator"] = "GPU"
    nb["metadata"].setdefault("colab", {}).update({"gpuType": "T4", "provenance": []})
    new = json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n"
    if new == raw:
        return False
    path.write_text(new)
    return True


def stale(root: Path = ROOT) -> list[str]:
    """Chapters whose first code cell is not the canonical cell (source and tags)."""
    want = text(root)
    out = []
    for p in chapters(root):
        cell = first_code_cell(json.loads(p.read_text()))
        if cell is None or "".join(cell["source"]) != want or cell["metadata"].get("tags") != TAGS:
            out.append(p.name)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only report chapters whose first cell differs")
    args = ap.parse_args(argv)
    if args.check:
        bad = stale()
        for name in bad:
            print(f"{name}: first code cell is not the canonical one (run scripts/first_cell.py)")
        return 1 if bad else 0
    src = text()
    for p in chapters():
        print(f"{p.name}: {'updated' if apply(p, src) else 'unchanged'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
