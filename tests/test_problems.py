import torch

from kernelbook.models.problems import P27_CONV3D_GN_MEAN, P73_CONV_BN_SCALE


def test_p73_reference_shapes_and_training_mode():
    m = P73_CONV_BN_SCALE.model(seed=0)
    assert m.training and m.scaling_factor == 2.0
    x = P73_CONV_BN_SCALE.inputs(seed=1, batch=2)
    assert x.shape == (2, 8, 128, 128) and x.min() >= 0 and x.max() < 1
    with torch.no_grad():
        y = m(x[:, :, :10, :12])
    assert y.shape == (2, 64, 8, 10)
    assert int(m.bn.num_batches_tracked) == 1  # training mode updated the running statistics


def test_p73_seeded_init_is_reproducible():
    a, b = P73_CONV_BN_SCALE.model(seed=3), P73_CONV_BN_SCALE.model(seed=3)
    assert torch.equal(a.conv.weight, b.conv.weight) and torch.equal(a.conv.bias, b.conv.bias)


def test_p27_reference_shapes():
    m = P27_CONV3D_GN_MEAN.model(seed=0)
    x = P27_CONV3D_GN_MEAN.inputs(seed=1, batch=2)[:, :, :6, :7, :8]
    with torch.no_grad():
        y = m(x)
    assert y.shape == (2, 16)
