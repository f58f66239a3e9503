"""kmp.backend.fused_batch_norm: Keras's batch normalization in torch's
one kernel, the same numbers as a float32 reference; elsewhere `None`
(Keras's ops, which XLA fuses)."""

import numpy as np
import pytest
from keras import ops

from kmp import backend

torch_only = pytest.mark.skipif(
    backend.name() != "torch", reason="torch's fused kernel"
)


def reference(x, gamma, beta, axis, epsilon):
    """Keras's arithmetic in float64: the batch's mean and biased
    variance over every axis but `axis`, then the normalization."""
    x = np.asarray(x, "float64")
    axes = tuple(i for i in range(x.ndim) if i != axis % x.ndim)
    mean, variance = x.mean(axes), x.var(axes)
    shape = [1] * x.ndim
    shape[axis] = -1
    y = (x - mean.reshape(shape)) / np.sqrt(variance.reshape(shape) + epsilon)
    if gamma is not None:
        y = y * gamma.reshape(shape)
    if beta is not None:
        y = y + beta.reshape(shape)
    return y, mean, variance


def inputs(shape, seed=0):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 3 + 1).astype("float32")
    gamma = rng.uniform(0.5, 2, shape[-1]).astype("float32")
    beta = rng.standard_normal(shape[-1]).astype("float32")
    return x, gamma, beta


@torch_only
@pytest.mark.parametrize("shape, axis", [((4, 6, 5, 8), -1), ((8, 16), 1)])
@pytest.mark.parametrize("affine", [True, False])
def test_training_normalizes_by_the_batch_and_returns_its_statistics(
    shape, axis, affine
):
    x, gamma, beta = inputs(shape)
    if not affine:
        gamma = beta = None
    y, mean, variance = backend.fused_batch_norm(
        x, gamma, beta, None, None, axis, 1e-3, True
    )
    want_y, want_mean, want_variance = reference(x, gamma, beta, axis, 1e-3)
    assert tuple(y.shape) == shape and str(y.dtype) == "torch.float32"
    np.testing.assert_allclose(ops.convert_to_numpy(y), want_y, atol=1e-5)
    np.testing.assert_allclose(ops.convert_to_numpy(mean), want_mean, rtol=1e-6)
    np.testing.assert_allclose(
        ops.convert_to_numpy(variance), want_variance, rtol=1e-5
    )


@torch_only
def test_a_channels_first_axis_in_the_middle_is_moved_and_back():
    x, gamma, beta = inputs((4, 8, 5, 8))
    x = np.moveaxis(x, -1, 1).copy()  # channels first: axis 1 of 4
    y, _, _ = backend.fused_batch_norm(
        x, gamma, beta, None, None, 1, 1e-3, True
    )
    np.testing.assert_allclose(
        ops.convert_to_numpy(y),
        reference(x, gamma, beta, 1, 1e-3)[0],
        atol=1e-5,
    )


@torch_only
def test_16_bit_activations_stay_16_bit_with_float32_statistics():
    import torch

    x, gamma, beta = inputs((4, 6, 5, 16), seed=1)
    half = torch.tensor(x, dtype=torch.bfloat16, requires_grad=True)
    y, mean, variance = backend.fused_batch_norm(
        half, gamma, beta, None, None, -1, 1e-3, True
    )
    assert y.dtype == torch.bfloat16 and y.is_contiguous()
    assert mean.dtype == variance.dtype == torch.float32
    # The statistics of the bfloat16 values, in float32; the output is
    # their normalization rounded once to bfloat16.
    rounded = half.detach().float().numpy()
    want_y, want_mean, _ = reference(rounded, gamma, beta, -1, 1e-3)
    np.testing.assert_allclose(mean.numpy(), want_mean, rtol=1e-5)
    np.testing.assert_allclose(
        y.detach().float().numpy(), want_y, rtol=2**-8, atol=2**-8
    )
    y.float().sum().backward()
    assert half.grad.dtype == torch.bfloat16


@torch_only
def test_inference_normalizes_by_the_moving_statistics():
    x, gamma, beta = inputs((8, 16), seed=2)
    mean = np.linspace(-1, 1, 16).astype("float32")
    variance = np.linspace(0.5, 2, 16).astype("float32")
    y, batch_mean, batch_variance = backend.fused_batch_norm(
        x, gamma, beta, mean, variance, -1, 1e-3, False
    )
    assert batch_mean is None and batch_variance is None
    want = (x - mean) / np.sqrt(variance + 1e-3) * gamma + beta
    np.testing.assert_allclose(ops.convert_to_numpy(y), want, atol=1e-5)


def test_the_batch_axis_and_other_backends_take_keras_s_ops():
    x, gamma, beta = inputs((8, 16))
    assert (
        backend.fused_batch_norm(x, gamma, beta, None, None, 0, 1e-3, True)
        is None
    )
    fused = backend.fused_batch_norm(x, gamma, beta, None, None, -1, 1e-3, True)
    assert (fused is None) == (backend.name() != "torch")
