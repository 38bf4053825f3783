"""Autograd for the book's kernels: every op runs in any grad mode, and the fused ops have a backward.

A binding (``kernels/*.cpp``) computes values only, whatever the grad mode. This module is what
autograd sees:

* the capstones' fused ops — P73 in training mode (``conv_bn_scale_train``), P73 in eval mode on
  folded weights (``conv_bn_scale_eval``) and P27 (``p27_forward``) — are ``torch.autograd.Function``s
  with a backward derived for them (below);
* every other op, called with grad mode on and a tensor that requires grad, returns outputs whose
  ``grad_fn`` raises, naming the op, if a backward reaches it: never an output silently cut off
  from the graph.

Under ``torch.no_grad()`` or ``torch.inference_mode()`` (or when no input requires grad) each op
calls its binding directly: nothing is saved, and the forward costs what it costs without autograd.
The backward's convolutions run through cuDNN with TF32 off, so gradients are float32-accurate like
the forward. Double backward is refused by name.

The module imports torch alone: ``scripts/make_solutions.py`` copies it into the stand-alone
benchmark submissions, which must not depend on the book's toolkit.
"""

import contextlib
import functools

import torch


def _needs_grad(*tensors) -> bool:
    """True when autograd records: grad mode on and some tensor argument requires grad."""
    return torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors)


@contextlib.contextmanager
def _fp32_convolutions():
    """cuDNN convolutions in float32 (TF32 off) inside the block; the setting comes back after it."""
    before = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32 = before


def _first_derivatives_only(op: str) -> None:
    """A backward runs with grad mode on only when asked to build a graph of itself (create_graph=True)."""
    if torch.is_grad_enabled():
        raise RuntimeError(f"{op}: double backward is not supported (its backward is not differentiable); "
                           "call backward or torch.autograd.grad without create_graph=True")


def _conv_backward(dz, x, w, has_bias: bool, need: tuple, padding: int = 0):
    """(dx, dw, db) of a stride-1 convolution without dilation or groups, by cuDNN in float32."""
    dims = x.dim() - 2
    with _fp32_convolutions():
        return torch.ops.aten.convolution_backward(
            dz, x, w, [w.shape[0]] if has_bias else None, [1] * dims, [padding] * dims, [1] * dims, False,
            [0] * dims, 1, [need[0], need[1], need[2] and has_bias])


# ------------------------------------------------------------------------------------- P73, training mode

class _ConvBnScaleTrain(torch.autograd.Function):
    """y = s·BN_train(conv(x, W) + b), with the batch statistics; the running statistics are updated once,
    by the forward.

    Backward, with x̂ = (z − μ)·invstd the normalised conv output z and g = s·dy (the gradient at BN's
    output): dβ = s·Σ dy, dγ = s·Σ dy·x̂, and dz = γ·s·invstd·(dy − mean(dy) − x̂·mean(dy·x̂)) — BatchNorm's
    backward with γ·s as its weight, from the mean and invstd the forward saved (as cuDNN's BatchNorm
    does). z itself is never stored: the backward recomputes it with the eval kernel (one convolution),
    then takes dx, dW, db from dz by cuDNN's convolution backward.
    """

    @staticmethod
    def forward(ctx, ext, x, conv_w, conv_b, bn_w, bn_b, running_mean, running_var, num_batches_tracked,
                momentum, eps, scale, out, strategy, math, saved_stats):
        stats = saved_stats if saved_stats is not None else x.new_empty(2, conv_w.shape[0])
        y = ext.conv_bn_scale_train(x, conv_w, conv_b, bn_w, bn_b, running_mean, running_var, num_batches_tracked,
                                    momentum, eps, scale, out, strategy, math, stats)
        if out is not None:
            ctx.mark_dirty(out)
        ctx.save_for_backward(x, conv_w, conv_b, bn_w, stats)
        ctx.ext, ctx.eps, ctx.scale, ctx.math = ext, eps, scale, math
        return y

    @staticmethod
    def backward(ctx, dy):
        _first_derivatives_only("conv_bn_scale_train")
        x, w, b, gamma, stats = ctx.saved_tensors
        need_x, need_w, need_b, need_g, need_beta = ctx.needs_input_grad[1:6]
        grads = [None] * 16
        if dy.numel() == 0:  # an empty batch: no output depends on any input
            like = (x, w, stats[0], stats[0], stats[0])  # the shapes of x, W, b, γ and β
            need = ctx.needs_input_grad[1:6]
            grads[1:6] = [torch.zeros_like(t) if n else None for t, n in zip(like, need, strict=True)]
            return tuple(grads)
        s = ctx.scale
        z = ctx.ext.conv_bn_scale_eval(x, w, b, None, ctx.math)  # the conv output, recomputed
        gs = (gamma if gamma is not None else torch.ones_like(stats[0])) * s
        dz, dgs, dbs = torch.ops.aten.native_batch_norm_backward(
            dy.contiguous(), z, gs, None, None, stats[0], stats[1], True, ctx.eps,
            [need_x or need_w or need_b, need_g, need_beta])
        del z
        if need_x or need_w or need_b:
            grads[1:4] = _conv_backward(dz, x, w, b is not None, (need_x, need_w, need_b))
        grads[4] = dgs * s if need_g else None
        grads[5] = dbs * s if need_beta else None
        return tuple(grads)


def conv_bn_scale_train(ext, x, conv_w, conv_b, bn_w, bn_b, running_mean, running_var, num_batches_tracked,
                        momentum, eps, scale, out=None, strategy="auto", math="auto", saved_stats=None):
    """P73 in training mode (``ext.conv_bn_scale_train``), differentiable in x, the conv's weight and bias
    and BatchNorm's weight and bias."""
    if not _needs_grad(x, conv_w, conv_b, bn_w, bn_b):
        return ext.conv_bn_scale_train(x, conv_w, conv_b, bn_w, bn_b, running_mean, running_var,
                                       num_batches_tracked, momentum, eps, scale, out, strategy, math, saved_stats)
    return _ConvBnScaleTrain.apply(ext, x, conv_w, conv_b, bn_w, bn_b, running_mean, running_var,
                                   num_batches_tracked, momentum, eps, scale, out, strategy, math, saved_stats)


# ----------------------------------------------------------------------------------------- P73, eval mode

class _ConvEval(torch.autograd.Function):
    """y = conv(x, W') + b' on folded weights; backward: cuDNN's convolution backward in float32."""

    @staticmethod
    def forward(ctx, ext, x, folded_w, folded_b, out, math):
        y = ext.conv_bn_scale_eval(x, folded_w, folded_b, out, math)
        if out is not None:
            ctx.mark_dirty(out)
        ctx.save_for_backward(x, folded_w)
        ctx.has_bias = folded_b is not None
        return y

    @staticmethod
    def backward(ctx, dy):
        _first_derivatives_only("conv_bn_scale_eval")
        x, w = ctx.saved_tensors
        need = ctx.needs_input_grad[1:4]
        dx, dw, db = _conv_backward(dy.contiguous(), x, w, ctx.has_bias, need)
        return None, dx, dw, db, None, None


def conv_bn_scale_eval(ext, x, folded_w, folded_b=None, out=None, math="auto"):
    """The folded convolution (``ext.conv_bn_scale_eval``), differentiable in x and the folded weights —
    and so, through ``fold_bn_scale``'s ops, in the conv's and BatchNorm's parameters."""
    if not _needs_grad(x, folded_w, folded_b):
        return ext.conv_bn_scale_eval(x, folded_w, folded_b, out, math)
    return _ConvEval.apply(ext, x, folded_w, folded_b, out, math)


def fold_bn_scale(conv_w, conv_b, bn_w, bn_b, running_mean, running_var, eps, scale):
    """(W', b') with conv(x, W') + b' = s·BN_eval(conv(x, W) + b): W' = W·inv, b' = (b − μ)·inv + β·s,
    inv = γ·s/√(σ² + ε). Plain torch ops, so autograd carries dW', db' back to W, b, γ and β (the running
    statistics are buffers: no gradient)."""
    inv = torch.rsqrt(running_var + eps) * scale
    if bn_w is not None:
        inv = inv * bn_w
    w = (conv_w * inv.view(-1, *([1] * (conv_w.dim() - 1)))).contiguous()
    b = (conv_b - running_mean if conv_b is not None else -running_mean) * inv
    if bn_b is not None:
        b = b + bn_b * scale
    return w, b


def p73_forward(ext, conv, bn, scale, x, strategy="auto", math="auto"):
    """s·bn(conv(x)) by the fused kernels, deciding as ``nn.BatchNorm2d`` does: the batch statistics in training
    mode (or without running statistics), updating the running statistics when ``bn`` tracks them; otherwise its
    running statistics and the scale folded into the weights at this call (never stale)."""
    x = x.contiguous()
    if bn.training or bn.running_mean is None:
        track = bn.training and bn.track_running_stats
        return conv_bn_scale_train(ext, x, conv.weight, conv.bias, bn.weight, bn.bias,
                                   bn.running_mean if track else None, bn.running_var if track else None,
                                   bn.num_batches_tracked if track else None, bn.momentum, bn.eps, scale,
                                   strategy=strategy, math=math)
    w, b = fold_bn_scale(conv.weight, conv.bias, bn.weight, bn.bias, bn.running_mean, bn.running_var, bn.eps, scale)
    return conv_bn_scale_eval(ext, x, w, b, math=math)


# ------------------------------------------------------------------------------------------------- P27

class _P27(torch.autograd.Function):
    """y = mean_DHW(GroupNorm(hardswish(conv3d(x, W) + b))).

    Backward by recomputation: the forward keeps only its inputs (the fused kernel never forms the conv
    output, and neither does this op's saved state); the backward runs the same function through PyTorch's
    ops on them — the convolution in float32 — and lets autograd differentiate that. It costs a convolution
    forward and backward in cuDNN, about what eager PyTorch's backward costs; the fused forward's saving
    stays.
    """

    @staticmethod
    def forward(ctx, ext, x, conv_weight, conv_bias, gn_weight, gn_bias, num_groups, eps, out, smem_limit, math):
        y = ext.p27_forward(x, conv_weight, conv_bias, gn_weight, gn_bias, num_groups, eps, out, smem_limit, math)
        if out is not None:
            ctx.mark_dirty(out)
        ctx.save_for_backward(x, conv_weight, conv_bias, gn_weight, gn_bias)
        ctx.num_groups, ctx.eps = num_groups, eps
        return y

    @staticmethod
    def backward(ctx, dy):
        _first_derivatives_only("p27_forward")
        saved = ctx.saved_tensors
        need = ctx.needs_input_grad[1:6]
        with torch.enable_grad(), _fp32_convolutions():
            leaves = [t.detach().requires_grad_(n) if t is not None else None for t, n in zip(saved, need, strict=True)]
            x, w, b, gw, gb = leaves
            h = torch.nn.functional.hardswish(torch.nn.functional.conv3d(x, w, b))
            y = torch.nn.functional.group_norm(h, ctx.num_groups, gw, gb, ctx.eps).mean(dim=(2, 3, 4))
            wanted = [t for t, n in zip(leaves, need, strict=True) if n and t is not None]
            got = iter(torch.autograd.grad(y, wanted, dy))
        grads = [next(got) if n and t is not None else None for t, n in zip(leaves, need, strict=True)]
        return (None, *grads, None, None, None, None, None)


def p27_forward(ext, x, conv_weight, conv_bias, gn_weight, gn_bias, num_groups, eps, out=None, smem_limit=0,
                math="fp32"):
    """P27 by the fused kernel (``ext.p27_forward``), differentiable in x, the conv's weight and bias and
    GroupNorm's weight and bias."""
    if not _needs_grad(x, conv_weight, conv_bias, gn_weight, gn_bias):
        return ext.p27_forward(x, conv_weight, conv_bias, gn_weight, gn_bias, num_groups, eps, out, smem_limit, math)
    return _P27.apply(ext, x, conv_weight, conv_bias, gn_weight, gn_bias, num_groups, eps, out, smem_limit, math)


def p27_module_forward(ext, conv, group_norm, x, math="fp32"):
    """mean_DHW(group_norm(hardswish(conv(x)))) by the fused kernel, for the modules' current parameters."""
    gn = group_norm
    return p27_forward(ext, x.contiguous(), conv.weight.contiguous(), conv.bias, gn.weight, gn.bias, gn.num_groups,
                       gn.eps, math=math)


# --------------------------------------------------------------------------------- every other op

class _NoBackward(torch.autograd.Function):
    """Runs an op without a backward so that its outputs join the graph; a backward that reaches them
    raises, naming the op."""

    @staticmethod
    def forward(ctx, op, call, *tracked):
        ctx.op = op
        out = call()
        return tuple(out) if isinstance(out, list) else out

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError(f"{ctx.op}: this kernel has no backward, so no gradient can flow through it; call it "
                           "under torch.no_grad() (or on detached tensors) where no gradient is needed")


def no_backward(op: str, fn):
    """``fn`` (a binding's op) as autograd should see it: called directly unless autograd records, and then
    with outputs whose backward raises, naming ``op``."""
    @functools.wraps(fn)
    def call(*args, **kwargs):
        if torch.is_grad_enabled():
            tracked = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor) and a.requires_grad]
            if tracked:
                return _NoBackward.apply(op, lambda: fn(*args, **kwargs), *tracked)
        return fn(*args, **kwargs)
    return call


_DIFFERENTIABLE = {"conv_bn_scale_train": conv_bn_scale_train, "conv_bn_scale_eval": conv_bn_scale_eval,
                   "p27_forward": p27_forward}


def wrap(op: str, ext):
    """Binding ``op`` of the compiled module ``ext`` with its autograd: the fused op's Function where one
    is derived here, otherwise ``no_backward``."""
    if op in _DIFFERENTIABLE:
        return functools.wraps(getattr(ext, op))(functools.partial(_DIFFERENTIABLE[op], ext))
    return no_backward(op, getattr(ext, op))
