"""One code path that times a chapter's variants and declares them in its record.

A chapter (or a development script) hands ``run`` a dict of ``Variant``s: the function to time and
what it is — who provides it (ours, eager, compile, cuDNN, cuBLAS, torch), the mode, the arithmetic
it computes in, its FLOP and byte counts, and its role in the chapter. On a GPU each is timed inside
its NVTX range ``<chapter>/<variant>`` (``kb.timing.bench``) under its TF32 setting, and the timings
and the declarations go into the record; without one the recorded timings are read back. Either
way the same table comes out, with achieved GB/s and TFLOP/s where counts are declared.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from . import precision, progress, timing

PROVIDERS = ("ours", "eager", "compile", "cudnn", "cublas", "cutlass", "torch")


@dataclass
class Variant:
    """A measured variant: ``fn`` plus its declaration (everything but ``fn`` goes into the record)."""

    fn: Callable[[], object] | None
    provider: str
    mode: str = ""
    math: str = "fp32"          # fp32 | tf32 | 3xtf32 | fp64: corrected from the profile by ``math_from_profile``
    counts: Mapping[str, object] = field(default_factory=dict)  # {"flop": …, "bytes": …, "phases": […]?}
    role: str = "baseline"      # headline | baseline | reference-rate | control | …
    tf32: bool | None = None    # run with TF32 allowed for convolutions or not (None: as the settings are)
    tf32_matmul: bool | None = None  # the same for float32 matrix products
    note: str = ""
    row: str = ""               # the intro's results-table row it belongs to: "<problem> | <operation>"
    instruction: str = ""       # the tensor-core instruction it issues where not mma.sync: "wgmma" (its ceiling)

    def declaration(self) -> dict:
        if self.provider not in PROVIDERS:
            raise ValueError(f"provider {self.provider!r} is not one of {', '.join(PROVIDERS)}")
        d = {"provider": self.provider, "mode": self.mode, "math": self.math, "role": self.role,
             "counts": {k: [{q: float(n) for q, n in ph.items()} for ph in v] if k == "phases" else float(v)
                        for k, v in self.counts.items()}}  # phases: work that cannot overlap
        if self.tf32 is not None:
            d["tf32_allowed"] = self.tf32
        if self.tf32_matmul is not None:
            d["tf32_matmul_allowed"] = self.tf32_matmul
        if self.note:
            d["note"] = self.note
        if self.row:
            d["row"] = self.row
        if self.instruction:
            d["instruction"] = self.instruction
        return d


def declare(rec: dict, variants: Mapping[str, Variant]) -> None:
    """Put the variants' declarations into the record (a live record only: a stored one keeps its own)."""
    if rec.get("live"):
        rec.setdefault("variants", {}).update({n: v.declaration() for n, v in variants.items()})


def run(rec: dict, variants: Mapping[str, Variant], warmup: int = 25, rep: int = 100):
    """Time every variant live (or read the recorded times) and return ``results(rec, variants)``."""
    declare(rec, variants)
    if rec.get("live"):
        todo = variants.items() if len(variants) < 3 else progress.track(
            variants.items(), f"timing {rec['chapter']}", "variants", name=lambda kv: kv[0])
        for name, v in todo:
            if v.fn is None:
                raise ValueError(f"variant {name!r} has no function to time")
            now = precision.state()
            conv = now["conv"] if v.tf32 is None else v.tf32
            matmul = now["matmul"] if v.tf32_matmul is None else v.tf32_matmul
            with precision.tf32(conv, matmul):
                rec["timings_ms"][name] = timing.bench(v.fn, rec["chapter"], name, warmup, rep)
    return results(rec, list(variants))


def results(rec: dict, names: Iterable[str] | None = None):
    """A table of the recorded variants: provider, math, median/q20/q80 ms, GB/s and TFLOP/s."""
    import pandas as pd

    decl = rec.get("variants", {})
    names = list(names) if names is not None else list(rec["timings_ms"])
    missing = [n for n in names if n not in rec["timings_ms"]]
    if missing:
        raise KeyError(f"no timings for {missing} in the {rec['chapter']} record: re-record the chapter")
    rows = []
    for n in names:
        t, d = rec["timings_ms"][n], decl.get(n, {})
        row = {"variant": n, "provider": d.get("provider", ""), "math": d.get("math", ""),
               "median ms": t["median"], "q20 ms": t["q20"], "q80 ms": t["q80"]}
        c = d.get("counts", {})
        if "bytes" in c:
            row["GB/s"] = timing.gbps(c["bytes"], t["median"])
        if "flop" in c:
            row["TFLOP/s"] = timing.tflops(c["flop"], t["median"])
        rows.append(row)
    return pd.DataFrame(rows).set_index("variant")


_TF32_KERNEL = re.compile(r"tf32|s1688|s16816|hmma|gmma|tensorop", re.I)


def math_from_kernels(kernel_names: Iterable[str]) -> str:
    """'tf32' if any kernel name says it ran on float32 inputs on tensor cores (cuDNN's and cuBLAS's
    say so: …tf32…, s1688/s16816, hmma, gmma, tensorop), else 'fp32' (FFMA kernels: …_ffma_…,
    …sgemm…). Triton kernels do not say; their arithmetic shows in their error against float64."""
    return "tf32" if any(_TF32_KERNEL.search(k) for k in kernel_names) else "fp32"


def math_from_profile(rec: dict, profile_rows: Iterable[Mapping]) -> dict[str, str]:
    """Correct each declared variant's ``math`` from the kernels its profile shows; returns them."""
    by_variant: dict[str, list[str]] = {}
    for r in profile_rows:
        by_variant.setdefault(r["variant"], []).append(r["kernel"])
    found = {v: math_from_kernels(ks) for v, ks in by_variant.items()}
    if rec.get("live"):
        for v, m in found.items():
            d = rec.get("variants", {}).get(v)
            if d is not None and d["math"] in ("fp32", "tf32"):  # fp64, 3xtf32: declared by their kernels
                d["math"] = m
    return found


def clock_ghz(clocks) -> float:
    """The SM clock a kernel ran at by its own counters: ``clocks`` holds, per block, the ``clock64`` cycles and
    the ``%globaltimer`` nanoseconds around its loop (a tensor or rows of two); the median of cycles / ns, in GHz."""
    import statistics

    rows = clocks.double().cpu().tolist() if hasattr(clocks, "double") else clocks
    return float(statistics.median(cycles / ns for cycles, ns in rows if ns > 0))


def sm_clock_mhz(iters: int = 1 << 15) -> float | None:
    """The SM clock the GPU runs at now, in MHz, measured on the GPU itself (None without one).

    One short FFMA launch over every resident block (kernels/ceilings.cu, about 2 ms on an H200): each
    block reads its SM's ``clock64`` cycles and the ``%globaltimer`` nanoseconds around its loop, and the
    median of cycles / ns over the blocks is the clock. Called right after a timed run, the GPU is still
    at the clock those kernels ran at, so a peak computed from it (SMs × lanes × 2 FLOP × clock) is the
    peak of that run — not nvidia-smi's reading a moment later.
    """
    import torch

    if not torch.cuda.is_available():
        return None
    from .build import load

    return 1e3 * clock_ghz(load("ceilings").ffma(iters)[1])
