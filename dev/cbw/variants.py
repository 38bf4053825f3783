"""Check and time dev/cbw/conv_wgmma_x.cuh's variants (P73's 3xTF32 convolution through wgmma) on an sm_90 GPU.

    python dev/cbw/variants.py --resources t1 t3 t3.f2.l1     # any machine with nvcc: registers, spills, SASS
    python dev/cbw/variants.py --build-only t1 t3             # build the variants (4 to an extension)
    python dev/cbw/variants.py t1 t3 t3.f2.l1                 # sm_90: checks, then P73's timings, as JSON
    python dev/cbw/variants.py --small t3                     # checks on small shapes only (compute-sanitizer)
    python dev/cbw/variants.py --ncu t3                       # two launches on P73 (Nsight Compute profiles one)
    python dev/cbw/variants.py --quick t3 t9                  # checks and timings without the book's extension

A variant names its switches (the header's macros), dot-separated: t<n> CBW_TAPS (taps per FADD), f<n>
CBW_STORE_FAST, l<n> CBW_STORE_LDS, s<n> CBW_STATS, p<n> CBW_PIPE, r<n> CBW_RS, x<n> CBW_PIX, g<n> CBW_RING, k<n>
CBW_KW0, w<n> CBW_SW32, d<n> CBW_DIAG (diagnostics: their checks fail by design); "t1" alone is session 19's kernel,
t3.f1.l1 the one in kernels/ now. Checks (every variant, NaN-poisoned outputs): the odd shapes of the book's wgmma
test against float64, beside cuDNN float32 (TF32 off), and the definition's input classes (P73's, as the GPU tests
draw them) against float64, beside cuDNN float32 and the book's own 3xTF32 path (the landed wgmma kernel). A variant
passes where nothing is unwritten, its error is at most 2× cuDNN's (cancelling 6×, wide 2.5×: where the landed
3xTF32 path is held too); its ratio to the landed kernel's error is reported beside it. With s1 the statistics (Σx²,
Σx⁴ per input channel, Σy² per output channel) must match float64 sums to 1e-4, and the timing includes them.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))

MACROS = {"t": "CBW_TAPS", "f": "CBW_STORE_FAST", "l": "CBW_STORE_LDS", "s": "CBW_STATS", "p": "CBW_PIPE",
          "d": "CBW_DIAG", "r": "CBW_RS", "x": "CBW_PIX", "g": "CBW_RING", "k": "CBW_KW0", "w": "CBW_SW32"}
ARCH = "-gencode=arch=compute_90a,code=sm_90a"
MISS = {"cancelling": 6.0, "wide": 2.5}  # tests/test_conv_definition.py's TF32_MISS


def defines(variant: str) -> dict[str, int]:
    out = {}
    for part in variant.split("."):
        m = re.fullmatch(r"([tflspdrxgkw])(\d+)", part)
        if not m:
            raise SystemExit(f"unknown switch {part!r} in variant {variant!r} (one of {''.join(MACROS)}, then <n>)")
        out[MACROS[m.group(1)]] = int(m.group(2))
    return out


def flags(variant: str) -> list[str]:
    return [f"-D{k}={v}" for k, v in sorted(defines(variant).items())]


def resources(variant: str) -> dict:
    """nvcc's resource report for the torch-free probe, and SASS opcode counts where cuobjdump is found."""
    import shutil

    import kernelbook as kb

    obj = Path("/tmp") / f"cbw_probe_{variant}.o"
    cmd = ["nvcc", "--resource-usage", "-O3", "-lineinfo", "-std=c++17", ARCH, *flags(variant), "-I", str(HERE),
           "-c", str(HERE / "probe.cu"), "-o", str(obj)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        return {"variant": variant, "error": res.stderr[-2000:]}
    row = kb.build.parse_resource_usage(res.stdout + res.stderr)[0]
    out = {"variant": variant, **{k: row.get(k) for k in ("registers", "stack_bytes", "spill_store_bytes")}}
    cuobjdump = shutil.which("cuobjdump")
    if cuobjdump is None:
        import triton

        cand = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
        cuobjdump = str(cand) if cand.exists() else None
    if cuobjdump:
        sass = subprocess.run([cuobjdump, "-sass", str(obj)], capture_output=True, text=True).stdout
        ops = re.findall(r"^\s+/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9]+)", sass, re.MULTILINE)
        out["sass_static"] = len(ops)
        for op in ("FADD", "HGMMA", "LDS", "LD", "ST", "BRA"):
            out[op] = ops.count(op)
    return out


def build(variants: list[str], per: int = 4) -> dict:
    """Torch extensions holding the variants, `per` to one (conv_wgmma_x.cuh included once per variant, each in its
    own namespace, so the host side and torch's headers compile once per extension), built in parallel. The
    header's text is in each extension's name: an edited header is never served stale from the build cache.
    Returns {variant: object with .conv_wgmma}."""
    import hashlib
    import types
    from concurrent.futures import ThreadPoolExecutor

    from torch.utils.cpp_extension import load

    header = (HERE / "conv_wgmma_x.cuh").read_text() + (HERE / "bind.h").read_text()
    gen = Path("/tmp") / "cbw_gen"
    gen.mkdir(exist_ok=True)

    def one(chunk: list[str]):
        blocks = []
        for i, v in enumerate(chunk):
            defs = "".join(f"#define {k} {n}\n" for k, n in sorted(defines(v).items()))
            blocks.append(f"// {v}\n#define CBW_NS cbw_v{i}\n{defs}#include \"conv_wgmma_x.cuh\"\n")
        binds = "".join(f'    m.def("conv_{i}", &conv_with<cbw_v{i}::conv>, "{v}", pybind11::arg("x"), '
                        'pybind11::arg("w"), pybind11::arg("b") = pybind11::none(), '
                        'pybind11::arg("out") = pybind11::none(), pybind11::arg("stats") = pybind11::none());\n'
                        for i, v in enumerate(chunk))
        src = ("#include \"bind.h\"\n" + "".join(blocks) +
               f"PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {{\n{binds}}}\n")
        name = "cbwx_" + hashlib.sha1((src + header).encode()).hexdigest()[:12]
        (gen / f"{name}.cu").write_text(src)
        ext = load(name=name, sources=[str(gen / f"{name}.cu")], extra_include_paths=[str(HERE)],
                   extra_cuda_cflags=["-O3", ARCH], verbose=False)
        return {v: types.SimpleNamespace(conv_wgmma=getattr(ext, f"conv_{i}")) for i, v in enumerate(chunk)}

    chunks = [variants[i:i + per] for i in range(0, len(variants), per)]
    with ThreadPoolExecutor(len(chunks)) as pool:
        parts = list(pool.map(one, chunks))
    return {v: m for part in parts for v, m in part.items()}


SHAPES = [  # (N, C_in, H, W, C_out, x offset in floats): tests/test_conv_bn_scale.py's TC_SHAPES and two more,
    (2, 3, 34, 34, 64, 0), (2, 8, 33, 97, 64, 0), (3, 5, 20, 150, 100, 0), (1, 1, 3, 3, 1, 0),
    (2, 8, 9, 131, 7, 1), (1, 3, 40, 262, 130, 3), (4, 8, 5, 4, 64, 0),
    # then two with many tiles a block (≈ 16 and ≈ 10 on 132 SMs), so that CBW_RING's runs cross strips and images
    (8, 8, 130, 140, 64, 0), (6, 5, 40, 131, 130, 1),
]
# --small (compute-sanitizer): the first four, and one cheap shape with 2–3 tiles a block across images
SMALL = SHAPES[:4] + [(3, 4, 100, 10, 8, 0)]


def classes():
    """The definition's P73 classes, drawn as tests/test_conv_definition.py draws them."""
    import torch

    from kernelbook import check

    def u(shape, seed, low=-1.0, high=1.0):
        return check.rand(list(shape), seed=seed, device="cuda", low=low, high=high)

    xs, ws = (4, 8, 34, 34), (64, 8, 3, 3)
    w = u(ws, 2, -0.5, 0.5)
    sign = (torch.arange(72, device="cuda") % 2 * 2 - 1).float().reshape(ws[1:])
    wide = torch.sign(u(xs, 3)) * torch.exp2(torch.round(u(xs, 4, -60.0, 60.0)))
    return {"benchmark": (u(xs, 1, 0.0, 1.0), w), "shifted +1000": (u(xs, 1, 0.0, 1.0) + 1000, w),
            "shifted -1000": (u(xs, 1, 0.0, 1.0) - 1000, w),
            "cancelling": (1 + 1e-3 * u(xs, 5), sign * (1 + 1e-3 * u(ws, 6))),
            "wide": (wide * (1 + 0.5 * u(xs, 7, 0.0, 1.0)), w)}


def new_stats(x, w):
    import torch

    return torch.zeros(2 * x.shape[1] + w.shape[0], dtype=torch.float64, device="cuda")


def run_checks(mods, cbs, small: bool, quick: bool = False) -> list[dict]:
    import torch
    import torch.nn.functional as F

    import kernelbook as kb
    from kernelbook import check

    def rel(y, ref):
        return check.report(y, ref, 1.0)

    cases = []
    for (n, c, h, w, k, off) in (SMALL if small else SHAPES):
        x = check.rand([n * c * h * w + off], seed=k, device="cuda")[off:].view(n, c, h, w)
        cases.append((f"shape {n}x{c}x{h}x{w}->{k} +{off}", x, check.rand((k, c, 3, 3), seed=1, device="cuda",
                                                                        low=-0.5, high=0.5), 2.0))
    if not small:
        cases += [(name, x, w, MISS.get(name, 2.0)) for name, (x, w) in classes().items()]
    if quick and not small:  # P73's class, one odd shape and one with many tiles a block only
        cases = [cases[1], cases[len(SHAPES) - 1]] + [c for c in cases if c[0] == "benchmark"]
    rows = []
    for name, x, w, bound in cases:
        b = check.rand((w.shape[0],), seed=8, device="cuda", low=-1.0, high=1.0)
        ref = F.conv2d(x.double(), w.double(), b.double())
        with kb.precision.tf32(False):
            lib = rel(F.conv2d(x, w, b), ref)["rel_err"]
        landed = rel(cbs.conv_bn_scale_eval(x, w, b, math="3xtf32"), ref)["rel_err"] if cbs else float("nan")
        row = {"case": name, "cudnn_fp32": lib, "landed": landed}
        for v, m in mods.items():
            y = check.poisoned(ref.shape, device="cuda")
            st = new_stats(x, w) if defines(v).get("CBW_STATS") else None
            m.conv_wgmma(x, w, b, y, st)
            r = rel(y, ref)
            row[v] = r["rel_err"]
            row[v + "_ok"] = bool(r["unwritten"] == 0 and r["rel_err"] <= bound * max(lib, 2.0**-24))
            row[v + "_vs_landed"] = r["rel_err"] / max(landed, 2.0**-24)  # t3: ≤ 1.25 predicted; t9 ≈ 2
            if st is not None:
                x64 = x.double()
                want = torch.cat([(x64**2).sum(dim=(0, 2, 3)), (x64**4).sum(dim=(0, 2, 3)),
                                  (ref**2).sum(dim=(0, 2, 3))])
                worst = float(((st - want).abs() / want.abs().clamp_min(1e-300)).max())
                row[v + "_stats_err"] = worst
                row[v + "_stats_ok"] = bool(worst <= 1e-4) or name == "wide"  # 2^±120 squares: float's range
        rows.append(row)
    return rows


def timings(mods, cbs) -> dict:
    import torch
    import triton.testing as tt

    import kernelbook as kb

    p = kb.problems.P73_CONV_BN_SCALE
    x = p.inputs(seed=1).cuda()
    conv = p.model(seed=0).conv.cuda()
    w, b = conv.weight.detach().contiguous(), conv.bias.detach().contiguous()
    y = torch.empty(x.shape[0], 64, 126, 126, device="cuda")
    out = {"instruction": cbs.conv_bn_scale_tc_instruction(x) if cbs else "wgmma (not asked: --quick)"}
    for _ in range(2):  # the same order twice: drift shows as a change between rounds
        for v, m in mods.items():
            st = new_stats(x, w) if defines(v).get("CBW_STATS") else None
            out.setdefault(v, []).append(tt.do_bench(
                lambda m=m, st=st: m.conv_wgmma(x, w, b, y, st.zero_() if st is not None else None),
                warmup=100, rep=400))
        for math in ("3xtf32", "fp32") if cbs else ():
            out.setdefault(f"book_{math}", []).append(
                tt.do_bench(lambda math=math: cbs.conv_bn_scale_eval(x, w, b, y, math=math), warmup=100, rep=400))
        out.setdefault("fill", []).append(tt.do_bench(lambda: y.fill_(1.0), warmup=100, rep=400))
    # The tensor work a variant does (27 m64n128k8 a tile, padded channels and pixels counted) as a TF32 rate
    tiles = x.shape[0] * 126 * -(-126 // 128) * -(-w.shape[0] // 64)
    flop = tiles * 27 * 2 * 64 * 128 * 8
    out["tf32_tflops"] = {v: flop / min(out[v]) / 1e9 for v in mods}
    return out  # the rates to hold them against: dev/cbw/ceiling.py


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("variants", nargs="+")
    ap.add_argument("--resources", action="store_true", help="nvcc's report only (no GPU needed)")
    ap.add_argument("--build-only", action="store_true")
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--ncu", action="store_true")
    ap.add_argument("--quick", action="store_true", help="without the book's extension (no landed/book columns)")
    args = ap.parse_args()
    if args.resources:
        for v in args.variants:
            print(json.dumps(resources(v)))
        return 0
    import torch

    import kernelbook as kb

    mods = build(args.variants)
    if args.build_only:
        return 0
    p = kb.problems.P73_CONV_BN_SCALE
    if args.ncu:
        x, conv = p.inputs(seed=1).cuda(), p.model(seed=0).conv.cuda()
        with torch.no_grad():
            for m in mods.values():
                for _ in range(2):
                    m.conv_wgmma(x, conv.weight.detach(), conv.bias.detach())
        torch.cuda.synchronize()
        return 0
    cbs = None if args.quick else kb.build.load("conv_bn_scale")
    with torch.no_grad():
        res = {"checks": run_checks(mods, cbs, args.small, args.quick)}
        if not args.small:
            res["timing_ms"] = timings(mods, cbs)
    torch.cuda.synchronize()
    from dev.report import finish

    return finish(res)


if __name__ == "__main__":
    sys.exit(main())
