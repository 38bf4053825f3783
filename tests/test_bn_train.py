"""Chapter 1's fused BatchNorm·scale: training and eval mode against nn.BatchNorm2d in float64.

GPU tests are marked ``gpu``; the argument checks that need no GPU run everywhere the CUDA toolkit is.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import kernelbook as kb
from kernelbook import check

SCALE = 2.0  # tolerances: check.pivoted_normalisation_tol, 8u(1 + max|μ − p|/σ) per input (derived in the chapter)


@pytest.fixture(scope="module")
def bn():
    return kb.build.load("bn_train", arch=None if kb.gpu() else "90")


@pytest.fixture(autouse=True)
def _no_grad():
    """The kernels are forward-only: every test calls them as the chapter does, with grad mode off
    (γ, β of an nn.BatchNorm2d are parameters that require grad; in grad mode the outputs would join a graph
    whose backward refuses)."""
    with torch.no_grad():
        yield


def _reference(c, momentum, seed):
    ref = nn.BatchNorm2d(c, momentum=momentum).double()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        ref.weight.copy_(torch.rand(c, generator=g, dtype=torch.float64) * 2 - 0.5)
        ref.bias.copy_(torch.randn(c, generator=g, dtype=torch.float64))
    return ref.cuda()


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1, 64, 126, 126), (3, 5, 7, 9), (4, 67, 33, 35), (2, 3, 256, 256),
                                   (64, 256, 3, 3), (2, 8, 1, 1), (5, 7, 4, 4), (2, 1, 2, 1),
                                   (2, 1500, 4, 4)])  # more channels than resident stats blocks
@pytest.mark.parametrize("momentum", [0.1, None, 0.0, 1.0])
def test_train_then_eval_match_float64(bn, shape, momentum):
    c = shape[1]
    ref = _reference(c, momentum, seed=sum(shape))
    ours = copy.deepcopy(ref).float()
    for step in range(3):
        x = check.rand(shape, seed=step + 10 * sum(shape), device="cuda", low=-1, high=3)
        tol = check.pivoted_normalisation_tol(x)
        out = check.poisoned(shape, device="cuda")
        y, mean, var = bn.bn_scale_train(x, ours.weight, ours.bias, ours.running_mean, ours.running_var,
                                         ours.num_batches_tracked, momentum, ours.eps, SCALE, out)
        assert y.data_ptr() == out.data_ptr()
        with torch.no_grad():
            y_ref = ref(x.double()) * SCALE
        check.assert_close(out, y_ref, tol, what=f"step {step} output")
        check.assert_close(mean, x.double().mean(dim=(0, 2, 3)), tol, what="batch mean")
        check.assert_close(var, x.double().var(dim=(0, 2, 3), unbiased=False), tol, what="batch variance")
        check.assert_close(ours.running_mean, ref.running_mean, tol, what="running_mean")
        check.assert_close(ours.running_var, ref.running_var, tol, what="running_var")
        assert int(ours.num_batches_tracked) == int(ref.num_batches_tracked) == step + 1
    # Eval from our own running statistics (already checked above), so this checks the eval kernel:
    # a few roundings relative to |y|.
    with torch.no_grad():
        ref.running_mean.copy_(ours.running_mean)
        ref.running_var.copy_(ours.running_var)
    ref.eval()
    x = check.rand(shape, seed=99, device="cuda", low=-1, high=3)
    y = bn.bn_scale_eval(x, ours.weight, ours.bias, ours.running_mean, ours.running_var, ours.eps, SCALE)
    with torch.no_grad():
        check.assert_close(y, ref(x.double()) * SCALE, 1e-6, what="eval output")


@pytest.mark.gpu
def test_p73_sized_tensor_and_shifted_data(bn):
    """The benchmark's conv-output shape, with a mean 1700× the spread (one-pass E[x²]−E[x]² fails here): the
    statistics summed about a pivot and the mean applied as two floats keep the error at float32's level."""
    shape = (128, 64, 126, 126)
    ref = _reference(64, 0.1, seed=3)
    ours = copy.deepcopy(ref).float()
    x = check.rand(shape, seed=5, device="cuda", low=999.0, high=1001.0)
    y, _, var = bn.bn_scale_train(x, ours.weight, ours.bias, ours.running_mean, ours.running_var,
                                  ours.num_batches_tracked, 0.1, ours.eps, SCALE, None)
    with torch.no_grad():
        y_ref = ref(x.double()) * SCALE
    tol = check.pivoted_normalisation_tol(x)  # 1e-6: no growth with μ/σ; E[x²] − E[x]² would be off by ~1e-1
    assert tol < 2e-6
    check.assert_close(var, x.double().var(dim=(0, 2, 3), unbiased=False), tol, what="variance at μ/σ≈1700")
    check.assert_close(y, y_ref, tol, what="output at μ/σ≈1700")
    check.assert_close(ours.running_var, ref.running_var, tol, what="running_var")


@pytest.mark.gpu
def test_no_affine_and_no_running_stats(bn):
    shape = (4, 6, 10, 12)
    x = check.rand(shape, seed=2, device="cuda")
    y, _, _ = bn.bn_scale_train(x, None, None, None, None, None, 0.1, 1e-5, SCALE, None)
    with torch.no_grad():
        check.assert_close(y, nn.functional.batch_norm(x.double(), None, None, training=True) * SCALE,
                           check.pivoted_normalisation_tol(x))


@pytest.mark.gpu
def test_empty_batch_counts_the_batch_like_pytorch(bn):
    ref = nn.BatchNorm2d(3).cuda()
    ours = copy.deepcopy(ref)
    x = torch.empty(0, 3, 4, 4, device="cuda")
    y, _, _ = bn.bn_scale_train(x, ours.weight, ours.bias, ours.running_mean, ours.running_var,
                                ours.num_batches_tracked, 0.1, 1e-5, SCALE, None)
    with torch.no_grad():
        y_ref = ref(x) * SCALE
    assert y.shape == y_ref.shape == (0, 3, 4, 4)
    assert int(ours.num_batches_tracked) == int(ref.num_batches_tracked) == 1
    assert torch.equal(ours.running_mean, ref.running_mean) and torch.equal(ours.running_var, ref.running_var)


@pytest.mark.gpu
def test_runs_on_the_current_stream(bn):
    shape = (8, 16, 32, 32)
    ref = _reference(16, 0.1, seed=4)
    ours = copy.deepcopy(ref).float()
    x = check.rand(shape, seed=6, device="cuda")
    out = torch.empty_like(x)
    args = (x, ours.weight, ours.bias, ours.running_mean, ours.running_var, ours.num_batches_tracked, 0.1,
            ours.eps, SCALE, out)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        bn.bn_scale_train(*args)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        bn.bn_scale_train(*args)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    with torch.no_grad():  # the reference sees the same two batches: warm-up and replay
        ref(x.double())
        y_ref = ref(x.double()) * SCALE
    check.assert_close(out, y_ref, check.pivoted_normalisation_tol(x), what="graph replay output")
    assert int(ours.num_batches_tracked) == 2  # warm-up + replay; capture launched nothing


@pytest.mark.gpu
@pytest.mark.parametrize("call, message", [
    (lambda m, x, v, n: m.bn_scale_train(x.cpu(), v, v, v, v, n, 0.1, 1e-5, 2.0), "x must be a CUDA tensor"),
    (lambda m, x, v, n: m.bn_scale_train(x.double(), v, v, v, v, n, 0.1, 1e-5, 2.0), "x must be float32"),
    (lambda m, x, v, n: m.bn_scale_train(x.transpose(2, 3), v, v, v, v, n, 0.1, 1e-5, 2.0), "x must be contiguous"),
    (lambda m, x, v, n: m.bn_scale_train(x[0], v, v, v, v, n, 0.1, 1e-5, 2.0), "x must be 4-D"),
    (lambda m, x, v, n: m.bn_scale_train(x, v[:3], v, v, v, n, 0.1, 1e-5, 2.0), r"weight must have shape \[4\]"),
    (lambda m, x, v, n: m.bn_scale_train(x, v, v, v.cpu(), v, n, 0.1, 1e-5, 2.0), "running_mean must be a CUDA"),
    (lambda m, x, v, n: m.bn_scale_train(x, v, v, v, None, None, 0.1, 1e-5, 2.0), "given together"),
    (lambda m, x, v, n: m.bn_scale_train(x, v, v, v, v, n.float(), 0.1, 1e-5, 2.0),
     "num_batches_tracked must be int64"),
    (lambda m, x, v, n: m.bn_scale_train(x, v, v, v, v, n, 1.5, 1e-5, 2.0), "momentum must be in"),
    (lambda m, x, v, n: m.bn_scale_train(x[:1, :, :1, :1].contiguous(), v, v, v, v, n, 0.1, 1e-5, 2.0),
     "more than 1 value per channel"),
    (lambda m, x, v, n: m.bn_scale_eval(x, v, v, v, v[:2], 1e-5, 2.0), r"running_var must have shape \[4\]"),
    (lambda m, x, v, n: m.bn_scale_train(x[:, :0].contiguous(), None, None, None, None, None, 0.1, 1e-5, 2.0),
     "at least one channel"),
    (lambda m, x, v, n: m.bn_scale_train(torch.empty(1, 1, 8193, 8193, device="cuda"), None, None, None, None,
                                         None, 0.1, 1e-5, 2.0), "planes of more than 67107840 values"),
])
def test_bad_input_is_named(bn, call, message):
    x = torch.rand(2, 4, 5, 5, device="cuda")
    v = torch.ones(4, device="cuda")
    n = torch.zeros((), dtype=torch.long, device="cuda")
    with pytest.raises(RuntimeError, match=message):
        call(bn, x, v, n)


@pytest.mark.gpu
def test_grad_mode_runs_and_a_backward_is_refused_by_name(bn):
    """With grad mode on and γ a parameter, both kernels run with the values they give under no_grad; the
    outputs (all three of training mode's) carry a grad_fn whose backward raises, naming the op."""
    x = torch.rand(2, 4, 5, 5, device="cuda")
    ref = nn.BatchNorm2d(4).cuda()
    args = (ref.weight, ref.bias, ref.running_mean, ref.running_var, None, 1e-5, 2.0)
    with torch.enable_grad():
        y, mean, var = bn.bn_scale_train(x, *args[:4], ref.num_batches_tracked.clone(), 0.1, *args[5:])
        assert all(t.grad_fn is not None for t in (y, mean, var))
        with pytest.raises(RuntimeError, match="bn_scale_train: this kernel has no backward"):
            y.sum().backward()
        e = bn.bn_scale_eval(x.requires_grad_(), ref.weight.detach(), None, ref.running_mean, ref.running_var,
                             1e-5, 2.0)
        with pytest.raises(RuntimeError, match="bn_scale_eval: this kernel has no backward"):
            e.sum().backward()
    e0 = bn.bn_scale_eval(x.detach(), ref.weight, None, ref.running_mean, ref.running_var, 1e-5, 2.0)
    assert not e0.requires_grad and torch.equal(e0, e.detach())  # before the next step moves the statistics
    y0, _, _ = bn.bn_scale_train(x.detach(), *args[:4], ref.num_batches_tracked.clone(), 0.1, *args[5:])
    assert not y0.requires_grad and torch.equal(y0, y.detach())


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(128, 64, 126, 126), (4, 67, 33, 35), (2, 3, 512, 512), (2, 1500, 4, 4),
                                   (3, 5, 7, 9)])
def test_stats_grid_is_at_most_one_wave(bn, shape):
    """The statistics grid is sized by the occupancy API: the resident blocks shared out over the channels
    (never more than one wave unless a channel needs one block), each block under 2^22 values."""
    n, c, h, w = shape
    g = bn.stats_grid(n, c, h, w)
    props = torch.cuda.get_device_properties(0)
    assert g["sm_count"] == props.multi_processor_count
    assert 1 <= g["blocks_per_sm"] <= props.max_threads_per_multi_processor // bn.config()["threads"]
    assert g["resident_blocks"] == g["sm_count"] * g["blocks_per_sm"]
    assert g["blocks"] == c * g["splits"]
    assert g["waves"] <= 1.0 or g["splits"] == 1
    assert n * h * w <= g["splits"] * bn.config()["max_values_per_block"]
    if c * 2 <= g["resident_blocks"] and n * h * w >= 4 * g["resident_blocks"]:
        assert g["waves"] > 0.5  # and the wave is mostly full


@pytest.mark.compile
def test_config_reports_the_kernel_constants(bn):
    cfg = bn.config()
    assert cfg["threads"] % 32 == 0 and cfg["unroll"] >= 1
    assert cfg["max_plane"] == 65535 * cfg["threads"] * cfg["unroll"]
    assert cfg["max_values_per_block"] < 2**24  # a block's count is kept in float


@pytest.mark.compile
@pytest.mark.parametrize("x, message", [
    (torch.ones(2, 3, 4), "x must be 4-D"),
    (torch.ones(2, 3, 4, 4, dtype=torch.float64), "x must be float32, got float64"),
    (torch.ones(2, 3, 4, 4), "x must be a CUDA tensor"),
])
def test_bad_input_without_a_gpu(bn, x, message):
    with pytest.raises(RuntimeError, match=message):
        bn.bn_scale_train(x, None, None, None, None, None, 0.1, 1e-5, 2.0, None)
