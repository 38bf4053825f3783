"""How many taps may the wgmma convolution chain inside the tensor core before one rounded FADD? A CPU model.

    python dev/tap_chains.py          # one table: each accumulation schedule's error on a few input classes

kernels/conv_wgmma.cuh adds each tap's three products (lo·hi, hi·lo, hi·hi, each a wgmma.m64n128k8 of 8 input
channels) into a fresh accumulator and then adds that into the running sum with a rounded FADD: 64 FADDs per
thread per tap, about 40 % of a consumer's instructions. Chaining two taps per FADD halves them. The cost is
accuracy: the tensor core's accumulator does not round, it truncates. This script models that on the CPU, in
float64, so that the schedule to try on the GPU is chosen with a prediction written down first.

The model of one wgmma k8 step (an assumption, calibrated below): the eight products are exact; they and the
accumulator are aligned to the largest exponent among them, every bit below 2^(e_max − 23 − g) is dropped
(toward zero), the aligned terms are summed exactly, and the sum is truncated to a float32 significand. g, the
extra alignment bits, is unknown; session 18 measured on the H200 (P73's input, 16 images) 0.995e-7 for one tap
per FADD and 1.9e-7 for three taps chained per FADD (each tap's products in the order lo·hi, hi·lo, hi·hi), which
picks g. Schedules (a tap's products: s = lo·hi and hi·lo, the small terms; b = hi·hi):
  * "1": s b | FADD per tap (the landed kernel);
  * "3 naive": s b s b s b | FADD (session 18's measured variant);
  * "2 naive": s b s b | FADD;
  * "2 small-first": s s b b | FADD — both taps' small terms first, so only the two hi·hi steps truncate at
    the size of the sum, as in "1";
  * "3 small-first": s s s b b b | FADD;
  * "9 small-first": all nine taps' small terms, then their nine hi·hi steps, one FADD (into the bias).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernelbook.models import guard_study as gs  # noqa: E402


def tf32(v: torch.Tensor, nearest: bool) -> torch.Tensor:
    b = v.float().view(torch.int32)
    b = b + 0x1000 if nearest else b
    return (b & -8192).view(torch.float32).double()


def trunc_to(v: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    return torch.trunc(v / q) * q  # toward zero, to a multiple of q (a power of two: exact in float64)


def f32_rz(v: torch.Tensor) -> torch.Tensor:
    """float64 → the float32 value toward zero (|v| within float32's normal range here)."""
    f = v.float().double()  # nearest
    over = f.abs() > v.abs()
    down = torch.nextafter(f.float(), torch.zeros_like(f.float())).double()
    return torch.where(over, down, f)


def step(d: torch.Tensor, prods: torch.Tensor, g: int) -> torch.Tensor:
    """d + Σ prods (prods: [..., 8]) under the model above."""
    terms = torch.cat([d.unsqueeze(-1), prods], dim=-1)
    m = terms.abs().amax(dim=-1, keepdim=True)
    e = torch.floor(torch.log2(torch.where(m > 0, m, torch.ones_like(m))))
    q = torch.exp2(e - 23 - g)
    return f32_rz(trunc_to(terms, q).sum(dim=-1))


def tap_products(x: torch.Tensor, w: torch.Tensor) -> list[dict[str, torch.Tensor]]:
    """Per tap: the products lo·hi, hi·lo, hi·hi as [n, c_out, ho, wo, 8] (8 input channels, zero-padded)."""
    x64, w64 = x.double(), w.double()
    xh, wh = tf32(x64, True), tf32(w64, True)
    xl, wl = tf32(x64 - xh, False), tf32(w64 - wh, True)  # the tensor core reads lo's top bits; w's lo rounded
    n, c, h, wd = x.shape
    ho, wo = h - 2, wd - 2
    taps = []
    for kh in range(3):
        for kw in range(3):
            s = (slice(None), slice(None), slice(kh, kh + ho), slice(kw, kw + wo))

            taps.append({k: F.pad(torch.einsum("nchw,oc->nohwc", a[s], bb[:, :, kh, kw]), (0, 8 - c))
                         for k, a, bb in (("lohi", xh, wl), ("hilo", xl, wh), ("hihi", xh, wh))})
    return taps


def schedule(taps, bias: torch.Tensor, chain: int, small_first: bool, g: int) -> torch.Tensor:
    shape = taps[0]["hihi"].shape[:-1]
    acc = bias.float().double().view(1, -1, 1, 1).expand(shape).clone()
    for t0 in range(0, len(taps), chain):
        group = taps[t0:t0 + chain]
        order = ([p[k] for p in group for k in ("lohi", "hilo")] + [p["hihi"] for p in group] if small_first
                 else [p[k] for p in group for k in ("lohi", "hilo", "hihi")])
        d = torch.zeros(shape, dtype=torch.float64)
        for prods in order:
            d = step(d, prods, g)
        acc = (acc + d).float().double()  # the rounded FADD
    return acc


def rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y - ref).norm() / ref.norm())


SCHEDULES = {"1": (1, False), "3 naive": (3, False), "2 naive": (2, False), "2 small-first": (2, True),
             "3 small-first": (3, True), "9 small-first": (9, True)}


def main() -> int:
    torch.manual_seed(0)
    p73 = torch.nn.Conv2d(8, 64, 3)
    w0, b0 = p73.weight.detach(), p73.bias.detach()
    u = torch.rand(2, 8, 40, 40)
    cx, cw, cb = gs.cancelling_inputs(n=2, size=40)
    cases = {"P73 (rand, default init)": (u, w0, b0), "shifted +1000": (u + 1000, w0, b0),
             "natural / gabor": (gs.natural_batch(2, seed=0, size=40), *gs.filter_sets(0)["gabor_all"]),
             "cancelling": (cx, cw, cb),
             "wide (2^±60)": (torch.sign(u - 0.5) * torch.exp2(torch.round(120 * u - 60)) * (1 + 0.5 * u), w0, b0)}
    print(f"{'case':26s} {'g':>2s} {'library':>9s} " + " ".join(f"{k:>13s}" for k in SCHEDULES))
    for name, (x, w, b) in cases.items():
        ref = F.conv2d(x.double(), w.double(), b.double())
        lib = rel(F.conv2d(x, w, b).double(), ref)
        taps = tap_products(x, w)
        for g in (1, 2):
            errs = [rel(schedule(taps, b, c, sf, g), ref) for c, sf in SCHEDULES.values()]
            print(f"{name:26s} {g:2d} {lib:9.2e} " + " ".join(f"{e:9.2e} {e / errs[0]:3.1f}" for e in errs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
