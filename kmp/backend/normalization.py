"""Batch normalization in one kernel where Keras's is many (torch).

Keras's `BatchNormalization` computes from ops: the input cast to
float32, its moments, the normalization, the result cast back. XLA fuses
them on TensorFlow and JAX. Eager torch runs each as a kernel of its
own, and each of their gradients too: in a training step some sixty aten
calls a layer, most of them passes over the activation, float32 ones at
twice a 16-bit activation's bytes. torch's own kernel
(`native_batch_norm`, cuDNN's on a GPU) does the same arithmetic with
float32 statistics and parameters, the activation read and written in
its own dtype: one call forward, one backward.
"""

from kmp.backend._current import name


def fused_batch_norm(
    x, gamma, beta, moving_mean, moving_variance, axis, epsilon, training
):
    """Batch normalization of `x` over every axis but `axis`, in one kernel.

    Training: `(y, mean, variance)`, `y` normalized by the batch's mean
    and (biased) variance, which are returned in float32 for the moving
    averages. Inference: `(y, None, None)`, `y` normalized by the moving
    statistics. `y = (x - mean) / sqrt(variance + epsilon) * gamma + beta`
    in `x`'s dtype, computed in float32; `gamma` and `beta` may be
    `None`.

    Returns `None` where Keras's own ops are as good (TensorFlow and JAX,
    whose XLA fuses them) or `axis` is the batch axis: the caller then
    computes as Keras does.
    """
    if name() != "torch":
        return None
    import torch

    x = _tensor(x)
    axis = axis % x.ndim
    if x.ndim < 2 or axis == 0:
        return None
    # torch's kernel normalizes axis 1. Moving the features there is a
    # view: a channels-last activation is then torch's channels_last
    # memory format, which the kernel reads as it is.
    order = [0, axis, *(i for i in range(1, x.ndim) if i != axis)]
    inverse = sorted(range(x.ndim), key=order.__getitem__)
    moved = x.permute(order)
    gamma, beta = _tensor(gamma), _tensor(beta)
    if training:
        y, mean, inverse_std = torch.ops.aten.native_batch_norm(
            moved, gamma, beta, None, None, True, 0.0, epsilon
        )
        # The kernel keeps 1 / sqrt(variance + epsilon); the variance is
        # recovered from it (never below 0: rounding near epsilon).
        variance = (inverse_std.detach() ** -2 - epsilon).clamp_min(0.0)
        return y.permute(inverse), mean.detach(), variance
    y = torch.nn.functional.batch_norm(
        moved,
        _tensor(moving_mean),
        _tensor(moving_variance),
        gamma,
        beta,
        training=False,
        eps=epsilon,
    )
    return y.permute(inverse), None, None


def _tensor(x):
    if x is None:
        return None
    from keras import ops

    return ops.convert_to_tensor(x)
