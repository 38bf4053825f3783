#!/usr/bin/env python3
"""Development probe for the 3xTF32 matrix product (GPU): error against float64 and speed against cuBLAS.

    python dev/gemm.py [M N K ...]      (default: 8192 8192 8192 and P73's implicit GEMM)

Prints, per shape, each variant's median time (do_bench, L2 flushed), TFLOP/s of the useful FLOPs
(2·M·N·K) and relative error against float64: ours in 3xTF32 and plain TF32, cuBLAS in float32
and in TF32.
"""

from __future__ import annotations

import sys

import torch

import kernelbook as kb
from kernelbook import check


def main(argv: list[str]) -> int:
    nums = [int(v) for v in argv] or [8192, 8192, 8192, 2_032_128, 64, 72]
    shapes = [tuple(nums[i:i + 3]) for i in range(0, len(nums), 3)]
    mod = kb.build.load("gemm_3xtf32")
    print("config", dict(mod.config()))
    for m, n, k in shapes:
        a = check.rand([m, k], seed=1, device="cuda", low=-1, high=1)
        b = check.rand([k, n], seed=2, device="cuda", low=-1, high=1)
        rows = min(m, 2048)
        ref = a[:rows].double() @ b.double()
        variants = {
            "ours_3xtf32": (lambda a=a, b=b: mod.gemm_tf32(a, b, 3), None),
            "ours_tf32": (lambda a=a, b=b: mod.gemm_tf32(a, b, 1), None),
            "cublas_fp32": (lambda a=a, b=b: a @ b, False),
            "cublas_tf32": (lambda a=a, b=b: a @ b, True),
        }
        for name, (fn, tf32) in variants.items():
            with kb.precision.tf32(conv=True, matmul=bool(tf32)):
                out = fn()
                err = check.report(out[:rows], ref, tol=1.0)["rel_err"]
                t = kb.timing.bench(fn, "dev_gemm", name)["median"]
            print(f"{m}x{n}x{k} {name:12s} {t:8.3f} ms {2 * m * n * k / t / 1e9:8.1f} TFLOP/s  err {err:.2e}",
                  flush=True)
        del a, b, ref
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
