"""kernelbook — the toolkit behind the book: build, check, time, profile and record fused CUDA kernels.

Notebooks import it as ``import kernelbook as kb`` and use ``kb.build``, ``kb.check``, ``kb.timing``,
``kb.profile``, ``kb.records``, ``kb.plots``, ``kb.problems``, ``kb.measure`` (times a chapter's variants
and declares them in its record), ``kb.precision`` (the one TF32 switch) and ``kb.show`` (tables and
kernel excerpts as the reader sees them), and the chapters' own models:
``kb.folding``, ``kb.roofline``, ``kb.coalescing``, ``kb.variance`` (``kb.summary`` builds the intro's
table). ``kb.gpu()`` says what is live and ``kb.glue`` hands a computed number to the prose.
"""

from . import (
    build,
    check,
    coalescing,
    device,
    folding,
    gn_mean,
    measure,
    paths,
    plots,
    precision,
    problems,
    profile,
    records,
    roofline,
    show,
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


def glue_all(values: dict) -> None:
    """``glue`` each ``name: value`` of a dict literal (the notebook test reads the names from it)."""
    for name, value in values.items():
        glue(name, value)


def glue_md(name: str, text: str) -> None:
    """Store Markdown for the prose, rendered as Markdown there (``{glue:md}`name```): for glued
    sentences that carry code, emphasis or links, which ``{glue:text}`` would show as raw syntax."""
    from IPython.display import Markdown
    from myst_nb import glue as _glue

    _glue(name, Markdown(text), display=False)


__all__ = ["build", "check", "coalescing", "describe", "device", "folding", "glue", "glue_all", "glue_md", "gn_mean",
           "gpu", "measure", "paths", "plots", "precision", "problems", "profile", "records", "roofline", "show",
           "summary", "timing", "variance"]
