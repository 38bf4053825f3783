"""Check and time dev/edge/edge_multi.cuh (the border sums without atomics) against the book's border kernel.

    python dev/edge/run.py            # checks on odd shapes, then P73's timings: S = 0 (the book's), -1
    python dev/edge/run.py --small    # checks on small shapes only (compute-sanitizer)
    python dev/edge/run.py --ncu      # the book's kernel and the partials once each on P73 (Nsight Compute)

S = -1 is the candidate: per-sample partials, then their reduction over the samples.

Checks: every slot the candidate writes equals the book kernel's to 1e-12 relative (the same float sums per sample;
the doubles' order of addition differs), and no other slot is written.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
SHAPES = [(2, 8, 34, 34), (3, 5, 20, 150), (1, 1, 3, 3), (5, 8, 4, 5), (9, 3, 131, 7), (2, 8, 130, 129)]
SIZES = (-1,)  # the partials (S = 1, 2, 4, 8 samples a block ran slower than the book: H100, session 26)


def build():
    from torch.utils.cpp_extension import load

    return load(name="edge_multi", sources=[str(HERE / "ext.cu")], extra_include_paths=[str(HERE)],
                extra_cuda_cflags=["-O3"], verbose=False)


def main() -> int:
    import argparse

    import torch
    import triton.testing as tt

    import kernelbook as kb
    from dev.report import finish

    ap = argparse.ArgumentParser()
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--build-only", action="store_true")
    ap.add_argument("--ncu", action="store_true", help="the book's kernel, then the partials, once each on P73")
    args = ap.parse_args()
    m = build()
    if args.build_only:
        return 0
    if args.ncu:
        x = kb.problems.P73_CONV_BN_SCALE.inputs(seed=0).cuda()
        for S in (0, -1):
            m.edge_sums(x, S)
        torch.cuda.synchronize()
        return 0
    rows = []
    for n, c, h, w in SHAPES[:3] if args.small else SHAPES:
        x = kb.check.rand((n, c, h, w), seed=n * h + w, device="cuda")
        ref = m.edge_sums(x, 0)
        row = {"shape": [n, c, h, w]}
        for S in SIZES:
            got = m.edge_sums(x, S)
            rel = float(((got - ref).abs() / ref.abs().clamp_min(1e-300)).max())
            row[f"S{S}"] = rel
            row[f"S{S}_ok"] = bool(rel <= 1e-12 and torch.equal(got != 0, ref != 0))
        rows.append(row)
    res = {"checks": rows}
    if not args.small:
        x = kb.problems.P73_CONV_BN_SCALE.inputs(seed=0).cuda()
        res["timing_ms"] = {f"S{S}": tt.do_bench(lambda S=S: m.edge_sums(x, S), warmup=50, rep=300)
                            for S in (0, *SIZES)}
        res["timing_ms"]["zeros"] = tt.do_bench(lambda: torch.zeros(27000, dtype=torch.float64, device="cuda"),
                                                warmup=50, rep=300)  # edge_sums' own allocation, in every row
    return finish(res)


if __name__ == "__main__":
    sys.exit(main())
