"""A `call` set on one layer, which runs on the layer it is set on when
it runs (`layer_call`): kmp's wrappers of how a layer runs
(`kmp.islands`'s `return_float32`) are made by it.

Flax NNX's transforms (`nnx.jit`, `nnx.grad`; Keras's layers are NNX
modules under `KERAS_NNX_ENABLED=true`) run a copy of the model: they
split it into its variables and its structure and merge the two into new
objects, each layer's other attributes carried over as they are. A
function set as a layer's `call` that closes over the layer is such an
attribute: the copy's call would run the original layer, whose variables
the transform does not trace, and the gradients by the copy's would be
zero (keras-io's NNX guide's loop moved no weight in 200 steps). Under
NNX the call is therefore an `nnx.Object` holding the layer as an
attribute, which the copy points at the copy, as it does a layer's
sublayers; elsewhere it is a closure, as it always was.
"""

import functools
from typing import Callable

from kmp.backend._current import is_nnx


def layer_call(
    layer, function: Callable, *held, method: str = "call"
) -> Callable:
    """A call to set as `layer.call` (or as the layer's `method`) in
    place of the one it has now: `call(*args, **kwargs)` returns
    `function(layer, *held, *args, **kwargs)`, where `layer` (and any
    layer or `layer_call` among `held`: the instance's call it wraps, a
    layer the call uses) is the one the call runs on, a copy's under an
    NNX transform. It has the signature of the method it replaces
    (`functools.wraps`), and its marks (kmp's `_kmp_...` attributes);
    more can be set on it as on a function."""
    wrapped = getattr(layer, method)
    if not is_nnx():

        @functools.wraps(wrapped)
        def call(*args, **kwargs):
            return function(layer, *held, *args, **kwargs)

        return call
    call = _nnx_layer_call()(layer, function, held)
    # Not `wrapped`'s whole `__dict__`: another `LayerCall`'s holds its
    # layer, function and NNX's state.
    functools.update_wrapper(call, wrapped, updated=())
    for key, value in vars(wrapped).items():
        if key.startswith("_kmp_"):
            setattr(call, key, value)
    return call


@functools.cache
def _nnx_layer_call():
    from flax import nnx

    class LayerCall(nnx.Object):
        # An NNX graph node: NNX's split and merge copy `layer` and
        # `held` with the model; `function` is carried as it is.
        def __init__(self, layer, function, held):
            self.layer = layer
            self.function = function
            self.held = held

        def __call__(self, *args, **kwargs):
            return self.function(self.layer, *self.held, *args, **kwargs)

    return LayerCall
