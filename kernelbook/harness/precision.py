"""The book's one TF32 switch, and its policy.

PyTorch lets cuDNN run a float32 convolution in TF32 by default and keeps float32 matrix products in
full float32; whether a convolution *does* use TF32 is cuDNN's choice of algorithm at run time. The
book's policy, stated once: our kernels compute in float32 (FFMA; chapters 6-8 also in 3xTF32 on the tensor
cores), checked against float64 like every kernel; every baseline is measured
with PyTorch's defaults (so as a user would get it), and where TF32 could change a baseline's time it
is measured a second time with TF32 off (variant names ending in ``_fp32``). Which arithmetic a
baseline used is read from the kernels its profile shows, and its error against float64 is shown.

PyTorch 2.9 added ``fp32_precision`` settings beside the older ``allow_tf32`` flags and refuses to
*read* the old flags once the new ones hold a TF32 choice the old ones cannot express ("a mix of the
legacy and new APIs"). torch.compile's Inductor still reads the old flags (seen with torch 2.11 on an
H200: compiling P73's convolution after setting ``torch.backends.cuda.matmul.fp32_precision`` raised
that error), while setting the old flags keeps both views consistent (the new settings then read
"tf32" or "ieee" to match). So this module sets the old flags, and every chapter sets TF32 only here.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


def state() -> dict[str, bool]:
    """Whether TF32 is allowed now for cuDNN convolutions and for float32 matrix products."""
    import torch

    return {"conv": bool(torch.backends.cudnn.allow_tf32), "matmul": bool(torch.backends.cuda.matmul.allow_tf32)}


def _set(conv: bool, matmul: bool) -> None:
    import torch

    torch.backends.cudnn.allow_tf32 = conv
    torch.backends.cuda.matmul.allow_tf32 = matmul


@contextmanager
def tf32(conv: bool, matmul: bool | None = None) -> Iterator[None]:
    """Allow (True) or forbid (False) TF32 for convolutions and, if given, matrix products; the
    previous settings come back on exit. ``tf32(False, False)`` is strict float32 everywhere."""
    before = state()
    _set(conv, before["matmul"] if matmul is None else matmul)
    try:
        yield
    finally:
        _set(before["conv"], before["matmul"])


def defaults() -> None:
    """PyTorch's defaults: cuDNN may use TF32 for convolutions; matrix products stay float32."""
    _set(conv=True, matmul=False)
