"""Which kernels each variant launched, and what the hardware counted for them.

``kernels`` runs each variant inside its NVTX range under torch.profiler and returns, per variant,
the CUDA kernels launched, how often, and their device time. ``ncu`` runs a script under Nsight
Compute once per range (selected with ``--nvtx --nvtx-include``) and returns the metrics asked for.
"""

from __future__ import annotations

import csv
import io
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from . import progress
from .timing import nvtx_range


@contextmanager
def _quiet_native_stderr() -> Iterator[None]:
    """Silence file descriptor 2 for a moment: the profiler's native library (Kineto) writes status
    lines there, which Jupyter would show as a cell's stderr output."""
    sys.stderr.flush()
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def cpu_ops(fn: Callable[[], object]):
    """How often each operator and ``record_function`` range ran during ``fn()`` (CPU profiler)."""
    import pandas as pd
    from torch.profiler import ProfilerActivity, profile

    with _quiet_native_stderr(), profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return pd.Series([e.name for e in prof.events()], dtype=object).value_counts().rename("calls")


def summarise(variant: str, device_events: Iterable[tuple[str, float]]) -> list[dict]:
    """One row per distinct kernel (or memcpy/memset) name: launches, total and mean device time in µs."""
    acc: dict[str, list[float]] = {}
    for name, us in device_events:
        acc.setdefault(name, []).append(float(us))
    rows = [{"variant": variant, "kernel": k, "launches": len(d), "total_us": sum(d), "mean_us": sum(d) / len(d)}
            for k, d in acc.items()]
    return sorted(rows, key=lambda r: -r["total_us"])


def kernels(variants: Mapping[str, Callable[[], object]], chapter: str, repeat: int = 1):
    """Kernels each variant launches, as a table: variant, kernel, launches, total and mean µs.

    Each variant runs (after one warm-up call) in a profiling session of its own, inside its NVTX
    range, with the device synchronised before and after: every device activity the session records
    is that variant's, with no attribution heuristics.
    """
    import pandas as pd
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    rows: list[dict] = []
    for v, fn in variants.items():
        fn()  # warm up: lazy initialisation, cuDNN autotuning, compilation
        torch.cuda.synchronize()
        with _quiet_native_stderr(), profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                                             acc_events=True) as prof:
            with nvtx_range(chapter, v):
                for _ in range(repeat):
                    fn()
            torch.cuda.synchronize()
        range_name = f"{chapter}/{v}"
        events = [(e.name(), e.duration_ns() / 1e3) for e in prof.profiler.kineto_results.events()
                  if e.device_type() == DeviceType.CUDA and not e.is_user_annotation() and e.name() != range_name]
        rows += summarise(v, events)
    return pd.DataFrame(rows, columns=["variant", "kernel", "launches", "total_us", "mean_us"])


def ncu_command(chapter: str, variant: str, metrics: Iterable[str], target: list[str]) -> list[str]:
    """The Nsight Compute command line that profiles only the kernels inside ``<chapter>/<variant>``
    (every kernel inside ``<chapter>`` when ``variant`` is empty)."""
    rng = f"{chapter}/{variant}/" if variant else f"{chapter}/"
    return ["ncu", "--clock-control", "none", "--nvtx", "--nvtx-include", rng,
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
                     "value": value, "id": int(r.get("ID") or -1)})
    return rows


def ncu(script: str, chapter: str, variants: Iterable[str], metrics: Iterable[str], timeout: int = 600,
        one_process: bool = False):
    """Run ``script`` (Python source that calls each variant inside ``nvtx_range``) under Nsight Compute
    and return the metrics of the kernels in each variant's range, as a table.

    By default one ncu process per variant, selected by its range (a variant may launch any number of
    kernels). ``one_process=True`` profiles every kernel inside ``<chapter>/`` in a single process — one
    start-up of Python, CUDA and the extension instead of one per variant — for a script that launches
    exactly one kernel per variant, in the order of ``variants``: the n-th kernel is the n-th variant's.
    """
    import pandas as pd

    if shutil.which("ncu") is None:
        raise RuntimeError("Nsight Compute (ncu) is not on PATH")
    metrics, variants = list(metrics), list(variants)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "ncu_target.py"
        path.write_text(script)
        runs = [(None, ncu_command(chapter, "", metrics, [sys.executable, str(path)]))] if one_process else [
            (v, ncu_command(chapter, v, metrics, [sys.executable, str(path)])) for v in variants]
        for v, cmd in progress.track(runs, f"Nsight Compute, {chapter}", "runs",
                                     name=lambda r: r[0] or "every range"):
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
            what = f"{chapter}/{v}" if v else f"{chapter}/"
            if res.returncode != 0:
                raise RuntimeError(f"ncu failed for {what} (exit {res.returncode}):\n"
                                   f"{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
            found = parse_ncu_csv(res.stdout)
            if not found:
                raise RuntimeError(f"ncu profiled no kernel inside {what}:\n{res.stdout[-3000:]}")
            if v is None:  # one kernel per variant, in launch order
                ids = sorted({r["id"] for r in found})
                if len(ids) != len(variants):
                    raise RuntimeError(f"ncu profiled {len(ids)} kernels inside {what}, expected one for each of "
                                       f"the {len(variants)} variants")
                owner = dict(zip(ids, variants, strict=True))
                rows += [{"variant": owner[r["id"]], **r} for r in found]
            else:
                rows += [{"variant": v, **r} for r in found]
    cols = ["variant", "kernel", "metric", "unit", "value"]
    return pd.DataFrame(rows)[cols] if rows else pd.DataFrame(columns=cols)


def kernel_us(table, variant: str, pattern: str) -> float:
    """Total µs of the kernels of ``variant`` whose names match the regex ``pattern`` (case-insensitive),
    in a table from ``kernels`` (or its records): how a chapter splits a variant's time by kernel."""
    rows = table[(table["variant"] == variant) & table["kernel"].str.contains(pattern, case=False)]
    return float(rows["total_us"].sum())
