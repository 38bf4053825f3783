#!/usr/bin/env python3
"""Execute chapters top to bottom, as the book build does, optionally recording GPU results.

    python scripts/run_notebooks.py                       # every chapter
    python scripts/run_notebooks.py 00_method --record    # one chapter; write results/<gpu>/00_method.json
    python scripts/run_notebooks.py --out /tmp/executed   # keep the executed copies (with outputs)
    python scripts/run_notebooks.py --record-compiler     # store compiler reports (needs nvcc, not a GPU)

Recording needs a CUDA GPU: it sets KERNELBOOK_RECORD=1 for the kernel, and each chapter's last
cell writes its record. The stored notebooks are never modified.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, DeadKernelError

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("chapters", nargs="*", help="notebook stems, e.g. 00_method (default: all)")
    ap.add_argument("--record", action="store_true", help="write results/<gpu>/<chapter>.json (GPU only)")
    ap.add_argument("--record-compiler", action="store_true",
                    help="store the compiler reports (results/compiler/), for builds without nvcc; no GPU needed")
    ap.add_argument("--out", type=Path, help="folder for the executed notebooks")
    ap.add_argument("--timeout", type=int, default=1800, help="per-cell timeout in seconds")
    args = ap.parse_args()

    paths = [NOTEBOOKS / f"{c}.ipynb" for c in args.chapters] or sorted(NOTEBOOKS.glob("[0-9]*.ipynb"))
    if args.record:
        import kernelbook

        if kernelbook.gpu() is None:
            ap.error("--record needs a CUDA GPU: without one the chapters show recorded results")
        os.environ["KERNELBOOK_RECORD"] = "1"
    if args.record or args.record_compiler:
        os.environ["KERNELBOOK_RECORD_COMPILER"] = "1"
    failed = []
    for p in paths:
        nb = nbformat.read(p, as_version=4)
        client = NotebookClient(nb, timeout=args.timeout, kernel_name="python3",
                                resources={"metadata": {"path": str(NOTEBOOKS)}})
        t0 = time.perf_counter()
        try:
            client.execute()
            status = "ok"
        except (CellExecutionError, DeadKernelError) as e:
            status = "FAILED"
            failed.append(p.stem)
            print(str(e)[-4000:], file=sys.stderr)
        print(f"{p.stem}: {status} in {time.perf_counter() - t0:.0f} s; slowest cells: {slowest(nb)}", flush=True)
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            nbformat.write(nb, args.out / p.name)
    return 1 if failed else 0


def slowest(nb, n: int = 3) -> str:
    """The n cells that took longest, from the timing nbclient records in each cell's metadata."""
    from datetime import datetime

    def seconds(cell) -> float:
        t = cell.get("metadata", {}).get("execution", {})
        start, end = t.get("iopub.execute_input"), t.get("shell.execute_reply")
        if not (start and end):
            return 0.0
        return (datetime.fromisoformat(end.replace("Z", "+00:00"))
                - datetime.fromisoformat(start.replace("Z", "+00:00"))).total_seconds()

    cells = sorted(((seconds(c), c.get("id", "?")) for c in nb.cells if c.cell_type == "code"), reverse=True)
    return ", ".join(f"{cid} {s:.0f} s" for s, cid in cells[:n]) or "none timed"


if __name__ == "__main__":
    sys.exit(main())
