#!/usr/bin/env python3
"""P73 on a GPU in one call: chapter 7's checks and timings, for every build of the kernel in SWEEP.

    python dev/p73.py [--variants default,sync] [--no-compile] [--out DIR]

A thin wrapper over what notebooks/07_capstone_conv_bn_scale.ipynb runs, for use while
kernels/conv_bn_scale changes. Each build named by --variants (``SWEEP``: -D defines) compiles in the
background (``kb.build.load``) and is checked against float64 (``kb.check``): P73's training step (the
``auto``, ``moments`` and ``inplace`` strategies: output and running statistics) and its eval conv on
weights folded by ``kb.folding.fold``, and odd shapes (three training steps, then the eval conv). The
submission (``kb.problems.load_solution``) passes KernelBench's own check
(``kb.problems.kernelbench_check``). Then the chapter's baselines (eager, torch.compile with TF32 on
and off, cuDNN on folded weights), each build's train, in-place and eval kernels and the submission
are timed by ``kb.measure.run`` in a live record (``kb.records.new``), with the counts of
``kb.roofline`` declared. The record is never saved to results/: with --out (default: $OUT when
set) it is written to DIR/dev_p73.json. Exit status 1 if any check failed. About 3 minutes on an H200.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's kernelbook

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import kernelbook as kb  # noqa: E402

# name → -D defines for kernels/conv_bn_scale.cu (tests/test_conv_bn_scale.py checks each compiles spill-free).
SWEEP: dict[str, dict[str, int]] = {
    "default": {},                                                      # 2 rows/thread, cp.async, 2 blocks/SM
    "sync": {"KB_CBS_ASYNC": 0},                                        # same, ordinary loads for staging
    "rpt1": {"KB_CBS_RPT": 1, "KB_CBS_MIN_BLOCKS": 3},                  # chapter 2's shape + double buffering
    "rpt1_sync": {"KB_CBS_RPT": 1, "KB_CBS_MIN_BLOCKS": 3, "KB_CBS_ASYNC": 0},
    "rpt3": {"KB_CBS_RPT": 3, "KB_CBS_MIN_BLOCKS": 1},                  # 96 accumulators, 1 block/SM
}

CHAPTER = "07_capstone_conv_bn_scale"  # the NVTX ranges are the chapter's: <chapter>/<variant>
P73 = kb.problems.P73_CONV_BN_SCALE
SCALE = P73.init_args[3]
TOL = 1e-5                                   # the chapter's bound against float64
TARGET_MS = {"train": 0.35, "eval": 0.25}    # the chapter's targets
ODD_SHAPES = [(1, 8, 33, 97, 64), (4, 3, 32, 32, 16), (2, 19, 9, 130, 5), (2, 8, 17, 300, 100)]  # N, C_in, H, W, C_out


def train_step(mod, m, x, out=None, strategy="auto"):
    """A training-mode forward of the kernel on m's conv and bn (running statistics updated), as chapter 7's."""
    c, b = m.conv, m.bn
    return mod.conv_bn_scale_train(x, c.weight, c.bias, b.weight, b.bias, b.running_mean, b.running_var,
                                   b.num_batches_tracked, b.momentum, b.eps, SCALE, out=out, strategy=strategy)


def odd_shape_checks(mod, name: str) -> dict[str, dict]:
    """Three training steps (cumulative running statistics; the in-place strategy at step 1), then the
    eval conv, on shapes the kernel was not tuned for, each against float64."""
    res = {}
    for shape in ODD_SHAPES:
        n, c_in, h, w, c_out = shape
        torch.manual_seed(n + c_in + h + w)
        r64 = nn.ModuleDict({"conv": nn.Conv2d(c_in, c_out, 3), "bn": nn.BatchNorm2d(c_out, momentum=None)})
        r64 = r64.cuda().double()
        ours = copy.deepcopy(r64).float()
        for step in range(3):
            xs = kb.check.rand((n, c_in, h, w), seed=step, device="cuda")
            y = train_step(mod, ours, xs, strategy="inplace" if step == 1 else "auto")
            y64 = r64.bn(r64.conv(xs.double())) * SCALE
            res[f"{name} train {shape} step {step}"] = kb.check.report(y, y64, 1e-4)
            res[f"{name} train {shape} step {step}: running_var"] = kb.check.report(
                ours.bn.running_var, r64.bn.running_var, 1e-4)
        c = ours.conv
        res[f"{name} eval conv {shape}"] = kb.check.report(
            mod.conv_bn_scale_eval(xs, c.weight, c.bias), F.conv2d(xs.double(), c.weight.double(), c.bias.double()),
            TOL)
    return res


def p73_checks(mod, name: str, model, x, ref: dict) -> dict[str, dict]:
    """P73's training step from the benchmark's initial state, each strategy (output and running
    statistics), and the eval conv on the folded weights, against float64 (chapter 7's checks)."""
    res = {}
    for s in ("auto", "moments", "inplace"):
        m, out = copy.deepcopy(model), kb.check.poisoned(ref["train"].shape, device="cuda")
        train_step(mod, m, x, out, s)
        res[f"{name} P73 train ({s}): output"] = kb.check.report(out, ref["train"], TOL)
        for k in ("running_mean", "running_var"):
            res[f"{name} P73 train ({s}): {k}"] = kb.check.report(getattr(m.bn, k), ref["stats"][k], TOL)
    out = kb.check.poisoned(ref["eval"].shape, device="cuda")
    res[f"{name} P73 eval: output"] = kb.check.report(mod.conv_bn_scale_eval(x, *ref["folded"], out=out),
                                                      ref["eval"], TOL)
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", default=",".join(SWEEP), help=f"builds to check and time, of {', '.join(SWEEP)}")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile baselines")
    ap.add_argument("--out", type=Path, default=os.environ.get("OUT"), help="write DIR/dev_p73.json")
    args = ap.parse_args()
    names = [v for v in args.variants.split(",") if v]
    unknown = set(names) - set(SWEEP)
    if unknown:
        ap.error(f"unknown variants {sorted(unknown)}: SWEEP has {', '.join(SWEEP)}")

    torch.set_grad_enabled(False)  # forward passes only: nothing for autograd to record
    print(kb.describe(), flush=True)
    rec = kb.records.new(CHAPTER, kernels=["conv_bn_scale"], solutions=[P73.name])  # live; never saved here
    pool = ThreadPoolExecutor(len(names) + 1)  # the builds compile while the references are computed
    builds = {v: pool.submit(kb.build.load, "conv_bn_scale", defines=SWEEP[v]) for v in names}
    sol = kb.problems.load_solution(P73)
    sol_build = pool.submit(sol._ext)
    kb.precision.defaults()
    torch.backends.cudnn.benchmark = True
    torch._dynamo.config.cache_size_limit = 64

    model, x = P73.model(seed=0).cuda(), P73.inputs(seed=1, device="cuda")  # training mode, as the benchmark
    ref64 = copy.deepcopy(model).double()
    m_eval = copy.deepcopy(model).eval()
    ref = {"train": ref64(x.double()),                                  # ref64's running stats: one step on
           "stats": {k: getattr(ref64.bn, k) for k in ("running_mean", "running_var")},
           "eval": copy.deepcopy(m_eval).double()(x.double()),
           "folded": kb.folding.fold(m_eval.conv, m_eval.bn, SCALE, dtype=torch.float64)}  # rounded once
    w_f, b_f = ref["folded"]
    x_cl, w_cl = (t.contiguous(memory_format=torch.channels_last) for t in (x, w_f))
    y = torch.empty_like(ref["train"], dtype=torch.float32)
    counts = {k: {"flop": c.flop, "bytes": c.bytes} for k, c in (
        ("moments", kb.roofline.p73_fused_train(strategy="moments")),
        ("inplace", kb.roofline.p73_fused_train(strategy="materialise")), ("eval", kb.roofline.p73_fused_eval()))}
    V = kb.measure.Variant
    TR, EV = {"mode": "train", "counts": counts["inplace"]}, {"mode": "eval", "counts": counts["eval"]}
    m_eager = copy.deepcopy(model)
    variants = {
        "eager_train": V(lambda: m_eager(x), "eager", **TR, tf32=True),
        "eager_eval": V(lambda: m_eval(x), "eager", **EV, tf32=True),
        "cudnn_folded_fp32": V(lambda: F.conv2d(x, w_f, b_f), "cudnn", **EV, tf32=False),
        "cudnn_folded_cl_tf32": V(lambda: F.conv2d(x_cl, w_cl, b_f), "cudnn", **EV, tf32=True),
        "cudnn_folded_cl_fp32": V(lambda: F.conv2d(x_cl, w_cl, b_f), "cudnn", **EV, tf32=False),
    }
    if not args.no_compile:
        c_tr = torch.compile(copy.deepcopy(model))  # compiled at its first call, in the error loop below
        variants["compile_train"] = V(lambda: c_tr(x), "compile", **TR, tf32=True)
        variants["compile_train_fp32"] = V(lambda: c_tr(x), "compile", **TR, tf32=False)
        for name in ("compile_eval", "compile_eval_fp32"):  # chapter 2's, compiled now
            how = kb.folding.COMPILED[name]
            fn = kb.folding.compiled(m_eval, x, **how)
            if fn is not None:
                variants[name] = V(fn, "compile", **EV, tf32=how["tf32"])

    failures = []
    for v in names:
        try:
            mod = builds[v].result()
        except Exception as e:  # one build that fails must not hide the others' results
            failures.append(f"build {v}: {type(e).__name__}: {str(e)[:300]}")
            print(f"!! build {v} failed: {e}", flush=True)
            continue
        rec.setdefault("builds", {})[v] = {"defines": SWEEP[v], "config": [int(c) for c in mod.config()]}
        rec["checks"] |= p73_checks(mod, v, model, x, ref) | odd_shape_checks(mod, v)
        m, m_ip = copy.deepcopy(model), copy.deepcopy(model)  # each timed step updates its own statistics
        variants |= {
            f"ours_train[{v}]": V(lambda mod=mod, m=m: train_step(mod, m, x, y), "ours", "train",
                                  counts=counts["moments"], role="headline"),
            f"ours_train_inplace[{v}]": V(lambda mod=mod, m=m_ip: train_step(mod, m, x, y, "inplace"),
                                          "ours", **TR, role="control"),
            f"ours_eval[{v}]": V(lambda mod=mod: mod.conv_bn_scale_eval(x, w_f, b_f, out=y), "ours", **EV,
                                 role="headline"),
        }
        print(f"{v}: built, config {rec['builds'][v]['config']}, checks done", flush=True)

    sol_build.result()
    rows, _, new = kb.problems.kernelbench_check(P73, lambda: sol.ModelNew(*P73.init_args))
    rec["solution_check"] = {"trials": rows}
    failures += [f"solution: KernelBench trial {r['trial']}" for r in rows if not r["allclose"]]
    kb.precision.defaults()
    new.load_state_dict(model.state_dict())  # the weights of the references (the seeded module's are others)
    new_eval = sol.ModelNew(*P73.init_args).cuda()
    new_eval.load_state_dict(m_eval.state_dict())
    new_eval.eval()
    variants["solution_train"] = V(lambda: new(x), "ours", "train", counts=counts["moments"])
    variants["solution_eval"] = V(lambda: new_eval(x), "ours", **EV)

    rec["variant_errors"] = {}  # each variant's own error against float64 (TF32 baselines err by design)
    for name, v in variants.items():
        with kb.precision.tf32(bool(v.tf32)):
            rec["variant_errors"][name] = kb.check.report(v.fn(), ref[v.mode], TOL)
    t = kb.measure.run(rec, variants)
    rec["sm_clock_mhz"] = kb.measure.sm_clock_mhz()  # right after the runs: their clock
    first = next((v for v in names if v in rec.get("builds", {})), None)
    if first:
        runs = {n: variants[n].fn for n in (f"ours_train[{first}]", f"ours_train_inplace[{first}]")}
        prof = kb.profile.kernels(runs, CHAPTER, repeat=5)
        rec["kernels"] = prof.to_dict("records")
        print(prof.to_string(), flush=True)

    t["mode"] = [variants[n].mode for n in t.index]
    t["error vs float64"] = [rec["variant_errors"][n]["rel_err"] for n in t.index]
    print(t[["mode", "provider", "median ms", "q20 ms", "q80 ms", "TFLOP/s", "error vs float64"]]
          .sort_values("median ms").to_string(float_format=lambda v: f"{v:.4g}"))
    ours = t[t.index.str.startswith(("ours_", "solution_"))]
    failures += [f"{n}: error {e:.1e} against float64" for n, e in ours["error vs float64"].items() if e > TOL]
    failures += [k for k, r in rec["checks"].items() if not r["passed"]]
    ceil = kb.summary.ceilings(kb.device.slug(rec["provenance"]["gpu"]))  # the roofline chapter's, if recorded
    for mode, c in (("train", kb.roofline.p73_fused_train(strategy="moments")), ("eval", kb.roofline.p73_fused_eval())):
        mine = ours[ours.index.str.startswith("ours") & (ours["mode"] == mode)]["median ms"]
        base = t[(t["provider"] != "ours") & (t["mode"] == mode)]["median ms"]
        if mine.empty:
            continue
        best = mine.idxmin()
        bound = f"; {100 * kb.roofline.bound_ms(c, *ceil) / mine[best]:.0f} % of its roofline bound" if ceil else ""
        print(f"best {mode}: {best} {mine[best]:.3f} ms (target {TARGET_MS[mode]}{bound}); fastest baseline "
              f"{base.idxmin() if len(base) else None} {base.min():.3f} ms")
    print(f"{len(rec['checks'])} checks against float64; " + ("FAILED:\n  " + "\n  ".join(failures)
                                                                if failures else "all passed"))
    if args.out:
        path = Path(args.out) / "dev_p73.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        body = {k: v for k, v in rec.items() if k != "live"} | {"failures": failures}
        path.write_text(json.dumps(body, indent=1, default=lambda o: o.item() if hasattr(o, "item") else str(o)))
        print(f"wrote {path}")
    pool.shutdown(wait=False)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
