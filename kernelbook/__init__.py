"""kernelbook — the toolkit behind the book: build, check, time, profile and record fused CUDA kernels.

It has three rooms:

- ``kernelbook/harness/`` — the bench: ``build``, ``check``, ``timing``, ``measure`` (times a chapter's
  variants and declares them in its record), ``precision`` (the one TF32 switch), ``profile``, ``records``,
  ``device``, ``paths``, ``plots`` and ``show`` (tables and kernel excerpts as the reader sees them);
- ``kernelbook/models/`` — the problems and the chapters' own models: ``problems``, ``roofline``,
  ``folding``, ``coalescing``, ``variance``, ``gn_mean``, ``tensorcore``, ``training``, ``autograd_ops``;
- ``kernelbook/site/`` — what the book's pages assemble: ``summary`` (builds the intro's table).

Notebooks import it as ``import kernelbook as kb`` and use every module flat, whatever its room:
``kb.build``, ``kb.roofline``, ``kb.summary``, ... ``kb.gpu()`` says what is live and ``kb.glue``
hands a computed number to the prose.
"""

from .harness import (
    build,
    check,
    device,
    measure,
    paths,
    plots,
    precision,
    profile,
    records,
    show,
    timing,
)
from .harness.device import describe, gpu
from .models import autograd_ops, coalescing, folding, gn_mean, problems, roofline, tensorcore, training, variance
from .site import summary


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


__all__ = ["autograd_ops", "build", "check", "coalescing", "describe", "device", "folding", "glue", "glue_all",
           "glue_md", "gn_mean", "gpu", "measure", "paths", "plots", "precision", "problems", "profile", "records",
           "roofline", "show", "summary", "tensorcore", "timing", "training", "variance"]
