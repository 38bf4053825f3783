"""Which kernels each variant launched, and what the hardware counted for them.

``kernels`` runs each variant inside its NVTX range under torch.profiler and returns, per range,
the CUDA kernels launched, how often, and their device time. ``ncu`` runs a script under Nsight
Compute once per range (selected with ``--nvtx --nvtx-include``) and returns the metrics asked for.
"""

from __future__ import annotations

import csv
import io
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from .timing import nvtx_range


def _enclosing_range(evt, ranges: Mapping[str, str]) -> str | None:
    """The variant whose range encloses profiler event ``evt`` (walking up its CPU parents)."""
    e = evt
    while e is not None:
        if e.name in ranges:
            return ranges[e.name]
        e = e.cpu_parent
    return None


def collect(events: Iterable, ranges: Mapping[str, str]) -> list[dict]:
    """Group the kernels of torch.profiler ``events`` by enclosing range.

    ``ranges`` maps a range name ('<chapter>/<variant>') to the variant. Each event that launched
    kernels lists them in ``.kernels`` (name, duration in µs); torch attaches a kernel to the CPU
    op that launched it, so the range is found by walking up ``.cpu_parent``.
    """
    acc: dict[tuple[str, str], list[float]] = {}
    for evt in events:
        for k in getattr(evt, "kernels", ()) or ():
            variant = _enclosing_range(evt, ranges)
            if variant is None:
                continue
            acc.setdefault((variant, k.name), []).append(float(k.duration))
    order = {v: i for i, v in enumerate(ranges.values())}
    rows = [
        {"variant": v, "kernel": name, "launches": len(d), "total_us": sum(d), "mean_us": sum(d) / len(d)}
        for (v, name), d in acc.items()
    ]
    rows.sort(key=lambda r: (order[r["variant"]], -r["total_us"]))
    return rows


def kernels(variants: Mapping[str, Callable[[], object]], chapter: str, repeat: int = 1):
    """Kernels launched by each variant (one warm-up call first), as a table: variant, kernel, launches, µs."""
    import pandas as pd
    import torch
    from torch.profiler import ProfilerActivity, profile

    for fn in variants.values():  # warm up: lazy init, cuDNN autotuning, compilation
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for v, fn in variants.items():
            with nvtx_range(chapter, v):
                for _ in range(repeat):
                    fn()
            torch.cuda.synchronize()
    ranges = {f"{chapter}/{v}": v for v in variants}
    return pd.DataFrame(collect(prof.events(), ranges),
                        columns=["variant", "kernel", "launches", "total_us", "mean_us"])


def ncu_command(chapter: str, variant: str, metrics: Iterable[str], target: list[str]) -> list[str]:
    """The Nsight Compute command line that profiles only the kernels inside ``<chapter>/<variant>``."""
    return ["ncu", "--clock-control", "none", "--nvtx", "--nvtx-include", f"{chapter}/{variant}/",
            "--metrics", ",".join(metrics), "--csv", "--print-units", "base", *target]


def parse_ncu_csv(text: str) -> list[dict]:
    """Rows (kernel, metric, unit, value) from ``ncu --csv`` output (other lines are skipped)."""
    lines = [ln for ln in text.splitlines() if ln.startswith('"')]
    rows = []
    for r in csv.DictReader(io.StringIO("\n".join(lines))):
        raw = r.get("Metric Value", "").replace(",", "")
        try:
            value = float(raw)
        except ValueError:
            continue
        rows.append({"kernel": r["Kernel Name"], "metric": r["Metric Name"], "unit": r.get("Metric Unit", ""),
                     "value": value})
    return rows


def ncu(script: str, chapter: str, variants: Iterable[str], metrics: Iterable[str], timeout: int = 600):
    """Run ``script`` (Python source that calls each variant inside ``nvtx_range``) under Nsight Compute
    once per variant, and return the metrics of the kernels in that variant's range, as a table."""
    import pandas as pd

    if shutil.which("ncu") is None:
        raise RuntimeError("Nsight Compute (ncu) is not on PATH")
    metrics = list(metrics)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "ncu_target.py"
        path.write_text(script)
        for v in variants:
            cmd = ncu_command(chapter, v, metrics, [sys.executable, str(path)])
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
            if res.returncode != 0:
                raise RuntimeError(f"ncu failed for {chapter}/{v} (exit {res.returncode}):\n"
                                   f"{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
            found = parse_ncu_csv(res.stdout)
            if not found:
                raise RuntimeError(f"ncu profiled no kernel inside {chapter}/{v}:\n{res.stdout[-3000:]}")
            rows += [{"variant": v, **r} for r in found]
    return pd.DataFrame(rows, columns=["variant", "kernel", "metric", "unit", "value"])
