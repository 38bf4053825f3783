#!/usr/bin/env python3
"""Time the intro table's variants and the capstones' peers once in this process; append the run to a spread file.

    python scripts/spread.py                           # appends to results/<gpu-slug>/spread.json
    python scripts/spread.py --out /tmp/spread.json    # appends there instead

Run it three or more times, each a fresh process: the intro table shows, per variant, the least and greatest of
the runs' medians (``kb.summary.spread``) and rounds speed-ups to what that range allows. Each chapter's variants
are built here as its notebook builds them (the same modules, seeds, shapes and settings; its toolkit functions
where it has them) and timed by ``kb.measure.run`` under the TF32 setting its record declares. Which variants
are timed is ``kb.summary.spread_variants()``; ``BUILDERS`` below builds exactly those (a test holds the two
equal). Needs a CUDA GPU; about a minute on an H200 once the kernels are compiled.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import kernelbook as kb  # noqa: E402
from kernelbook import check, folding, gn_mean, precision, problems, summary  # noqa: E402

Fns = dict[str, Callable[[], object]]


class Builder(NamedTuple):
    variants: tuple[str, ...]  # what it returns, in the chapter's order
    kernels: tuple[str, ...]   # the kernels/ it loads
    make: Callable[[dict], Fns]


BUILDERS: dict[str, Builder] = {}


def builds(chapter: str, variants: tuple[str, ...], kernels: tuple[str, ...]):
    """Register ``make(kernels) -> {variant: fn}`` as the way ``chapter``'s ``variants`` are built."""
    def register(make: Callable[[dict], Fns]) -> Callable[[dict], Fns]:
        BUILDERS[chapter] = Builder(variants, kernels, make)
        return make
    return register


@builds("00_method", ("scale_torch", "scale_ours"), ("scale",))
def _method(k: dict) -> Fns:
    """The chapter's headline size: 1 GiB of float32, scaled by PyTorch and by ours."""
    x = torch.rand(1024 << 18, device="cuda")
    return {"scale_torch": lambda: x * 2.0, "scale_ours": lambda: k["scale"].scale(x, 2.0)}


@builds("01_bn_modes", ("eager_bn_scale", "compile_bn_scale", "ours_bn_scale_train", "eager_bn_scale_eval",
                        "ours_bn_scale_eval"), ("bn_train",))
def _bn_modes(k: dict) -> Fns:
    """BatchNorm · 2.0 on P73's conv output, training and eval mode, under no_grad as the chapter times it."""
    torch.set_grad_enabled(False)
    mod, p73 = k["bn_train"], problems.P73_CONV_BN_SCALE
    (n, _, h, w), (c_out, ks, scale) = p73.input_shape, p73.init_args[1:]
    x = check.rand((n, c_out, h - ks + 1, w - ks + 1), seed=7, device="cuda", low=-1, high=3)
    y, bn_t = torch.empty_like(x), nn.BatchNorm2d(c_out).cuda()
    bn_e, bn_c = copy.deepcopy(bn_t).eval(), copy.deepcopy(bn_t)
    compiled = torch.compile(lambda inp: bn_c(inp) * scale)
    compiled(x)  # compile once, outside the timing
    return {"eager_bn_scale": lambda: bn_t(x) * scale, "compile_bn_scale": lambda: compiled(x),
            "ours_bn_scale_train": lambda: mod.bn_scale_train(
                x, *bn_t.parameters(), *bn_t.buffers(), 0.1, bn_t.eps, scale, y),
            "eager_bn_scale_eval": lambda: bn_e(x) * scale,
            "ours_bn_scale_eval": lambda: mod.bn_scale_eval(
                x, *bn_e.parameters(), *list(bn_e.buffers())[:2], bn_e.eps, scale, y)}


@builds("02_bn_folding", ("eager_eval", "ours_fast", "compile_eval"), ("conv2d_folded",))
def _bn_folding(k: dict) -> Fns:
    """``kb.folding.eval_variants``, with only the row's torch.compile setting compiled."""
    p73 = problems.P73_CONV_BN_SCALE
    row_compile = {"compile_eval": folding.COMPILED["compile_eval"]}
    with mock.patch.dict(folding.COMPILED, row_compile, clear=True):
        variants, _ = folding.eval_variants(k["conv2d_folded"], folding.demo_model(p73), p73.init_args[3], p73, {})
    return {n: variants[n].fn for n in BUILDERS["02_bn_folding"].variants}


@builds("06_tensor_cores", ("eager_fp32", "ours_w2"), ("gemm_wgmma",))
def _tensor_cores(k: dict) -> Fns:
    """C = A·B at 8192³: cuBLAS in float32 and the chapter's headline on sm_90, wgmma's w2 in 3xTF32."""
    a = check.rand([8192, 8192], seed=1, device="cuda", low=-1, high=1)
    b = check.rand([8192, 8192], seed=2, device="cuda", low=-1, high=1)
    return {"eager_fp32": lambda: a @ b, "ours_w2": lambda: k["gemm_wgmma"].gemm(a, b, 3, 2)}


@builds("07_capstone_conv_bn_scale", (
    "eager_train", "compile_train", "compile_train_fp32", "ours_train", "eager_eval", "cudnn_folded_fp32",
    "cudnn_folded_cl_tf32", "cudnn_folded_cl_fp32", "cutlass_folded_cl_3xtf32", "compile_eval", "compile_eval_fp32",
    "ours_eval"), ("conv_bn_scale", "cutlass_conv"))
def _capstone_p73(k: dict) -> Fns:
    """P73 whole, training and eval mode: the module, torch.compile of it, cuDNN and CUTLASS on the folded
    weights, and ours; eval mode with the running statistics one training step on, as in the chapter."""
    torch.set_grad_enabled(False)
    torch.backends.cudnn.benchmark = True
    torch._dynamo.config.cache_size_limit = 64
    mod, cl, p73 = k["conv_bn_scale"], k["cutlass_conv"].raw, problems.P73_CONV_BN_SCALE
    (n, _, h, w), (c_out, ks, scale) = p73.input_shape, p73.init_args[1:]
    model, x = p73.model(seed=0).cuda(), p73.inputs(seed=1, device="cuda")
    y = torch.empty(n, c_out, h - ks + 1, w - ks + 1, device="cuda")

    def train_step(m):
        c, b = m.conv, m.bn
        return mod.conv_bn_scale_train(x, c.weight, c.bias, b.weight, b.bias, b.running_mean, b.running_var,
                                       b.num_batches_tracked, b.momentum, b.eps, scale, y, "auto", "auto")

    def compiled(module):
        c = torch.compile(copy.deepcopy(module))
        with precision.tf32(True):
            c(x)
        return c

    m_eval = copy.deepcopy(model)
    train_step(m_eval)
    m_eval.eval()
    w_f, b_f = folding.fold(m_eval.conv, m_eval.bn, scale)
    x_cl, w_cl = (t.contiguous(memory_format=torch.channels_last) for t in (x, w_f))
    m_eager, m_ours = copy.deepcopy(model), copy.deepcopy(model)
    c_tr, c_ev = compiled(model), compiled(m_eval)
    conv_cl = lambda: F.conv2d(x_cl, w_cl, b_f)  # cuDNN, channels-last
    return {"eager_train": lambda: m_eager(x), "compile_train": lambda: c_tr(x), "compile_train_fp32": lambda: c_tr(x),
            "ours_train": lambda: train_step(m_ours), "eager_eval": lambda: m_eval(x),
            "cudnn_folded_fp32": lambda: F.conv2d(x, w_f, b_f), "cudnn_folded_cl_tf32": conv_cl,
            "cudnn_folded_cl_fp32": conv_cl,
            "cutlass_folded_cl_3xtf32": lambda: cl.cutlass_conv2d(x_cl, w_cl, b_f),
            "compile_eval": lambda: c_ev(x), "compile_eval_fp32": lambda: c_ev(x),
            "ours_eval": lambda: mod.conv_bn_scale_eval(x, w_f, b_f, y)}


@builds("08_capstone_conv3d_groupnorm_mean", ("eager", "conv_only", "eager_fp32", "cudnn_bench", "compile",
                                              "compile_fp32", "eager_cl3d", "eager_cl3d_fp32", "tail_fused",
                                              "ours", "cutlass_conv3d"),
        ("conv3d_gn_mean", "cutlass_conv"))
def _capstone_p27(k: dict) -> Fns:
    """P27 whole: the module (also with cudnn.benchmark, and in channels_last_3d), its convolution alone,
    torch.compile of it, cuDNN's convolution with our tail, ours, and CUTLASS's 3xTF32 conv3d alone."""
    torch.set_grad_enabled(False)
    ext, p27 = k["conv3d_gn_mean"], problems.P27_CONV3D_GN_MEAN
    m, x = gn_mean.model(seed=0), p27.inputs(seed=0, device="cuda")
    compiled = torch.compile(m)
    with precision.tf32(True):
        compiled(x)  # compile once, outside the timing
    cl3d = torch.channels_last_3d
    m_cl, x_cl = (t.to(memory_format=cl3d) for t in (copy.deepcopy(m), x))
    xp, wp, bias = gn_mean.cutlass_operands(m, x)  # prepared once, untimed, as the chapter does

    def bench():
        with gn_mean.cudnn_benchmark():
            return m(x)

    return {"eager": lambda: m(x), "conv_only": lambda: F.conv3d(x, m.conv.weight, m.conv.bias),
            "eager_fp32": lambda: m(x), "cudnn_bench": bench, "compile": lambda: compiled(x),
            "compile_fp32": lambda: compiled(x), "eager_cl3d": lambda: m_cl(x_cl),
            "eager_cl3d_fp32": lambda: m_cl(x_cl), "tail_fused": lambda: gn_mean.tail(ext, m, x),
            "ours": lambda: gn_mean.fused(ext, m, x),
            "cutlass_conv3d": lambda: k["cutlass_conv"].raw.cutlass_conv3d(xp, wp, bias)}


def time_chapter(chapter: str, mods: dict, declared: dict) -> dict[str, dict]:
    """Build ``chapter``'s variants from PyTorch's settings as a fresh chapter kernel starts with them (so no
    chapter inherits another's) and time them with ``kb.measure.run`` (the chapter's warm-up and repetitions,
    its NVTX ranges) under each one's declared TF32 setting; {variant: median/q20/q80 ms}."""
    torch.set_grad_enabled(True)
    torch.backends.cudnn.benchmark = False
    precision.defaults()
    built = BUILDERS[chapter].make(mods)
    assert set(built) == set(BUILDERS[chapter].variants), f"{chapter} built {sorted(built)}"
    rec = {"chapter": chapter, "live": True, "timings_ms": {}}
    variants = {v: kb.measure.Variant(fn, declared[v]["provider"], tf32=declared[v].get("tf32_allowed"),
                                      tf32_matmul=declared[v].get("tf32_matmul_allowed"))
                for v, fn in built.items()}
    kb.measure.run(rec, variants)
    return rec["timings_ms"]


def mismatch(wanted: dict[str, list[str]]) -> list[str]:
    """Where ``BUILDERS`` and the variants the records ask for (``summary.spread_variants``) differ."""
    out = [f"{c}: the records ask for {sorted(set(vs) - set(BUILDERS[c].variants))}, not built here"
           for c, vs in wanted.items() if c in BUILDERS and set(vs) - set(BUILDERS[c].variants)]
    out += [f"{c}: built here but not asked for: {sorted(set(b.variants) - set(wanted.get(c, ())))}"
            for c, b in BUILDERS.items() if set(b.variants) - set(wanted.get(c, ()))]
    return out + [f"{c}: no builder here" for c in wanted if c not in BUILDERS]


def new_run(recs: list[dict]) -> dict:
    """This process's run: its pid and the provenance of a chapter record, hashing every kernel source (and
    submission) that the timed chapters' records name, so each chapter's ranges can be checked for staleness."""
    files = {f for r in recs for f in r["provenance"]["kernels"]}
    kernels = sorted({Path(f).stem for f in files if f.startswith("kernels/") and f.endswith(".cu")})
    solutions = sorted({Path(f).stem for f in files if f.startswith("solutions/")})
    prov = kb.records.new("spread", kernels, solutions)["provenance"]
    return {"pid": os.getpid(), "provenance": prov, "timings_ms": {}}


def load_kernels(names: list[str]) -> dict:
    """Compile (or reuse from the cache) every kernel the builders load, in parallel, before anything is timed."""
    with ThreadPoolExecutor(len(names)) as pool:
        return dict(zip(names, pool.map(kb.build.load, names), strict=True))


def report(out: Path, run: dict) -> None:
    """A short table: this run's median per variant, and the least–greatest of all runs in ``out`` so far."""
    runs = kb.records.spread_runs(out)
    print(f"\n{'variant':<52} {'this run ms':>11} {'min–max ms':>20} {'runs':>4}")
    for key, t in run["timings_ms"].items():
        ms = [r["timings_ms"][key]["median"] for r in runs if key in r["timings_ms"]]
        print(f"{key:<52} {t['median']:>11.4f} {f'{min(ms):.4f}–{max(ms):.4f}':>20} {len(ms):>4}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="spread file to append to (default: results/<gpu-slug>/spread.json)")
    args = ap.parse_args(argv)
    g = kb.gpu()
    if g is None:
        print("spread.py needs a CUDA GPU, and PyTorch sees none here: nothing was timed.", file=sys.stderr)
        return 2
    wanted = summary.spread_variants()
    if problems_found := mismatch(wanted):
        print("spread.py: its builders and the records disagree:\n  " + "\n  ".join(problems_found), file=sys.stderr)
        return 2
    recs = {r["chapter"]: r for r in kb.records.on_gpu() if r["chapter"] in BUILDERS}
    out = args.out or kb.records.spread_path(g["slug"])
    t0 = time.perf_counter()
    run = new_run(list(recs.values()))
    mods = load_kernels(sorted({n for b in BUILDERS.values() for n in b.kernels}))
    print(f"spread: kernels ready in {time.perf_counter() - t0:.0f} s", flush=True)
    failed = []
    for i, chapter in enumerate(BUILDERS, 1):
        t1 = time.perf_counter()
        try:
            timings = time_chapter(chapter, mods, recs[chapter]["variants"])
        except Exception:  # shown, and the other chapters still timed
            traceback.print_exc()
            failed.append(chapter)
            continue
        finally:
            torch.cuda.empty_cache()
        run["timings_ms"].update({f"{chapter}/{v}": t for v, t in timings.items()})
        print(f"spread: [{i}/{len(BUILDERS)}] {chapter}: {len(timings)} variants built and timed in "
              f"{time.perf_counter() - t1:.0f} s ({time.perf_counter() - t0:.0f} s so far)", flush=True)
    n = kb.records.append_run(run, out)
    report(out, run)
    print(f"\nspread: run {n} (pid {run['pid']}) appended to {out} in {time.perf_counter() - t0:.0f} s"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
