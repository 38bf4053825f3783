#!/usr/bin/env python3
"""Small, complete workloads for compute-sanitizer: every kernel on awkward sizes and alignments.

    compute-sanitizer --tool memcheck --error-exitcode 1 python scripts/sanitize.py [kernel ...]

Sizes are small (the sanitizer slows kernels down by orders of magnitude) but cover every code path:
empty input, tails, misaligned views. Each result is also checked, so a silent wrong answer fails too.
"""

from __future__ import annotations

import sys

import torch

import kernelbook as kb
from kernelbook import check


def scale() -> None:
    mod = kb.build.load("scale")
    for n in (0, 1, 3, 4, 5, 255, 257, 1023, 4097, (1 << 16) + 3):
        for x_off, out_off in ((0, 0), (1, 0), (0, 3)):
            x = check.rand([n + x_off], seed=n + x_off, device="cuda")[x_off:]
            out = check.poisoned([n + out_off], device="cuda")[out_off:]
            mod.scale_out(x, 1.5, out)
            check.assert_close(out, 1.5 * x.double(), tol=check.FP32_UNIT_ROUNDOFF, what=f"scale n={n}")


WORKLOADS = {"scale": scale}

if __name__ == "__main__":
    names = sys.argv[1:] or list(WORKLOADS)
    for name in names:
        WORKLOADS[name]()
        torch.cuda.synchronize()
        print(f"{name}: ok")
