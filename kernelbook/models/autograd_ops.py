"""Autograd for the capstones' fused ops: they run in any grad mode, and they have a backward.

A binding (``kernels/*.cpp``) computes values only. The capstones' fused ops — P73 in training mode
(``conv_bn_scale_train``) and in eval mode (``conv_bn_scale_folded``; the eval kernel alone,
``conv_bn_scale_eval``, too) and P27 (``p27_forward``) — are ``torch.autograd.Function``s here, with a
backward derived for them (below); ``kb.build.load`` hands them out in place of the bindings. Every
other op (the design chapters' kernels) runs in any grad mode too, and its output carries a ``grad_fn``
that raises, naming the op, if a backward reaches it: a gradient never skips a kernel silently.

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


def _conv_backward(dz, x, w, has_bias: bool, need: tuple):
    """(dx, dw, db) of a stride-1 convolution without padding, dilation or groups, by cuDNN in float32."""
    dims = x.dim() - 2
    with _fp32_convolutions():
        return torch.ops.aten.convolution_backward(
            dz, x, w, [w.shape[0]] if has_bias else None, [1] * dims, [0] * dims, [1] * dims, False,
            [0] * dims, 1, [need[0], need[1], need[2] and has_bias])


# ----------------------------------------------------------------------------------------------------- P73

def _recompute_z(ext, x, w, b):
    """The convolution's output z = conv(x, W) + b, which the fused forward never wrote, again: by FFMA, whose
    round-to-nearest errors average out over a channel's sums (the tensor cores' truncation would bias them)."""
    return ext.conv_bn_scale_eval(x, w, b, None, "fp32")


class _ConvBnScale(torch.autograd.Function):
    """y = s·BN(conv(x, W) + b): training mode with the batch statistics (the running statistics updated once,
    by the forward), or eval mode with the running statistics folded into the weights.

    Backward, with z the conv output, x̂ its normalised value and δ = ∂L/∂y: ∂L/∂β = s·Σδ, ∂L/∂γ = s·Σδ·x̂ and
    ∂L/∂z = γ·s·r·(δ − mean(δ) − x̂·mean(δ·x̂)) in training mode (r = 1/√(var + ε) of the batch; BatchNorm's own
    backward with γ·s as its weight), γ·s·r·δ in eval mode (r of the running variance); then the convolution's
    backward takes ∂L/∂z to x and W (cuDNN, TF32 off). z is recomputed (one convolution), and so are the batch
    statistics, from it (one pass): the moments' statistics the forward used are accurate to its output, but a
    backward built on statistics that differ from its z by their rounding errs more than eager's (measured). In
    training mode ∂L/∂b is exactly 0 (the batch mean removes any bias) and Σ ∂L/∂z = 0, so ∂L/∂W is taken
    against x with each channel's mean removed: the rounding left in Σ ∂L/∂z then does not meet the input's mean.
    """

    @staticmethod
    def forward(ctx, ext, x, conv_w, conv_b, bn_w, bn_b, running_mean, running_var, num_batches_tracked,
                momentum, eps, scale, out, strategy, math, training):
        if training:
            y = ext.conv_bn_scale_train(x, conv_w, conv_b, bn_w, bn_b, running_mean, running_var,
                                        num_batches_tracked, momentum, eps, scale, out, strategy, math)
            ctx.save_for_backward(x, conv_w, conv_b, bn_w)
        else:
            w, b = fold_bn_scale(conv_w, conv_b, bn_w, bn_b, running_mean, running_var, eps, scale)
            y = ext.conv_bn_scale_eval(x, w, b, out, math)
            ctx.save_for_backward(x, conv_w, conv_b, bn_w, running_mean.clone(), running_var.clone())
        if out is not None:
            ctx.mark_dirty(out)
        ctx.ext, ctx.eps, ctx.scale, ctx.training = ext, eps, scale, training
        return y

    @staticmethod
    def backward(ctx, dy):
        _first_derivatives_only("conv_bn_scale_train" if ctx.training else "conv_bn_scale (eval)")
        x, w, b, gamma, *running = ctx.saved_tensors
        need_x, need_w, need_b, need_g, need_beta = ctx.needs_input_grad[1:6]
        grads = [None] * 16
        c_out = w.shape[0]
        if dy.numel() == 0:  # an empty batch: no output depends on any input
            like = (x, w, w.new_empty(c_out), w.new_empty(c_out), w.new_empty(c_out))
            grads[1:6] = [torch.zeros_like(t) if n else None for t, n in zip(like, ctx.needs_input_grad[1:6],
                                                                             strict=True)]
            return tuple(grads)
        s = ctx.scale
        z = _recompute_z(ctx.ext, x, w, b)
        gs = (gamma if gamma is not None else torch.ones(c_out, device=z.device, dtype=z.dtype)) * s
        if ctx.training:
            var, mean = torch.var_mean(z, dim=(0, 2, 3), correction=0)
            stats = (None, None, mean, torch.rsqrt(var + ctx.eps))
        else:
            stats = (*running, None, None)
        dz, dgs, dbs = torch.ops.aten.native_batch_norm_backward(
            dy.contiguous(), z, gs, *stats, ctx.training, ctx.eps, [need_x or need_w or need_b, need_g, need_beta])
        del z
        if ctx.training:
            if need_x or need_w:
                xc = x - x.mean(dim=(0, 2, 3), keepdim=True) if need_w else x
                grads[1], grads[2], _ = _conv_backward(dz, xc, w, False, (need_x, need_w, False))
            grads[3] = torch.zeros_like(b) if need_b else None
        elif need_x or need_w or need_b:
            grads[1:4] = _conv_backward(dz, x, w, b is not None, (need_x, need_w, need_b))
        grads[4] = dgs * s if need_g else None
        grads[5] = dbs * s if need_beta else None
        return tuple(grads)


def conv_bn_scale_train(ext, x, conv_w, conv_b, bn_w, bn_b, running_mean, running_var, num_batches_tracked,
                        momentum, eps, scale, out=None, strategy="auto", math="auto"):
    """P73 in training mode (``ext.conv_bn_scale_train``), differentiable in x, the conv's weight and bias
    and BatchNorm's weight and bias."""
    if not _needs_grad(x, conv_w, conv_b, bn_w, bn_b):
        return ext.conv_bn_scale_train(x, conv_w, conv_b, bn_w, bn_b, running_mean, running_var,
                                       num_batches_tracked, momentum, eps, scale, out, strategy, math)
    return _ConvBnScale.apply(ext, x, conv_w, conv_b, bn_w, bn_b, running_mean, running_var, num_batches_tracked,
                              momentum, eps, scale, out, strategy, math, True)


def fold_bn_scale(conv_w, conv_b, bn_w, bn_b, running_mean, running_var, eps, scale):
    """(W', b') with conv(x, W') + b' = s·BN_eval(conv(x, W) + b): W' = W·inv, b' = (b − μ)·inv + β·s,
    inv = γ·s/√(σ² + ε), at the time of the call (never stale)."""
    inv = torch.rsqrt(running_var + eps) * scale
    if bn_w is not None:
        inv = inv * bn_w
    w = (conv_w * inv.view(-1, *([1] * (conv_w.dim() - 1)))).contiguous()
    b = (conv_b - running_mean if conv_b is not None else -running_mean) * inv
    if bn_b is not None:
        b = b + bn_b * scale
    return w, b


def conv_bn_scale_folded(ext, x, conv_w, conv_b, bn_w, bn_b, running_mean, running_var, eps, scale, out=None,
                         math="auto"):
    """P73 in eval mode: BatchNorm's running statistics and the scale folded into the weights at this call and
    the eval kernel run on them; differentiable in x, the conv's weight and bias and BatchNorm's weight and
    bias (the running statistics are buffers). The backward is eval-mode BatchNorm's on the recomputed conv
    output, not the fold's: differentiating through W' and b' adds two terms of ∂L/∂γ that cancel when the
    running mean is far from the bias (measured: up to 5× eager's error)."""
    if not _needs_grad(x, conv_w, conv_b, bn_w, bn_b):
        w, b = fold_bn_scale(conv_w, conv_b, bn_w, bn_b, running_mean, running_var, eps, scale)
        return ext.conv_bn_scale_eval(x, w, b, out, math)
    return _ConvBnScale.apply(ext, x, conv_w, conv_b, bn_w, bn_b, running_mean, running_var, None, None, eps,
                              scale, out, None, math, False)


class _ConvEval(torch.autograd.Function):
    """y = conv(x, W) + b by the eval kernel, for weights given as they are; backward: cuDNN's convolution
    backward in float32."""

    @staticmethod
    def forward(ctx, ext, x, w, b, out, math):
        y = ext.conv_bn_scale_eval(x, w, b, out, math)
        if out is not None:
            ctx.mark_dirty(out)
        ctx.save_for_backward(x, w)
        ctx.has_bias = b is not None
        return y

    @staticmethod
    def backward(ctx, dy):
        _first_derivatives_only("conv_bn_scale_eval")
        x, w = ctx.saved_tensors
        dx, dw, db = _conv_backward(dy.contiguous(), x, w, ctx.has_bias, ctx.needs_input_grad[1:4])
        return None, dx, dw, db, None, None


def conv_bn_scale_eval(ext, x, folded_w, folded_b=None, out=None, math="auto"):
    """The convolution of the eval kernel (``ext.conv_bn_scale_eval``), differentiable in x and its weights."""
    if not _needs_grad(x, folded_w, folded_b):
        return ext.conv_bn_scale_eval(x, folded_w, folded_b, out, math)
    return _ConvEval.apply(ext, x, folded_w, folded_b, out, math)


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
    return conv_bn_scale_folded(ext, x, conv.weight, conv.bias, bn.weight, bn.bias, bn.running_mean, bn.running_var,
                                bn.eps, scale, math=math)


# ------------------------------------------------------------------------------------------------- P27

class _P27(torch.autograd.Function):
    """y = mean_DHW(GroupNorm(hardswish(conv3d(x, W) + b))).

    Backward by recomputation: the forward keeps only its inputs (the fused kernel never forms the conv
    output, and neither does this op's saved state); the backward runs the same function through PyTorch's
    ops on them — the convolution in float32 — and lets autograd differentiate that. It costs a convolution
    forward and backward in cuDNN in float32: about what eager PyTorch's step costs with TF32 off, many times
    its step with PyTorch's default (which lets cuDNN's 3-D convolution backward run in TF32).
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


# --------------------------------------------------------------------------------- the bindings' names

_DIFFERENTIABLE = {"conv_bn_scale_train": conv_bn_scale_train, "conv_bn_scale_eval": conv_bn_scale_eval,
                   "p27_forward": p27_forward}  # the bindings' names; conv_bn_scale_folded is built on the second


class _NoBackward(torch.autograd.Function):
    """A kernel without a derivative: the forward is the binding's, the backward raises, naming the op."""

    @staticmethod
    def forward(ctx, op, fn, names, *values):
        k = len(values) - len(names)
        out = fn(*values[:k], **dict(zip(names, values[k:], strict=True)))
        outs = out if isinstance(out, (tuple, list)) else (out,)
        written = [o for o in outs if isinstance(o, torch.Tensor) and any(o is v for v in values)]
        if written:  # an out= argument, filled in place
            ctx.mark_dirty(*written)
        ctx.op = op
        return tuple(out) if isinstance(out, list) else out

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError(f"{ctx.op}: this kernel has no backward (it computes values only), so no gradient can "
                           "flow through it; compute the gradient with PyTorch's ops, or call the kernel on "
                           "tensors that do not require grad")


def _forward_only(op: str, fn):
    """``fn`` (binding ``op``) in any grad mode: called directly unless autograd records, and otherwise through
    ``_NoBackward``, so that its outputs join the graph with a backward that refuses by name."""

    @functools.wraps(fn)
    def call(*args, **kwargs):
        if not _needs_grad(*args, *kwargs.values()):
            return fn(*args, **kwargs)
        out = _NoBackward.apply(op, fn, tuple(kwargs), *args, *kwargs.values())
        return list(out) if isinstance(out, tuple) else out  # the binding's list, as a list again

    return call


def wrap(op: str, ext):
    """Binding ``op`` of the compiled module ``ext`` as the book calls it: the fused op's Function where one is
    derived here, otherwise the binding in any grad mode, with a backward that refuses by name."""
    if op in _DIFFERENTIABLE:
        return functools.wraps(getattr(ext, op))(functools.partial(_DIFFERENTIABLE[op], ext))
    return _forward_only(op, getattr(ext, op))
