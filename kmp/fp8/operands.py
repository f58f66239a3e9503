"""Reading any float8 matmul layer, Keras's (`model.quantize("float8")`,
`kmp.float8`) or kmp's own (`Float8Dense`, ...): which layers of a model
are float8, and the operands each quantizes (`observe_operands`, the
doctor's headroom).

Keras's layers quantize both operands inside their private method
`_float8_call`; `observe_operands` wraps that method on each instance
for the `with` block only (an instance attribute, removed on exit), as
the one place kmp reaches into a Keras layer's private code: Keras has no
hook there. kmp's layers call an observer of their own.
"""

import contextlib

import keras

from kmp.fp8.float8_layers import _Float8
from kmp.fp8.matmuls import projections
from kmp.fp8.quantization import E4M3
from kmp.fp8.quantization import FLOAT8_MAX


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
            observer(layer, operand, x, scale * FLOAT8_MAX[E4M3])
        return call(inputs, training=training)

    return observed
