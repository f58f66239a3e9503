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

How: an instance-level `call` (as `broadcast_once` wraps KerasHub's
position embedding) that runs the class's call with the recomputed
GELU in `layer.activation` and puts the GELU back after it. Outside
the call the attribute is the GELU itself, so `get_config` and a
`.keras` file say what they said (Keras 3.16 serializes a built-in
activation by identity: a wrapper left in the attribute would be saved
as a function safe mode will not load). On JAX a call runs when the
step is traced, so the swap costs nothing per step.

A quantized layer (float8, int8) keeps its GELU as written: its matmul
is no 16-bit GEMM with an epilogue (Keras sends a quantized layer to
its `quantized_call`, which the wrapper leaves alone, and the wrapper
reads `quantization_mode` too); so does a layer whose `activation` has
been changed since.

It applies to the layers that end their call with their `activation`
and whose matmul XLA can fuse it into (`Dense`, `EinsumDense`) and to
`Activation` layers, when that activation is Keras's `gelu` (its exact
form: these layers call it with its defaults) or KerasHub's
`gelu_approximate` (GPT-2's, registered as
`keras_hub>gelu_approximate`), and only while the layer runs the
class's own `call` (Keras's `Dense.call`, ...): a subclass with a call
of its own (kmp 0.1's `Float8Dense`, whose float8 pattern is not a
16-bit GEMM either) keeps its GELU as written. A GELU that a layer's
own code calls (KerasHub's Gemma MLP, a lambda) is left as it is.

`kmp.pin_float32` applies it on JAX. Like
`kmp.islands.broadcast_once`, this is how the layer runs, not what it
is: a `.keras` file does not keep it, and `kmp.load_model` applies it
again when it pins the loaded model. Deleting the instance's `call`
(`del layer.call`) undoes it.
"""

import keras

from kmp import backend

# The layers whose call ends in `self.activation(x)` after a matmul, and
# Keras's activation layer.
_LAYERS = (
    keras.layers.Dense,
    keras.layers.EinsumDense,
    keras.layers.Activation,
)
# Their own calls: a subclass's call may not end in the activation, or
# not after a 16-bit matmul (kmp 0.1's Float8Dense).
_STOCK_CALLS = tuple(cls.call for cls in _LAYERS)


def is_gelu(activation):
    """Whether `activation` is Keras's `gelu` or KerasHub's
    `gelu_approximate` (itself, not a function that calls it)."""
    if activation is keras.activations.gelu:
        return True
    # Registered when KerasHub is imported, which a model holding it has
    # done; None otherwise.
    hub = keras.saving.get_registered_object("keras_hub>gelu_approximate")
    return hub is not None and activation is hub


def recomputes_gelu(layer):
    """Whether `recompute_gelu` has been applied to `layer`: its `call` is
    the instance's own, kmp's wrapper (deleting it undoes it). A wrapper
    set over kmp's later hides it: then this says False, and `del
    layer.call` removes both."""
    own = vars(layer).get("call")
    return getattr(own, "_kmp_recomputes_gelu", False)


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
    if recomputes_gelu(layer):
        return True
    if type(layer).call not in _STOCK_CALLS or not is_gelu(
        getattr(layer, "activation", None)
    ):
        return False
    activation = layer.activation
    recomputed = backend.recompute_in_backward(activation)
    if recomputed is activation:  # not JAX: nothing to recompute
        return False
    # The class's call, whatever the class is when the layer runs
    # (kmp.float8 swaps it), unless the instance already had its own;
    # on the layer running it, an NNX transform's copy too
    # (`kmp.backend.layer_call`).
    own = vars(layer).get("call")
    call = backend.layer_call(
        layer, _call_recomputing_gelu, own, activation, recomputed
    )
    call._kmp_recomputes_gelu = True
    layer.call = call
    return True


def _call_recomputing_gelu(layer, own, activation, recomputed, *args, **kw):
    def stock():
        if own is not None:
            return own(*args, **kw)
        return type(layer).call(layer, *args, **kw)

    if (
        type(layer).call not in _STOCK_CALLS  # a class swapped in
        or getattr(layer, "quantization_mode", None) is not None
        or layer.activation is not activation
    ):
        # A quantized layer's matmul (float8, int8) is no 16-bit
        # GEMM with an epilogue: recomputed after kmp's float8 GEMM
        # the GELU makes the step write its input for the backward
        # pass (a scratch compile for an H200, GPT-2 at width 1024,
        # not kept: 0.13 GB more a decoder block), and after Keras's
        # float8 pattern XLA fuses it into an FP8 GEMM whose
        # epilogue it then cannot emit (a RET_CHECK,
        # `!has_aux_output`, jaxlib 0.10.2). Keras sends a quantized
        # layer to `quantized_call`, which this wrapper is not;
        # `call` itself, called directly, gets here.
        return stock()
    layer.activation = recomputed
    try:
        return stock()
    finally:
        layer.activation = activation
