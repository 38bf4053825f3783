"""How good is the guard of P73's moments strategy? Measured error against its prediction on natural images, classic
filters and synthetic cases.

The moments strategy (kernels/conv_moments.cuh) takes a channel's batch variance as w_cᵀΣw_c, with Σ the 3×3×C_in
patch covariance summed in float32 about a per-channel pivot (the mean of a 4×4 grid of sample 0). Each entry of Σ
errs relative to S = Σ + m·mᵀ, the second moment about the pivot: in the worst case the variance errs by u·κ_c,
κ_c = |w_c|ᵀ|S||w_c| / w_cᵀΣw_c; independent roundings add in quadrature, and the error measured follows
u·√(floor² + (spread·ρ_c)²), ρ_c = ‖(w_c w_cᵀ) ∘ S‖_F / w_cᵀΣw_c. The guard of strategy "auto" predicts the
norm-wise output error from it (``guard_prediction``: a channel's variance error δ_c moves its normalised output by
δ_c/2, channels weighted by (γ_c·s)²) and takes the moments while it is at most √3·u·√(C_in·9), what "float32-
accurate" (≤ 2× the float32 library's error, about u·√K for its K-term dot products) leaves for the statistics.
This module builds the inputs that test that rule — crops of two photographs (``natural_batch``), classic and
random filters (``filter_sets``), a far-off pivot (``with_outlier_pivot``), a smooth field at the rule's edge
(``edge_cases``) — computes κ and ρ in float64, measures every strategy's output and variance error against float64
beside eager PyTorch's float32 error, with the guard's choice, prediction and the time of the guarded call
(``error_vs_kappa``), and fits the model's floor and spread from such measurements (``calibrate``).
``python -m kernelbook.models.guard_study --out FILE`` runs the study on a GPU.
"""

from __future__ import annotations

import copy
import functools
import importlib.util
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

K = 3  # P73's kernel size
GREY = (0.2125, 0.7154, 0.0721)  # luminance of linear R, G, B (ITU-R BT.709), as scikit-image's rgb2gray
IMAGES = ("astronaut.png", "coffee.png")  # bundled with scikit-image (no download)
TOL = 1e-5  # the norm-wise error every path of chapter 7 is held to
U = 2.0**-24  # float32's unit roundoff
# The guard's model of the moments' variance error per arithmetic of the sums, as the kernel has it
# (conv_moments.cuh, GuardModel): rel. error ≈ u·√(floor² + (spread·ρ_c)²); tests check the two agree.
GUARD_MODEL = {"fp32": {"floor": 2.0, "spread": 1.25}, "3xtf32": {"floor": 4.0, "spread": 2.0}}
GUARD_ALLOWANCE = math.sqrt(3.0)  # √(2² − 1): the statistics' share of twice the library's u·√K
# A 3xTF32 product's error as a standard deviation in units of u of |w·x|, as the kernel has it (conv_moments.cuh,
# CONV_TF32_UNIT): ``split_product_error`` emulates the split at 1.2–1.3u rms; 2 leaves a margin for the tensor
# core's truncating accumulation, which the emulation leaves out.
CONV_TF32_UNIT = 2.0


# ------------------------------------------------------------------------------------------------ inputs

def skimage_data_dir() -> Path:
    """The data folder of the installed scikit-image package, found without importing it (importing skimage
    pulls in SciPy; only its bundled PNGs are read here)."""
    spec = importlib.util.find_spec("skimage")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "natural_batch reads the photographs bundled with the scikit-image package (astronaut.png, "
            "coffee.png), which is not installed: pip install scikit-image (it is not imported, so "
            "--no-deps is enough)", name="skimage")
    for loc in spec.submodule_search_locations:
        d = Path(loc) / "data"
        if all((d / f).is_file() for f in IMAGES):
            return d
    raise FileNotFoundError(f"the installed scikit-image has no data/{IMAGES[0]} and data/{IMAGES[1]} in "
                            f"{list(spec.submodule_search_locations)}")


@functools.cache
def _image_channels(name: str) -> np.ndarray:
    """(4, H, W) float32 in [0, 1]: R, G, B and grey of one bundled photograph."""
    import matplotlib.image as mpimg

    rgb = np.asarray(mpimg.imread(skimage_data_dir() / name), dtype=np.float64)[..., :3]  # PNG: floats in [0, 1]
    if rgb.max() > 1.0:  # an 8-bit image read as integers
        rgb = rgb / 255.0
    grey = rgb @ np.asarray(GREY)
    return np.clip(np.concatenate([rgb.transpose(2, 0, 1), grey[None]]), 0.0, 1.0).astype(np.float32)


def natural_batch(n: int, seed: int, size: int = 128, device: str | torch.device = "cpu") -> torch.Tensor:
    """P73-shaped input (n, 8, size, size), float32 in [0, 1]: sample k is a random size×size crop of each of
    astronaut.png and coffee.png (scikit-image's), channels R, G, B, grey of the first, then of the second:
    neighbouring pixels and the four channels of an image are strongly correlated, unlike ``torch.rand``."""
    imgs = [_image_channels(f) for f in IMAGES]
    for f, im in zip(IMAGES, imgs, strict=True):
        if min(im.shape[1:]) < size:
            raise ValueError(f"{f} is {im.shape[1]}×{im.shape[2]}: no {size}×{size} crop")
    rng = np.random.default_rng(seed)
    out = np.empty((n, 4 * len(imgs), size, size), dtype=np.float32)
    for k in range(n):
        for j, im in enumerate(imgs):
            r, c = (int(rng.integers(0, s - size + 1)) for s in im.shape[1:])
            out[k, 4 * j:4 * j + 4] = im[:, r:r + size, c:c + size]
    return torch.from_numpy(out).to(device)


def with_outlier_pivot(x: torch.Tensor, factor: float = 1000.0) -> torch.Tensor:
    """A copy of x whose values x[0, c, 0, 0] — one of the 16 samples of the moments kernel's pivot — are ``factor``
    times each channel's mean magnitude: one far-off value per channel, which moves the pivot by a sixteenth of it."""
    y = x.clone()
    y[0, :, 0, 0] = factor * x.abs().mean(dim=(0, 2, 3))
    return y


# ----------------------------------------------------------------------------------------------- filters

SOBEL_X = ((-1.0, 0.0, 1.0), (-2.0, 0.0, 2.0), (-1.0, 0.0, 1.0))
LAPLACIAN = ((0.0, 1.0, 0.0), (1.0, -4.0, 1.0), (0.0, 1.0, 0.0))
DIFFERENCE = ((0.0, 0.0, 0.0), (0.0, 0.375, -0.375), (0.0, 0.0, 0.0))  # chapter 7's horizontal difference


def gabor(theta: float, wavelength: float = 3.0, sigma: float = 1.0) -> torch.Tensor:
    """A 3×3 even (cosine) Gabor kernel at orientation ``theta``, its mean removed (so it ignores a constant)."""
    r = torch.arange(-1.0, 2.0, dtype=torch.float64)
    yy, xx = torch.meshgrid(r, r, indexing="ij")
    u = xx * math.cos(theta) + yy * math.sin(theta)
    g = torch.exp(-(xx**2 + yy**2) / (2 * sigma**2)) * torch.cos(2 * math.pi * u / wavelength)
    return g - g.mean()


def filter_sets(seed: int, c_in: int = 8, c_out: int = 64) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """name → (conv weight (c_out, c_in, 3, 3), bias (c_out,)), float32. ``<k>_one``: kernel k on input channel
    c mod c_in of output channel c, the other channels zero; ``<k>_all``: k on every input channel with random
    signs (channels that cancel against each other); Gabor filters turn by 22.5° every c_in output channels;
    every output channel has a random magnitude. ``random_normal``: Gaussian weights; ``kaiming_uniform``:
    P73's own initialisation (``nn.Conv2d``'s, seeded as ``kb.problems`` seeds it), with its bias;
    ``difference``: chapter 7's two-tap difference, horizontal and vertical in turn, on one input channel."""
    from .problems import P73_CONV_BN_SCALE

    g = torch.Generator().manual_seed(seed)
    bound = 1.0 / math.sqrt(c_in * K * K)  # nn.Conv2d's bias range
    bias = (torch.rand(c_out, generator=g, dtype=torch.float64) * 2 - 1) * bound
    amp = 0.5 + torch.rand(c_out, generator=g, dtype=torch.float64)
    signs = torch.randint(0, 2, (c_out, c_in), generator=g).double() * 2 - 1
    sobel_x = torch.tensor(SOBEL_X, dtype=torch.float64)
    diff_h = torch.tensor(DIFFERENCE, dtype=torch.float64)
    kernels = {"sobel_x": lambda c: sobel_x, "sobel_y": lambda c: sobel_x.T,
               "laplacian": lambda c: torch.tensor(LAPLACIAN, dtype=torch.float64),
               "gabor": lambda c: gabor(math.pi * (c // c_in % 8) / 8)}
    out = {}
    for name, kern in kernels.items():
        one, every = (torch.zeros(c_out, c_in, K, K, dtype=torch.float64) for _ in range(2))
        for c in range(c_out):
            one[c, c % c_in] = amp[c] * kern(c)
            every[c] = amp[c] * signs[c].view(c_in, 1, 1) * kern(c)
        out[f"{name}_one"], out[f"{name}_all"] = one, every
    out["random_normal"] = torch.randn(c_out, c_in, K, K, generator=g, dtype=torch.float64) * bound
    diff = torch.zeros(c_out, c_in, K, K, dtype=torch.float64)
    for c in range(c_out):
        diff[c, c % c_in] = amp[c] * (diff_h if c // c_in % 2 == 0 else diff_h.T)
    out["difference"] = diff
    sets = {k: (w.float().contiguous(), bias.float()) for k, w in out.items()}
    with torch.random.fork_rng():  # seeded as the benchmark seeds P73, without touching the caller's generator
        if (c_in, c_out) == (8, 64):
            conv = P73_CONV_BN_SCALE.model(seed=seed).conv
        else:
            torch.manual_seed(seed)
            conv = torch.nn.Conv2d(c_in, c_out, K)
    sets["kaiming_uniform"] = (conv.weight.detach().float().contiguous(), conv.bias.detach().float())
    return sets


# --------------------------------------------------------------------------------------------------- κ

def patch_moments(x: torch.Tensor, k: int = K, chunk: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean (C·k²,) and biased covariance (C·k², C·k²) of x's k×k patches (no padding), in float64, ordered as a
    conv weight's (channel, row, column). Summed ``chunk`` samples at a time about each channel's mean, so that
    the benchmark's batch needs no 2 GB patch matrix."""
    c = x.shape[1]
    centre = x.detach().double().mean(dim=(0, 2, 3))
    s1 = torch.zeros(c * k * k, dtype=torch.float64, device=x.device)
    gram = torch.zeros(c * k * k, c * k * k, dtype=torch.float64, device=x.device)
    count = 0
    for part in x.detach().split(chunk):
        p = F.unfold(part.double() - centre.view(1, c, 1, 1), k)  # (b, C·k², L)
        s1 += p.sum(dim=(0, 2))
        gram += torch.einsum("bkl,bjl->kj", p, p)
        count += p.shape[0] * p.shape[2]
    mean_c = s1 / count
    return mean_c + centre.repeat_interleave(k * k), gram / count - torch.outer(mean_c, mean_c)


def kernel_pivot(x: torch.Tensor) -> torch.Tensor:
    """The per-channel pivot the moments kernel subtracts before it forms products: the mean of the 16 values on
    a 4×4 grid over sample 0 (rows and columns ⌊i·(H−1)/3⌋), summed in float32 in the kernel's order."""
    _, c, h, w = x.shape
    rows, cols = [i * (h - 1) // 3 for i in range(4)], [j * (w - 1) // 3 for j in range(4)]
    grid = x[0][:, rows][:, :, cols].detach().float().reshape(c, 16)
    acc = torch.zeros(c, dtype=torch.float32, device=x.device)
    for k in range(16):
        acc = acc + grid[:, k]
    return (acc * 0.0625).double()


def _about_pivot(x, w, pivot, moments):
    """(w as rows in float64, Σ, the second moments S about ``pivot`` — Σ itself for None) for kappa and rho."""
    mean, cov = moments if moments is not None else patch_moments(x)
    wr = w.detach().reshape(len(w), -1).to(device=cov.device, dtype=torch.float64)
    if pivot is None:
        return wr, cov, cov
    if isinstance(pivot, str) and pivot != "kernel":
        raise ValueError(f"pivot must be None, 'kernel' or one value per input channel, got {pivot!r}")
    p = kernel_pivot(x) if isinstance(pivot, str) else torch.as_tensor(pivot)
    d = mean - p.to(device=cov.device, dtype=torch.float64).repeat_interleave(wr.shape[1] // len(p))
    return wr, cov, cov + torch.outer(d, d)


def kappa(x: torch.Tensor, w: torch.Tensor, pivot: str | torch.Tensor | None = None,
          moments: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """κ_c = |w_c|ᵀ|Σ||w_c| / w_cᵀΣw_c per output channel, in float64 on the CPU. With ``pivot`` ("kernel": the
    kernel's own, ``kernel_pivot``; or one value per input channel), |Σ| becomes |S_p|, S_p = Σ + (m − p)(m − p)ᵀ
    the second moments about the pivot that the kernel actually sums: the amplification its rounding meets when
    every entry errs the same way (a bound). ``moments``: ``patch_moments(x)`` if already computed."""
    wr, cov, a = _about_pivot(x, w, pivot, moments)
    num = ((wr.abs() @ a.abs()) * wr.abs()).sum(1)
    den = ((wr @ cov) * wr).sum(1)
    return (num / den).cpu()


def rho(x: torch.Tensor, w: torch.Tensor, pivot: str | torch.Tensor | None = "kernel",
        moments: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """ρ_c = ‖(w_c w_cᵀ) ∘ S‖_F / w_cᵀΣw_c per output channel (float64, CPU): κ_c's root-sum-square counterpart,
    the amplification of independent roundings of S's entries (ρ_c ≤ κ_c). S about the kernel's pivot by default,
    as the guard computes it; ``pivot`` and ``moments`` as for ``kappa``."""
    wr, cov, a = _about_pivot(x, w, pivot, moments)
    frob = ((wr**2) @ (a**2) * wr**2).sum(1)  # Σ_uv (w_u S_uv w_v)²
    return (frob.sqrt() / ((wr @ cov) * wr).sum(1)).cpu()


def guard_allowance(c_in: int) -> float:
    """The output error the guard allows the moments' statistics: √3·u·√K, K = c_in·9 (the library's u·√K)."""
    return GUARD_ALLOWANCE * U * math.sqrt(c_in * K * K)


def guard_prediction(x: torch.Tensor, w: torch.Tensor, math_: str, bn_w: torch.Tensor | None = None,
                     bn_b: torch.Tensor | None = None, eps: float = 1e-5, scale: float = 1.0,
                     moments: tuple[torch.Tensor, torch.Tensor] | None = None) -> dict:
    """What the guard of strategy "auto" computes, in float64 on the CPU, for the moments path in ``math_``
    ("fp32" or "3xtf32": the arithmetic of its sums and of its output convolution). The statistics' predicted
    norm-wise output error, E = ½·u·√(Σ_c (γ_c s)²·r_c³·(floor² + spread²·ρ_c²) / D), r_c = σ_c²/(σ_c² + ε),
    D = Σ_c ((γ_c s)²·r_c + (β_c s)²); for a 3xTF32 output convolution its own rounding,
    E_conv = CONV_TF32_UNIT·u·√(Σ_c (γ_c s)²·Q_c/(σ_c² + ε) / D), Q_c = Σ_k w_ck²·E[x_k²] (a product's error
    scales with |w·x|, so cancelling products err relative to the small output); the allowance; and the choice:
    the moments while E ≤ allowance, their convolution on ``math_`` while also √(E² + E_conv²) ≤ allowance and by
    FFMA otherwise (the FFMA convolution errs about as the library's, which the allowance already counts).
    {"predicted": E, "predicted_conv": E_conv (0 for "fp32"), "allowed", "choice": "moments" | "inplace",
    "conv": the moments' convolution's arithmetic, "rho": ρ_c}."""
    model = GUARD_MODEL[math_]
    wr, cov, _ = _about_pivot(x, w, "kernel", moments)
    mean = (moments if moments is not None else patch_moments(x))[0].to(cov.device, torch.float64)
    var = ((wr @ cov) * wr).sum(1).clamp_min(0.0).cpu()
    q = ((wr**2) @ (torch.diagonal(cov) + mean**2)).cpu()  # Q_c: Σ_k w_ck²·E[x_k²], x about zero as convolved
    r_c = rho(x, w, "kernel", moments)
    c_out = len(var)
    g = (torch.ones(c_out, dtype=torch.float64) if bn_w is None else bn_w.detach().double().cpu()) * scale
    be = (torch.zeros(c_out, dtype=torch.float64) if bn_b is None else bn_b.detach().double().cpu()) * scale
    r = var / (var + eps)
    terms = torch.where(var > 0, model["floor"] ** 2 + (model["spread"] * r_c) ** 2, model["floor"] ** 2)
    num, den = float((g**2 * r**3 * terms).sum()), float((g**2 * r + be**2).sum())
    num_conv = float(torch.where(var + eps > 0, g**2 * q / (var + eps), torch.zeros_like(q)).sum())
    e = 0.5 * U * math.sqrt(num / den) if den > 0 else 0.0
    e_conv = CONV_TF32_UNIT * U * math.sqrt(num_conv / den) if den > 0 and math_ == "3xtf32" else 0.0
    allowed = guard_allowance(w.shape[1])
    conv = math_ if math.hypot(e, e_conv) <= allowed else "fp32"
    return {"predicted": e, "predicted_conv": e_conv, "allowed": allowed,
            "choice": "moments" if e <= allowed else "inplace", "conv": conv, "rho": r_c}


def split_product_error(n: int = 1 << 20, seed: int = 0) -> dict[str, float]:
    """The error of one 3xTF32 product w·x as the tensor-core convolution forms it, emulated in float64 on the CPU,
    relative to |w·x| and in units of u, per operand distribution ("uniform": x in [0, 1), w in [−1, 1); "normal";
    "lognormal": x = e^z): w split with rounding (hi to the nearest TF32, lo = w − hi rounded again), x with hi
    rounded and lo kept in float32 but read by the tensor core truncated to TF32 (its 13 low bits dropped), and
    the product hi·hi + hi·lo + lo·hi with lo·lo dropped, summed exactly. {distribution: rms}; the accumulation's
    own rounding is left out."""
    rng = np.random.default_rng(seed)

    def tf32(v, nearest):
        b = v.astype(np.float32).view(np.uint32)
        b = (b + np.uint32(0x1000)) if nearest else b  # ties away, as split_fast and cvt.rna
        return (b & np.uint32(0xFFFFE000)).view(np.float32).astype(np.float64)

    draws = {"uniform": (rng.random(n), rng.uniform(-1.0, 1.0, n)),
             "normal": (rng.standard_normal(n), rng.standard_normal(n)),
             "lognormal": (np.exp(rng.standard_normal(n)), rng.standard_normal(n))}
    out = {}
    for name, (x, w) in draws.items():
        x, w = x.astype(np.float32).astype(np.float64), w.astype(np.float32).astype(np.float64)
        xh, wh = tf32(x, True), tf32(w, True)
        xl, wl = tf32(x - xh, False), tf32(w - wh, True)
        exact = w * x
        err = (wh * xh + wh * xl + wl * xh - exact) / np.abs(exact)
        out[name] = float(np.sqrt(np.mean(err[np.isfinite(err)] ** 2)) / U)
    return out


# ------------------------------------------------------------------------------------------- measurement

@dataclass
class Case:
    """One measurement: input x (N, C_in, H, W) and the conv's weight and bias, with labels for the table."""

    name: str
    x: torch.Tensor
    w: torch.Tensor
    b: torch.Tensor | None = None
    input: str = ""
    filters: str = ""


def pairs(inputs: Mapping[str, torch.Tensor], filters: Mapping[str, tuple[torch.Tensor, torch.Tensor]],
          ) -> list[Case]:
    """Every (input, filter set) pair as a Case named ``<input> / <filters>``."""
    return [Case(f"{i} / {f}", x, w, b, input=i, filters=f) for i, x in inputs.items() for f, (w, b) in filters.items()]


EDGE_DELTAS = (0.4, 0.3, 0.25, 0.2, 0.15)  # edge_cases' noise: predicted/allowed ≈ 0.3 … 3 on both maths


def edge_cases(seed: int = 0, deltas: Sequence[float] = EDGE_DELTAS, n: int = 4, size: int = 64) -> list[Case]:
    """Cases at the guard's edge: P73's own filters (``filter_sets``' kaiming_uniform) with each input channel's 9
    taps made to sum to zero — dense filters (all 72 taps) that cancel on smooth inputs — on a smooth field plus
    uniform noise of amplitude δ (``kb.variance.smooth_field``, 8 channels): the less noise, the more they
    cancel; over ``EDGE_DELTAS`` the predicted error crosses the allowance on both arithmetics. Dense, so that the
    library's error is that of 72-term dot products, as the allowance assumes."""
    from .variance import smooth_field

    w, b = filter_sets(seed)["kaiming_uniform"]
    w = (w - w.mean(dim=(2, 3), keepdim=True)).contiguous()
    return [Case(f"edge δ={d:g} n{n} / kaiming, zero-sum taps", smooth_field(d, seed, n=n, c=8, h=size, w=size),
                 w, b, input=f"edge δ={d:g}", filters="kaiming_zero_sum") for d in deltas]


def study_sections(batches: Sequence[int] = (128, 16), seed: int = 0, natural: bool = True,
                   outlier_factors: Sequence[float] = (10.0, 1000.0)) -> dict[str, list[Case]]:
    """The study's cases by section, most telling first (a run short of time can stop between sections), on the
    CPU: P73 itself (its initialisation and ``torch.rand`` input at the benchmark's batch); natural images at the
    benchmark's batch with every filter set; the guard's edge (``edge_cases``); chapter 7's difference filter on
    its smooth field (κ ≈ 10⁴ to 10⁵); far-off pivots (``with_outlier_pivot``) on P73's and on a natural batch;
    then, for each other batch, natural images and P73's input with every filter set. ``natural=False`` leaves the
    photographs out (no scikit-image needed)."""
    from .problems import P73_CONV_BN_SCALE as P
    from .variance import smooth_field

    small, full = min(batches), P.input_shape[0]
    sets = filter_sets(seed)

    def case(label: str, x: torch.Tensor, filters: str) -> Case:
        return Case(f"{label} / {filters}", x, *sets[filters], input=label, filters=filters)

    p73_small = P.inputs(seed=1, batch=small)
    out = {"p73": [case(f"p73 n{full}", P.inputs(seed=1, batch=full), "kaiming_uniform")]}
    if natural and full in batches:
        out[f"filters n{full}"] = pairs({f"natural n{full}": natural_batch(full, seed)}, sets)
    out["edge"] = edge_cases(seed)
    out["smooth"] = [case(f"smooth δ={d:.0e} n{small}", smooth_field(d, seed, n=small, c=8, h=128, w=128),
                          "difference") for d in (1e-2, 1e-4)]
    out["outlier"] = [case(f"p73 n{small} pivot×{f:g}", with_outlier_pivot(p73_small, f), "kaiming_uniform")
                      for f in outlier_factors]
    if natural:
        nat = with_outlier_pivot(natural_batch(small, seed), outlier_factors[-1])
        out["outlier"] += [case(f"natural n{small} pivot×{outlier_factors[-1]:g}", nat, name)
                           for name in ("kaiming_uniform", "sobel_x_one")]
    for n in (n for n in batches if n != full):
        inputs = {f"natural n{n}": natural_batch(n, seed)} if natural else {}
        inputs[f"p73 n{n}"] = p73_small if n == small else P.inputs(seed=1, batch=n)
        out[f"filters n{n}"] = pairs(inputs, sets)
    return out


def _module(w: torch.Tensor, b: torch.Tensor | None, scale: float):
    """P73 (conv → training-mode BN → ·scale) with this filter, γ = 1, β = 0 and momentum 1: after one call its
    running mean and variance are this batch's mean and unbiased variance (nn.BatchNorm2d and the kernel both
    update running ← (1 − m)·running + m·batch)."""
    from .problems import P73

    m = P73(w.shape[1], w.shape[0], w.shape[-1], scale)
    with torch.no_grad():
        m.conv.weight.copy_(w)
        if b is None:
            m.conv.bias = None
        else:
            m.conv.bias.copy_(b)
    m.bn.momentum = 1.0
    return m


def _channel_errors(mean, var, mean64, var64) -> tuple[torch.Tensor, torch.Tensor]:
    """Per channel: |var − var64| / var64, and |mean − mean64| in units of the batch's standard deviation."""
    return (var.double() - var64).abs().div(var64).cpu(), (mean.double() - mean64).abs().div(var64.sqrt()).cpu()


def _train(ext, m, x: torch.Tensor, scale: float, strategy: str, math_: str, out: torch.Tensor) -> torch.Tensor:
    """One training-mode call of the fused kernel on m's conv and bn (their running statistics updated)."""
    c, bn = m.conv, m.bn
    return ext.conv_bn_scale_train(x, c.weight, c.bias, bn.weight, bn.bias, bn.running_mean, bn.running_var,
                                   bn.num_batches_tracked, bn.momentum, bn.eps, scale, out, strategy, math_)


def _time_auto(ext, model, x, scale, math_, out, chapter, variant, warmup, rep) -> float:
    """Median ms of the guarded call (strategy "auto") on a copy of ``model``, by ``kb.timing.bench``."""
    from ..harness import timing

    m = copy.deepcopy(model)
    return timing.bench(lambda: _train(ext, m, x, scale, "auto", math_, out), chapter, variant, warmup=warmup,
                        rep=rep)["median"]


def error_vs_kappa(mod, cases: Iterable[Case] | Mapping[str, tuple], maths: Sequence[str] = ("fp32", "3xtf32"),
                   strategies: Sequence[str] = ("moments", "inplace"), scale: float = 2.0, tol: float = TOL,
                   time: bool = True, warmup: int = 5, rep: int = 20, chapter: str = "guard_study",
                   device: str = "cuda"):
    """For each case, training-mode P73 (``_module``) by every strategy × math of ``mod`` (the ``conv_bn_scale``
    extension) against float64 — the output's ``kb.check.report`` (norm-wise) and the batch variance's relative
    error per channel (the running variance after one call at momentum 1) — beside eager float32 PyTorch's (TF32
    off) on the same input; with κ per channel (about the mean, and about the kernel's pivot) and ρ (about the
    pivot), the guard's choice, predicted output error and allowance for each math (the kernel's, and
    ``guard_prediction``'s on the CPU: ``guard_predicts``, ``predicted_cpu``), and, if ``time``, the guarded call's
    time (strategy "auto") for each math and for the default math. One row per case × math × strategy (a pandas
    DataFrame); per-channel values are lists.
    ``f32_accurate``: the output errs at most 2× eager's error (never less than 2u), the book's rule.
    ``device``: where everything runs (the kernels need "cuda"; the tests run the logic on a CPU stand-in)."""
    import pandas as pd

    from ..harness import check, precision

    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("error_vs_kappa runs the fused conv_bn_scale kernels: it needs a CUDA GPU, and none is "
                           "visible")
    ext = getattr(mod, "raw", mod)  # the binding itself: values only, no autograd
    if isinstance(cases, Mapping):
        cases = [Case(name, *v) for name, v in cases.items()]
    rows = []
    for case in cases:
        x = case.x.to(device, torch.float32).contiguous()
        w = case.w.to(device, torch.float32).contiguous()
        b = None if case.b is None else case.b.to(device, torch.float32).contiguous()
        moments = patch_moments(x)
        kap, kap_p = kappa(x, w, moments=moments), kappa(x, w, "kernel", moments=moments)
        rho_p = rho(x, w, "kernel", moments=moments)
        model = _module(w, b, scale).to(device)
        bn = (model.bn.weight, model.bn.bias, model.bn.eps, scale)
        timed = {"chapter": chapter, "warmup": warmup, "rep": rep}
        with torch.no_grad():
            ref = copy.deepcopy(model).double()
            y64 = ref(x.double())
            mean64, var64 = ref.bn.running_mean, ref.bn.running_var  # the batch's mean, unbiased variance
            eager = copy.deepcopy(model)
            with precision.tf32(False, False):
                e = check.report(eager(x), y64, tol)
            e_var, e_mean = _channel_errors(eager.bn.running_mean, eager.bn.running_var, mean64, var64)
            out = torch.empty_like(y64, dtype=torch.float32)
            g = ext.conv_bn_scale_guard(x, w, b, "auto", *bn)
            default = {"default_math": g["math"], "default_choice": g["choice"], "default_conv": g["conv"],
                       "default_predicted": g["predicted"], "default_predicted_conv": g["predicted_conv"]}
            if time:
                default["default_ms"] = _time_auto(ext, model, x, scale, "auto", out, variant=f"{case.name}/auto",
                                                   **timed)
            for math_ in maths:
                g = ext.conv_bn_scale_guard(x, w, b, math_, *bn)
                cpu = guard_prediction(x, w, g["math"], *bn[:2], eps=bn[2], scale=scale, moments=moments)
                guard = {"choice": g["choice"], "conv": g["conv"], "guard_predicted": g["predicted"],
                         "guard_predicted_conv": g["predicted_conv"], "guard_allowed": g["allowed"],
                         "guard_predicts": cpu["choice"], "conv_predicts": cpu["conv"],
                         "predicted_cpu": cpu["predicted"], "predicted_conv_cpu": cpu["predicted_conv"]}
                if time:
                    guard["auto_ms"] = _time_auto(ext, model, x, scale, math_, out,
                                                  variant=f"{case.name}/auto_{math_}", **timed)
                for strategy in strategies:
                    m = copy.deepcopy(model)
                    out.fill_(float("nan"))  # an element the kernel never writes stays NaN and is counted
                    r = check.report(_train(ext, m, x, scale, strategy, math_, out), y64, tol)
                    v_err, m_err = _channel_errors(m.bn.running_mean, m.bn.running_var, mean64, var64)
                    eager_tol = max(2.0 * e["rel_err"], 2.0 * check.FP32_UNIT_ROUNDOFF)
                    rows.append({
                        "case": case.name, "input": case.input, "filters": case.filters, "n": int(x.shape[0]),
                        "strategy": strategy, "math": math_, **guard, **default,
                        "kappa_max": float(kap.max()), "kappa_pivot_max": float(kap_p.max()),
                        "rho_pivot_max": float(rho_p.max()), "rho_pivot_rms": float(rho_p.square().mean().sqrt()),
                        "rel_err": r["rel_err"], "max_abs_err": r["max_abs_err"], "unwritten": r["unwritten"],
                        "passed": r["passed"], "eager_rel_err": e["rel_err"],
                        "ratio_to_eager": r["rel_err"] / e["rel_err"] if e["rel_err"] > 0 else float("inf"),
                        "f32_accurate": bool(r["unwritten"] == 0 and r["rel_err"] <= eager_tol),
                        "var_err": float(v_err.max()), "eager_var_err": float(e_var.max()),
                        "mean_err_sigma": float(m_err.max()), "eager_mean_err_sigma": float(e_mean.max()),
                        "batches_counted": int(m.bn.num_batches_tracked),
                        "kappa_c": kap.tolist(), "kappa_pivot_c": kap_p.tolist(), "rho_pivot_c": rho_p.tolist(),
                        "var_err_c": v_err.tolist(),
                        "eager_var_err_c": e_var.tolist()})
        del y64, out, ref
    return pd.DataFrame(rows)


def cancelling_inputs(n: int = 8, size: int = 48, c_in: int = 8, c_out: int = 64, seed: int = 0,
                      device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x, w, b): the book's cancelling input class for a 3×3 convolution — inputs 1 + 10⁻³·u, taps alternating in
    sign down the filter's C_in·9 inputs (each times 1 + 10⁻³·u), u uniform in [−1, 1) — so each output sums
    terms of size ≈ 1 to ≈ 10⁻², while the batch statistics are well conditioned (the spread is the inputs')."""
    gen = torch.Generator().manual_seed(seed)

    def u(*shape):
        return 2.0 * torch.rand(shape, generator=gen) - 1.0

    sign = (torch.arange(c_in * K * K) % 2 * 2 - 1).float().reshape(c_in, K, K)
    x, w, b = 1 + 1e-3 * u(n, c_in, size, size), sign * (1 + 1e-3 * u(c_out, c_in, K, K)), 0.1 * u(c_out)
    return x.to(device), w.to(device), b.to(device)


def cancelling_check(mod, scale: float = 2.0, **inputs) -> dict:
    """Training mode on ``cancelling_inputs`` (γ = 1, β = 0, ε = 1e-5): the guard's choice and predictions (the
    statistics' E, the tensor-core convolution's E_conv, the allowance), and the output's error against float64
    for the default call, for the moments with each arithmetic forced (sums and convolution), and for eager
    float32 PyTorch (TF32 off). ``passed``: the default within twice eager's error. JSON-ready."""
    from ..harness import check, precision

    ext = getattr(mod, "raw", mod)
    x, w, b = cancelling_inputs(device="cuda", **inputs)

    def bn(z):
        return F.batch_norm(z, None, None, None, None, True, 0.0, 1e-5) * scale

    ref = bn(F.conv2d(x.double(), w.double(), b.double()))
    with precision.tf32(False, False):
        eager = check.report(bn(F.conv2d(x, w, b)), ref, 1.0)["rel_err"]
    err, auto = {}, None
    for name, strategy, math_ in (("auto", "auto", "auto"), ("moments_3xtf32", "moments", "3xtf32"),
                                  ("moments_fp32", "moments", "fp32")):
        if math_ == "3xtf32" and torch.cuda.get_device_capability(x.device)[0] < 8:
            continue
        y = ext.conv_bn_scale_train(x, w, b, None, None, None, None, None, 0.1, 1e-5, scale, None, strategy, math_)
        r = check.report(y, ref, 1.0)
        err[name] = r["rel_err"]
        if name == "auto":
            auto = r
    g = ext.conv_bn_scale_guard(x, w, b, "auto", None, None, 1e-5, scale)
    return {"choice": g["choice"], "conv": g["conv"], "math": g["math"], "predicted": g["predicted"],
            "predicted_conv": g["predicted_conv"], "allowed": g["allowed"], "eager_rel_err": eager,
            **{f"{k}_rel_err": v for k, v in err.items()}, "rel_err": err["auto"],
            "max_abs_err": auto["max_abs_err"], "tol": 2.0 * eager,
            "passed": bool(auto["unwritten"] == 0 and err["auto"] <= 2.0 * eager)}


def cancelling_glue(cc: dict) -> dict:
    """The numbers the capstone quotes from ``cancelling_check``'s record (``cc``), as cc_<key>, and the errors'
    ratios to eager float32's (NaN where the GPU had no tensor cores to force)."""
    nan = float("nan")
    keys = ("predicted", "predicted_conv", "allowed", "auto_rel_err", "moments_3xtf32_rel_err", "eager_rel_err")
    return {**{f"cc_{k}": cc.get(k, nan) for k in keys}, "cc_ratio_auto": cc["auto_rel_err"] / cc["eager_rel_err"],
            "cc_ratio_tc": cc.get("moments_3xtf32_rel_err", nan) / cc["eager_rel_err"]}


def implied_u(df, kappa_min: float = 10.0):
    """From the moments' rows of ``error_vs_kappa``: per math, the largest variance error per unit of κ over the
    channels with κ ≥ ``kappa_min`` (below it the float32 rounding of the variance itself dominates), by the
    guard's κ and by the pivot's; and the κ threshold that would keep that error at ``TOL``."""
    import pandas as pd

    out = {}
    for math_, g in df[df["strategy"] == "moments"].groupby("math"):
        err = np.concatenate([np.asarray(v) for v in g["var_err_c"]])
        res = {}
        for col in ("kappa_c", "kappa_pivot_c"):
            kap = np.concatenate([np.asarray(v) for v in g[col]])
            keep = kap >= kappa_min
            res[f"u_eff ({col})"] = float((err[keep] / kap[keep]).max()) if keep.any() else float("nan")
            res[f"kappa at {TOL:.0e} ({col})"] = TOL / res[f"u_eff ({col})"]
        res["channels"] = int(len(err))
        out[math_] = res
    return pd.DataFrame(out).T


def _rms(values) -> float:
    return float(np.sqrt(np.mean(np.square(np.asarray(values, dtype=np.float64)))))


def calibrate(df, floor_rho: float = 1.2):
    """The guard's model fitted to the moments' rows of ``error_vs_kappa``, per math of the sums: the floor (the
    largest rms over channels of the variance error, in units of u, among cases whose rms ρ is below
    ``floor_rho``), the spread (the largest √(rms δ² − floor²)/rms ρ, with the kernel's floor), the kernel's own
    (``GUARD_MODEL``), and the largest ratio of a case's rms error to the kernel's model (≤ 1: every case covered).
    The rms over channels, not the largest channel: the guard sums the channels' errors into the output's norm."""
    import pandas as pd

    out = {}
    for math_, g in df[df["strategy"] == "moments"].groupby("math"):
        d = np.array([_rms(v) for v in g["var_err_c"]]) / U
        r = np.array([_rms(v) for v in g["rho_pivot_c"]])
        fl, sp = GUARD_MODEL[math_]["floor"], GUARD_MODEL[math_]["spread"]
        low = r < floor_rho
        out[math_] = {"floor measured": float(d[low].max()) if low.any() else float("nan"),
                      "spread measured": float((np.sqrt(np.maximum(d**2 - fl**2, 0.0)) / r).max()),
                      "floor": fl, "spread": sp, "worst / model": float((d / np.sqrt(fl**2 + (sp * r) ** 2)).max()),
                      "cases": len(g)}
    return pd.DataFrame(out).T


def verdicts(df):
    """One row per case of ``error_vs_kappa``'s frame, for the default arithmetic (``default_math``): the path the
    guard took, its predicted error and allowance, the guarded call's error, eager float32's, their ratio, the
    moments forced (error and ratio), the guarded call's time, and whether the call is float32-accurate."""
    import pandas as pd

    rows = []
    for case, g in df.groupby("case", sort=False):
        g = g[g["math"] == g["default_math"].iloc[0]].set_index("strategy")
        a, mo = g.loc["auto"], g.loc["moments"] if "moments" in g.index else None
        rows.append({"case": case, "path": a["choice"], "predicted": a["guard_predicted"],
                     "allowed": a["guard_allowed"], "error": a["rel_err"], "eager": a["eager_rel_err"],
                     "ratio": a["ratio_to_eager"], "moments forced": np.nan if mo is None else mo["rel_err"],
                     "forced ratio": np.nan if mo is None else mo["ratio_to_eager"],
                     "ms": a.get("auto_ms", np.nan), "f32_accurate": bool(a["f32_accurate"])})
    return pd.DataFrame(rows).set_index("case")


NATURAL_COLUMNS = {"rho_pivot_rms": "ρ (rms)",
                   "default_predicted": "E", "default_choice": "path",
                   "default_rel_err": "error", "eager_rel_err": "eager",
                   "moments_fp32_rel_err": "forced FFMA", "moments_3xtf32_rel_err": "forced 3xTF32"}


NATURAL_FORMATS = {"ρ (rms)": "{:.1f}",
                   **dict.fromkeys(["E", "error", "eager", "forced FFMA", "forced 3xTF32"], "err")}
SHORT = {"kaiming_uniform": "P73's init", "sobel_x_one": "Sobel", "laplacian_one": "Laplacian",
         "gabor_one": "Gabor", "random_normal": "random"}  # filter sets as the chapter names them
NATURAL_FILTERS = ("kaiming_uniform", "sobel_x_one", "laplacian_one", "gabor_one", "random_normal")


def _path(row: dict) -> str:
    """A natural-image row's default path in words: "moments", "moments, FFMA conv" (the guard kept the
    statistics but not the tensor-core convolution) or "inplace"."""
    p = row.get("default_choice", "")
    ffma_conv = p == "moments" and row.get("default_math") == "3xtf32" and row.get("default_conv") == "fp32"
    return "moments, FFMA conv" if ffma_conv else p


def natural_table(nat: dict):
    """``chapter_check``'s rows as the chapter shows them: one row per filter set, short column names (a column a
    record does not hold shows as missing)."""
    import pandas as pd

    rows = [{**r, "default_choice": _path(r)} for r in nat["rows"]]
    df = pd.DataFrame(rows).set_index("filters").reindex(columns=list(NATURAL_COLUMNS))
    return df.rename(columns=NATURAL_COLUMNS).rename(index=lambda f: SHORT.get(f, f))


def chapter_check(mod, filters: Sequence[str] = NATURAL_FILTERS, n: int = 128, seed: int = 0, rep: int = 20) -> dict:
    """The capstone's natural-image check: a batch of ``n`` natural-image crops (``natural_batch``) through each
    filter set of ``filter_sets``, the moments forced on both arithmetics (their variance error against κ about
    the pivot) and the default call (its path, the guard's predicted error and allowance, its error against eager
    float32's, time). JSON-ready: ``rows``, one per filter set, and ``u_eff``, per math the largest variance error
    per unit of κ (channels with κ ≥ 10)."""
    sets = filter_sets(seed)
    x = natural_batch(n, seed, device="cuda")
    cases = [Case(f, x, *sets[f], input="natural", filters=f) for f in filters]
    chapter = "07_capstone_conv_bn_scale"
    df = error_vs_kappa(mod, cases, strategies=("moments",), time=False, chapter=chapter)
    default = error_vs_kappa(mod, cases, maths=("auto",), strategies=("auto",), rep=rep, chapter=chapter)
    u = implied_u(df)
    rows = []
    for (f, g), (_, d) in zip(df.groupby("filters", sort=False), default.iterrows(), strict=True):
        rows.append({"filters": f, "kappa_pivot_max": d["kappa_pivot_max"], "kappa_max": d["kappa_max"],
                     "rho_pivot_rms": d["rho_pivot_rms"], "default_math": d["default_math"],
                     "default_choice": d["default_choice"], "default_predicted": d["default_predicted"],
                     "default_conv": d["default_conv"], "default_predicted_conv": d["default_predicted_conv"],
                     "default_allowed": d["guard_allowed"], "default_ms": d["default_ms"],
                     "default_rel_err": d["rel_err"], "default_max_abs_err": d["max_abs_err"],
                     "eager_rel_err": d["eager_rel_err"],
                     **{f"moments_{r['math']}_rel_err": r["rel_err"] for _, r in g.iterrows()}})
    return {"n": n, "rows": rows, "u_eff": {m: float(u.loc[m, "u_eff (kappa_pivot_c)"]) for m in u.index}}


def _listed(names: Sequence[str]) -> str:
    """'a', 'a and b', 'a, b and c'."""
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def chapter_glue(nat: dict) -> dict:
    """The numbers the capstone's prose quotes from ``chapter_check``'s record (``nat``): batch size, largest κ
    and ρ (rms over channels), the default's paths in words, the guard's largest predicted error where it kept
    the moments and its smallest where it went in place, its error's largest ratio to eager float32's (over all
    filter sets, and where it took the moments), worst errors, the guard's allowance, the default call's slowest
    time on each path, and u_eff per math in units of 2⁻²⁴."""
    rows = nat["rows"]
    said = {"moments": "the moments", "moments, FFMA conv": "the moments with the FFMA convolution",
            "inplace": "the in-place path"}
    by_path = {p: [SHORT.get(r["filters"], r["filters"]) for r in rows if _path(r) == p] for p in said}
    words = "; ".join(f"{said[p]} for {_listed(names)}" for p, names in by_path.items() if names)
    ratio = {p: max((r["default_rel_err"] / r["eager_rel_err"] for r in rows if p in (None, r["default_choice"])),
                    default=float("nan")) for p in (None, "moments")}
    ms = {p: max((r.get("default_ms", float("nan")) for r in rows if r["default_choice"] == p),
                 default=float("nan")) for p in ("moments", "inplace")}
    e = {p: [r.get("default_predicted", float("nan")) for r in rows if r["default_choice"] == p]
         for p in ("moments", "inplace")}  # the guard's predicted error on each path
    return {"nat_n": int(nat.get("n", 128)), "nat_kappa_max": max(r["kappa_pivot_max"] for r in rows),
            "nat_rho_max": max(r.get("rho_pivot_rms", float("nan")) for r in rows),
            "nat_ms_moments": ms["moments"], "nat_ms_inplace": ms["inplace"],
            "nat_paths": words, "nat_e_kept": max(e["moments"], default=float("nan")),
            "nat_e_refused": min(e["inplace"], default=float("nan")),
            "nat_worst": max(r["default_rel_err"] for r in rows),
            "nat_eager": max(r["eager_rel_err"] for r in rows),
            "nat_ratio": ratio[None], "nat_ratio_moments": ratio["moments"],
            "nat_allowed": rows[0].get("default_allowed", float("nan")),
            "nat_tc_worst": max(r.get("moments_3xtf32_rel_err", float("nan")) for r in rows),
            "nat_tc_vs_tol": "within the" if max(r["moments_3xtf32_rel_err"] for r in rows) <= TOL else "beyond the",
            "u_eff_tc": nat["u_eff"].get("3xtf32", float("nan")) / U, "u_eff_ffma": nat["u_eff"]["fp32"] / U}


def guard_glue(guard: dict, math_: str) -> dict:
    """The guard's numbers the capstone's prose quotes: its model for the sums in ``math_`` and by FFMA
    (``GUARD_MODEL``) and for the tensor-core convolution (``CONV_TF32_UNIT``), the allowance at P73's 72 patch
    values and the split's emulated rms error (``split_product_error``, in u), and from the record (``guard``) the
    predicted errors on the ill-conditioned check and on P73 (missing from a record made before the guard kept
    them: NaN)."""
    nan = float("nan")
    return {"g_floor": GUARD_MODEL[math_]["floor"], "g_spread": GUARD_MODEL[math_]["spread"],
            "g_floor_ffma": GUARD_MODEL["fp32"]["floor"], "g_spread_ffma": GUARD_MODEL["fp32"]["spread"],
            "g_allowed": guard_allowance(8), "g_ill_predicted": guard.get("ill_predicted", nan),
            "g_p73_predicted": guard.get("p73_predicted", nan),
            "g_p73_predicted_conv": guard.get("p73_predicted_conv", nan), "g_conv_unit": CONV_TF32_UNIT,
            "split_rms": max(split_product_error().values())}


def natural_check(nat: dict, tol: float) -> dict:
    """``chapter_check``'s result as a record check: the default's worst error against the chapter's tolerance."""
    worst = max(r["default_rel_err"] for r in nat["rows"])
    return {"rel_err": worst, "max_abs_err": max(r["default_max_abs_err"] for r in nat["rows"]), "tol": tol,
            "unwritten": 0, "passed": bool(worst <= tol),
            "paths": {r["filters"]: r["default_choice"] for r in nat["rows"]}}


def emulate_moments(x: torch.Tensor, w: torch.Tensor, pivot: bool = True, band: int = 2048):
    """(κ_c about the kernel's pivot, σ_c² the moments' way) on the CPU with the kernel's arithmetic: float32
    products of pivot-shifted patch values, per-band float32 sums, bands merged and the quadratic form in float64."""
    import torch.nn.functional as F

    pt = F.unfold(x, K).transpose(1, 2).reshape(-1, w[0].numel())
    wr = w.reshape(len(w), -1).double()
    if pivot:  # the kernel's pivot of each channel, subtracted from all of that channel's values
        pt = pt - kernel_pivot(x).float().repeat_interleave(K * K)
    gram = sum((b.T @ b).double() for b in pt.split(band))  # bands merged in double
    mean = sum(b.sum(0).double() for b in pt.split(band)) / len(pt)
    return kappa(x, w, "kernel"), ((gram / len(pt) - torch.outer(mean, mean)) @ wr.T * wr.T).sum(0)


# ---------------------------------------------------------------------------------------------------- the run

def _plain(o):
    """JSON-safe: numpy/torch scalars to Python, non-finite floats to None."""
    if isinstance(o, dict):
        return {str(k): _plain(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_plain(v) for v in o]
    if hasattr(o, "item") and not isinstance(o, (str, bytes)):
        o = o.item()
    if isinstance(o, float) and not math.isfinite(o):
        return None
    return o


def main(argv: Sequence[str] | None = None) -> int:
    """The study on a GPU: every section of ``study_sections`` (most telling first) through ``error_vs_kappa``
    (fp32 and 3xTF32 sums; auto, moments and in place), the JSON rewritten after each section so that a run cut
    short keeps what it measured, then ``verdicts``, ``calibrate`` and ``implied_u`` printed."""
    import argparse
    import json
    import time as clock

    import pandas as pd

    ap = argparse.ArgumentParser(prog="python -m kernelbook.models.guard_study", description=main.__doc__)
    ap.add_argument("--out", required=True, type=Path, help="the JSON file to write")
    ap.add_argument("--batches", default="128,16", help="batch sizes of the natural-image sections")
    ap.add_argument("--budget-s", type=float, default=110.0,
                    help="skip the sections left once this many seconds of measuring (after the build) have passed")
    ap.add_argument("--rep", type=int, default=20, help="ms of timed calls per timing (kb.timing.bench's rep)")
    ap.add_argument("--no-time", action="store_true", help="do not time the guarded call")
    args = ap.parse_args(argv)
    t0 = clock.perf_counter()
    natural = True
    try:
        skimage_data_dir()
    except (ModuleNotFoundError, FileNotFoundError) as e:
        print(f"guard_study: natural images left out: {e}", flush=True)
        natural = False
    sections = study_sections(batches=tuple(int(b) for b in args.batches.split(",")), natural=natural)
    print(f"guard_study: {sum(len(v) for v in sections.values())} cases in {len(sections)} sections prepared "
          f"({clock.perf_counter() - t0:.1f} s)", flush=True)
    if not torch.cuda.is_available():
        print("guard_study: no CUDA GPU is visible; the study measures the fused kernels on one", flush=True)
        return 2
    from ..harness import build, records

    t_build = clock.perf_counter()
    mod = build.load("conv_bn_scale")
    rec = records.new("guard_study", kernels=["conv_bn_scale"])
    meta = {"provenance": rec["provenance"], "build_s": clock.perf_counter() - t_build,
            "args": {**vars(args), "out": str(args.out)},
            "natural_images": natural, "guard_model": {m: mod.raw.guard_model(m) for m in ("fp32", "3xtf32")},
            "default_math": mod.raw.conv_bn_scale_math(sections["p73"][0].x[:1].cuda(), "auto"), "tol": TOL,
            "sections": {k: [c.name for c in v] for k, v in sections.items()}, "section_s": {}, "skipped": [],
            "errors": {}}
    print(f"guard_study: built in {meta['build_s']:.0f} s on {rec['provenance']['gpu']}; default math "
          f"{meta['default_math']}", flush=True)
    frames: list = []

    def save():
        df = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
        doc = {**meta, "elapsed_s": clock.perf_counter() - t0, "rows": df.to_dict("records")}
        if frames:
            doc |= {"implied_u": implied_u(df).to_dict("index"), "calibration": calibrate(df).to_dict("index"),
                    "verdicts": verdicts(df).reset_index().to_dict("records")}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(_plain(doc), allow_nan=False))
        return df

    t_measure = clock.perf_counter()
    for name, cases in sections.items():
        if clock.perf_counter() - t_measure > args.budget_s:
            meta["skipped"].append(name)
            print(f"guard_study: budget spent, section {name!r} skipped", flush=True)
            continue
        ts = clock.perf_counter()
        for case in cases:
            try:
                frames.append(error_vs_kappa(mod, [case], strategies=("auto", "moments", "inplace"),
                                             time=not args.no_time, rep=args.rep))
            except RuntimeError as e:  # one case's failure (a refused input, memory) is recorded, not fatal
                meta["errors"][case.name] = str(e).splitlines()[0]
                print(f"guard_study: {case.name}: {meta['errors'][case.name]}", flush=True)
            torch.cuda.empty_cache()
        meta["section_s"][name] = clock.perf_counter() - ts
        save()
        print(f"guard_study: section {name!r}: {len(cases)} cases in {meta['section_s'][name]:.1f} s", flush=True)
    df = save()
    if df.empty:
        print("guard_study: nothing measured", flush=True)
        return 1
    with pd.option_context("display.width", 250, "display.max_columns", 40, "display.max_rows", 500,
                           "display.float_format", "{:.3g}".format):
        v = verdicts(df)
        print(v.to_string())
        print("\nthe guard's model against the measured variance errors (rms over channels, units of u):")
        print(calibrate(df).to_string())
        bad = v[~v["f32_accurate"]]
        print(f"\ndefault path not float32-accurate (> 2× eager) in {len(bad)} of {len(v)} cases"
              + (":\n" + bad.to_string() if len(bad) else ""))
        cpu = df[df["choice"] != df["guard_predicts"]]
        print(f"kernel's choice differs from the CPU prediction in {len(cpu)} rows"
              + (":\n" + cpu[["case", "math", "choice", "guard_predicted", "predicted_cpu"]].to_string()
                 if len(cpu) else ""))
    print(f"guard_study: wrote {args.out} in {clock.perf_counter() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
