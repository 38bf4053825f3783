"""Where things live: the repository's folders and the extension build cache (outside the repo)."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # kernelbook/harness/paths.py -> the repository
KERNELS = ROOT / "kernels"
RESULTS = ROOT / "results"
NOTEBOOKS = ROOT / "notebooks"


def cache_dir() -> Path:
    """Build folder for compiled extensions: $KERNELBOOK_CACHE, else ~/.cache/kernelbook."""
    env = os.environ.get("KERNELBOOK_CACHE")
    base = Path(env) if env else Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "kernelbook"
    base.mkdir(parents=True, exist_ok=True)
    return base
