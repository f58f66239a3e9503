"""The doctor's instruments: taps on layers, and temporary policies.

`kmp.diagnose` must see every layer's outputs and differentiate by them,
for any model (Sequential, Functional, subclassed, nested), without
changing it. `Taps` wraps each layer's `call` (and `quantized_call`,
which a quantized layer runs instead) on the instance for the
duration of a `with` block: its floating outputs go through a tap
(`kmp.backend.taped_gradients`), the wrapper is removed on exit, also
after an exception. `dtype_policies` switches layers' dtype policies the
same way, which is how the doctor runs a model in float32 without cloning
it (a clone would need every layer's `get_config`).

What a tap cannot see: computations a subclassed model's `call` does
between its layers, and the layers inside an RNN or `TimeDistributed`,
which run in a loop (a tap there would see one step, or a tracer of the
loop). Those are observed as a whole.
"""

import contextlib

import keras
from keras import ops

from kmp.model_layers import all_layers

# Their inner layers run inside a loop (scan, while, vmap): not tapped.
LOOPING = (keras.layers.RNN, keras.layers.TimeDistributed)


def observed_layers(model, nested=True):
    """The layers whose outputs are tapped, in depth-first order; with
    `nested=False`, the model's own layers only."""
    inside_loops = set()
    for layer in all_layers(model):
        if isinstance(layer, LOOPING):
            inside_loops.update(id(inner) for inner in all_layers(layer)[1:])
    candidates = (
        all_layers(model)
        if nested
        else list(model._flatten_layers(include_self=False, recursive=False))
    )
    return [
        layer
        for layer in candidates
        if not isinstance(layer, (keras.layers.InputLayer, keras.Model))
        and id(layer) not in inside_loops
    ]


def is_random(layer):
    """Dropout, noise and augmentation layers: they draw from a seed."""
    return bool(getattr(layer, "_seed_generators", None))


class Taps:
    """Wraps each observed layer's `call` on the instance while active.

    Random layers are called with `training=False` (both passes must see
    the same values, and a dropout mask drawn in float16 differs from one
    drawn in float32); their outputs are not tapped.
    """

    def __init__(self, layers):
        self.layers = layers
        self.tap = None  # set by each pass, while it traces or runs
        self._tapped = set()

    def start(self, tap):
        """Routes outputs to `tap(index, x)` until `stop()`."""
        self.tap, self._tapped = tap, set()

    def stop(self):
        self.tap, self._tapped = None, set()

    def _tap_once(self, index, x):
        # A layer that returns a sublayer's output (MultiHeadAttention
        # returns its output projection's) would count it twice. The
        # tapped tensors live until the pass ends, so ids stay unique.
        if id(x) in self._tapped:
            return x
        tapped = self.tap(index, x)
        self._tapped.add(id(tapped))
        return tapped

    def _wrap(self, index, layer, call):
        random = is_random(layer)

        def tapped_call(*args, **kwargs):
            if random and "training" in kwargs:
                kwargs["training"] = False
            outputs = call(*args, **kwargs)
            if self.tap is None or random:
                return outputs
            return keras.tree.map_structure(
                lambda x: self._tap_once(index, x) if _is_float(x) else x,
                outputs,
            )

        return tapped_call

    def __enter__(self):
        self._saved = []
        try:
            for index, layer in enumerate(self.layers):
                # A quantized layer (Keras's float8, what kmp.float8 makes)
                # runs `quantized_call` in place of `call`.
                for method in ("call", "quantized_call"):
                    if not hasattr(layer, method):
                        continue
                    own = layer.__dict__.get(method)
                    self._saved.append((layer, method, own))
                    wrapped = self._wrap(index, layer, getattr(layer, method))
                    setattr(layer, method, wrapped)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc):
        for layer, method, own in reversed(self._saved):
            if own is None:
                delattr(layer, method)
            else:
                setattr(layer, method, own)
        self._saved = []


def _is_float(x):
    return (
        x is not None
        and ops.is_tensor(x)
        and keras.backend.is_float_dtype(x.dtype)
    )


@contextlib.contextmanager
def dtype_policies(layers, policy):
    """Gives `layers` the dtype policy `policy` inside the block."""
    # The private attribute, not the setter: the setter edits a
    # DTypePolicyMap in place, which would outlive the block.
    saved = [(layer, layer._dtype_policy) for layer in layers]
    try:
        for layer in layers:
            layer._dtype_policy = keras.DTypePolicy(policy)
        yield
    finally:
        for layer, previous in saved:
            layer._dtype_policy = previous
