#!/usr/bin/env python3
"""One GPU call for the P73 capstone: build the kernel variants, check them against float64, time everything.

    python dev/p73.py [--out DIR] [--no-compile] [--variants default,sync]

Builds every variant of kernels/conv_bn_scale in SWEEP (in parallel, while the baselines run), checks each
against float64 on P73 and on odd shapes (training: output and running statistics; eval: the folded conv),
times eager / torch.compile (PyTorch's default TF32 convolutions, and TF32 off) / cuDNN on folded weights /
ours / the generated solution, runs the KernelBench-style check of the solution, and prints a summary.
With --out, writes DIR/dev_p73.json. Exit status 1 if any check failed. Meant to take < 3 minutes on an H200.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import os
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# name → -D defines for kernels/conv_bn_scale.cu (tests/test_conv_bn_scale.py checks each compiles spill-free).
SWEEP: dict[str, dict[str, int]] = {
    "default": {},                                                      # 2 rows/thread, cp.async, 2 blocks/SM
    "sync": {"KB_CBS_ASYNC": 0},                                        # same, ordinary loads for staging
    "rpt1": {"KB_CBS_RPT": 1, "KB_CBS_MIN_BLOCKS": 3},                  # chapter 2's shape + double buffering
    "rpt1_sync": {"KB_CBS_RPT": 1, "KB_CBS_MIN_BLOCKS": 3, "KB_CBS_ASYNC": 0},
    "rpt3": {"KB_CBS_RPT": 3, "KB_CBS_MIN_BLOCKS": 1},                  # 96 accumulators, 1 block/SM
}

CHAPTER = "06_capstone_conv_bn_scale"
FLOP = 2 * 9_364_045_824          # P73's convolution: MACs × 2
OUT_BYTES = 128 * 64 * 126 * 126 * 4
failures: list[str] = []


def log(msg: str, t0: float = time.perf_counter()) -> None:
    print(f"[{time.perf_counter() - t0:6.1f}s] {msg}", flush=True)


def guarded(what: str):
    """Run a stage; on an exception print it, record a failure and carry on."""
    def deco(fn):
        def run(*a, **k):
            try:
                return fn(*a, **k)
            except Exception as e:  # noqa: BLE001 — one broken stage must not hide the others' results
                failures.append(f"{what}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
                print(f"!! {what} FAILED:\n{traceback.format_exc()[-3000:]}", flush=True)
                return None
        return run
    return deco


def bench(fn, variant: str) -> dict:
    """Median / q20 / q80 ms, L2 flushed (kb.timing.bench; without nvtx installed, do_bench alone)."""
    import kernelbook as kb

    try:
        import nvtx  # noqa: F401

        return kb.timing.bench(fn, CHAPTER, variant)
    except ImportError:
        from triton.testing import do_bench

        med, q20, q80 = do_bench(fn, warmup=25, rep=100, quantiles=list(kb.timing.QUANTILES))
        return {"median": med, "q20": q20, "q80": q80}


def load_solution():
    spec = importlib.util.spec_from_file_location("solution_p73", ROOT / "solutions" / "73_Conv2d_BatchNorm_Scaling.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod._ext()
    return mod


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile baselines")
    ap.add_argument("--variants", default=",".join(SWEEP))
    args = ap.parse_args()

    import torch
    import torch.nn.functional as F

    import kernelbook as kb
    from kernelbook import check

    torch.set_grad_enabled(False)  # the kernels are forward-only: their bindings refuse tensors that need grad
    g = kb.gpu()
    log(f"device: {g}  torch {torch.__version__}  kernelbook from {kb.__file__}")
    variants = [v for v in args.variants.split(",") if v]
    pool = ThreadPoolExecutor(len(variants) + 1)
    builds = {v: pool.submit(kb.build.load, "conv_bn_scale", None, False, SWEEP[v]) for v in variants}
    sol_future = pool.submit(load_solution)

    results: dict = {"device": g, "torch": torch.__version__, "timings_ms": {}, "errors": {}, "variants": {}}
    T, E = results["timings_ms"], results["errors"]
    torch.backends.cudnn.benchmark = True
    prob = kb.problems.P73_CONV_BN_SCALE
    model = prob.model(seed=0).cuda()                 # training mode, as the benchmark runs it
    x = prob.inputs(seed=1, device="cuda")
    with torch.no_grad():
        ref64 = copy.deepcopy(model).double()
        y64_train = ref64(x.double())                 # ref64's running stats are now one step on
        m_eval = copy.deepcopy(model).eval()
        y64_eval = copy.deepcopy(m_eval).double()(x.double())
        w_f, b_f = kb.folding.fold(m_eval.conv, m_eval.bn, 2.0, dtype=torch.float64)
    log("float64 references ready")

    def err(out, ref):
        return kb.check.report(out, ref, 1.0)["rel_err"]

    @guarded("baselines")
    def baselines():
        with torch.no_grad():
            m_tr, m_ev = copy.deepcopy(model), copy.deepcopy(m_eval)
            for tf32 in (True, False):
                torch.backends.cudnn.allow_tf32 = tf32
                sfx = "" if tf32 else "_fp32"
                T["eager_train" + sfx] = bench(lambda: m_tr(x), "eager_train" + sfx)
                E["eager_train" + sfx] = err(m_tr(x), y64_train)
                T["eager_eval" + sfx] = bench(lambda: m_ev(x), "eager_eval" + sfx)
                E["eager_eval" + sfx] = err(m_ev(x), y64_eval)
                name = "cudnn_folded_" + ("tf32" if tf32 else "fp32")
                T[name] = bench(lambda: F.conv2d(x, w_f, b_f), name)
                E[name] = err(F.conv2d(x, w_f, b_f), y64_eval)
            torch.backends.cudnn.allow_tf32 = True
        log("eager and cuDNN timed")

    @guarded("torch.compile")
    def compiled():
        with torch.no_grad():
            c_tr, c_ev = torch.compile(copy.deepcopy(model)), torch.compile(copy.deepcopy(m_eval))
            for tf32 in (True, False):  # PyTorch's default is TF32 convolutions (cudnn.allow_tf32 = True)
                torch.backends.cudnn.allow_tf32 = tf32
                sfx = "" if tf32 else "_fp32"
                for name, fn, ref in (("compile_train" + sfx, c_tr, y64_train), ("compile_eval" + sfx, c_ev, y64_eval)):
                    E[name] = err(fn(x), ref)  # the first call compiles
                    T[name] = bench(lambda fn=fn: fn(x), name)
                    log(f"{name}: {T[name]['median']:.3f} ms, error {E[name]:.1e}")
            torch.backends.cudnn.allow_tf32 = True

    baselines()
    if not args.no_compile:
        compiled()

    @guarded("variant")
    def variant(name: str):
        mod = builds[name].result()
        info = {"defines": SWEEP[name], "config": list(mod.config())}
        # odd shapes, training (3 steps, momentum None) and eval
        from torch import nn
        for n, c_in, h, w, c_out in [(1, 8, 33, 97, 64), (4, 3, 32, 32, 16), (2, 19, 9, 130, 5), (2, 8, 17, 300, 100)]:
            torch.manual_seed(n + c_in + h + w)
            r64 = nn.ModuleDict({"conv": nn.Conv2d(c_in, c_out, 3), "bn": nn.BatchNorm2d(c_out, momentum=None)})
            r64 = r64.cuda().double()
            ours = copy.deepcopy(r64).float()
            for step in range(3):
                xs = check.rand((n, c_in, h, w), seed=step, device="cuda")
                c, b = ours["conv"], ours["bn"]
                y = mod.conv_bn_scale_train(xs, c.weight, c.bias, b.weight, b.bias, b.running_mean, b.running_var,
                                            b.num_batches_tracked, None, b.eps, 2.0,
                                            strategy="inplace" if step == 1 else "auto")
                with torch.no_grad():
                    y_ref = r64["bn"](r64["conv"](xs.double())) * 2.0
                check.assert_close(y, y_ref, 1e-4, what=f"{name} train {n, c_in, h, w, c_out} step {step}")
                check.assert_close(b.running_var, r64["bn"].running_var, 1e-4, what=f"{name} running_var")
            with torch.no_grad():
                ye = mod.conv_bn_scale_eval(xs, c.weight, c.bias)
                check.assert_close(ye, F.conv2d(xs.double(), c.weight.double(), c.bias.double()), 1e-5,
                                   what=f"{name} eval conv {n, c_in, h, w, c_out}")
        # P73: training step from the benchmark's initial state, and eval on folded weights
        m = copy.deepcopy(model)
        out = check.poisoned(y64_train.shape, device="cuda")
        run_tr = lambda: mod.conv_bn_scale_train(x, m.conv.weight, m.conv.bias, m.bn.weight, m.bn.bias,  # noqa: E731
                                                 m.bn.running_mean, m.bn.running_var, m.bn.num_batches_tracked,
                                                 0.1, m.bn.eps, 2.0, out)
        run_tr()
        info["train_err"] = check.assert_close(out, y64_train, 1e-5, what=f"{name} P73 train")["rel_err"]
        info["running_mean_err"] = check.assert_close(m.bn.running_mean, ref64.bn.running_mean, 1e-5,
                                                      what=f"{name} running_mean")["rel_err"]
        info["running_var_err"] = check.assert_close(m.bn.running_var, ref64.bn.running_var, 1e-5,
                                                     what=f"{name} running_var")["rel_err"]
        wf32, bf32 = w_f.float(), b_f.float()
        out.fill_(float("nan"))
        mod.conv_bn_scale_eval(x, wf32, bf32, out)
        info["eval_err"] = check.assert_close(out, y64_eval, 1e-5, what=f"{name} P73 eval")["rel_err"]
        T[f"ours_train[{name}]"] = bench(run_tr, f"ours_train[{name}]")
        m2 = copy.deepcopy(model)
        run_ip = lambda: mod.conv_bn_scale_train(x, m2.conv.weight, m2.conv.bias, m2.bn.weight, m2.bn.bias,  # noqa: E731
                                                 m2.bn.running_mean, m2.bn.running_var, m2.bn.num_batches_tracked,
                                                 0.1, m2.bn.eps, 2.0, out, strategy="inplace")
        run_ip()
        info["train_inplace_err"] = check.assert_close(out, y64_train, 1e-5,
                                                       what=f"{name} P73 train inplace")["rel_err"]
        T[f"ours_train_inplace[{name}]"] = bench(run_ip, f"ours_train_inplace[{name}]")
        if name == variants[0]:
            try:
                tab = kb.profile.kernels({"moments": run_tr, "inplace": run_ip}, CHAPTER, repeat=5)
                print(tab.to_string(), flush=True)
                results["kernels"] = tab.to_dict(orient="records")
            except Exception as e:  # noqa: BLE001
                print("profile failed:", e)
        T[f"ours_eval[{name}]"] = bench(lambda: mod.conv_bn_scale_eval(x, wf32, bf32, out), f"ours_eval[{name}]")
        info["train_minus_eval_ms"] = T[f"ours_train[{name}]"]["median"] - T[f"ours_eval[{name}]"]["median"]
        results["variants"][name] = info
        log(f"{name}: train {T[f'ours_train[{name}]']['median']:.3f} ms (err {info['train_err']:.1e}), "
            f"eval {T[f'ours_eval[{name}]']['median']:.3f} ms (err {info['eval_err']:.1e}), config {info['config']}")

    for v in variants:
        variant(v)

    @guarded("solution")
    def solution():
        sol = sol_future.result()
        torch.manual_seed(42)
        ref = prob.module(*prob.init_args).cuda()
        torch.manual_seed(42)
        new = sol.ModelNew(*prob.init_args).cuda()
        with torch.no_grad():
            for trial in range(5):  # KernelBench's check: same seed, 5 trials, modules reused, training mode
                torch.manual_seed(trial)
                xt = torch.rand(prob.input_shape, device="cuda")
                assert torch.allclose(new(xt), ref(xt), atol=1e-2, rtol=1e-2), f"solution: trial {trial}"
            T["solution_train"] = bench(lambda: new(x), "solution_train")
            new.load_state_dict(model.state_dict())  # y64_train's weights (the seeded module's are others)
            new.train()
            E["solution_train"] = err(new(x), y64_train)
            new.load_state_dict(m_eval.state_dict())
            new.eval()
            E["solution_eval"] = err(new(x), y64_eval)
            T["solution_eval"] = bench(lambda: new(x), "solution_eval")
        assert E["solution_train"] <= 1e-5 and E["solution_eval"] <= 1e-5, "solution: error against float64"
        log(f"solution: KernelBench-style check passed; train {T['solution_train']['median']:.3f} ms, "
            f"eval {T['solution_eval']['median']:.3f} ms")

    solution()

    # ---- summary ----
    print("\nvariant                          median ms   q20–q80          error vs float64")
    for k, t in sorted(T.items(), key=lambda kv: kv[1]["median"]):
        e = E.get(k)
        if e is None and k.startswith("ours_"):
            vi = results["variants"].get(k[k.index("[") + 1:-1], {})
            e = vi.get("train_err" if k.startswith("ours_train") else "eval_err")
        print(f"{k:32s} {t['median']:9.3f}   {t['q20']:.3f}–{t['q80']:.3f}   {e if e is None else f'{e:.1e}'}")
    ours_tr = {k: t["median"] for k, t in T.items() if k.startswith("ours_train")}
    ours_ev = {k: t["median"] for k, t in T.items() if k.startswith("ours_eval")}
    base_tr = {k: t["median"] for k, t in T.items() if k.split("_")[0] in ("eager", "compile") and "train" in k}
    base_ev = {k: t["median"] for k, t in T.items() if k.startswith(("eager_eval", "compile_eval", "cudnn"))}
    if ours_tr and ours_ev:
        btr, bev = min(ours_tr, key=ours_tr.get), min(ours_ev, key=ours_ev.get)
        summary = {
            "best_train": btr, "best_train_ms": ours_tr[btr], "target_train_ms": 0.80,
            "best_eval": bev, "best_eval_ms": ours_ev[bev], "target_eval_ms": 0.45,
            "eval_tflops": kb.timing.tflops(FLOP, ours_ev[bev]),
            "fastest_train_baseline": min(base_tr, key=base_tr.get) if base_tr else None,
            "fastest_eval_baseline": min(base_ev, key=base_ev.get) if base_ev else None,
        }
        summary["train_beats_baselines"] = all(ours_tr[btr] < v for v in base_tr.values())
        summary["eval_beats_baselines"] = all(ours_ev[bev] < v for v in base_ev.values())
        results["summary"] = summary
        print(f"\nbest train {btr}: {ours_tr[btr]:.3f} ms (target 0.80; beats every baseline: "
              f"{summary['train_beats_baselines']}; fastest baseline {summary['fastest_train_baseline']})")
        print(f"best eval  {bev}: {ours_ev[bev]:.3f} ms = {summary['eval_tflops']:.1f} TFLOP/s (target 0.45; "
              f"beats every baseline: {summary['eval_beats_baselines']}; "
              f"fastest baseline {summary['fastest_eval_baseline']})")
        print(f"output write at 4.2 TB/s alone: {OUT_BYTES / 4.2e9:.3f} ms; in-place normalise (read + write): "
              f"{2 * OUT_BYTES / 4.2e9:.3f} ms")
    results["failures"] = failures
    print("\nFAILURES:\n  " + "\n  ".join(failures) if failures else "\nall checks passed")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "dev_p73.json").write_text(json.dumps(results, indent=1, default=str))
        log(f"wrote {args.out / 'dev_p73.json'}")
    pool.shutdown(wait=False)
    return 1 if failures else 0


if __name__ == "__main__":
    os.environ.setdefault("KERNELBOOK_CACHE", "/tmp/kbcache")
    sys.exit(main())
