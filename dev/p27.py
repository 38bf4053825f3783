#!/usr/bin/env python3
"""P27 on a GPU in one call: chapter 8's checks against float64, its variants timed, Nsight Compute.

    python dev/p27.py               # checks + timings (+ Nsight Compute when ncu is on PATH)
    python dev/p27.py --no-ncu      # without the profiler section
    python dev/p27.py --sweep       # also time -DKB_P27_KD_UNROLL=2 and 4 (two more builds, ~1 min)
    python dev/p27.py --out DIR     # the record as DIR/dev_p27.json (default: $OUT when set)

A thin wrapper over what notebooks/08_capstone_conv3d_groupnorm_mean.ipynb runs, for use while
kernels/conv3d_gn_mean changes, with the chapter's own helpers (``kb.gn_mean``): ``gn_mean.checks`` checks
the fused kernel (FFMA and tensor cores) against float64 on P27's full batch and on odd shapes, the
depth-slab plans of smaller GPUs and shifted inputs, the tail kernel on P27; the submission
(``kb.problems.load_solution``) passes KernelBench's own check (``kb.problems.kernelbench_check``) and
float64. Then ``eager`` and ``compile`` (TF32 allowed, and ``_fp32``), ``conv_only`` (cuDNN's conv3d
alone: the Amdahl cap of fusing the tail), ``tail_fused`` (cuDNN conv3d + our one tail kernel) and
``ours`` (one fused kernel; ``ours_tc``: on the tensor cores) are timed by ``kb.measure.run`` in a live
record (``kb.records.new``) that is never saved to results/, and the fused kernel is profiled by
``kb.profile.ncu`` with the chapter's metrics. Exit status 1 if any check failed. About 1–2 minutes on an
H200.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's kernelbook

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import kernelbook as kb  # noqa: E402
from kernelbook import gn_mean as gm  # noqa: E402
from kernelbook import roofline as rl  # noqa: E402

CHAPTER = "08_capstone_conv3d_groupnorm_mean"  # the NVTX ranges are the chapter's: <chapter>/<variant>
P27 = kb.problems.P27_CONV3D_GN_MEAN
CONV, FUSED = rl.p27_conv(), rl.p27_fused()
FLOP = 2 * CONV.macs  # the convolution's FLOP, the chapter's TFLOP/s


def solution_check(rec: dict) -> None:
    """The submission file: KernelBench's check, then 64 samples against float64."""
    sol = kb.problems.load_solution(P27)
    rows, _, new = kb.problems.kernelbench_check(P27, lambda: sol.ModelNew(*P27.init_args))
    rec["kernelbench_check"] = rows
    xt = P27.inputs(seed=4, batch=64, device="cuda")
    r64, tol = gm.reference64(new, xt)
    rec["checks"]["solution file vs float64 (64 samples)"] = kb.check.report(new(xt), r64, tol)


def variants(ext, kd: dict) -> tuple[dict[str, kb.measure.Variant], torch.nn.Module, torch.Tensor]:
    """The chapter's variants of P27 at the benchmark's shape (``ours_kd<u>``: the unroll builds in ``kd``),
    and the module and input they run."""
    V, whole = kb.measure.Variant, {"flop": FUSED.flop, "bytes": FUSED.bytes}
    m, x = gm.model(seed=0), P27.inputs(seed=0, device="cuda")
    compiled = torch.compile(m)  # compiled at its first call, in the error loop of main
    return {
        "eager": V(lambda: m(x), "eager", counts=whole, tf32=True),
        "eager_fp32": V(lambda: m(x), "eager", counts=whole, tf32=False),
        "compile": V(lambda: compiled(x), "compile", counts=whole, tf32=True),
        "compile_fp32": V(lambda: compiled(x), "compile", counts=whole, tf32=False),
        "conv_only": V(lambda: F.conv3d(x, m.conv.weight, m.conv.bias), "cudnn", tf32=True,
                       counts={"flop": CONV.flop, "bytes": CONV.bytes}),
        "tail_fused": V(lambda: gm.tail(ext, m, x), "ours", counts=whole, mode="cuDNN conv, our tail", tf32=True),
        "ours": V(lambda: gm.fused(ext, m, x), "ours", counts=whole, role="headline"),
        "ours_tc": V(lambda: gm.fused(ext, m, x, math="3xtf32"), "ours", counts=whole, role="control",
                     math="3xtf32"),
        **{f"ours_kd{u}": V(lambda e=e: gm.fused(e, m, x), "ours", counts=whole, role="control")
           for u, e in kd.items()},
    }, m, x


def ncu(rec: dict) -> None:
    """Nsight Compute on the fused kernel (the chapter's metrics; the basic ones if ncu refuses them)."""
    if shutil.which("ncu") is None:
        print("ncu is not on PATH: skipped")
        return
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))  # the child's
    target = gm.ncu_target(CHAPTER)
    try:
        table = kb.profile.ncu(target, CHAPTER, ["ours"], gm.NCU_ALL)
    except RuntimeError as e:
        print(f"ncu refused the full metric list ({str(e)[:300]}); basic metrics only")
        table = kb.profile.ncu(target, CHAPTER, ["ours"], gm.NCU_BASIC)
    rec["ncu"] = table.to_dict("records")
    nc = table.groupby("metric")["value"].sum()
    for k, v in gm.counters(nc, CONV.macs, FUSED.read).items():
        print(f"  {gm.COUNTERS[k]:52s} {v:10.3f}")
    for s, v in gm.stalls(nc).items():
        print(f"  warps stalled per issue: {s:28s} {v:10.3f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-ncu", action="store_true", help="skip the Nsight Compute section")
    ap.add_argument("--sweep", action="store_true", help="also time the kd-loop unroll builds (2 and 4)")
    ap.add_argument("--out", type=Path, default=os.environ.get("OUT"), help="write DIR/dev_p27.json")
    args = ap.parse_args()

    torch.set_grad_enabled(False)  # forward passes only: nothing for autograd to record
    print(kb.describe(), flush=True)
    rec = kb.records.new(CHAPTER, kernels=["conv3d_gn_mean"], solutions=[P27.name])  # live; never saved here
    kb.precision.defaults()  # PyTorch's defaults; variants named *_fp32 turn TF32 off
    ext = kb.build.load("conv3d_gn_mean")
    rec["config"] = dict(ext.config())
    for r in kb.build.resources("conv3d_gn_mean", "90"):
        print(f"  sm_90 {r['kernel']}: {r['registers']} registers, {r['spill_store_bytes']} B spill stores")

    rec["checks"] |= gm.checks(ext)
    solution_check(rec)
    kb.precision.defaults()
    kd = {u: kb.build.load("conv3d_gn_mean", defines={"KB_P27_KD_UNROLL": u}) for u in (2, 4)} if args.sweep else {}
    runs, m, x = variants(ext, kd)
    ref, _ = gm.reference64(m, x[:32])
    rec["variant_errors"] = {}
    for name, v in runs.items():  # the first calls also compile
        with kb.precision.tf32(bool(v.tf32)):
            out = v.fn()
        if name != "conv_only":
            rec["variant_errors"][name] = kb.check.report(out[:32], ref, gm.TOL)
    t = kb.measure.run(rec, runs)
    rec["sm_clock_mhz"] = kb.measure.sm_clock_mhz()  # right after the runs: their clock
    prov = rec["provenance"]
    floor_ms = 1e3 * FLOP / rl.fp32_peak(prov["sm_count"], rec["sm_clock_mhz"] * 1e6, prov["capability"])
    ms = t["median ms"]
    t["TFLOP/s"] = FLOP / ms / 1e9
    t["% of FFMA peak"] = 100 * floor_ms / ms
    t["× eager"] = ms["eager"] / ms
    t["error vs float64"] = [rec["variant_errors"].get(n, {}).get("rel_err", float("nan")) for n in t.index]
    print(f"\nSM clock after the runs {rec['sm_clock_mhz']} MHz: the FFMA floor is {floor_ms:.3f} ms")
    print(t.drop(columns=["GB/s", "provider"], errors="ignore").to_string(float_format=lambda v: f"{v:.4g}"))
    print(f"conv alone is {100 * ms['conv_only'] / ms['eager']:.0f} % of eager; fusing only the tail gives "
          f"at most {ms['eager'] / ms['conv_only']:.2f}x")

    if not args.no_ncu:
        ncu(rec)
    failed = [k for k, r in rec["checks"].items() if not r["passed"]]
    failed += [f"solution: KernelBench trial {r['trial']}" for r in rec["kernelbench_check"] if not r["allclose"]]
    failed += [f"{k}: error {e['rel_err']:.1e}" for k, e in rec["variant_errors"].items()
               if k.startswith("ours") and not e["passed"]]
    for k, r in rec["checks"].items():
        print(f"  {'ok  ' if r['passed'] else 'FAIL'} {k:52s} {r['rel_err']:.2e}")
    print(f"{len(rec['checks'])} checks against float64" + (f"; FAILED: {failed}" if failed else ", all passed"))
    if args.out:
        path = Path(args.out) / "dev_p27.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        body = {k: v for k, v in rec.items() if k != "live"} | {"failures": failed}
        path.write_text(json.dumps(body, indent=1, default=lambda o: o.item() if hasattr(o, "item") else str(o)))
        print(f"wrote {path}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
