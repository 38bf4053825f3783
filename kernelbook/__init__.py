"""kernelbook — the toolkit behind the book: build, check, time, profile and record fused CUDA kernels.

Notebooks import it as ``import kernelbook as kb`` and use ``kb.build``, ``kb.check``, ``kb.timing``,
``kb.profile``, ``kb.records``, ``kb.plots`` and ``kb.problems``, and the chapters' own models:
``kb.folding``, ``kb.roofline``, ``kb.coalescing``, ``kb.variance`` (``kb.summary`` builds the intro's
table). ``kb.gpu()`` says what is live and ``kb.glue`` hands a computed number to the prose.
"""

from . import (
    build,
    check,
    coalescing,
    device,
    folding,
    paths,
    plots,
    problems,
    profile,
    records,
    roofline,
    summary,
    timing,
    variance,
)
from .device import describe, gpu


def glue(name: str, value) -> None:
    """Store ``value`` for the prose (``{glue:text}`name:.2f```) without displaying it.

    NumPy and torch scalars become plain Python numbers, so format specs apply to them.
    """
    from myst_nb import glue as _glue

    if hasattr(value, "item"):
        value = value.item()
    _glue(name, value, display=False)


__all__ = ["build", "check", "coalescing", "describe", "device", "folding", "glue", "gpu", "paths", "plots", "problems",
           "profile", "records", "roofline", "summary", "timing", "variance"]
