"""The P73 capstone's fused kernels (kernels/conv_bn_scale.*) against float64, in training and eval mode, with
the convolution and the moments' sums by FFMA (math="fp32") or on the tensor cores (math="3xtf32", the default
where it runs).

GPU tests are marked ``gpu``; argument checks and compilation of the swept variants run wherever the CUDA
toolkit is (marked ``compile``).
"""

from __future__ import annotations

import copy
import importlib.util
import shutil
import subprocess

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import kernelbook as kb
from kernelbook import check
from kernelbook.harness.paths import ROOT

SCALE = 2.0


@pytest.fixture(autouse=True)
def _forward_only():
    """The forward's tests run under no_grad, as the chapter does; tests/test_backward.py runs the backward."""
    with torch.no_grad():
        yield


@pytest.fixture(scope="module")
def cbs():
    return kb.build.load("conv_bn_scale", arch=None if kb.gpu() else "90")


def _modules(c_in, c_out, momentum, seed):
    """A float64 reference (conv, bn) with non-trivial γ, β and running statistics, and a float32 copy."""
    torch.manual_seed(seed)
    conv, bn = nn.Conv2d(c_in, c_out, 3).double(), nn.BatchNorm2d(c_out, momentum=momentum).double()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        bn.weight.copy_(torch.rand(c_out, generator=g, dtype=torch.float64) * 3 - 1)  # includes negative γ
        bn.bias.copy_(torch.randn(c_out, generator=g, dtype=torch.float64))
        bn.running_mean.copy_(torch.randn(c_out, generator=g, dtype=torch.float64))
        bn.running_var.copy_(torch.rand(c_out, generator=g, dtype=torch.float64) + 0.5)
    ref = nn.ModuleDict({"conv": conv, "bn": bn}).cuda()
    return ref, copy.deepcopy(ref).float()


def train_tol(x: torch.Tensor, conv: nn.Conv2d) -> float:
    """Norm-wise tolerance of a training-mode conv → BN: the conv's rounding (Higham's bound for its
    C_in·9 + 1 terms) divided by σ, so amplified by 1 + |μ|/σ per channel, plus the normalisation's own."""
    with torch.no_grad():
        x64 = x.double()
        ref = conv(x64)
        abs_ref = F.conv2d(x64.abs(), conv.weight.abs(), conv.bias.abs())
    t_conv = check.dot_tol(conv.in_channels * 9 + 1, abs_ref, ref)
    mu, sd = ref.mean(dim=(0, 2, 3)), ref.std(dim=(0, 2, 3), unbiased=False)
    return check.normalisation_tol(ref, (0, 2, 3)) + t_conv * (1.0 + float((mu.abs() / sd).max()))


def run_train(cbs, ours, x, momentum, out=None, strategy="auto", math="auto"):
    c, b = ours["conv"], ours["bn"]
    return cbs.conv_bn_scale_train(x, c.weight, c.bias, b.weight, b.bias, b.running_mean, b.running_var,
                                   b.num_batches_tracked, momentum, b.eps, SCALE, out, strategy=strategy, math=math)


MATHS = ["fp32", "3xtf32"]


def skip_without_tensor_cores(math: str) -> None:
    """math="3xtf32" needs TF32 tensor cores (sm_80 or newer); "auto" picks FFMA below that."""
    if math == "3xtf32" and torch.cuda.get_device_capability()[0] < 8:
        pytest.skip("the 3xTF32 path needs sm_80 or newer")


SHAPES = [  # (N, C_in, H, W, C_out)
    (1, 8, 33, 97, 64),      # N = 1, W = 97, odd H
    (4, 3, 32, 32, 16),      # C_in = 3, C_out = 16, 32×32
    (2, 19, 9, 130, 5),      # C_in over one staged chunk (the unpipelined path), C_out not a multiple of 8
    (2, 8, 17, 300, 100),    # several column tiles and two channel blocks (per-block stats flushed twice)
    (3, 1, 5, 3, 1),         # one output column
    (1, 2, 3, 4, 70),        # one output row: 2 values per channel
    (5, 8, 7, 131, 64),      # odd HO with 2 rows per thread: the last tile's second row is masked
]


@pytest.mark.gpu
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("momentum", [0.1, None])
@pytest.mark.parametrize("strategy, math", [("auto", "auto"), ("auto", "fp32"), ("inplace", "auto"),
                                            ("inplace", "3xtf32")])
def test_train_matches_float64_over_three_steps(cbs, shape, momentum, strategy, math):
    """auto: the moments where C_in ≤ 8, on the tensor cores (math auto) or by FFMA; in place by FFMA (auto) or
    on the tensor cores (statistics in a pass over y)."""
    skip_without_tensor_cores(math)
    n, c_in, h, w, c_out = shape
    if math == "3xtf32" and c_in > 8:
        pytest.skip("math='3xtf32' takes at most 8 input channels (refused: test_train_rejects_bad_parameters)")
    ref, ours = _modules(c_in, c_out, momentum, seed=sum(shape))
    for step in range(3):
        x = check.rand((n, c_in, h, w), seed=step + 7 * sum(shape), device="cuda", low=-0.5, high=1.5)
        tol = train_tol(x, ref["conv"])
        out = check.poisoned((n, c_out, h - 2, w - 2), device="cuda")
        y = run_train(cbs, ours, x, momentum, out, strategy, math)
        assert y.data_ptr() == out.data_ptr()
        with torch.no_grad():
            y_ref = ref["bn"](ref["conv"](x.double())) * SCALE
        check.assert_close(out, y_ref, tol, what=f"step {step} output {shape}")
        # The batch mean's rounding scales with the magnitudes summed (mean of conv(|x|, |w|, |b|)), not with the
        # mean itself, which can be near zero: the tolerance says so.
        rm = ref["bn"].running_mean
        with torch.no_grad():
            c = ref["conv"]
            abs_mean = F.conv2d(x.double().abs(), c.weight.abs(), c.bias.abs()).mean(dim=(0, 2, 3))
        mean_tol = tol * (1.0 + float(abs_mean.norm() / rm.norm()))
        check.assert_close(ours["bn"].running_mean, rm, mean_tol, what="running_mean")
        check.assert_close(ours["bn"].running_var, ref["bn"].running_var, 2 * tol, what="running_var")
        assert int(ours["bn"].num_batches_tracked) == int(ref["bn"].num_batches_tracked) == step + 1


@pytest.mark.gpu
@pytest.mark.parametrize("strategy, math", [("moments", "3xtf32"), ("moments", "fp32"), ("inplace", "fp32"),
                                            ("inplace", "3xtf32"), ("auto", "auto")])
def test_p73_train_and_eval_within_1e_5(cbs, strategy, math):
    """The benchmark's shapes and initialisation: relative error ≤ 1e-5 (the capstone's target)."""
    skip_without_tensor_cores(math)
    prob = kb.problems.P73_CONV_BN_SCALE
    model = prob.model(seed=0).cuda()
    ref = copy.deepcopy(model).double()
    x = prob.inputs(seed=1, device="cuda")
    y = cbs.conv_bn_scale_train(x, model.conv.weight, model.conv.bias, model.bn.weight, model.bn.bias,
                                model.bn.running_mean, model.bn.running_var, model.bn.num_batches_tracked, 0.1,
                                model.bn.eps, SCALE, strategy=strategy, math=math)
    with torch.no_grad():
        y_ref = ref(x.double())
    check.assert_close(y, y_ref, 1e-5, what="P73 train output")
    check.assert_close(model.bn.running_mean, ref.bn.running_mean, 1e-5, what="P73 running_mean")
    check.assert_close(model.bn.running_var, ref.bn.running_var, 1e-5, what="P73 running_var")
    del y, y_ref
    model.eval()
    ref.eval()
    w, b = kb.folding.fold(model.conv, model.bn, SCALE, dtype=torch.float64)
    with torch.no_grad():
        check.assert_close(cbs.conv_bn_scale_eval(x, w, b, math=math), ref(x.double()), 1e-5,
                           what="P73 eval output")


@pytest.mark.gpu
@pytest.mark.parametrize("shift", [1000.0, -1000.0])
def test_3xtf32_no_worse_than_eager_fp32_on_shifted_input(cbs, shift):
    """Inputs far from zero (x + shift, P73's filter): the tensor-core path errs no more than PyTorch's own
    float32 convolution (TF32 off) does on the same input, and no more than the FFMA path."""
    skip_without_tensor_cores("3xtf32")
    prob = kb.problems.P73_CONV_BN_SCALE
    conv = prob.model(seed=0).cuda().conv
    x = prob.inputs(seed=3, batch=16, device="cuda") + shift
    ref = F.conv2d(x.double(), conv.weight.double(), conv.bias.double())
    with kb.precision.tf32(False):
        eager = check.report(F.conv2d(x, conv.weight, conv.bias), ref, 1e-5)["rel_err"]
    errs = {m: check.report(cbs.conv_bn_scale_eval(x, conv.weight, conv.bias, math=m), ref, 1e-5)["rel_err"]
            for m in MATHS}
    assert errs["3xtf32"] <= eager and errs["3xtf32"] <= errs["fp32"], (errs, eager)


def ill_conditioned_modules():
    """Channel 0 a horizontal difference filter (κ ≈ 5e4 on kb.variance.smooth_field(1e-4)), channel 1 a random filter;
    momentum 1, so the running statistics are this batch's own (their error is the statistics' error)."""
    conv, bn = nn.Conv2d(3, 2, 3), nn.BatchNorm2d(2, momentum=1.0)
    with torch.no_grad():
        conv.weight.zero_()
        conv.weight[0, 0, 1, 1], conv.weight[0, 0, 1, 2] = 0.375, -0.375
        conv.weight[1] = check.rand((3, 3, 3), seed=1, low=-0.5, high=0.5)
        conv.bias.fill_(0.1)
    ours = nn.ModuleDict({"conv": conv, "bn": bn}).cuda()
    return copy.deepcopy(ours).double(), ours


def channel_rel_err(out, ref):
    """The largest per-channel relative error of a per-channel vector."""
    return float(((out.double() - ref) / ref).abs().max())


@pytest.mark.gpu
def test_auto_guard_takes_the_inplace_path_on_ill_conditioned_data(cbs):
    x = kb.variance.smooth_field(1e-4, seed=0, device="cuda")
    ref, ours = ill_conditioned_modules()
    assert cbs.conv_bn_scale_auto_choice(x, ours["conv"].weight, ours["conv"].bias) == "inplace"
    with torch.no_grad():
        y_ref = ref["bn"](ref["conv"](x.double())) * SCALE
    _, moments = ill_conditioned_modules()
    run_train(cbs, moments, x, 1.0, strategy="moments")  # what the guard avoids: a visibly wrong variance
    assert channel_rel_err(moments["bn"].running_var, ref["bn"].running_var) > 1e-4
    y = run_train(cbs, ours, x, 1.0, strategy="auto")
    check.assert_close(y, y_ref, 1e-5, what="auto, ill-conditioned output")
    assert channel_rel_err(ours["bn"].running_mean, ref["bn"].running_mean) <= 1e-5
    assert channel_rel_err(ours["bn"].running_var, ref["bn"].running_var) <= 1e-5
    assert int(ours["bn"].num_batches_tracked) == 1  # counted once: by the in-place path only


@pytest.mark.gpu
@pytest.mark.parametrize("math", MATHS)
@pytest.mark.parametrize("where", [(0, 0), (5, 7)])
def test_auto_guard_is_safe_with_an_outlying_pixel(cbs, math, where):
    """One pixel per input channel 1000× the rest: at (0, 0), one of the pivot's 16 samples, it moves the pivot far
    from the mean, and the guard (κ about the pivot) must see it; elsewhere it is only data. Either way the default
    path's statistics stay within the guard's tolerance of float64's (momentum 1: the running statistics are this
    batch's), and its output within the training tolerance."""
    skip_without_tensor_cores(math)
    prob = kb.problems.P73_CONV_BN_SCALE
    model = prob.model(seed=0).cuda()
    ref = copy.deepcopy(model).double()
    model.bn.momentum = ref.bn.momentum = 1.0
    x = prob.inputs(seed=4, batch=8, device="cuda")
    x[0, :, where[0], where[1]] = 1000.0
    with torch.no_grad():
        y_ref = ref(x.double())
        y = cbs.conv_bn_scale_train(x, model.conv.weight, model.conv.bias, model.bn.weight, model.bn.bias,
                                    model.bn.running_mean, model.bn.running_var, model.bn.num_batches_tracked,
                                    1.0, model.bn.eps, SCALE, math=math)
        if where == (0, 0):
            assert cbs.conv_bn_scale_auto_choice(x, model.conv.weight, model.conv.bias, math=math) == "inplace"
    assert channel_rel_err(model.bn.running_var, ref.bn.running_var) <= 1e-5
    check.assert_close(y, y_ref, train_tol(x, ref.conv), what=f"auto ({math}), outlier at {where}")


@pytest.mark.gpu
@pytest.mark.parametrize("math", MATHS)
def test_auto_guard_takes_the_moments_on_p73(cbs, math):
    skip_without_tensor_cores(math)
    prob = kb.problems.P73_CONV_BN_SCALE
    model = prob.model(seed=0).cuda()
    x = prob.inputs(seed=1, device="cuda")
    with torch.no_grad():
        assert cbs.conv_bn_scale_auto_choice(x, model.conv.weight, model.conv.bias, math=math) == "moments"


@pytest.mark.gpu
@pytest.mark.parametrize("shape, misaligned", [((3, 5, 40, 133, 7), True), ((2, 8, 16, 128, 8), False),
                                               ((1, 6, 70, 257, 3), False), ((4, 1, 3, 9, 2), True)])
def test_moments_sums_on_both_paths_match_float64(cbs, shape, misaligned):
    """The moments strategy with its sums by FFMA and on the tensor cores, on shapes around the tensor-core
    kernel's 16-row, 128-column tiles, with x 16-byte aligned (float4 staging) or not: the batch statistics
    (momentum 1: the running statistics are this batch's) and the output against float64."""
    skip_without_tensor_cores("3xtf32")
    n, c_in, h, w, c_out = shape
    for math in MATHS:
        ref, ours = _modules(c_in, c_out, 1.0, seed=sum(shape))
        x = check.rand([n * c_in * h * w + 1], seed=w, device="cuda", low=-0.5, high=1.5)
        x = (x[1:] if misaligned else x[:-1]).view(n, c_in, h, w)
        tol = train_tol(x, ref["conv"])
        y = run_train(cbs, ours, x, 1.0, strategy="moments", math=math)
        with torch.no_grad():
            y_ref = ref["bn"](ref["conv"](x.double())) * SCALE
        check.assert_close(y, y_ref, tol, what=f"moments ({math}) output {shape}")
        check.assert_close(ours["bn"].running_var, ref["bn"].running_var, 2 * tol, what=f"running_var ({math})")


@pytest.mark.gpu
@pytest.mark.parametrize("shift", [1000.0, -1000.0])
def test_moments_on_tensor_cores_no_worse_than_eager_on_shifted_input(cbs, shift):
    """P73's training step on x + shift: the default path (the moments' sums and the convolution on the tensor
    cores) errs no more than eager PyTorch in float32 (TF32 off) on the same input; its variance within 1e-5."""
    skip_without_tensor_cores("3xtf32")
    prob = kb.problems.P73_CONV_BN_SCALE
    model = prob.model(seed=0).cuda()
    ref, eager = copy.deepcopy(model).double(), copy.deepcopy(model)
    x = prob.inputs(seed=3, batch=16, device="cuda") + shift
    with torch.no_grad(), kb.precision.tf32(False):
        y_ref, y_eager = ref(x.double()), eager(x)
    y = cbs.conv_bn_scale_train(x, model.conv.weight, model.conv.bias, model.bn.weight, model.bn.bias,
                                model.bn.running_mean, model.bn.running_var, model.bn.num_batches_tracked, 0.1,
                                model.bn.eps, SCALE, strategy="moments", math="3xtf32")
    err, err_eager = (check.report(t, y_ref, 1.0)["rel_err"] for t in (y, y_eager))
    assert err <= err_eager, (err, err_eager)
    check.assert_close(model.bn.running_var, ref.bn.running_var, 1e-5, what="running_var")


@pytest.mark.compile
def test_guard_model_and_probe_checks(cbs):
    """The kernel's error model is the one the toolkit's CPU prediction uses (guard_study.GUARD_MODEL and
    CONV_TF32_UNIT)."""
    from kernelbook.models import guard_study as gs

    for math in MATHS:
        assert cbs.guard_model(math) == {"u": gs.U, **gs.GUARD_MODEL[math], "allowance": pytest.approx(3**0.5),
                                         "conv_unit": gs.CONV_TF32_UNIT}
    with pytest.raises(RuntimeError, match="guard_model: math must be 'fp32' or '3xtf32', got 'auto'"):
        cbs.guard_model("auto")
    for op in ("conv_bn_scale_auto_choice", "conv_bn_scale_guard"):
        with pytest.raises(RuntimeError, match=f"{op}: x must be a CUDA tensor"):
            getattr(cbs, op)(torch.ones(1, 3, 6, 6), torch.ones(5, 3, 3, 3), None)


@pytest.mark.gpu
def test_guard_probe_reads_bn_parameters(cbs):
    """The guard weighs each channel by (γ_c·s)² and damps it by ε: a zero γ removes an ill-conditioned channel
    from the prediction, as the CPU's guard_prediction does; bad BN vectors are refused by name."""
    from kernelbook.models import guard_study as gs

    x = kb.variance.smooth_field(1e-2, seed=0, device="cuda")
    _, ours = ill_conditioned_modules()
    w, b = ours["conv"].weight, ours["conv"].bias
    for g, choice in ((torch.ones(2), "inplace"), (torch.tensor([0.0, 1.0]), "moments")):
        out = cbs.conv_bn_scale_guard(x, w, b, "fp32", g.cuda(), None, 1e-5, SCALE)
        cpu = gs.guard_prediction(x, w, "fp32", g, None, 1e-5, SCALE)
        assert out["choice"] == cpu["choice"] == choice, (out, cpu["predicted"])
        assert out["predicted"] == pytest.approx(cpu["predicted"], rel=0.05) and out["math"] == "fp32"
        assert cbs.conv_bn_scale_auto_choice(x, w, b, "fp32", g.cuda(), None, 1e-5, SCALE) == choice
    with pytest.raises(RuntimeError, match=r"conv_bn_scale_guard: bn_w must have shape \[2\]"):
        cbs.conv_bn_scale_guard(x, w, b, "fp32", torch.ones(3, device="cuda"))
    wide = cbs.conv_bn_scale_guard(torch.rand(1, 9, 5, 5, device="cuda"), torch.rand(2, 9, 3, 3, device="cuda"))
    assert wide["choice"] == "inplace"  # more input channels than the moments take


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(128, 8, 128, 128, 64), *SHAPES])
@pytest.mark.parametrize("math", MATHS)
def test_eval_conv_matches_float64(cbs, shape, math):
    skip_without_tensor_cores(math)
    n, c_in, h, w, c_out = shape
    x = check.rand((n, c_in, h, w), seed=sum(shape), device="cuda")
    wt = check.rand((c_out, c_in, 3, 3), seed=sum(shape) + 1, device="cuda", low=-0.3, high=0.3)
    b = check.rand((c_out,), seed=sum(shape) + 2, device="cuda", low=-1, high=1)
    ref = F.conv2d(x.double(), wt.double(), b.double())
    tol = check.dot_tol(c_in * 9 + 1, F.conv2d(x.double().abs(), wt.double().abs(), b.double().abs()), ref)
    out = check.poisoned(ref.shape, device="cuda")
    if math == "3xtf32" and c_in > 8:  # the tensor-core path takes at most 8 input channels, and says so
        with pytest.raises(RuntimeError, match=f"math='3xtf32' supports at most 8 input channels, got {c_in}"):
            cbs.conv_bn_scale_eval(x, wt, b, out, math=math)
        assert cbs.conv_bn_scale_math(x) == "fp32" and out.isnan().all()
        return
    assert cbs.conv_bn_scale_eval(x, wt, b, out, math=math).data_ptr() == out.data_ptr()
    check.assert_close(out, ref, tol, what=f"eval conv {shape} ({math})")
    check.assert_close(cbs.conv_bn_scale_eval(x, wt, None, math=math), F.conv2d(x.double(), wt.double()), tol,
                       what=f"eval conv without bias {shape} ({math})")


@pytest.mark.gpu
def test_misaligned_output_and_side_stream(cbs):
    ref, ours = _modules(3, 20, 0.1, seed=5)
    x = check.rand((2, 3, 10, 36), seed=9, device="cuda")
    buf = check.poisoned((2 * 20 * 8 * 34 + 1,), device="cuda")
    out = buf[1:].view(2, 20, 8, 34)  # 4-byte aligned only: scalar stores, scalar apply path
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run_train(cbs, ours, x, 0.1, out)
    torch.cuda.synchronize()
    with torch.no_grad():
        y_ref = ref["bn"](ref["conv"](x.double())) * SCALE
    check.assert_close(out, y_ref, train_tol(x, ref["conv"]), what="misaligned view on a side stream")
    assert torch.isnan(buf[0])


@pytest.mark.gpu
def test_empty_batch_counts_and_single_value_is_refused(cbs):
    _, ours = _modules(3, 4, 0.1, seed=1)
    y = run_train(cbs, ours, torch.rand(0, 3, 6, 6, device="cuda"), 0.1)
    assert y.shape == (0, 4, 4, 4) and int(ours["bn"].num_batches_tracked) == 1
    with pytest.raises(RuntimeError, match="more than 1 value per channel"):
        run_train(cbs, ours, torch.rand(1, 3, 3, 3, device="cuda"), 0.1)
    assert cbs.conv_bn_scale_eval(torch.rand(0, 3, 6, 6, device="cuda"), ours["conv"].weight, None).shape == (
        0, 4, 4, 4)


@pytest.mark.gpu
@pytest.mark.parametrize("call, message", [
    (lambda f, x, m: f(x.cpu(), m, None), "x must be a CUDA tensor"),
    (lambda f, x, m: f(x.double(), m, None), "x must be float32, got float64"),
    (lambda f, x, m: f(x.transpose(2, 3), m, None), "x must be contiguous"),
    (lambda f, x, m: f(x[0], m, None), "x must be 4-D"),
    (lambda f, x, m: f(x[:, :2].contiguous(), m, None), "weight has 3 input channels but x has 2"),
    (lambda f, x, m: f(x[..., :2].contiguous(), m, None), "smaller than the 3x3 kernel"),
    (lambda f, x, m: f(x, m, torch.empty(2, 5, 4, 4, device="cuda")), r"out must have shape \[2, 5, 4, 5\]"),
    (lambda f, x, m: f(x, m, m["bn"].running_mean), "out must have shape"),
])
def test_train_rejects_bad_input(cbs, call, message):
    _, ours = _modules(3, 5, 0.1, seed=2)
    x = torch.rand(2, 3, 6, 7, device="cuda")
    with pytest.raises(RuntimeError, match=message):
        call(lambda x_, m, out: run_train(cbs, m, x_, 0.1, out), x, ours)


@pytest.mark.gpu
def test_train_rejects_bad_parameters(cbs):
    _, m = _modules(3, 5, 0.1, seed=3)
    c, b = m["conv"], m["bn"]
    x = torch.rand(2, 3, 6, 7, device="cuda")
    f = cbs.conv_bn_scale_train
    cases = [
        (lambda: f(x, c.weight[..., :2].contiguous(), c.bias, b.weight, b.bias, b.running_mean, b.running_var,
                   b.num_batches_tracked, 0.1, 1e-5, 2.0), "specialised for 3x3 filters"),
        (lambda: f(x, c.weight, c.bias[:3], b.weight, b.bias, b.running_mean, b.running_var,
                   b.num_batches_tracked, 0.1, 1e-5, 2.0), r"bias must have shape \[5\]"),
        (lambda: f(x, c.weight, c.bias, b.weight[:4], b.bias, b.running_mean, b.running_var,
                   b.num_batches_tracked, 0.1, 1e-5, 2.0), r"bn_w must have shape \[5\]"),
        (lambda: f(x, c.weight, c.bias, b.weight, b.bias, b.running_mean.double(), b.running_var,
                   b.num_batches_tracked, 0.1, 1e-5, 2.0), "running_mean must be float32"),
        (lambda: f(x, c.weight, c.bias, b.weight, b.bias, b.running_mean, None, b.num_batches_tracked, 0.1, 1e-5,
                   2.0), "must be given together"),
        (lambda: f(x, c.weight, c.bias, b.weight, b.bias, b.running_mean, b.running_var,
                   b.num_batches_tracked.float(), 0.1, 1e-5, 2.0), "num_batches_tracked must be int64"),
        (lambda: f(x, c.weight, c.bias, b.weight, b.bias, b.running_mean, b.running_var,
                   b.num_batches_tracked, 1.5, 1e-5, 2.0), "momentum must be in"),
        (lambda: f(x, c.weight, c.bias, b.weight, b.bias, b.running_mean, b.running_var,
                   b.num_batches_tracked, 0.1, -1.0, 2.0), "eps must be non-negative"),
        (lambda: f(x, c.weight, c.bias, b.weight, b.bias, b.running_mean, b.running_var,
                   b.num_batches_tracked, 0.1, 1e-5, 2.0, strategy="twice"), "strategy must be 'auto', 'moments'"),
        (lambda: f(torch.rand(2, 9, 6, 7, device="cuda"), torch.rand(5, 9, 3, 3, device="cuda"), c.bias, b.weight,
                   b.bias, b.running_mean, b.running_var, b.num_batches_tracked, 0.1, 1e-5, 2.0, strategy="moments"),
         "moments strategy supports at most 8 input channels, got 9"),
        (lambda: f(x, c.weight, c.bias, b.weight, b.bias, b.running_mean, b.running_var,
                   b.num_batches_tracked, 0.1, 1e-5, 2.0, math="tf32"), "math must be 'auto', 'fp32' or '3xtf32'"),
        (lambda: f(torch.rand(2, 9, 6, 7, device="cuda"), torch.rand(5, 9, 3, 3, device="cuda"), c.bias, b.weight,
                   b.bias, b.running_mean, b.running_var, b.num_batches_tracked, 0.1, 1e-5, 2.0, strategy="inplace",
                   math="3xtf32"), "math='3xtf32' supports at most 8 input channels, got 9"),
    ]
    before = (b.running_mean.clone(), b.running_var.clone(), int(b.num_batches_tracked))
    for call, message in cases:
        with pytest.raises(RuntimeError, match=message):
            call()
    assert torch.equal(before[0], b.running_mean) and torch.equal(before[1], b.running_var)
    assert before[2] == int(b.num_batches_tracked)  # a refused call changes nothing


@pytest.mark.gpu
def test_affine_false_and_untracked(cbs):
    torch.manual_seed(4)
    conv, bn = nn.Conv2d(4, 12, 3).cuda(), nn.BatchNorm2d(12, affine=False, track_running_stats=False).cuda()
    x = check.rand((3, 4, 11, 13), seed=4, device="cuda")
    y = cbs.conv_bn_scale_train(x, conv.weight, conv.bias, None, None, None, None, None, 0.1, bn.eps, SCALE)
    with torch.no_grad():
        y_ref = copy.deepcopy(bn).double()(copy.deepcopy(conv).double()(x.double())) * SCALE
    check.assert_close(y, y_ref, train_tol(x, copy.deepcopy(conv).double()), what="affine=False, untracked")


@pytest.mark.compile
def test_bad_input_without_a_gpu(cbs):
    w = torch.ones(5, 3, 3, 3)
    for fn in (lambda x: cbs.conv_bn_scale_eval(x, w, None),
               lambda x: cbs.conv_bn_scale_train(x, w, None, None, None, None, None, None, 0.1, 1e-5, 2.0)):
        with pytest.raises(RuntimeError, match="x must be 4-D"):
            fn(torch.ones(3, 6, 6))
        with pytest.raises(RuntimeError, match="x must be float32, got float64"):
            fn(torch.ones(1, 3, 6, 6, dtype=torch.float64))
        with pytest.raises(RuntimeError, match="x must be contiguous"):
            fn(torch.ones(1, 3, 6, 6).transpose(2, 3))
        with pytest.raises(RuntimeError, match="x must be a CUDA tensor"):
            fn(torch.ones(1, 3, 6, 6))
    with pytest.raises(RuntimeError, match="weight must be 4-D"):
        cbs.conv_bn_scale_eval(torch.ones(1, 3, 6, 6), torch.ones(5, 27), None)
    with pytest.raises(RuntimeError, match="conv_bn_scale_math: x must be a CUDA tensor"):
        cbs.conv_bn_scale_math(torch.ones(1, 3, 6, 6))


@pytest.mark.compile
def test_default_configuration(cbs):
    rpt, co_t, groups, wrows, min_blocks, use_async, smem_eval, smem_train = cbs.config()
    assert (rpt, co_t, groups, wrows) == (2, 8, 8, 1)
    assert smem_eval == 4 * (2 * 8 * (rpt * wrows + 2) * 132 + 8 * 9 * co_t * groups)
    assert smem_train == smem_eval + 32 * wrows * groups * co_t * 8
    # two resident blocks of the training kernel per SM on an H200 (228 KB of shared memory per SM)
    assert 2 * (smem_train + 1024) <= 228 * 1024


@pytest.mark.compile
def test_no_host_state_shared_between_loaded_modules(cbs):
    """A static local of a function template with external linkage is an STB_GNU_UNIQUE symbol ('u' in nm), which
    the dynamic linker shares between every loaded module, RTLD_LOCAL or not: with the launcher's cache of resident
    blocks shared, a second variant (or the generated solution) in one process skipped its shared-memory opt-in."""
    if shutil.which("nm") is None:
        pytest.skip("nm (binutils) is not installed")
    syms = subprocess.run(["nm", "-D", "-C", "--defined-only", cbs.__file__], capture_output=True, text=True,
                          check=True).stdout.splitlines()
    unique = [s for s in syms if " u " in s and not s.split(" u ", 1)[1].startswith("std::")]
    assert not unique, f"process-wide (STB_GNU_UNIQUE) symbols in the extension: {unique}"


def _sweep():
    spec = importlib.util.spec_from_file_location("dev_p73", ROOT / "dev" / "p73.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.SWEEP


@pytest.mark.compile
@pytest.mark.parametrize("name, defines", list(_sweep().items()))
def test_swept_variants_compile_without_spills_on_sm90(name, defines):
    for r in kb.build.resources("conv_bn_scale", "90", defines):
        assert r["spill_store_bytes"] == 0 and r["stack_bytes"] == 0, f"{name}: {r['kernel']} spills on sm_90"


def test_phases_bound_takes_each_phase_at_its_rate():
    """The ladder's bounds: one rate for both phases is the roofline's phased bound; a faster rate for the
    convolution's phase only lowers it."""
    ph, bw = kb.roofline.p73_train_phases(strategy="moments"), 4e12
    same = kb.training.phases_bound_ms(ph, (6e13, 6e13), bw)
    assert same == pytest.approx(kb.roofline.phased_bound_ms(ph, 6e13, bw))
    assert kb.training.phases_bound_ms(ph, (6e13, 1e14), bw) < same


# (N, C_in, H, W, C_out, x offset, out offset): P73's channels, odd widths and heights, two and three channel
# blocks, two and three column tiles, a one-output image, misaligned input and output.
TC_SHAPES = [(2, 3, 34, 34, 64, 0, 0), (2, 8, 33, 97, 64, 0, 1), (3, 5, 20, 150, 100, 0, 0), (1, 1, 3, 3, 1, 0, 0),
             (2, 8, 9, 131, 7, 1, 3), (1, 3, 40, 262, 130, 3, 0)]


@pytest.mark.gpu
def test_wgmma_and_mma_sync_give_the_same_convolution(cbs):
    """On an sm_90 GPU the 3xTF32 convolution runs on wgmma (conv_wgmma.cuh), elsewhere on mma.sync; forced onto
    mma.sync there it gives bitwise the same eval-mode output (the same products, joined in the same order), and
    training mode's strategies agree to float32 rounding (their statistics use atomics: not bitwise)."""
    x0 = torch.zeros(1, 1, 3, 3, device="cuda")
    default = cbs.conv_bn_scale_tc_instruction(x0)
    if torch.cuda.get_device_capability() != (9, 0):
        assert default == "mma.sync"
        pytest.skip("wgmma needs an sm_90 GPU")
    assert default == "wgmma"
    for n, c, h, w, k, xo, yo in TC_SHAPES:
        x = check.rand([n * c * h * w + xo], seed=k, device="cuda")[xo:].view(n, c, h, w)
        wt = check.rand((k, c, 3, 3), seed=1, device="cuda", low=-0.5, high=0.5)
        b = check.rand((k,), seed=2, device="cuda")
        shape = (n, k, h - 2, w - 2)
        runs = {}
        for forced in (False, True):
            assert cbs.conv_bn_scale_tc_instruction(x, mma_sync=forced) == ("mma.sync" if forced else "wgmma")
            try:
                y = check.poisoned([torch.Size(shape).numel() + yo], device="cuda")[yo:].view(shape)
                cbs.conv_bn_scale_eval(x, wt, b, y, math="3xtf32")
                trains = [cbs.conv_bn_scale_train(x, wt, b, None, None, None, None, None, 0.1, 1e-5, SCALE,
                                                  strategy=s, math="3xtf32") for s in ("moments", "inplace")
                          if n * (h - 2) * (w - 2) > 1]  # training mode needs two values per channel
                runs[forced] = (y, *trains)
            finally:
                cbs.conv_bn_scale_tc_instruction(x, mma_sync=False)
        (ew, *tw), (em, *tm) = runs[False], runs[True]
        assert torch.equal(ew, em), (shape, (ew - em).abs().max().item())
        assert torch.isfinite(ew).all(), shape  # every output written
        for a, m in zip(tw, tm, strict=True):
            check.assert_close(a, m.double(), 1e-6, what=f"training {shape}")
    assert cbs.conv_bn_scale_tc_instruction(x0) == "wgmma"  # the default restored


def test_conv_bounds_put_the_convolution_at_its_instructions_rate():
    """Chapter 7's bounds with the sums and the convolution on different instructions: equal rates give the
    phased bounds of eval mode and of the moments strategy; a faster convolution lowers both, and the eval bound
    never falls below the bytes' time."""
    rl, bw = kb.roofline, 4e12
    phases = {"eval mode (folded conv)": [rl.p73_fused_eval()],
              "moments, then one conv": rl.p73_train_phases(strategy="moments")}
    ev, mo = kb.training.conv_bounds_ms(phases, 6e13, 6e13, bw)
    assert ev == pytest.approx(rl.phased_bound_ms(phases["eval mode (folded conv)"], 6e13, bw))
    assert mo == pytest.approx(rl.phased_bound_ms(phases["moments, then one conv"], 6e13, bw))
    ev2, mo2 = kb.training.conv_bounds_ms(phases, 6e13, 1e15, bw)
    assert ev2 < ev and mo2 < mo
    assert ev2 == pytest.approx(1e3 * rl.p73_fused_eval().bytes / bw)
