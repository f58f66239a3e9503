"""Layers that compute in float32 inside a mixed-precision model.

These are KerasHub's idiom (b): cast up to float32 inside `call`, compute,
and return the layer's `compute_dtype`, so that the next matmul still runs
in float16 (or bfloat16) on tensor cores. They differ from their Keras
parents only in that; `kmp.pin_float32` puts them in place of the exact
Keras classes, and because they are registered for serialization a pinned
model keeps them through `.keras` save and load.

Use idiom (a), `dtype="float32"` on the layer, where the *output* itself
must be float32 (a model's final softmax); `kmp.pin_float32` does that for
the layers that produce model outputs.
"""

import keras
from keras import ops

from kmp.model_layers import swap_class


class _Float32Compute(keras.layers.Layer):
    """Mixin: run the parent's `call` on float32 inputs, return
    `compute_dtype`. A `Layer`, so that it can be swapped in under NNX
    (`kmp.model_layers.swap_class`)."""

    def call(self, inputs, *args, **kwargs):
        outputs = super().call(ops.cast(inputs, "float32"), *args, **kwargs)
        return ops.cast(outputs, self.compute_dtype)


@keras.saving.register_keras_serializable(package="kmp")
class Float32Softmax(_Float32Compute, keras.layers.Softmax):
    """`keras.layers.Softmax` computed in float32, returned in
    `compute_dtype`.

    Under `mixed_float16`, a softmax's exponentials and normalising sum lose
    precision (and its large-negative mask value, range) in float16. This
    layer casts its input to float32, applies the softmax there, and casts
    the probabilities back to the layer's compute dtype for the next
    matmul.

    Args:
        axis: As for `keras.layers.Softmax`.
        **kwargs: Base layer keyword arguments, such as `name` and `dtype`.

    Example:

    ```python
    kmp.enable("mixed_float16")
    probs = kmp.layers.Float32Softmax()(scores)   # float16 out,
                                                  # float32 inside
    ```
    """


@keras.saving.register_keras_serializable(package="kmp")
class Float32Activation(_Float32Compute, keras.layers.Activation):
    """`keras.layers.Activation` computed in float32, returned in
    `compute_dtype`.

    Used by `kmp.pin_float32` for softmax, log-softmax and sigmoid
    activations inside a model.

    Args:
        activation: As for `keras.layers.Activation`.
        **kwargs: Base layer keyword arguments, such as `name` and `dtype`.
    """


@keras.saving.register_keras_serializable(package="kmp")
class MultiHeadAttention(keras.layers.MultiHeadAttention):
    """`keras.layers.MultiHeadAttention` whose attention softmax computes in
    float32.

    The query, key, value and output projections and both attention
    matmuls keep the layer's policy (float16 under `mixed_float16`); only
    the softmax over the attention scores runs in float32, through a
    `kmp.layers.Float32Softmax`, and hands float16 probabilities to the
    next matmul. (When Keras takes its fused `ops.dot_product_attention`
    path, used when there is no dropout and no returned scores, that op
    already computes its softmax in float32 on the TensorFlow and JAX
    backends; this layer changes the other path.)

    Args:
        As for `keras.layers.MultiHeadAttention`.
    """

    def _build_attention(self, rank):
        super()._build_attention(rank)
        swap_class(self._softmax, Float32Softmax)

    def after_swap_class(self):
        """Called by `kmp.model_layers.swap_class` when a built Keras
        `MultiHeadAttention` becomes this class: its softmax was made by
        the stock `_build_attention`."""
        swap_class(self._softmax, Float32Softmax)
