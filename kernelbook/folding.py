"""Folding an eval-mode BatchNorm and a scale factor into the convolution before them (chapter 2).

With inv = γ·s / sqrt(running_var + eps), conv → BN(eval) → ·s is one convolution with
W' = W·inv (per output channel) and b' = (b − running_mean)·inv + β·s (b = 0 without a conv bias).
``fold`` computes W' and b' at call time from the modules' current parameters, so they can never be
stale; ``FoldedConvBNScale`` is the module built on it.
"""

from __future__ import annotations

import torch
from torch import nn


def fold(conv: nn.Conv2d, bn: nn.BatchNorm2d, scale: float = 1.0,
         dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(W', b') such that conv2d(x, W', b') == bn(conv(x)) * scale with ``bn`` in eval mode.

    Computed in ``dtype`` (default: the weights' own) and returned in the weights' dtype; pass
    ``torch.float64`` to fold exactly and round once at the end.
    """
    if not bn.track_running_stats or bn.running_mean is None:
        raise ValueError("fold: BatchNorm without running statistics normalises with batch statistics in every "
                         "mode, so it cannot be folded into the convolution")
    if conv.out_channels != bn.num_features:
        raise ValueError(f"fold: conv has {conv.out_channels} output channels but BatchNorm has "
                         f"{bn.num_features} features")
    out_dtype = conv.weight.dtype
    dt = dtype or out_dtype
    with torch.no_grad():
        w = conv.weight.to(dt)
        c = w.shape[0]
        gamma = bn.weight.to(dt) if bn.affine else torch.ones(c, dtype=dt, device=w.device)
        beta = bn.bias.to(dt) if bn.affine else torch.zeros(c, dtype=dt, device=w.device)
        bias = conv.bias.to(dt) if conv.bias is not None else torch.zeros(c, dtype=dt, device=w.device)
        inv = gamma * scale / torch.sqrt(bn.running_var.to(dt) + bn.eps)
        w_folded = w * inv.view(-1, *([1] * (w.dim() - 1)))
        b_folded = (bias - bn.running_mean.to(dt)) * inv + beta * scale
    return w_folded.to(out_dtype).contiguous(), b_folded.to(out_dtype).contiguous()


class FoldedConvBNScale(nn.Module):
    """conv → BN → ·scale as one folded convolution in eval mode; refuses to run in training mode.

    It keeps the original ``conv`` and ``bn`` submodules (so ``state_dict`` keys are unchanged) and
    folds at every call (so an update to weights or running statistics is always seen). ``conv_fn``
    runs the folded convolution: ``F.conv2d`` by default, or a custom kernel with the same signature.
    """

    def __init__(self, conv: nn.Conv2d, bn: nn.BatchNorm2d, scale: float, conv_fn=None):
        super().__init__()
        if conv_fn is not None and (conv.stride, conv.padding, conv.dilation, conv.groups) != ((1, 1), (0, 0),
                                                                                              (1, 1), 1):
            raise ValueError("FoldedConvBNScale: a custom conv_fn computes a plain convolution (stride 1, no padding, "
                             f"no dilation, one group); this conv has stride {conv.stride}, padding {conv.padding}, "
                             f"dilation {conv.dilation}, groups {conv.groups}")
        self.conv, self.bn, self.scale = conv, bn, float(scale)
        self.conv_fn = conv_fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training or self.bn.training:
            raise RuntimeError("FoldedConvBNScale: folding BatchNorm is exact only in eval mode; in training mode "
                               "BatchNorm normalises with batch statistics (call .eval(), or use an unfolded "
                               "training-mode kernel)")
        w, b = fold(self.conv, self.bn, self.scale)
        if self.conv_fn is not None:
            return self.conv_fn(x, w, b)
        return nn.functional.conv2d(x, w, b, self.conv.stride, self.conv.padding, self.conv.dilation,
                                    self.conv.groups)
