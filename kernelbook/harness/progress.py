"""Progress of a long loop inside a notebook cell, shown in place while it runs.

A learner running a chapter live should never watch a silent cell for half a minute: the loops that time
variants, run Nsight Compute or sweep tile shapes report how far they are, on one line that is updated in
place (an IPython display handle), and leave a one-line summary of what they did and how long it took.
Outside a notebook kernel (scripts, tests) they show nothing.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")


def _in_kernel() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def track(items: Iterable[T], what: str, unit: str, name=str) -> Iterator[T]:
    """Yield ``items`` while one line says '<what>: k/n <unit> (s elapsed), now <name(item)>'; at the end it
    says '<what>: n <unit> in s'. ``what`` names the work ("timing 03_roofline"), ``unit`` the items."""
    items = list(items)
    if not _in_kernel():
        yield from items
        return
    from IPython.display import Pretty, display

    t0 = time.perf_counter()
    handle = display(Pretty(f"{what}: 0/{len(items)} {unit}"), display_id=True)
    for k, item in enumerate(items):
        handle.update(Pretty(f"{what}: {k}/{len(items)} {unit} ({time.perf_counter() - t0:.0f} s), "
                             f"now {name(item)}"))
        yield item
    handle.update(Pretty(f"{what}: {len(items)} {unit} in {time.perf_counter() - t0:.0f} s"))
