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

`float8_matmuls`, `matmul_sizes` and `observe_operands` read both kinds,
for the audit and the doctor.
"""

import contextlib

import keras
import ml_dtypes
from keras import ops

from kmp.errors import InputError
from kmp.islands import MultiHeadAttention
from kmp.model_layers import swap_class

E4M3 = "float8_e4m3fn"
E5M2 = "float8_e5m2"
_MAX = {dtype: float(ml_dtypes.finfo(dtype).max) for dtype in (E4M3, E5M2)}
_TINY = {"float16": float(ml_dtypes.finfo("float16").tiny)}


def scale_for(amax, dtype, compute_dtype):
    """The per-tensor scale, in `compute_dtype`, that maps `amax` to the
    largest `dtype` value: `amax / max(dtype)`.

    A zero `amax` gives 1 (nothing to scale). A non-finite one gives a
    non-finite scale, so what is quantized with it turns NaN rather than
    saturating: an overflow stays visible. Under float16 the scale is at
    least float16's smallest normal number, which it must be to be
    represented at all; E5M2 has float16's exponent range, so nothing
    that float16 can hold is lost by that floor.
    """
    amax = ops.cast(amax, "float32")
    scale = ops.where(amax > 0, amax / _MAX[dtype], 1.0)
    if compute_dtype in _TINY:
        scale = ops.maximum(scale, _TINY[compute_dtype])
    return ops.cast(scale, compute_dtype)


def quantize(x, scale, dtype):
    """`x` rounded to `dtype` at `scale` (a scalar in the compute dtype),
    returned in the scale's dtype: `convert(q) * scale`, the form XLA
    rewrites into an FP8 GEMM.

    The division is done in float32 (a float16 quotient could overflow
    before the clip); values beyond the float8 range saturate."""
    limit = _MAX[dtype]
    scaled = ops.divide(ops.cast(x, "float32"), ops.cast(scale, "float32"))
    q = ops.cast(ops.clip(scaled, -limit, limit), dtype)
    return ops.multiply(ops.cast(q, scale.dtype), scale)


def amax(x):
    """`max|x|` in float32."""
    return ops.max(ops.abs(ops.cast(x, "float32")))


@ops.custom_gradient
def _quantize_forward(x, scale):
    """E4M3 quantization with a straight-through gradient."""

    def grad(*args, upstream=None):
        if upstream is None:  # TensorFlow passes it positionally
            (upstream,) = args
        return upstream, ops.zeros_like(scale)

    return quantize(x, scale, E4M3), grad


@ops.custom_gradient
def quantize_gradient(y):
    """The identity forward; the backward quantizes the gradient to E5M2
    at its own (current) scale. Placed right after the matmul, so both
    gradient GEMMs read the quantized gradient."""

    def grad(*args, upstream=None):
        if upstream is None:
            (upstream,) = args
        scale = scale_for(amax(upstream), E5M2, upstream.dtype)
        return quantize(upstream, scale, E5M2)

    return y, grad


class _Float8:
    """Mixin for a Keras matmul layer with `kernel`: float8 operands."""

    default_amax_history_length = 16

    def __init__(self, *args, amax_history_length=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.amax_history_length = _history_length(amax_history_length)

    def build(self, input_shape):
        super().build(input_shape)
        self._float8_build()

    def _float8_build(self):
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
        return _quantize_forward(x, scale)

    def _float8_call(self, inputs, training, product):
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
        return self._float8_call(inputs, training, ops.matmul)


@keras.saving.register_keras_serializable(package="kmp")
class Float8EinsumDense(_Float8, keras.layers.EinsumDense):
    """`keras.layers.EinsumDense` whose einsum runs in float8, as
    `Float8Dense` does (the projections of attention layers).

    Args:
        amax_history_length: As for `Float8Dense`.
        **kwargs: As for `keras.layers.EinsumDense`.
    """

    def call(self, inputs, training=None):
        return self._float8_call(
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
        layer._float8_build()
    return layer


def _convert_projections(attention):
    for dense in projections(attention):
        if is_eligible_einsum(dense):
            convert(dense)


def projections(attention):
    """The four `EinsumDense` projections of a built attention layer."""
    return [
        getattr(attention, name)
        for name in (
            "_query_dense",
            "_key_dense",
            "_value_dense",
            "_output_dense",
        )
        if isinstance(getattr(attention, name, None), keras.layers.EinsumDense)
    ]


def matmul_sizes(layer):
    """`(contracting, output)` sizes of a built Dense or EinsumDense
    kernel: the product of the kernel dims it sums over, and of the rest."""
    shape = tuple(layer.kernel.shape)
    if isinstance(layer, keras.layers.EinsumDense):
        inputs, rest = layer.equation.split(",")
        kernel, output = rest.split("->")
        summed = [
            size
            for letter, size in zip(kernel, shape)
            if letter in inputs and letter not in output
        ]
    else:
        summed = shape[:1]
    contracting = 1
    for size in summed:
        contracting *= size
    total = 1
    for size in shape:
        total *= size
    return contracting, total // contracting


def is_eligible_einsum(layer):
    """Whether a built projection's sizes suit float8 tensor cores
    (multiples of 16)."""
    return all(size % 16 == 0 for size in matmul_sizes(layer))


FLOAT8_CLASSES = (Float8Dense, Float8EinsumDense, Float8MultiHeadAttention)


def _is_keras_float8(layer):
    return getattr(layer, "quantization_mode", None) == "float8" and hasattr(
        layer, "inputs_scale"
    )


def float8_matmuls(layers):
    """The float8 matmul layers among `layers`, Keras's and kmp's,
    attention projections included, each once."""
    found = []
    for layer in layers:
        if isinstance(layer, keras.layers.MultiHeadAttention):
            found += [
                dense
                for dense in projections(layer)
                if isinstance(dense, _Float8) or _is_keras_float8(dense)
            ]
        elif isinstance(layer, _Float8) or _is_keras_float8(layer):
            found.append(layer)
    # An attention's projections are also among `layers` when it is built.
    return list({id(layer): layer for layer in found}.values())


@contextlib.contextmanager
def observe_operands(layers, observer):
    """Calls `observer(layer, operand, x, limit)` each time one of
    `layers` (float8 matmul layers, Keras's or kmp's) quantizes an
    operand, inside the `with` block: `operand` is `"inputs"` or
    `"kernel"`, `x` the value about to be quantized, `limit` the |x| its
    delayed scale maps to the largest E4M3 value (a float), or `None`
    when the layer scales by `x` itself (a kmp layer with an empty
    history).

    For eager calls (the doctor measures each operand's headroom this
    way); a compiled step would call `observer` once, while tracing.
    """
    layers = list(layers)
    for layer in layers:
        if isinstance(layer, _Float8):
            layer._operand_observer = observer
        else:
            # Keras's layer: its `_float8_call` quantizes both operands.
            object.__setattr__(
                layer, "_float8_call", _observed(layer, observer)
            )
    try:
        yield
    finally:
        for layer in layers:
            if isinstance(layer, _Float8):
                layer._operand_observer = None
            else:
                del layer.__dict__["_float8_call"]


def _observed(layer, observer):
    """Keras's `layer._float8_call`, telling `observer` its operands first.
    Keras keeps `scale = amax / max(E4M3)` in `{operand}_scale`."""
    call = layer._float8_call

    def observed(inputs, training=None):
        for operand, x in (("inputs", inputs), ("kernel", layer._kernel)):
            scale = float(getattr(layer, f"{operand}_scale"))
            observer(layer, operand, x, scale * _MAX[E4M3])
        return call(inputs, training=training)

    return observed
