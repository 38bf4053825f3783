"""Timing GPU work: CUDA events, warm-up, L2 flushed between repetitions, median and quantiles.

``bench`` is a thin wrapper over ``triton.testing.do_bench``, which already does the hard parts:
it runs the function once, estimates its time, warms up for ``warmup`` ms, then times ``rep`` ms
worth of calls, each preceded by a write to a 256 MB buffer that evicts the L2 cache, each timed
with its own pair of CUDA events. We add the NVTX range and the record format.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

QUANTILES = (0.5, 0.2, 0.8)


@contextmanager
def nvtx_range(chapter: str, variant: str) -> Iterator[None]:
    """Mark work as ``<chapter>/<variant>`` for every profiler.

    Nsight tools see two nested push/pop ranges, ``chapter`` around ``variant``, which is exactly
    what ``ncu --nvtx --nvtx-include "<chapter>/<variant>/"`` selects (ncu reads '/' as nesting, so a
    single range with a slash in its name could not be selected). torch.profiler sees one
    ``record_function`` named ``<chapter>/<variant>``.
    """
    import nvtx
    import torch

    with nvtx.annotate(chapter), nvtx.annotate(variant), torch.profiler.record_function(f"{chapter}/{variant}"):
        yield


def bench(fn: Callable[[], object], chapter: str, variant: str, warmup: int = 25, rep: int = 100) -> dict:
    """Median, 20th and 80th percentile of ``fn``'s device time in ms, inside its NVTX range."""
    from triton.testing import do_bench

    with nvtx_range(chapter, variant):
        med, q20, q80 = do_bench(fn, warmup=warmup, rep=rep, quantiles=list(QUANTILES))
    return {"median": med, "q20": q20, "q80": q80}


def gbps(nbytes: float, ms: float) -> float:
    """Achieved bandwidth in GB/s (10⁹ bytes per second) for ``nbytes`` moved in ``ms``."""
    return nbytes / (ms * 1e-3) / 1e9


def tflops(flops: float, ms: float) -> float:
    """Achieved rate in TFLOP/s (10¹² floating-point operations per second; an FMA is 2)."""
    return flops / (ms * 1e-3) / 1e12
