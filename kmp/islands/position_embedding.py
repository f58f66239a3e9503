"""KerasHub's `PositionEmbedding`, broadcast over the batch so that XLA
keeps the activations' layout on a GPU.

KerasHub's layer returns its table broadcast to the input's shape, and
the table's gradient is then a sum over the batch: at a batch of 32 or
more, XLA's GPU layout assignment lays the whole residual stream out
batch-innermost for that sum, and every matmul and LayerNorm pays for
transposes (`kmp.backend.broadcast_over_batch` says how; compiled for
an H200, KerasHub's GPT-2 at width 1024, batch 32 moves a third less
outside its matmuls without it). `broadcast_once(layer)` makes the
layer compute one example's embedding with KerasHub's own call and
repeat it over the batch as kmp's backend writes it: the same values.

What it does not touch: explicit `positions` and KerasHub's serving
path (vLLM's per-token positions), which differ between examples, and
an unbatched or empty input take KerasHub's call as it is.
`kmp.pin_float32` applies it on JAX only: elsewhere the repeat is
KerasHub's broadcast anyway. Like `kmp.rematerialize`, this is how the
layer runs, not what it is: a `.keras` file does not keep it, and
`kmp.load_model` applies it again when it pins the loaded model.
"""

import inspect
import sys

from keras import ops

from kmp import backend


def is_keras_hub_position_embedding(layer):
    """Whether `layer` is exactly KerasHub's `PositionEmbedding` (a
    subclass keeps its own call). KerasHub is not imported here: a
    model that has the layer has imported it."""
    keras_hub = sys.modules.get("keras_hub")
    layers = getattr(keras_hub, "layers", None)
    cls = getattr(layers, "PositionEmbedding", None)
    return cls is not None and type(layer) is cls


def broadcasts_once(layer):
    """Whether `broadcast_once` has been applied to `layer`: its `call` is
    the instance's own, kmp's wrapper (deleting it gives KerasHub's
    back)."""
    own = vars(layer).get("call")
    return getattr(own, "_kmp_broadcast_once", False)


def broadcast_once(layer):
    """Makes KerasHub's `PositionEmbedding` embed one example's positions
    and repeat them over the batch (module docstring).

    Applies to batched input (rank 3 or more, a batch of at least one
    whose size is known when the call is traced, as on JAX); anything
    else takes KerasHub's call. Applying it twice changes nothing.

    Args:
        layer: A KerasHub `PositionEmbedding` (see
            `is_keras_hub_position_embedding`).
    """
    if broadcasts_once(layer):
        return
    # KerasHub's call (the instance's own, if it had one) on the layer
    # running, an NNX transform's copy too (`kmp.backend.layer_call`).
    own = vars(layer).get("call")
    signature = inspect.signature(layer.call)
    call = backend.layer_call(layer, _call_broadcasting_once, own, signature)
    call._kmp_broadcast_once = True
    layer.call = call


def _call_broadcasting_once(layer, own, signature, inputs, *args, **kwargs):
    def stock(inputs):
        if own is not None:
            return own(inputs, *args, **kwargs)
        return type(layer).call(layer, inputs, *args, **kwargs)

    shape = ops.shape(inputs)
    positions = signature.bind(inputs, *args, **kwargs).arguments.get(
        "positions"
    )
    if (
        len(shape) < 3  # one unbatched sequence
        or not isinstance(shape[0], int)  # unknown until run
        or shape[0] == 0
        or positions is not None
        or _serving(layer)
    ):
        return stock(inputs)
    # KerasHub's call broadcasts to its input's shape: given one example,
    # it returns that example's (1, length, features).
    one = stock(inputs[:1])
    return backend.broadcast_over_batch(one[0], shape[0])


def _serving(layer):
    """Whether KerasHub serves the layer through vLLM, whose positions
    differ from token to token (KerasHub 0.32's module function; an
    older KerasHub has no serving path)."""
    module = sys.modules.get(type(layer).__module__)
    positions = getattr(module, "_vllm_serving_positions", None)
    return positions is not None and positions() is not None
