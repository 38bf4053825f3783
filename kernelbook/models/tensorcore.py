"""Chapter 6's model: TF32 rounding and the 3xTF32 split, emulated on the CPU, and the chapter's
GPU plumbing (the checks, the Nsight Compute counters and the script they are read from); also the
counters chapter 7 reads for its tensor-core convolution.

TF32 keeps float32's sign and 8 exponent bits and the top 10 of its 23 mantissa bits. The GPU's
``cvt.rna.tf32.f32`` rounds to the nearest TF32 value, ties away from zero; ``to_tf32`` does the same
to a float32 tensor with integer operations on its bits, so every CPU experiment here rounds exactly
as the kernel does.
"""

from __future__ import annotations

import torch

from .gn_mean import STALL, STALLS  # the stall reasons Nsight Compute reports, as chapter 8 reads them

TF32_MANTISSA_BITS = 10
TF32_UNIT_ROUNDOFF = 2.0 ** -(TF32_MANTISSA_BITS + 1)  # half an ulp at 1: 2^-11 ≈ 4.9e-4
DROPPED = 13  # float32 mantissa bits TF32 does not keep


def to_tf32(x: torch.Tensor) -> torch.Tensor:
    """``x`` (float32) rounded to the nearest TF32 value, ties away from zero (as ``cvt.rna``); the
    result is a float32 tensor whose low 13 mantissa bits are zero. Infinities and NaNs pass through."""
    if x.dtype != torch.float32:
        raise TypeError(f"to_tf32 takes float32, got {x.dtype}")
    bits = x.contiguous().view(torch.int32)
    half = 1 << (DROPPED - 1)
    rounded = (bits + half) & ~((1 << DROPPED) - 1)  # magnitude bits round up at half: ties away from zero
    finite = (bits & 0x7F800000) != 0x7F800000
    return torch.where(finite, rounded, bits).view(torch.float32)


def split(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x = hi + lo (up to a rounding of lo): hi = x rounded to TF32, lo = the remainder rounded to TF32."""
    hi = to_tf32(x)
    return hi, to_tf32(x - hi)


def product_errors(ks, trials: int = 64, seed: int = 0, shift: float = 0.0):
    """Relative error of dot products of length k (uniform inputs in [-1, 1), the first operand shifted by
    ``shift``), against the exact float64 result, for each way of forming the products:

    * ``tf32``: hi_a·hi_b, what plain TF32 tensor cores multiply;
    * ``3xtf32``: hi_a·hi_b + hi_a·lo_b + lo_a·hi_b (the split, lo_a·lo_b dropped);
    * ``4xtf32``: all four products (what dropping lo_a·lo_b costs);
    * ``fp32``: float32 products and float32 sums in order (a CPU's FMA-free loop, for scale).

    The TF32 variants' products are exact in float64 (11-bit × 11-bit significands) and summed in float64,
    so their error is the split's alone. Returns one row per k: the largest error over the trials,
    relative to Σ|a·b| (the scale a dot product's rounding error is measured against)."""
    import pandas as pd

    g = torch.Generator().manual_seed(seed)
    rows = []
    for k in ks:
        a = (torch.rand(trials, k, generator=g) * 2 - 1 + shift).float()
        b = (torch.rand(trials, k, generator=g) * 2 - 1).float()
        exact = (a.double() * b.double()).sum(1)
        scale = (a.double() * b.double()).abs().sum(1)
        (ah, al), (bh, bl) = split(a), split(b)
        ah, al, bh, bl = (t.double() for t in (ah, al, bh, bl))
        sums = {"tf32": (ah * bh).sum(1), "3xtf32": (ah * bh + ah * bl + al * bh).sum(1),
                "4xtf32": (ah * bh + ah * bl + al * bh + al * bl).sum(1)}
        acc, prod = torch.zeros(trials, dtype=torch.float32), a * b  # float32 products
        for i in range(k):  # float32 adds, in order: k roundings
            acc = acc + prod[:, i]
        sums["fp32"] = acc.double()
        rows.append({"k": k, **{n: float(((v - exact).abs() / scale).max()) for n, v in sums.items()}})
    return pd.DataFrame(rows).set_index("k")


def truncate_tf32(x: torch.Tensor) -> torch.Tensor:
    """``x`` (float32) with its low 13 mantissa bits cleared: what a tensor core does to an operand's raw float32
    bits (the chapter's probe shows it), a truncation toward zero."""
    if x.dtype != torch.float32:
        raise TypeError(f"truncate_tf32 takes float32, got {x.dtype}")
    return (x.contiguous().view(torch.int32) & ~((1 << DROPPED) - 1)).view(torch.float32)


def split_bound(truncated: int = 0) -> float:
    """The split's worst relative error per product, to first order, as the chapter derives it: with
    u = 2^-11, |r_a·r_b| ≤ u²|ab| (the dropped product of the remainders r = a − hi) plus, for each lo,
    its own rounding error times the other operand's hi: at most half an ulp of lo, u²/2 of |ab|, when lo
    is rounded to nearest, and less than a whole ulp, u², when it is truncated. ``truncated``: how many of
    the two lo parts are truncated — 0: 2u² ≈ 4.8e-7; 1: 2.5u² (against float32's own 2^-24 ≈ 6.0e-8)."""
    if truncated not in (0, 1, 2):
        raise ValueError(f"truncated counts lo parts: 0, 1 or 2, got {truncated}")
    return (1 + 0.5 * (2 - truncated) + truncated) * TF32_UNIT_ROUNDOFF ** 2


SPLIT_INPUTS = {"uniform [−1, 1)": (-1.0, 1.0, False), "2⁻²⁰ to 2²⁰, log-uniform": (-20.0, 20.0, True),
                "1 to 1 + 2⁻¹⁰": (1.0, 1 + 2**-10, False)}  # the last: near a binade's start, the worst case


def split_check(n: int = 1 << 20, seed: int = 0):
    """The per-product bound (``split_bound``) checked on the CPU: the worst relative error of
    hi_a·hi_b + hi_a·lo_b + lo_a·hi_b against the exact a·b over ``n`` random float32 pairs per input
    class (``SPLIT_INPUTS``), with both lo parts rounded to nearest (``split``, as the GEMM kernel does)
    and with b's lo truncated (as the capstones' tensor-core kernels leave it); in units of 2^-22 (u²),
    beside the bound. Products of TF32 values and of float32 values are exact in float64."""
    import pandas as pd

    g = torch.Generator().manual_seed(seed)

    def draw(lo: float, hi: float, log: bool) -> torch.Tensor:
        x = torch.rand(n, generator=g, dtype=torch.float64) * (hi - lo) + lo
        if log:  # magnitudes spread over 2^lo … 2^hi, both signs
            x = torch.exp2(x) * torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0).double()
        return x.float()

    u2 = TF32_UNIT_ROUNDOFF ** 2
    ways = {"lo rounded to nearest (both)": (to_tf32, 0), "b's lo truncated": (truncate_tf32, 1)}
    rows = {w: {} for w in ways}
    for name, spec in SPLIT_INPUTS.items():
        a, b = draw(*spec), draw(*spec)
        ah, bh = to_tf32(a), to_tf32(b)
        al = to_tf32(a - ah).double()
        exact = a.double() * b.double()
        for w, (lo_b, _) in ways.items():
            bl = lo_b(b - bh).double()
            got = ah.double() * bh.double() + ah.double() * bl + al * bh.double()
            rows[w][name] = float(((got - exact).abs() / exact.abs()).max()) / u2
    out = pd.DataFrame(rows).T.rename_axis("lo parts")
    out["bound"] = [split_bound(t) / u2 for _, t in ways.values()]
    return out


def idea_glue(worst, errs, shifted) -> dict:
    """The numbers the Idea section quotes: the worst split products of ``split_check`` (``worst``: its
    observed maxima per way of rounding lo, in units of 2^-22), the derived bounds, and the dot-product errors
    of ``product_errors`` at k = 1,024 (``errs``; ``shifted``: with a shifted by 1,000)."""
    from ..harness.check import FP32_UNIT_ROUNDOFF

    e1k = errs.loc[1024]
    return {"rn_worst": worst.iloc[0], "tr_worst": worst.iloc[1], "split_bound": split_bound(),
            "split_bound_tr": split_bound(1), "bound_over_u": split_bound() / FP32_UNIT_ROUNDOFF,
            "cpu_tf32_1k": e1k["tf32"], "cpu_3x_1k": e1k["3xtf32"], "cpu_fp32_1k": e1k["fp32"],
            "cpu_4x_1k": e1k["4xtf32"], "cpu_3x_shift_1k": shifted.loc[1024, "3xtf32"],
            "cpu_4x_shift_1k": shifted.loc[1024, "4xtf32"]}


def gemm_flop(m: int, n: int, k: int) -> int:
    """The useful FLOP of C = A·B: a multiply-add per (row, column, k), 2 FLOP each."""
    return 2 * m * n * k


def gemm_bytes(m: int, n: int, k: int) -> int:
    """Least DRAM bytes of C = A·B in float32: A and B read once, C written once."""
    return 4 * (m * k + k * n + m * n)


VERSIONS = {  # version → what it changed (kernels/gemm_3xtf32.cu says how)
    1: "split each fragment as loaded; three products chained on one accumulator over K",
    2: "each 8-deep step from zero, joined to the accumulator by an FADD",
    3: "split once per element, as the slab is staged, into (hi, lo) pairs",
    4: "the independent steps interleaved in issue order",
    5: "hi and lo in separate planes; A's fragments by ldmatrix",
}

WGMMA_VERSIONS = {  # Hopper's path (kernels/gemm_wgmma.cu): the TMA fills shared memory, wgmma reads it
    "w1": "wgmma from shared memory filled by the TMA; one accumulator over K",
    "w2": "each 32-deep slab into a fresh accumulator, joined by FADDs",
}

CHECK_SHAPES = [(256, 256, 256), (130, 132, 36), (1, 4, 4), (37, 12, 20), (129, 260, 1028), (4096, 64, 72)]


def check_versions(mod, shapes=CHECK_SHAPES, seed: int = 0, wg=None) -> list[dict]:
    """Every version in 3xTF32, and plain TF32, against float64 on ``shapes``, beside cuBLAS's float32
    product of the same inputs: one row per shape and version (1–5; "w1", "w2" through ``wg``, the gemm_wgmma
    module, where given), errors relative to the largest |ref|."""
    from ..harness import check, precision

    rows = []
    for m, n, k in shapes:
        a = check.rand([m, k], seed=seed + m + k, device="cuda", low=-1, high=1)
        b = check.rand([k, n], seed=seed + n + 7 * k, device="cuda", low=-1, high=1)
        ref = a.double() @ b.double()
        with precision.tf32(conv=False, matmul=False):
            fp32 = check.report(a @ b, ref, tol=1.0)["rel_err"]
        for version in VERSIONS:
            r3, r1 = (check.report(mod.gemm_tf32(a, b, p, version), ref, tol=1.0) for p in (3, 1))
            rows.append({"shape": f"{m}×{n}×{k}", "version": version, "3xTF32": r3["rel_err"], "TF32": r1["rel_err"],
                         "cuBLAS float32": fp32, "3xTF32 max abs": r3["max_abs_err"]})
        for name in WGMMA_VERSIONS if wg is not None else ():
            r3, r1 = (check.report(wg.gemm(a, b, p, int(name[1])), ref, tol=1.0) for p in (3, 1))
            rows.append({"shape": f"{m}×{n}×{k}", "version": name, "3xTF32": r3["rel_err"], "TF32": r1["rel_err"],
                         "cuBLAS float32": fp32, "3xTF32 max abs": r3["max_abs_err"]})
    return rows


def error_growth(mod, cutlass=None, ks=(64, 512, 2048, 8192), mn: int = 256, seed: int = 5, wg=None) -> list[dict]:
    """Relative error against float64 of the chained (v1) and per-step (v5) 3xTF32 products, of cuBLAS in
    float32, (given the ``cutlass_gemm`` module) of CUTLASS's 3xTF32 GEMM and (given ``wg``, gemm_wgmma) of the
    wgmma versions, as K grows (M = N = ``mn``)."""
    from ..harness import check, precision

    rows = []
    for k in ks:
        a = check.rand([mn, k], seed=seed + k, device="cuda", low=-1, high=1)
        b = check.rand([k, mn], seed=seed + 2 * k, device="cuda", low=-1, high=1)
        ref = a.double() @ b.double()
        with precision.tf32(conv=False, matmul=False):
            fp32 = a @ b
        outs = [("v1 chained", mod.gemm_tf32(a, b, 3, 1)), ("v5 per step", mod.gemm_tf32(a, b, 3, 5)),
                ("cuBLAS float32", fp32)]
        if cutlass is not None:
            outs.append(("CUTLASS 3xTF32", cutlass.cutlass_gemm(a, b, 3, 0)))
        if wg is not None:
            outs += [("w1 chained", wg.gemm(a, b, 3, 1)), ("w2 per slab", wg.gemm(a, b, 3, 2))]
        rows.append({"k": k, **{name: check.report(out, ref, tol=1.0)["rel_err"] for name, out in outs}})
    return rows


# One m16n8k8 on chosen values (kernels/mma_probe.cu): what the tensor core does to an operand's low bits and
# how it rounds a sum. Each case: A's first row holds `terms` copies of a, B's first column ones, C[0, 0] = c.
PROBE_CASES = {
    "operand 1 + 2⁻¹¹ + 2⁻¹³ (× 1)": (1 + 2**-11 + 2**-13, 0.0, 1),
    "sum 1 + 1.5·2⁻²⁴": (3 * 2**-25, 1.0, 1),
    "sum −1 − 1.5·2⁻²⁴": (-3 * 2**-25, -1.0, 1),
    "sum 1 − 2⁻²⁶": (-(2**-26), 1.0, 1),
    "sum 1 + 8 × 2⁻²⁵": (2**-25, 1.0, 8),
    "sum 1 + 8 × 2⁻²⁶": (2**-26, 1.0, 8),
}


def probe(pr) -> list[dict]:
    """Each PROBE_CASES case through one TF32 mma: the exact value, float32's nearest, and the mma's result with
    the operands' float32 bits as they are and with cvt.rna first (``pr``: the mma_probe module)."""
    rows = []
    for name, (a_val, c_val, terms) in PROBE_CASES.items():
        a, b, c = torch.zeros(16, 8, device="cuda"), torch.zeros(8, 8, device="cuda"), torch.zeros(16, 8, device="cuda")
        a[0, :terms], b[:terms, 0], c[0, 0] = a_val, 1.0, c_val
        exact = float(torch.tensor(a_val, dtype=torch.float64) * terms + c_val)
        rows.append({"case": name, "exact": exact, "float32 nearest": float(torch.tensor(exact)),
                     "mma, raw bits": float(pr.mma_probe(a, b, c, False)[0, 0]),
                     "mma, cvt.rna": float(pr.mma_probe(a, b, c, True)[0, 0])})
    return rows


def mma_sum_model(addends, width: int = 25) -> float:
    """One mma's float32 accumulation as the probe finds it: every addend (the products and C) is aligned to
    the largest and cut toward zero ``width`` bits below that one's leading bit, and the sum of what is left
    is cut toward zero to float32. Exact in float64 for the probe's few addends."""
    import math

    top = max((math.frexp(x)[1] for x in addends if x != 0), default=None)
    if top is None:
        return 0.0
    q = 2.0 ** (top - 1 - width)  # frexp: 2^(e-1) <= |x| < 2^e
    s = sum(math.trunc(x / q) * q for x in addends)
    if s == 0:
        return 0.0
    ulp = 2.0 ** (math.frexp(s)[1] - 1 - 23)  # float32 keeps 23 bits after the leading one
    return math.trunc(s / ulp) * ulp


def probe_model(conv=truncate_tf32, width: int = 25) -> dict[str, float]:
    """Each PROBE_CASES case as ``mma_sum_model`` predicts it, the operand first converted by ``conv``
    (``truncate_tf32``: raw float32 bits; ``to_tf32``: after cvt.rna)."""
    out = {}
    for name, (a_val, c_val, terms) in PROBE_CASES.items():
        a = float(conv(torch.tensor([a_val], dtype=torch.float32))[0])
        out[name] = mma_sum_model([c_val] + [a] * terms, width)
    return out


def probe_misses(rows: list[dict]) -> list[str]:
    """The probe's cases (``probe``'s rows) where the GPU's result differs from the model's, with raw bits or
    after cvt.rna: empty when the rule of ``mma_sum_model`` explains every row."""
    raw, rna = probe_model(truncate_tf32), probe_model(to_tf32)
    return [f"{r['case']} ({col})" for r in rows for col, model in (("mma, raw bits", raw), ("mma, cvt.rna", rna))
            if r[col] != model[r["case"]]]


def probe_glue(rows: list[dict]) -> dict[str, float]:
    """The probe's numbers the chapter quotes: the operand case, raw and rounded; the sums that show the
    truncation (with float32's nearest beside the first) and the cut before the sum; and what cutting the
    exact sum 1 − 2⁻²⁶ to float32 would give instead (the float32 below 1)."""
    r = {row["case"]: row for row in rows}
    op, up, down = r["operand 1 + 2⁻¹¹ + 2⁻¹³ (× 1)"], r["sum 1 + 1.5·2⁻²⁴"], r["sum −1 − 1.5·2⁻²⁴"]
    lost, kept, gone = r["sum 1 − 2⁻²⁶"], r["sum 1 + 8 × 2⁻²⁵"], r["sum 1 + 8 × 2⁻²⁶"]
    raw = "mma, raw bits"
    return {"probe_op_raw": op[raw], "probe_op_rna": op["mma, cvt.rna"], "probe_up": up[raw],
            "probe_up_rn": up["float32 nearest"], "probe_down": down[raw], "probe_lost": lost[raw],
            "probe_below": mma_sum_model([1.0, -(2.0**-26)], width=60), "probe_kept": kept[raw],
            "probe_gone": gone[raw]}


def mma_ceiling(pr, blocks: int, iters: int, seed: int = 0):
    """(function to time, FLOP, GHz): the varying-operand TF32 ceiling of kernels/mma_probe.cu, its FLOP per call,
    and the SM clock one call ran at by its own counters (median over blocks of clock64 cycles / ns)."""
    cfg = pr.ceiling_config()
    g = torch.Generator().manual_seed(seed)
    seeds = torch.randint(0, 2**31 - 1, (6 * cfg["threads"],), generator=g, dtype=torch.int32).cuda()
    flop = blocks * cfg["threads"] // 32 * iters * cfg["chains"] * 2 * cfg["macs_per_mma"]
    from ..harness.measure import clock_ghz

    return (lambda: pr.mma_ceiling(seeds, blocks, iters)), flop, clock_ghz(pr.mma_ceiling(seeds, blocks, iters)[1])


def wgmma_ceiling(wg, blocks: int, iters: int, seed: int = 0):
    """(function to time, FLOP, GHz) of kernels/gemm_wgmma.cu's ceiling: every warpgroup issues wgmma m64n256k8
    on its own random TF32 tiles in shared memory, nothing else; FLOP per call and the clock one call ran at."""
    cfg = wg.ceiling_config()
    g = torch.Generator().manual_seed(seed)
    seeds = torch.randint(1, 2**31 - 1, (cfg["threads"],), generator=g, dtype=torch.int32).cuda()
    flop = blocks * cfg["warpgroups"] * iters * cfg["products_per_round"] * 2 * cfg["macs_per_product"]
    from ..harness.measure import clock_ghz

    return (lambda: wg.wgmma_ceiling(seeds, blocks, iters)), flop, clock_ghz(wg.wgmma_ceiling(seeds, blocks, iters)[1])


def bad_inputs(mod) -> dict[str, str]:
    """What the binding says to each bad input (the message, or 'accepted')."""
    from ..harness.check import run_backward

    cuda = {"device": "cuda"}
    cases = {
        "K not a multiple of 4": lambda: mod.gemm_tf32(torch.ones(8, 6, **cuda), torch.ones(6, 8, **cuda)),
        "inner sizes differ": lambda: mod.gemm_tf32(torch.ones(8, 8, **cuda), torch.ones(4, 8, **cuda)),
        "a vector": lambda: mod.gemm_tf32(torch.ones(8, **cuda), torch.ones(8, 8, **cuda)),
        "float64": lambda: mod.gemm_tf32(torch.ones(8, 8, dtype=torch.float64, **cuda), torch.ones(8, 8, **cuda)),
        "CPU tensor": lambda: mod.gemm_tf32(torch.ones(8, 8), torch.ones(8, 8)),
        "misaligned": lambda: mod.gemm_tf32(torch.ones(65, **cuda)[1:].view(8, 8), torch.ones(8, 8, **cuda)),
        "transposed": lambda: mod.gemm_tf32(torch.ones(8, 12, **cuda).t(), torch.ones(8, 8, **cuda)),
        "version 6": lambda: mod.gemm_tf32(torch.ones(8, 8, **cuda), torch.ones(8, 8, **cuda), 3, 6),
        "a backward through it": lambda: run_backward(
            lambda: mod.gemm_tf32(torch.ones(8, 8, requires_grad=True, **cuda), torch.ones(8, 8, **cuda))),
    }
    out = {}
    for name, call in cases.items():
        try:
            call()
            out[name] = "accepted"
        except (RuntimeError, ValueError, TypeError) as e:
            out[name] = str(e).splitlines()[0]
    return out


NCU_METRICS = [
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
    "smsp__issue_active.avg.pct_of_peak_sustained_active",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
    "sm__inst_executed_pipe_tensor_op_hmma.sum",
    "sm__inst_executed_pipe_tensor_op_gmma.sum",
    "smsp__inst_executed.sum",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
]

# The script Nsight Compute runs: each profiled variant once, inside its NVTX range, on 4096³.
NCU_TARGET = """
import torch, kernelbook as kb
mod = kb.build.load("gemm_3xtf32")
a = kb.check.rand([4096, 4096], seed=1, device="cuda", low=-1, high=1)
b = kb.check.rand([4096, 4096], seed=2, device="cuda", low=-1, high=1)
sms = torch.cuda.get_device_properties(a.device).multi_processor_count
fns = {"mma_peak": lambda: mod.mma_peak(4 * sms, 1024, a.device),
       "v2_3xtf32": lambda: mod.gemm_tf32(a, b, 3, 2), "v5_3xtf32": lambda: mod.gemm_tf32(a, b, 3, 5),
       "cublas_tf32": lambda: a @ b}
wg = kb.build.load("gemm_wgmma")
if wg.available(a.device):  # Hopper's path, on sm_90 only
    fns |= {"w1_3xtf32": lambda: wg.gemm(a, b, 3, 1), "w2_3xtf32": lambda: wg.gemm(a, b, 3, 2)}
for variant, fn in fns.items():
    with kb.precision.tf32(conv=False, matmul=variant == "cublas_tf32"):
        with kb.timing.nvtx_range("06_tensor_cores", variant):
            fn()
torch.cuda.synchronize()
"""


# Why warps wait, for versions 2 and 5: Nsight Compute's warps stalled per issued instruction, by reason (the same
# reasons chapter 8 reads).
NCU_STALLS = [STALL.format(s) for s in STALLS]


def ncu_rows(rec: dict, chapter: str, variants: list[str]) -> None:
    """One Nsight Compute pass over ``NCU_TARGET``'s ``variants`` with ``NCU_METRICS`` and the stall reasons
    (``NCU_STALLS``), into ``rec``: the counters' rows under "ncu", the stall rows under "ncu_stalls". Should this
    ncu refuse a stall metric, the counters alone are collected again, "ncu_stalls" stays empty and ncu's words
    go under "ncu_stalls_error"."""
    from ..harness import profile

    try:
        found = profile.ncu(NCU_TARGET, chapter, variants, NCU_METRICS + NCU_STALLS)
    except RuntimeError as err:  # a stall metric this ncu does not know must not stop the chapter
        rec["ncu_stalls_error"] = str(err)[-500:]
        found = profile.ncu(NCU_TARGET, chapter, variants, NCU_METRICS)
    stall = found["metric"].isin(NCU_STALLS)
    rec["ncu"], rec["ncu_stalls"] = found[~stall].to_dict("records"), found[stall].to_dict("records")


def stall_table(rows: list[dict], variants=("v2_3xtf32", "v5_3xtf32"), top: int = 6):
    """Warps stalled per issued instruction, reason × variant (columns named v2, v5), for the ``top`` reasons
    largest in either variant (largest first; empty without rows)."""
    import pandas as pd

    if not rows:
        return pd.DataFrame()
    t = pd.DataFrame(rows).pivot_table(index="metric", columns="variant", values="value", aggfunc="sum")
    t = t.rename(index={STALL.format(s): s for s in STALLS})[list(variants)]
    t = t.loc[t.max(axis=1).sort_values(ascending=False).index[:top]]
    return t.rename(columns=lambda v: v.split("_")[0]).rename_axis("stalled for")  # v2_3xtf32 → v2


def stall_glue(rec: dict, nc, warps_per_scheduler: float) -> dict:
    """What the Profile quotes of a record's stall rows (``rec["ncu_stalls"]``, every reason) for versions 2
    and 5: version 2's fixed-latency stalls; version 5's math-pipe and fixed-latency stalls, its shared-memory
    stalls together (a full queue, a result awaited), all of its stalls and not-selected cycles summed, the
    cycles each of its warps takes per instruction issued, from its share of issue slots (``nc``:
    ``ncu_table``) and its warps per scheduler — that sum plus the issuing cycle, as a check."""
    rows = rec.get("ncu_stalls", [])
    if not rows:  # an ncu that refused the stall metrics: the prose shows nan
        return dict.fromkeys(["wait_v2", "mpt_v5", "wait_v5", "smem_v5", "stall_sum_v5", "issue_v5_frac",
                              "cyc_v5"], float("nan"))
    table, issue_pct = stall_table(rows, top=len(STALLS)), nc.loc["v5_3xtf32", "issue %"]
    v2, v5 = table["v2"], table["v5"]
    return {"wait_v2": v2["wait"], "mpt_v5": v5["math_pipe_throttle"], "wait_v5": v5["wait"],
            "smem_v5": v5["mio_throttle"] + v5["short_scoreboard"], "stall_sum_v5": v5.sum(),
            "issue_v5_frac": issue_pct / 100, "cyc_v5": warps_per_scheduler / (issue_pct / 100)}


SHORT_RESOURCES = {"registers": "regs", "smem_bytes": "static smem B", "stack_bytes": "stack B",
                   "spill_store_bytes": "spill st. B", "spill_load_bytes": "spill ld. B"}


def resources(arch: str = "90"):
    """The GEMM kernels' compiler report for sm_``arch`` (``kb.build.resources``), kernel × resource with short
    names, and what the chapter quotes of version 5's three-pass kernel and its PTX: (table, glue dict, the PTX's
    mma.sync instructions)."""
    import pandas as pd

    from ..harness import build, show

    res = pd.DataFrame(build.resources("gemm_3xtf32", arch))
    res["kernel"] = res["kernel"].map(show.kernel_name)
    ptx = build.ptx_instructions("gemm_3xtf32", "gemm_tf32_v5_kernelILi3E")
    mma_ops = [op for op in ptx if op.startswith("mma.sync")]
    v5 = res[res.kernel.str.contains("v5")]
    v34 = res[res.kernel.str.startswith("gemm_tf32_v3_kernel<3")]  # versions 3 and 4 (interleaved)
    three = res.set_index("kernel")["registers"]
    glue = {"ptx_mma": len(mma_ops), "regs_v5": v5.registers.max(), "spill_v5": v5.spill_store_bytes.max(),
            "stack_v5": v5.stack_bytes.max(), "spill_ld_v5": v5.spill_load_bytes.max(),
            "ptx_ldmatrix": ptx.count("ldmatrix.sync.aligned.m8n8.x4.shared.b16"),
            "regs_v1": three["gemm_tf32_kernel<3, 1>"], "regs_v2": three["gemm_tf32_kernel<3, 0>"],
            "regs_v34": v34.registers.max(), "spill_v34": v34.spill_store_bytes.max(),
            "spill_ld_v34": v34.spill_load_bytes.max()}
    return res.drop(columns=["arch"]).set_index("kernel").rename(columns=SHORT_RESOURCES), glue, mma_ops


def ncu_glue(nc, which: list[str]) -> dict:
    """The numbers the Profile section quotes from ``ncu_table``'s rows for ``which`` (the peak kernel, versions
    2 and 5, cuBLAS's TF32 GEMM, in that order): each one's tensor pipe, issue and warp slots, instructions per
    mma; the cycles a scheduler needs per mma at the peak's pace (its instructions per mma over its share of the
    issue slots); the share of issue slots version 5 would need to keep that pace, and the share of it version
    2's instruction count allows (its cap)."""
    npk, n2, n5, ncb = (nc.loc[v] for v in which)
    per = "instr. per TC"
    cycles = npk[per] / (npk["issue %"] / 100)  # issue cycles per mma at the peak rate
    return {"tp_v5": n5["tensor pipe %"], "tp_v2": n2["tensor pipe %"], "tp_peak": npk["tensor pipe %"],
            "issue_v5": n5["issue %"], "issue_v2": n2["issue %"], "issue_peak": npk["issue %"],
            "ipm_peak": npk[per], "cycles": cycles, "warps_v5": n5["warps %"], "ipm_v5": n5[per],
            "ipm_v2": n2[per], "need_v5": 100 * n5[per] / cycles, "cap_v2": 100 * cycles / n2[per],
            "tp_cublas": ncb["tensor pipe %"], "warps_cublas": ncb["warps %"],
            "bank_v5": n5["bank conflicts"], "tc_v5": n5["TC instr."],
            "issue_peak_frac": npk["issue %"] / 100}


def wgmma_ncu_glue(nc) -> dict:
    """What the chapter quotes of ``ncu_table``'s wgmma rows (w1, w2; NaN where not profiled): tensor pipe,
    issue slots, HGMMA instructions and warp instructions per tensor-core instruction."""
    out = {}
    for v in ("w1", "w2"):
        row = nc.loc[f"{v}_3xtf32"] if f"{v}_3xtf32" in nc.index else None
        for key, col in (("tp", "tensor pipe %"), ("issue", "issue %"), ("gmma", "HGMMA"),
                         ("ipm", "instr. per TC")):
            out[f"{key}_{v}"] = float("nan") if row is None else row[col]
    return out


def ncu_table(rows: list[dict]):
    """Nsight Compute's rows as variant × counter, with short names: % of cycles the tensor pipe was
    active, % of issue slots used, % of warp slots occupied, tensor-core instructions (HMMA for
    ``mma.sync``; the counter includes HGMMA, ``wgmma``'s, of which the next column says how many),
    shared-memory bank conflicts, and warp instructions issued per tensor-core instruction."""
    import pandas as pd

    rows = pd.DataFrame(rows)  # the wgmma versions' split pass is a kernel of its own: not the GEMM's
    rows = rows[~rows.get("kernel", pd.Series("", index=rows.index)).str.contains("split_planes")]
    t = rows.pivot_table(index="variant", columns="metric", values="value", aggfunc="sum")
    pct = ".avg.pct_of_peak_sustained_active"
    out = pd.DataFrame({
        "tensor pipe %": t["sm__pipe_tensor_op_hmma_cycles_active" + pct],
        "issue %": t["smsp__issue_active" + pct],
        "warps %": t["sm__warps_active" + pct],
        "TC instr.": t["sm__inst_executed_pipe_tensor_op_hmma.sum"],  # counts the HGMMA too
        "HGMMA": t["sm__inst_executed_pipe_tensor_op_gmma.sum"],
        "bank conflicts": t["l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum"],
    })
    out["instr. per TC"] = t["smsp__inst_executed.sum"] / out["TC instr."]
    return out


def mma3_rate() -> float:
    """FLOP/s of float32-accurate products on the tensor cores, as chapter 6 measured them: a third of the
    TF32 rate of its ``mma_peak`` kernel (``mma.sync`` on registers, nothing else), read from its record."""
    from ..harness import records

    ch8 = records.load("06_tensor_cores")
    flop, t = ch8["variants"]["mma_peak"]["counts"]["flop"], ch8["timings_ms"]["mma_peak"]["median"]
    return 1e3 * flop / t / 3


# The capstones' counters for a kernel's two paths, on the tensor cores and by FFMA: the pipes, issue and
# warp slots, instructions per mma, and why warps waited between issues.
PATH_NCU_METRICS = [*NCU_METRICS[:3], "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active",
                   "sm__inst_executed_pipe_tensor_op_hmma.sum", "smsp__inst_executed.sum",
                   *(STALL.format(s) for s in STALLS)]

def on_mma_sync(ext, x, fn):
    """``fn()`` with conv_bn_scale's tensor-core convolution forced onto ``mma.sync`` for the call (on an sm_90
    GPU it runs on ``wgmma``; the two give the same output bits): for comparisons."""
    ext = getattr(ext, "raw", ext)
    ext.conv_bn_scale_tc_instruction(x, mma_sync=True)
    try:
        return fn()
    finally:
        ext.conv_bn_scale_tc_instruction(x, mma_sync=False)


# The script Nsight Compute runs: each path once on P73, inside its NVTX range (on sm_90 the tensor-core
# convolution runs on wgmma, and again forced onto mma.sync).
P73_NCU_PATHS = ["ours_eval_tc", "ours_eval_tc_mma", "ours_eval"]
P73_NCU_TARGET = """
import torch, kernelbook as kb
torch.set_grad_enabled(False)  # nothing here needs a gradient
p73 = kb.problems.P73_CONV_BN_SCALE
mod, m = kb.build.load("conv_bn_scale"), p73.model(seed=0).cuda().eval()
x = p73.inputs(seed=1, device="cuda")
w, b = kb.folding.fold(m.conv, m.bn, 2.0)
eval_tc = lambda: mod.conv_bn_scale_eval(x, w, b, math="3xtf32")
paths = {"ours_eval_tc": eval_tc, "ours_eval_tc_mma": lambda: kb.tensorcore.on_mma_sync(mod, x, eval_tc),
         "ours_eval": lambda: mod.conv_bn_scale_eval(x, w, b, math="auto")}  # auto: FFMA in eval mode
for variant, fn in paths.items():
    fn()  # the first launch (opt-in, first touch) stays outside
    with kb.timing.nvtx_range("07_capstone_conv_bn_scale", variant):
        fn()
torch.cuda.synchronize()
"""

# What keeps P73's tensor-core convolution from its floor, by the instruction it issues (read from its counters on
# the H200: chapter 7's Profile).
P73_HELD_BY = {
    "wgmma": "the consumers' own instructions between the tensor core's steps (a tap's 64 additions, a share of "
             "the previous row's stores) from two consumer warps per scheduler",
    "mma.sync": "latency: too few warps resident (two blocks of 8 warps per SM; at 128 registers per thread no "
                "more fit) to cover the waits on dependent results",
}


def glue_instruction(instruction: str) -> None:
    """Glue, for chapter 7's prose, the instruction P73's tensor-core convolution issues (``tc_instr``) and what
    keeps it from its floor (``tc_held``)."""
    import kernelbook as kb

    kb.glue_md("tc_instr", f"`{instruction}`")
    kb.glue_md("tc_held", P73_HELD_BY[instruction])


def path_counters(rows: list[dict], order_by: str):
    """Nsight Compute's rows (``PATH_NCU_METRICS``) for a kernel's paths as counter × variant: % of cycles
    the tensor and FMA pipes were busy, % of issue slots used and of warp slots occupied, warp instructions
    per mma (where the tensor pipe worked), and, per issued instruction, the warps stalled for each reason,
    largest first for the variant ``order_by``."""
    import pandas as pd

    t = pd.DataFrame(rows).pivot_table(index="variant", columns="metric", values="value", aggfunc="sum")
    pct = ".avg.pct_of_peak_sustained_active"
    tensor = t["sm__pipe_tensor_op_hmma_cycles_active" + pct]
    out = pd.DataFrame({
        "tensor pipe %": tensor, "FMA pipe %": t["sm__pipe_fma_cycles_active" + pct],
        "issue %": t["smsp__issue_active" + pct], "warps %": t["sm__warps_active" + pct],
        "instr. / mma": (t["smsp__inst_executed.sum"] / t["sm__inst_executed_pipe_tensor_op_hmma.sum"])
        .where(tensor >= 1.0)})
    waits = pd.DataFrame({f"stalled: {s}": t[STALL.format(s)] for s in STALLS})
    return pd.concat([out, waits[waits.loc[order_by].sort_values(ascending=False).index]], axis=1).T


# ---- the chapter's figures ----

GROWTH_LABELS = {"v1 chained": "v1: one accumulator over all of K", "v5 per step": "v5: each step from zero",
                 "cuBLAS float32": "cuBLAS float32", "CUTLASS 3xTF32": "CUTLASS 3xTF32 (staged every 16)",
                 "w1 chained": "w1 (wgmma): one accumulator", "w2 per slab": "w2 (wgmma): each slab from zero"}


def plot_error_growth(ax, grow) -> None:
    """``error_growth``'s table (K → error per variant) on log axes, with the slopes of K and of √K drawn
    through the first points of the chained and the per-step versions."""
    from ..harness.plots import BASELINE, CEILING, OURS

    k = grow.index.to_numpy(dtype=float)
    style = {"w1 chained": dict(ls="--", marker="x", ms=8), "w2 per slab": dict(ls="--", marker="x", ms=8)}
    for col, colour in zip(GROWTH_LABELS, (BASELINE, OURS, CEILING, "#76b900", BASELINE, OURS), strict=True):
        if col in grow:
            ax.plot(k, grow[col], color=colour, label=GROWTH_LABELS[col], **style.get(col, dict(marker="o")))
    for col, power, ls, label in (("v1 chained", 1, "--", "∝ K"), ("v5 per step", 0.5, ":", "∝ √K")):
        ax.plot(k, grow[col].iloc[0] * (k / k[0]) ** power, ls=ls, lw=0.8, color="black", label=label)
    ax.set(xscale="log", yscale="log", xlabel="K (M = N = 256)", ylabel="relative error vs float64")
    ax.legend(fontsize=8)


CUTLASS_COLOUR = "#76b900"  # CUTLASS's kernels, in both of the chapter's figures


def rate_name(variant: str) -> str:
    """A variant of the 8192³ table as a figure names it: cuBLAS SGEMM, "ours, v5", "CUTLASS 3xTF32, 128×64"."""
    if variant.startswith("cutlass_"):
        _, math, tile = variant.split("_")
        return f"CUTLASS {math.replace('xtf', 'xTF').replace('tf32', 'TF32')}, {tile.replace('x', '×')}"
    if variant.startswith("ours_w"):
        return f"ours, {variant[5:]} (wgmma)"
    return variant.replace("eager_fp32", "cuBLAS SGEMM").replace("ours_", "ours, ")


def plot_rates(ax, tflops, lines: dict[str, float], hatched: frozenset[str] = frozenset()) -> None:
    """Horizontal bars of TFLOP/s per variant (``tflops``, a Series; cuBLAS grey, ours red, CUTLASS green),
    each labelled with its value, ``hatched`` variants (not float32-accurate) hatched and named in a legend, and
    a dotted vertical line per ceiling in ``lines`` (name → TFLOP/s), named beside it above the bars, each name
    on a row of its own and on a white ground (no line runs through it), to three significant figures as the
    chapter's prose gives them."""
    from matplotlib.patches import Patch

    from ..harness.plots import BASELINE, CEILING, OURS

    names = [rate_name(n) for n in tflops.index]
    colours = [BASELINE if n.startswith("cuBLAS") else CUTLASS_COLOUR if n.startswith("CUTLASS") else OURS
               for n in names]
    bars = ax.barh(names, tflops, color=colours)
    for bar, v in zip(bars, tflops.index, strict=True):
        if v in hatched:
            bar.set_hatch("///")
            bar.set_edgecolor("white")
    for y, v in enumerate(tflops):
        ax.text(v + 1, y, f"{v:.1f}", va="center", fontsize=9)
    for i, (name, x) in enumerate(sorted(lines.items(), key=lambda kv: kv[1])):  # one row each, lowest first
        ax.axvline(x, color=CEILING, ls=":", zorder=1)
        ax.text(x - 1, -0.9 - 0.8 * i, f"{name}: {x:.3g}", fontsize=9, ha="right", va="center", zorder=3,
                bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.5})
    if hatched & set(tflops.index):
        ax.legend(handles=[Patch(facecolor=OURS, hatch="///", edgecolor="white", label="not float32-accurate")],
                  loc="lower right", fontsize=8)
    ax.set_ylim(len(tflops) - 0.5, -0.6 - 0.8 * len(lines))  # top to bottom, rows for the ceilings' names
    ax.set_xlim(0, max(lines.values()) * 1.05)
    ax.set_xlabel("TFLOP/s (2·M·N·K / median time)")


def ceiling_clocks(pr, variants: dict, blocks: int, reps: int = 10) -> dict[str, float]:
    """The SM clock (GHz) each ceiling without its own clock counters ran at: each ``variants[name]``
    (kb.measure.Variant: cuBLAS's GEMMs, ``mma_peak``) runs ``reps`` times under its TF32 setting, and a short
    launch of the varying-operand ``mma.sync`` kernel follows on the same stream at once, reading its clock64
    cycles against the nanosecond timer (``kb.measure.clock_ghz``): the clock the GPU was at as the run ended."""
    from ..harness import precision
    from ..harness.measure import clock_ghz

    cfg = pr.ceiling_config()
    seeds = torch.randint(0, 2**31 - 1, (6 * cfg["threads"],), dtype=torch.int32, device="cuda")
    out = {}
    for name, v in variants.items():
        with precision.tf32(conv=False, matmul=bool(v.tf32_matmul)):
            for _ in range(reps):
                v.fn()
            out[name] = clock_ghz(pr.mma_ceiling(seeds, blocks, 512)[1])
    return out


# Each ceiling's row: its name, the instruction it issues, and the variant (or record) its rate comes from.
CEILINGS = [("FFMA (chapter 3)", "FFMA", "ffma"), ("cuBLAS float32", "FFMA", "eager_fp32"),
            ("cuBLAS TF32", "wgmma", "eager_tf32"), ("mma.sync TF32, constant operands", "mma.sync", "mma_peak"),
            ("mma.sync TF32, varying (the ceiling)", "mma.sync", "mma_ceiling"),
            ("wgmma TF32, varying (the ceiling)", "wgmma", "wgmma_ceiling")]


def ceilings_table(ch3: dict, t_ceil, rec: dict):
    """The rates a float32-accurate product can reach on this GPU, from chapter 3's FFMA record and this chapter's
    timed ceilings (``t_ceil``: kb.measure.run's table), each with the instruction it issues and the SM clock it
    ran at — "(own)": by its own counters (FFMA, the varying-operand mma.sync and wgmma kernels), "(after)": read
    right after its run (``rec["ceiling_clocks_ghz"]``, ``ceiling_clocks``), or "not in this record": (table, glue
    dict, FFMA
    TFLOP/s, the mma.sync ceiling ÷ 3). The mma.sync TF32 ceiling is the varying-operand kernel's."""
    import pandas as pd

    f3, t3 = ch3["variants"]["ffma_ours"]["counts"]["flop"], ch3["timings_ms"]["ffma_ours"]
    ffma = f3 / t3["median"] / 1e9  # TFLOP/s
    tflops = t_ceil["TFLOP/s"]
    mma = tflops["mma_ceiling"] if "mma_ceiling" in tflops else tflops["mma_peak"]
    rate = {"ffma": ffma, **tflops, "mma_ceiling": mma}
    own = {"ffma": ch3.get("ffma_clock", {}).get("kernel GHz (median over blocks)"),
           "mma_ceiling": rec.get("mma_clock_ghz"), "wgmma_ceiling": rec.get("wgmma_clock_ghz")}
    after = rec.get("ceiling_clocks_ghz", {})
    clock = {k: f"{own[k]:.2f} (own)" if own.get(k) else f"{after[k]:.2f} (after)" if k in after
             else "not in this record" for _, _, k in CEILINGS}
    table = pd.DataFrame([{"rate": n, "instruction": ins, "TFLOP/s": rate[k],
                           "float32-accurate TFLOP/s": rate[k] / 3 if "TF32" in n else rate[k], "SM GHz": clock[k]}
                          for n, ins, k in CEILINGS if k in rate]).set_index("rate")  # wgmma: sm_90 only
    glue = {"ffma_tflops": ffma, "tf32_over_ffma": tflops["eager_tf32"] / ffma, "mma_tflops": mma,
            "mma_const_tflops": tflops["mma_peak"], "mma3": mma / 3,
            "wgmma_tflops": rate.get("wgmma_ceiling", float("nan")),
            "wgmma3": rate.get("wgmma_ceiling", float("nan")) / 3,
            "wgmma_clock_ghz": rec.get("wgmma_clock_ghz") or float("nan"),
            "tf32_tflops": tflops["eager_tf32"], "mma_clock_ghz": rec.get("mma_clock_ghz") or float("nan"),
            "tf32_ghz": after.get("eager_tf32", float("nan"))}
    return table, glue, ffma, mma / 3


def cutlass_glue(t, err: dict, ours: str) -> dict:
    """The numbers the chapter quotes about CUTLASS's GEMMs in the 8192³ table ``t`` (variants cutlass_*): the
    fastest 3xTF32 tile's rate, block tile, error, its ratio to ``ours`` and its % of the mma.sync ceiling; the
    fastest plain TF32 tile's rate and its % of that arithmetic's ceiling."""
    c3 = t[t.index.str.startswith("cutlass_3xtf32")]["TFLOP/s"]
    c1 = t[t.index.str.startswith("cutlass_tf32")]["TFLOP/s"]
    best = c3.idxmax()
    return {"cutlass3_tflops": c3.max(), "cutlass3_tile": best.split("_")[-1].replace("x", " × "),
            "cutlass3_err": err[best], "cutlass3_vs_v5": c3.max() / t.loc[ours, "TFLOP/s"],
            "cutlass3_pct": t.loc[best, "% of its ceiling"], "cutlass1_tflops": c1.max(),
            "cutlass1_pct": t.loc[c1.idxmax(), "% of its ceiling"]}


def wgmma_glue(t, err: dict, sgemm: float) -> dict:
    """The numbers the chapter quotes about the wgmma versions in the 8192³ table ``t``: w1's and w2's rates
    and errors, w2's % of wgmma's 3xTF32 ceiling and its speed over cuBLAS's SGEMM (``sgemm`` TFLOP/s), CUTLASS's
    fastest 3xTF32 tile and version 5; plain TF32 through w1 (NaN where the GPU has no wgmma)."""
    if "ours_w2" not in t.index:
        keys = ["w1_tflops", "w2_tflops", "w1_err", "w2_err", "w2_pct", "w2_vs_sgemm", "w2_vs_cutlass",
                "w2_vs_v5", "w1_tf32_tflops", "w1_tf32_pct"]
        return dict.fromkeys(keys, float("nan"))
    w2, rate = t.loc["ours_w2"], t["TFLOP/s"]
    cut3 = rate[t.index.str.startswith("cutlass_3xtf32")].max()
    return {"w1_tflops": rate["ours_w1"], "w2_tflops": w2["TFLOP/s"], "w1_err": err["ours_w1"],
            "w2_err": err["ours_w2"], "w2_pct": w2["% of its ceiling"],
            "w2_vs_sgemm": w2["TFLOP/s"] / sgemm,
            "w2_vs_cutlass": w2["TFLOP/s"] / cut3, "w2_vs_v5": w2["TFLOP/s"] / rate["ours_v5"],
            "w1_tf32_tflops": rate["ours_w1_tf32"], "w1_tf32_pct": t.loc["ours_w1_tf32", "% of its ceiling"]}


# The inputs of the book's definition of float32-accurate (the method chapter) beyond uniform [-1, 1): a shifted
# far from zero, products that cancel, and magnitudes that span 2^-60 … 2^60. M × N × K of each product:
DEFINITION_SHAPE = (256, 256, 1024)


def definition_inputs(seed: int = 0, device: str = "cuda") -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """name → (a, b) for the definition's input classes, at DEFINITION_SHAPE."""
    from ..harness import check

    m, n, k = DEFINITION_SHAPE
    u = lambda shape, s, lo=-1.0, hi=1.0: check.rand(shape, seed=seed + s, device=device, low=lo, high=hi)  # noqa: E731
    sign = (torch.arange(k, device=device) % 2 * 2 - 1).float()[:, None]  # +1, −1, … down K
    wide = torch.sign(u([m, k], 3)) * torch.exp2(torch.round(u([m, k], 4, -60.0, 60.0)))
    return {"a shifted by +1000": (u([m, k], 1, 999.0, 1001.0), u([k, n], 2)),
            "products that cancel": (1 + 1e-3 * u([m, k], 5), sign * (1 + 1e-3 * u([k, n], 6))),
            "magnitudes 2^-60 … 2^60": (wide * (1 + 0.5 * u([m, k], 7, 0.0, 1.0)), u([k, n], 8))}


def version_name(version: int | str) -> str:
    """A version as the tables name it: v1 … v5 (mma.sync), w1, w2 (wgmma)."""
    return f"v{version}" if isinstance(version, int) else version


def version_checks(rows: list[dict]) -> dict[str, dict]:
    """The record's checks from ``check_versions``'s rows: every version but the chained ones (v1, w1), each
    shape, within twice cuBLAS's float32 error on the same inputs plus 1e-7 (for errors of a few roundings)."""
    out = {}
    for r in rows:
        if r["version"] not in (1, "w1"):
            tol = 2 * r["cuBLAS float32"] + 1e-7
            out[f"{version_name(r['version'])} {r['shape']}"] = {
                "rel_err": r["3xTF32"], "max_abs_err": r["3xTF32 max abs"], "tol": tol, "unwritten": 0,
                "passed": r["3xTF32"] <= tol}
    return out


def definition_rows(mod, cutlass, wg=None) -> list[dict]:
    """The definition's other input classes (``definition_inputs``) through versions 2–5, CUTLASS's 3xTF32 and
    (given ``wg``, gemm_wgmma) the staged wgmma version w2:
    each path's error against float64, cuBLAS float32's on the same input, and their ratio (≤ 2: float32-accurate
    by the book's definition)."""
    from ..harness import check, precision

    rows = []
    for name, (a, b) in definition_inputs().items():
        ref = a.double() @ b.double()
        with precision.tf32(conv=False, matmul=False):
            lib = check.report(a @ b, ref, tol=1.0)["rel_err"]
        paths = {f"v{v}": mod.gemm_tf32(a, b, 3, v) for v in VERSIONS if v > 1}
        paths["CUTLASS 3xTF32"] = cutlass.cutlass_gemm(a, b, 3, 0)
        if wg is not None:
            paths["w2"] = wg.gemm(a, b, 3, 2)
        for path, out in paths.items():
            err = check.report(out, ref, tol=1.0)["rel_err"]
            rows.append({"input": name, "path": path, "error": err, "cuBLAS float32": lib, "ratio": err / lib})
    return rows


def definition_table(rows: list[dict]):
    """``definition_rows`` as input × path → error over cuBLAS float32's."""
    import pandas as pd

    short = {"a shifted by +1000": "A + 1000", "products that cancel": "cancelling",
             "magnitudes 2^-60 … 2^60": "2⁻⁶⁰ to 2⁶⁰"}
    table = pd.DataFrame(rows).pivot(index="input", columns="path", values="ratio")
    return table.reindex(list(dict.fromkeys(r["input"] for r in rows))).rename(index=lambda i: short.get(i, i))


DEFINITION_KEYS = {"a shifted by +1000": "shift", "products that cancel": "cancel", "magnitudes 2^-60 … 2^60": "wide"}


def definition_glue(rows: list[dict]) -> dict[str, float]:
    """The definition's rows as the chapter quotes them: per input class, the worst ratio to cuBLAS float32's
    error of versions 2–5 (``def_v_shift``, ``def_v_cancel``, ``def_v_wide``), of CUTLASS's 3xTF32
    (``def_cut_…``) and of wgmma's w2 (``def_w_…``, where measured); at most 2 is float32-accurate by the
    book's definition."""
    out: dict[str, float] = {}
    for r in rows:
        kind = "cut" if r["path"].startswith("CUTLASS") else "w" if r["path"].startswith("w") else "v"
        key = f"def_{kind}_{DEFINITION_KEYS[r['input']]}"
        out[key] = max(out.get(key, 0.0), r["ratio"])
    return out


def check_glue(chk, definition: list[dict]) -> dict:
    """What the Check quotes of ``check_versions``'s rows (``chk``, a DataFrame) for versions 2–5: their worst
    error over cuBLAS float32's, on which shape and with which two errors; the worst on shapes with K of at
    least 20 (where the errors are more than a few roundings); and the definition's ratios
    (``definition_glue``)."""
    ok = chk[chk.version.isin([2, 3, 4, 5])]
    ratio = ok["3xTF32"] / ok["cuBLAS float32"]
    deep = ok["shape"].str.split("×").str[2].astype(int) >= 20
    w = ok.loc[ratio.idxmax()]
    return {"worst_ratio": ratio.max(), "worst_shape": w["shape"], "worst_ours": w["3xTF32"],
            "worst_cublas": w["cuBLAS float32"], "ratio_k20": ratio[deep].max(), **definition_glue(definition)}


def version_table(chk):
    """``check_versions``'s rows as a table: shape × version (3xTF32 error), with TF32's and cuBLAS's worst.
    Neighbouring versions whose errors are identical on every shape share one column ("v2–v5"), so the
    table says they add the same products in the same order and fits the page."""
    import pandas as pd
    chk = chk.assign(version=chk.version.map(version_name))
    by_v = chk.pivot(index="shape", columns="version", values="3xTF32")[list(chk.version.unique())]
    runs = []  # runs of neighbouring columns equal on every shape
    for col in by_v.columns:
        if runs and by_v[col].equals(by_v[runs[-1][0]]):
            runs[-1].append(col)
        else:
            runs.append([col])
    by_v = pd.DataFrame({r[0] if len(r) == 1 else f"{r[0]}–{r[-1]}": by_v[r[0]] for r in runs})
    worst = chk.groupby("shape")[["TF32", "cuBLAS float32"]].max()
    return by_v.join(worst.rename(columns={"TF32": "TF32, 1 pass"})).reindex(chk["shape"].unique())
