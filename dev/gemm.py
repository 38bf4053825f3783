#!/usr/bin/env python3
"""Development probe for the 3xTF32 matrix product (GPU): error against float64 and speed against cuBLAS.

    python dev/gemm.py [M N K ...]      (default: 8192 8192 8192 and P73's implicit GEMM)

Per shape, ours in 3xTF32 and in plain TF32 and cuBLAS in float32 and in TF32 are checked against
float64 (``kb.check.report``) and timed by ``kb.measure.run`` in a live record (never saved), each
under its declared TF32 setting; the table gives the median time and the TFLOP/s of the useful FLOPs
(2·M·N·K).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's kernelbook

import torch  # noqa: E402

import kernelbook as kb  # noqa: E402


def main(argv: list[str]) -> int:
    if {"-h", "--help"} & set(argv):
        print(__doc__)
        return 0
    nums = [int(v) for v in argv] or [8192, 8192, 8192, 2_032_128, 64, 72]
    shapes = [tuple(nums[i:i + 3]) for i in range(0, len(nums), 3)]
    rec = kb.records.new("dev_gemm", kernels=["gemm_3xtf32"])
    kb.precision.defaults()
    mod = kb.build.load("gemm_3xtf32")
    print("config", dict(mod.config()))
    V = kb.measure.Variant
    for m, n, k in shapes:
        a = kb.check.rand([m, k], seed=1, device="cuda", low=-1, high=1)
        b = kb.check.rand([k, n], seed=2, device="cuda", low=-1, high=1)
        rows = min(m, 2048)
        ref = a[:rows].double() @ b.double()
        flop, shape = {"flop": 2 * m * n * k}, f"[{m}x{n}x{k}]"
        variants = {
            f"ours_3xtf32{shape}": V(lambda a=a, b=b: mod.gemm_tf32(a, b, 3), "ours", math="3xtf32", counts=flop),
            f"ours_tf32{shape}": V(lambda a=a, b=b: mod.gemm_tf32(a, b, 1), "ours", math="tf32", counts=flop),
            f"cublas_fp32{shape}": V(lambda a=a, b=b: a @ b, "cublas", counts=flop, tf32_matmul=False),
            f"cublas_tf32{shape}": V(lambda a=a, b=b: a @ b, "cublas", math="tf32", counts=flop, tf32_matmul=True),
        }
        err = {}
        for name, v in variants.items():
            with kb.precision.tf32(conv=True, matmul=bool(v.tf32_matmul)):
                err[name] = kb.check.report(v.fn()[:rows], ref, tol=1.0)["rel_err"]
        t = kb.measure.run(rec, variants)
        t["error vs float64"] = [err[name] for name in t.index]
        print(t[["median ms", "TFLOP/s", "error vs float64"]].to_string(float_format=lambda v: f"{v:.4g}"), flush=True)
        del a, b, ref, variants
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
