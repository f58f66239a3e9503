"""GELU recomputed in the backward pass: a Transformer's feed-forward
matmul takes its bias and GELU into one kernel on a GPU (JAX).

Differentiated as Keras writes it, a `Dense(..., activation="gelu")`
keeps the GELU's inner `tanh` (or `erf` term) for its backward pass: its
forward kernel writes one more tensor of the layer's output size, and
XLA does not fuse the approximate GELU into cuBLASLt's epilogue
(`kmp.backend.recompute_in_backward` says why). `recompute_gelu(layer)`
gives the layer the same GELU, recomputed from its input in the
backward pass. Compiled for an H200 (`benchmarks/gpu_compile.py`),
KerasHub's GPT-2 at width 1024, batch 32 then moves 0.40 GB less a
decoder block, its GEMMs' bytes counted: the feed-forward GEMM writes
the GELU in a `BIAS_GELU_AUX` epilogue and the GELU's own forward
kernel is gone. The values are the same (the backend module says to
what rounding).

A quantized layer (float8, int8) keeps its GELU as written: its matmul
is no 16-bit GEMM with an epilogue (the wrapper reads the layer's
`quantization_mode` when the call is traced).

It applies to the layers that end their call with their `activation`
and whose matmul XLA can fuse it into (`Dense`, `EinsumDense`) and to
`Activation` layers, when that activation is Keras's `gelu` (the exact
or, with `approximate=True` where a layer passes it, the approximate
form) or KerasHub's `gelu_approximate` (GPT-2's, registered as
`keras_hub>gelu_approximate`). A GELU that a layer's own code calls
(KerasHub's Gemma MLP, a lambda) is left as it is.

`kmp.pin_float32` applies it on JAX. Like
`kmp.islands.broadcast_once`, this is how the layer runs, not what it
is: the layer's config names the same activation, a `.keras` file does
not keep the recomputation, and `kmp.load_model` applies it again when
it pins the loaded model.
"""

import functools

import keras

from kmp import backend

# The layers whose call ends in `self.activation(x)` after a matmul, and
# Keras's activation layer.
_LAYERS = (
    keras.layers.Dense,
    keras.layers.EinsumDense,
    keras.layers.Activation,
)


def is_gelu(activation):
    """Whether `activation` is Keras's `gelu` or KerasHub's
    `gelu_approximate` (itself, not a function that calls it)."""
    activation = getattr(activation, "__wrapped__", activation)
    if activation is keras.activations.gelu:
        return True
    # Registered when KerasHub is imported, which a model holding it has
    # done; None otherwise.
    hub = keras.saving.get_registered_object("keras_hub>gelu_approximate")
    return hub is not None and activation is hub


def recomputes_gelu(layer):
    """Whether `recompute_gelu` has been applied to `layer`: its
    activation is kmp's wrapper (`layer.activation.__wrapped__` is the
    GELU it wraps)."""
    return getattr(getattr(layer, "activation", None), "_kmp_recomputed", False)


def recompute_gelu(layer):
    """Makes `layer`'s GELU recompute itself in the backward pass (module
    docstring). Other layers and other activations are left as they are;
    applying it twice changes nothing.

    Args:
        layer: A Keras layer; it changes a `Dense`, `EinsumDense` or
            `Activation` whose activation is a GELU.

    Returns:
        Whether `layer` now recomputes its GELU.
    """
    if not isinstance(layer, _LAYERS) or not is_gelu(
        getattr(layer, "activation", None)
    ):
        return False
    if recomputes_gelu(layer):
        return True
    activation = layer.activation
    recomputed = backend.recompute_in_backward(activation)
    if recomputed is activation:  # not JAX: nothing to recompute
        return False

    def call(x, *args, **kwargs):
        # A quantized layer's matmul (float8, int8) is no 16-bit GEMM
        # with an epilogue: recomputed after kmp's float8 GEMM the GELU
        # makes the step write its input for the backward pass (compiled
        # for an H200, GPT-2 at width 1024: 0.13 GB more a decoder
        # block), and after Keras's float8 pattern XLA fuses it into an
        # FP8 GEMM whose epilogue it then cannot emit (a RET_CHECK,
        # `!has_aux_output`, jaxlib 0.10.2). Read when the call is
        # traced, so a layer quantized later is covered too.
        if getattr(layer, "quantization_mode", None) is not None:
            return activation(x, *args, **kwargs)
        return recomputed(x, *args, **kwargs)

    # The recomputed function's name (the one Keras registered the GELU
    # under), module and docstring; `__wrapped__`: the GELU itself.
    functools.update_wrapper(call, recomputed)
    call.__wrapped__ = activation
    call._kmp_recomputed = True
    layer.activation = call
    return True
