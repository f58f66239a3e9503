"""kmp's own float8 matmul layers, and reading any float8 layer's operands.

`kmp.float8(model)` now converts a model with Keras's own float8 (see
`kmp.fp8.convert`). The classes here are what it put in before (kmp 0.1):
they stay registered, so files written then still load and train, and
they can be used directly. Each writes every matmul in the form XLA's GPU
GEMM rewriter turns into one FP8 cuBLASLt GEMM
(`dot(convert(a8) * sa, convert(b8) * sb)`): inputs and kernels in E4M3
with delayed per-tensor scales, the output gradient in E5M2 scaled on the
spot, so the two gradient GEMMs are E5M2 x E4M3 (the rewriter refuses
E5M2 x E5M2).

Scaling, per tensor, `scale = amax / float8_max` so that `x / scale`
fills the float8 range:

    inputs, kernel (delayed):  amax = max(last `amax_history_length`
                               steps' max|x|), or this step's when the
                               history is empty; the history is updated
                               in training, like BatchNorm's statistics.
    output gradient (current): amax = max|g| of this very gradient.

Scaled on the spot, `loss_scale * g` is quantized to exactly
`loss_scale` times what `g` is (the loss scale is a power of two), so a
run does not depend on its loss scale; a non-finite gradient stays
non-finite, so the loss-scale optimizer still sees the overflow. It costs
one reduction over the gradient per layer. (Keras's float8 layers get the
same independence from `kmp.LossScaleOptimizer` instead.)

The arithmetic is `quantization`'s; `operands` reads these layers and
Keras's alike, for the audit and the doctor.
"""

import keras
from keras import ops

from kmp.errors import InputError
from kmp.fp8.matmuls import is_eligible_einsum
from kmp.fp8.matmuls import projections
from kmp.fp8.quantization import E4M3
from kmp.fp8.quantization import amax
from kmp.fp8.quantization import quantize_forward
from kmp.fp8.quantization import quantize_gradient
from kmp.fp8.quantization import scale_for
from kmp.islands import MultiHeadAttention
from kmp.model_layers import swap_class


class _Float8(keras.layers.Layer):
    """Mixin for a Keras matmul layer with `kernel`: float8 operands. A
    `Layer`, so that it can be swapped in under NNX
    (`kmp.model_layers.swap_class`)."""

    default_amax_history_length = 16

    def __init__(self, *args, amax_history_length=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.amax_history_length = _history_length(amax_history_length)

    def build(self, input_shape):
        super().build(input_shape)
        self._add_amax_histories()

    def _add_amax_histories(self):
        # Not `_float8_build`: that is Keras 3.15 Dense's private method
        # (its own float8 variables), which this would override.
        if getattr(self, "inputs_amax_history", None) is not None:
            return
        # `kmp.float8` converts built layers: their tracker is locked.
        locked = self._tracker.locked
        self._tracker.unlock()
        for name in ("inputs_amax_history", "kernel_amax_history"):
            variable = self.add_weight(
                name=name,
                shape=(self.amax_history_length,),
                initializer="zeros",
                dtype="float32",  # amaxes of float16 data can exceed it
                trainable=False,
                autocast=False,
                # Under tf.distribute every replica then holds the mean of
                # the replicas' amaxes, so all quantize alike (JAX's data
                # parallelism sees the global batch's amax as it is).
                aggregation="mean",
            )
            setattr(self, name, variable)
        if locked:
            self._tracker.lock()

    # `observe_operands` sets it: called with (layer, operand, x, history)
    # on every quantization of an operand.
    _operand_observer = None

    def _float8_operand(self, x, operand, training):
        """`x` quantized to E4M3 with the delayed scale of `operand`
        (`"inputs"` or `"kernel"`); in training, its amax goes into that
        operand's history."""
        history = getattr(self, f"{operand}_amax_history")
        if self._operand_observer is not None:
            recorded = float(ops.max(history))
            self._operand_observer(
                self, operand, x, recorded if recorded > 0 else None
            )
        # The gradient of the quantization is `x`'s: give it one dtype (a
        # kernel may arrive as its float32 variable).
        x = ops.cast(x, self.compute_dtype)
        current = amax(x)
        past = ops.convert_to_tensor(history)
        recorded = ops.max(past)
        scale = scale_for(
            ops.where(recorded > 0, recorded, current),
            E4M3,
            self.compute_dtype,
        )
        if training:
            # Non-finite amaxes are not recorded: one overflowing batch
            # would otherwise freeze the scale for the history's length.
            finite = ops.where(ops.isfinite(current), current, 0.0)
            history.assign(
                ops.concatenate([ops.reshape(finite, (1,)), past[:-1]])
            )
        return quantize_forward(x, scale)

    def _float8_matmul(self, inputs, training, product):
        """The parent's `call` with `product(inputs, kernel)` in float8:
        then the bias and activation, in the compute dtype."""
        x = self._float8_operand(inputs, "inputs", training)
        kernel = self._float8_operand(self.kernel, "kernel", training)
        x = quantize_gradient(product(x, kernel))
        if self.bias is not None:
            x = ops.add(x, self.bias)
        if self.activation is not None:
            x = self.activation(x)
        return x

    @property
    def variable_serialization_spec(self):
        spec = dict(super().variable_serialization_spec)
        spec[None] = [*spec[None], "inputs_amax_history", "kernel_amax_history"]
        return spec

    def get_config(self):
        return {
            **super().get_config(),
            "amax_history_length": self.amax_history_length,
        }


def _history_length(length):
    if length is None:
        return _Float8.default_amax_history_length
    if isinstance(length, bool) or not isinstance(length, int) or length < 1:
        raise InputError(
            "amax_history_length must be a positive int (the steps whose "
            f"largest |x| sets a float8 scale); got {length!r}."
        )
    return length


@keras.saving.register_keras_serializable(package="kmp")
class Float8Dense(_Float8, keras.layers.Dense):
    """`keras.layers.Dense` whose matmul runs in float8.

    Inputs and kernel are quantized to E4M3 with delayed per-tensor
    scales, the output gradient to E5M2 with its current scale (see this
    module's docstring); the kernel stays a float32 variable, the bias
    add and activation stay in the compute dtype. Use it under
    `mixed_bfloat16` or `mixed_float16`, or let `kmp.float8(model)` put it
    in place of a model's `Dense` layers.

    Args:
        amax_history_length: Steps of amax history behind the delayed
            scales (default 16).
        **kwargs: As for `keras.layers.Dense`.

    Example:

    ```python
    kmp.enable("mixed_bfloat16")
    layer = kmp.layers.Float8Dense(1024, activation="gelu")
    ```
    """

    def call(self, inputs, training=None):
        return self._float8_matmul(inputs, training, ops.matmul)


@keras.saving.register_keras_serializable(package="kmp")
class Float8EinsumDense(_Float8, keras.layers.EinsumDense):
    """`keras.layers.EinsumDense` whose einsum runs in float8, as
    `Float8Dense` does (the projections of attention layers).

    Args:
        amax_history_length: As for `Float8Dense`.
        **kwargs: As for `keras.layers.EinsumDense`.
    """

    def call(self, inputs, training=None):
        return self._float8_matmul(
            inputs, training, lambda a, b: ops.einsum(self.equation, a, b)
        )


@keras.saving.register_keras_serializable(package="kmp")
class Float8MultiHeadAttention(MultiHeadAttention):
    """`kmp.layers.MultiHeadAttention` whose query, key, value and output
    projections are `Float8EinsumDense` layers.

    The two attention matmuls (scores and weighted values) stay in the
    compute dtype, as in Transformer Engine, and the softmax computes in
    float32 (`kmp.layers.MultiHeadAttention`).

    Args:
        As for `keras.layers.MultiHeadAttention`.
    """

    def build(self, query_shape, value_shape, key_shape=None):
        super().build(query_shape, value_shape, key_shape)
        _convert_projections(self)


def convert(layer):
    """Turns a Keras `Dense`, `EinsumDense` or `MultiHeadAttention` (or
    kmp's) into its float8 class in place, built or not; returns it."""
    if isinstance(layer, _Float8 | Float8MultiHeadAttention):
        return layer
    if isinstance(layer, keras.layers.MultiHeadAttention):
        swap_class(layer, Float8MultiHeadAttention)
        if layer.built:
            _convert_projections(layer)
        return layer
    cls = (
        Float8EinsumDense
        if isinstance(layer, keras.layers.EinsumDense)
        else Float8Dense
    )
    swap_class(layer, cls)
    layer.amax_history_length = _history_length(None)
    if layer.built:
        layer._add_amax_histories()
    return layer


def _convert_projections(attention):
    for dense in projections(attention):
        if is_eligible_einsum(dense):
            convert(dense)


FLOAT8_CLASSES = (Float8Dense, Float8EinsumDense, Float8MultiHeadAttention)
