"""Rematerialization under the dtype policy: `kmp.rematerialize`.

Keras recomputes a layer in the backward pass instead of keeping its
activations when the layer was made under `keras.RematScope`. Under a
mixed policy its recomputation runs outside the autocast scope the
layer's `__call__` opened (keras-team/keras#21448, BUILD_NOTES defect
29): the recomputed call reads its float32 variables, and TensorFlow
(`ReluGrad` of float32 and float16) and torch (`torch.utils.checkpoint`
refusing a recomputed value of another dtype) fail the step. JAX traces
the recomputation inside the call and is unaffected.

`rematerialize(model, layers)` composes with Keras's: it gives the chosen
layers of a built model Keras's "full" mode (as if made under
`keras.RematScope(mode="full")`: no rebuild, so KerasHub's and
`keras.applications` models qualify), and makes every rematerialized
layer of the model recompute under the autocast scope of its call.
Rematerialization is how a model trains, not what it is: a `.keras` file
does not keep it (nor does Keras's), so call it again after loading.
"""

import functools

import keras

from kmp import backend
from kmp.errors import InputTypeError


def _is_static(value):
    """Whether a call argument holds no tensor (a flag such as
    `training`, None, a string)."""
    return not any(keras.ops.is_tensor(v) for v in keras.tree.flatten(value))


def _recomputes_in_policy(layer):
    """Wraps the function Keras rematerializes in the scope in force when
    the layer was called (its own autocast dtype), with the call's
    keyword arguments that hold no tensor bound: JAX's `checkpoint` would
    trace them, and a layer's `if training:` fails on a traced bool
    (KerasHub's attention does; Keras's own `RematScope` fails it on
    JAX)."""
    if getattr(layer, "_kmp_remat_in_policy", False):
        return
    stock = layer.rematerialized_call

    @functools.wraps(stock)
    def rematerialized_call(layer_call, *args, **kwargs):
        reads = backend.reads_in_force()
        state = backend.RecomputedState(layer)
        static = {k: v for k, v in kwargs.items() if _is_static(v)}
        # Tensors go in by position: TensorFlow's `recompute_grad` takes
        # no keyword tensors in a graph.
        names = [k for k in kwargs if k not in static]
        count = len(args)

        @functools.wraps(layer_call)
        def in_policy(*tensors, **bound):
            # `bound`: what Keras's own wrapper passes by keyword (from
            # Keras 3.16, a bool `training`, kept out of the trace too).
            call_kwargs = dict(zip(names, tensors[count:]), **static)
            call_kwargs.update(bound)
            with reads, state.run():
                outputs = layer_call(*tensors[:count], **call_kwargs)
            return state.pack(outputs)

        rematerialized = stock(in_policy, *args, **kwargs)

        def call(*call_args, **call_kwargs):
            return state.unpack(
                rematerialized(*call_args, *(call_kwargs[k] for k in names))
            )

        return call

    # An attribute of this layer, not of its class: the class, its config
    # and its file are Keras's own.
    layer.rematerialized_call = rematerialized_call
    layer._kmp_remat_in_policy = True


def _chooser(layers):
    if layers is None:
        return lambda layer: False
    if isinstance(layers, type) or (
        isinstance(layers, tuple) and all(isinstance(t, type) for t in layers)
    ):
        return lambda layer: isinstance(layer, layers)
    if callable(layers):
        return layers
    raise InputTypeError(
        "layers must be a layer class, a tuple of them, a function of a "
        f"layer that returns True for the ones to recompute, or None; got "
        f"{layers!r}."
    )


def rematerialized_layers(model) -> list:
    """The layers of `model` (itself included) Keras rematerializes
    (their own `RematScope` mode, or `kmp.rematerialize`'s)."""
    return [
        layer
        for layer in model._flatten_layers()
        if getattr(layer, "_remat_mode", None) is not None
    ]


def rematerialize(model, layers=None):
    """Recomputes layers of `model` in the backward pass, under the policy.

    Their activations are not kept between the forward and the backward
    pass: each is recomputed from the layer's inputs (Keras's
    rematerialization), so a step needs less memory and more compute.
    The recomputation reads the variables in the layer's compute dtype,
    as the forward pass did (which Keras's own `RematScope` does not do
    on TensorFlow and torch under a mixed policy).

    Choose whole blocks (a transformer block, a residual block layer):
    recomputing a block keeps only its input. A layer that updates state
    in its call (BatchNormalization's moving statistics) would update it
    again when recomputed on TensorFlow and torch; leave those out.

    Args:
        model: A built Keras model.
        layers: Which of its layers to recompute: a layer class or a
            tuple of classes, or a function of a layer that returns
            True for those to recompute. None: only the layers already
            made under a `keras.RematScope` (to make them recompute
            under the policy).

    Returns:
        The model, changed in place.

    Example:

    ```python
    model = keras_hub.models.GPT2CausalLM(backbone, preprocessor=None)
    kmp.rematerialize(model, keras_hub.layers.TransformerDecoder)
    ```
    """
    if not isinstance(model, keras.layers.Layer):
        raise InputTypeError(
            f"rematerialize takes a Keras model, got {type(model).__name__}."
        )
    chosen = _chooser(layers)
    # Keras's private hooks (`Operation._remat_mode`, which Keras reads at
    # each call, and `rematerialized_call`): without them a layer given
    # `_remat_mode` would silently keep its activations.
    for hook in ("_remat_mode", "rematerialized_call", "_flatten_layers"):
        backend.private_attribute(model, hook, "kmp.rematerialize")
    for layer in model._flatten_layers(include_self=False):
        if chosen(layer) and getattr(layer, "_remat_mode", None) is None:
            layer._remat_mode = keras.RematScope(mode="full")
    for layer in rematerialized_layers(model):
        _recomputes_in_policy(layer)
    return model


def recomputes_in_policy(layer) -> bool:
    """Whether `rematerialize` made `layer` recompute under its policy."""
    return getattr(layer, "_kmp_remat_in_policy", False)
