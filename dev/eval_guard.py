"""Could eval mode's math="auto" take the tensor cores on P73 safely? A CPU study of a guard eval mode could afford.

    python dev/eval_guard.py            # a table, one row per (input, filter) case; a few minutes on 2 cores

Training mode's guard predicts the 3xTF32 convolution's own norm-wise error from the moments it already sums:
E_conv = e_tc·u·√(Σ_c Q_c / Σ_c E[y_c²]), Q_c = Σ_k w_ck²·E[x_k²] (a product's split errs about e_tc·u·|w·x| at
random). Eval mode has no moments, but neither term needs them: E[x_k²] per input channel is one pass over x (the
wgmma kernel's producer loads every input value anyway), and E[y_c²] is the output's own second moment (the
consumers hold every output before they store it). So eval could run the tensor-core convolution, sum both in its
epilogue, and re-run the FFMA convolution (gated on a flag, as training's paths are) only where E_conv exceeds
training's allowance √3·u·√K.

This script measures, on the CPU in float64, whether that prediction bounds the error the split actually makes:
the tensor-core convolution is emulated tap by tap (w split with rounding, x's hi rounded and its lo truncated to
TF32 as the tensor core reads it, lo·lo dropped, each tap's three products summed exactly then rounded to
float32, the taps added in float32 from the bias — conv_wgmma.cuh's order), beside PyTorch's float32 convolution
on the CPU (the library's error). Columns: the prediction, the emulated error, their ratio, the library's error,
the emulated error over the library's, and the guard's choice against the allowance.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernelbook.models import guard_study as gs  # noqa: E402

U = 2.0**-24
E_TC = 2.0  # conv_moments.cuh's CONV_TF32_UNIT


def tf32(v: torch.Tensor, nearest: bool) -> torch.Tensor:
    b = v.float().view(torch.int32)
    b = b + 0x1000 if nearest else b
    return (b & -8192).view(torch.float32).double()  # the low 13 bits cleared


def emulated_tc(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """conv_wgmma.cuh's arithmetic on the CPU: per tap lo·hi + hi·lo + hi·hi exactly, rounded to float32, added in
    float32 into the bias."""
    x64, w64 = x.double(), w.double()
    xh, wh = tf32(x64, True), tf32(w64, True)
    xl, wl = tf32(x64 - xh, False), tf32(w64 - wh, True)
    n, c, h, wd = x.shape
    ho, wo = h - 2, wd - 2
    acc = b.float().view(1, -1, 1, 1).expand(n, -1, ho, wo).clone()
    for kh in range(3):
        for kw in range(3):
            s = (slice(None), slice(None), slice(kh, kh + ho), slice(kw, kw + wo))
            tap = sum(torch.einsum("nchw,oc->nohw", a[s], bb[:, :, kh, kw])
                      for a, bb in ((xh, wl), (xl, wh), (xh, wh)))
            acc = acc + tap.float()  # float32 addition, rounded to nearest
    return acc


def rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.double() - ref).norm() / ref.norm())


def prediction(x: torch.Tensor, w: torch.Tensor, y: torch.Tensor) -> float:
    ex2 = (x.double() ** 2).mean(dim=(0, 2, 3))  # E[x_i²] per input channel
    q = ((w.double() ** 2).sum(dim=(2, 3)) * ex2).sum(1)  # Q_c
    ey2 = (y.double() ** 2).mean(dim=(0, 2, 3))  # E[y_c²]
    return E_TC * U * math.sqrt(float(q.sum() / ey2.sum()))


def cases(n: int = 2, size: int = 64):
    torch.manual_seed(0)
    filters = gs.filter_sets(0)
    inputs = {"uniform": torch.rand(n, 8, size, size), "natural": gs.natural_batch(n, seed=0, size=size)}
    for name in ("kaiming_uniform", "sobel_x_one", "sobel_x_all", "laplacian_all", "gabor_all", "random_normal",
                 "difference"):
        w, b = filters[name]
        for inp, x in inputs.items():
            yield f"{inp} / {name}", x, w, b
    x, w, b = gs.cancelling_inputs(n=n, size=size)
    yield "cancelling / alternating", x, w, b


def main() -> int:
    allowed = gs.guard_allowance(8)
    print(f"allowance √3·u·√72 = {allowed:.2e}")
    print(f"{'case':34s} {'E_conv':>9s} {'emulated':>9s} {'pred/em':>7s} {'library':>9s} {'em/lib':>6s}  choice")
    for name, x, w, b in cases():
        ref = F.conv2d(x.double(), w.double(), b.double())
        tc = emulated_tc(x, w, b)
        lib = rel(F.conv2d(x, w, b), ref)
        em = rel(tc, ref)
        pred = prediction(x, w, tc)
        choice = "tensor cores" if pred <= allowed else "FFMA"
        print(f"{name:34s} {pred:9.2e} {em:9.2e} {pred / em:7.2f} {lib:9.2e} {em / lib:6.2f}  {choice}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
