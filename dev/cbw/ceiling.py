"""The wgmma TF32 rate of m64n128k8 in the shared-memory layouts the convolution could use, beside the book's
ceiling (m64n256k8, 128-byte swizzle), on an sm_90 GPU. Prints JSON: per form, TFLOP/s and the clock it ran at.

    python dev/cbw/ceiling.py              # sm_90: every form, then the book's ceiling
    python dev/cbw/ceiling.py --build-only

Forms (dev/cbw/ceiling.cu): sw128 (the 128-byte swizzle), sw32 (the 32-byte swizzle), none (no swizzle, the
convolution's), and none+shift / sw32+shift (B's start moving by a row per k step, as the taps move the window).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))

FORMS = {"sw128": (1, 0), "sw32": (3, 0), "sw32+shift": (3, 1), "none": (0, 0), "none+shift": (0, 1)}


def build():
    import hashlib

    from torch.utils.cpp_extension import load

    text = "".join((HERE / f).read_text() for f in ("ceiling.cu", "conv_wgmma_x.cuh"))
    return load(name="cbw_ceiling_" + hashlib.sha1(text.encode()).hexdigest()[:12],
                sources=[str(HERE / "ceiling.cu")], extra_include_paths=[str(HERE)],
                extra_cuda_cflags=["-O3", "-gencode=arch=compute_90a,code=sm_90a"], verbose=False)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--build-only", action="store_true")
    ap.add_argument("--iters", type=int, default=4000)
    args = ap.parse_args()
    mod = build()
    if args.build_only:
        return 0
    import torch
    import triton.testing as tt

    import kernelbook as kb
    from kernelbook.harness.measure import clock_ghz
    from kernelbook.models import tensorcore

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    blocks = 2 * sms
    seeds = torch.randint(1, 2**31 - 1, (256,), generator=torch.Generator().manual_seed(0), dtype=torch.int32).cuda()
    flop = blocks * 2 * args.iters * 4 * 2 * 64 * 128 * 8
    res = {"gpu": torch.cuda.get_device_name(0), "blocks": blocks, "iters": args.iters}
    for name, (sw, shift) in FORMS.items():
        ms = tt.do_bench(lambda sw=sw, shift=shift: mod.ceiling(seeds, sw, shift, blocks, args.iters),
                         warmup=20, rep=200)
        ghz = clock_ghz(mod.ceiling(seeds, sw, shift, blocks, args.iters)[1])
        res[name] = {"ms": ms, "tflops": flop / ms / 1e9, "clock_ghz": ghz}
    fn, cflop, ghz = tensorcore.wgmma_ceiling(kb.build.load("gemm_wgmma"), blocks, args.iters)
    ms = tt.do_bench(fn, warmup=20, rep=200)
    res["book m64n256k8 sw128"] = {"ms": ms, "tflops": cflop / ms / 1e9, "clock_ghz": ghz}
    print(json.dumps(res, indent=1))  # rates only: nothing here is checked
    return 0


if __name__ == "__main__":
    sys.exit(main())
