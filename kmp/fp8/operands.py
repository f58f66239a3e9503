"""Reading any float8 matmul layer, Keras's (`model.quantize("float8")`,
`kmp.float8`) or kmp's own (`Float8Dense`, ...): which layers of a model
are float8, and the operands each quantizes (`observe_operands`, the
doctor's headroom).

Keras's layers quantize both operands inside the forward pass their
`quantized_call` runs (Keras 3.15's private `_float8_call`, 3.16's
float8 strategy: the same call, reached through `quantized_call` in
both); `observe_operands` wraps `quantized_call` on each instance for the
`with` block only (an instance attribute, removed on exit): Keras has no
hook for the operands. kmp's layers call an observer of their own.
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
    saved = []  # Keras's layers, each with its own `quantized_call`, if any
    try:
        for layer in layers:
            if isinstance(layer, _Float8):
                layer._operand_observer = observer
            else:
                own = vars(layer).get("quantized_call")
                saved.append((layer, own))
                object.__setattr__(
                    layer, "quantized_call", _observed(layer, observer)
                )
        yield
    finally:
        for layer in layers:
            if isinstance(layer, _Float8):
                layer._operand_observer = None
        for layer, own in reversed(saved):
            if own is None:
                del vars(layer)["quantized_call"]
            else:
                object.__setattr__(layer, "quantized_call", own)


def _observed(layer, observer):
    """Keras's `layer.quantized_call`, telling `observer` its operands
    first. Keras keeps `scale = amax / max(E4M3)` in `{operand}_scale`
    and quantizes the float `kernel` (float8 takes no LoRA)."""
    call = layer.quantized_call

    def observed(inputs, *args, **kwargs):
        for operand, x in (("inputs", inputs), ("kernel", layer.kernel)):
            scale = float(getattr(layer, f"{operand}_scale"))
            observer(layer, operand, x, scale * FLOAT8_MAX[E4M3])
        return call(inputs, *args, **kwargs)

    return observed
