"""Counting the passes (`kmp.doctor._counts`), on hand-made pass results:
each tensor goes to its layer's counter, weights to their innermost
observed owner, call order is kept."""

import types

import keras
import numpy as np
import pytest

from kmp.doctor._counts import LayerCounts
from kmp.doctor._counts import weight_owners
from kmp.doctor._passes import PassResult
from kmp.doctor.numerics import FORMATS


class _Block(keras.layers.Layer):
    """A layer owning a Dense: its weights belong to the Dense."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.inner = keras.layers.Dense(2, name="inner")

    def call(self, x):
        return self.inner(x)


def _model():
    inputs = keras.Input((2,))
    x = _Block(name="block")(inputs)
    outputs = keras.layers.Dense(1, name="head")(x)
    return keras.Model(inputs, outputs)


def _observed(model):
    block = model.get_layer("block")
    return [block, block.inner, model.get_layer("head")]


def test_weights_belong_to_the_innermost_observed_layer():
    model = _model()
    layers = _observed(model)
    # inner's kernel and bias -> 1, head's -> 2; without `inner` observed,
    # the block owns them; unobserved weights go past the end.
    assert weight_owners(layers, model) == [1, 1, 2, 2]
    assert weight_owners(layers[::2], model) == [0, 0, 1, 1]
    assert weight_owners(layers[:1], model) == [0, 0, 1, 1]


def test_each_tensor_is_counted_for_its_layer_in_call_order():
    model = _model()
    layers = _observed(model)
    inputs = types.SimpleNamespace(
        fmt=FORMATS["float16"], scale=4.0, model=model
    )
    counts = LayerCounts(inputs, layers)

    def result(half, scale):
        dtype = "float16" if half else "float32"
        out = [np.full((2, 2), 2.0, dtype), np.full((2, 1), 3.0, dtype)]
        grads = [np.full((2, 2), 0.5 * scale, dtype), None]
        weights = [np.full(s, 1.0 * scale, dtype) for s in (4, 2, 2, 1)]
        # The head ran first, then inner (keys: observed-layer indices).
        return PassResult([2, 1], out[::-1], weights, [None, grads[0]])

    counts.add(result(False, 1.0), result(True, 4.0))
    assert list(counts.dtypes) == [2, 1]
    assert counts.dtypes == {2: "float16", 1: "float16"}
    assert counts.reference_dtypes == {2: "float32", 1: "float32"}
    activations = counts.counters["activations"]
    assert [c.values for c in activations] == [0, 4, 2, 0]
    assert activations[2].max_abs == 3.0
    gradients = counts.counters["activation_gradients"]
    assert [c.values for c in gradients] == [0, 4, 0, 0]
    assert gradients[1].relative_error() == 0.0  # 4 * 0.5 / 4 == 0.5
    weights = counts.counters["weight_gradients"]
    assert [c.values for c in weights] == [0, 6, 3, 0]
    assert weights[1].scale == 4.0 and activations[1].scale == 1.0


def test_passes_that_ran_layers_in_another_order_are_refused():
    model = _model()
    inputs = types.SimpleNamespace(
        fmt=FORMATS["float16"], scale=1.0, model=model
    )
    counts = LayerCounts(inputs, _observed(model))
    one = PassResult([0], [np.ones(2)], [None] * 4, [None])
    other = PassResult([1], [np.ones(2)], [None] * 4, [None])
    with pytest.raises(RuntimeError, match="different order"):
        counts.add(one, other)
