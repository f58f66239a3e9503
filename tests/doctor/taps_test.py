"""Taps wrap layer calls and dtype policies only inside their block."""

import keras
import numpy as np
import pytest

from kmp.doctor._taps import Taps
from kmp.doctor._taps import dtype_policies
from kmp.doctor._taps import is_random
from kmp.doctor._taps import observed_layers


def _model():
    inputs = keras.Input((6, 4))
    x = keras.layers.Dense(4, name="dense")(inputs)
    x = keras.layers.Dropout(0.5, name="drop")(x)
    x = keras.layers.LSTM(3, name="lstm")(x)
    inner = keras.Sequential([keras.layers.Dense(2, name="inner")], name="seq")
    return keras.Model(inputs, inner(x), name="outer")


def test_observed_layers_skip_inputs_models_and_loop_cells():
    model = _model()
    names = [layer.name for layer in observed_layers(model)]
    assert names == ["dense", "drop", "lstm", "inner"]
    assert is_random(model.get_layer("drop"))
    assert not is_random(model.get_layer("dense"))


def test_taps_see_outputs_in_call_order_and_restore_calls():
    model = _model()
    layers = observed_layers(model)
    seen = []
    taps = Taps(layers)
    x = np.ones((2, 6, 4), "float32")
    with taps:
        taps.start(lambda key, value: seen.append(key) or value)
        tapped = model(x, training=True)
        taps.stop()
    # Dropout ran with training=False (untapped); the LSTM's cell inside
    # its loop is not tapped, the LSTM is.
    assert seen == [0, 2, 3]
    assert all("call" not in layer.__dict__ for layer in layers)
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(tapped),
        keras.ops.convert_to_numpy(model(x, training=False)),
        rtol=1e-6,
    )


def test_taps_restore_after_an_exception_and_keep_user_patches():
    model = _model()
    dense = model.get_layer("dense")
    patched = dense.call
    dense.call = patched  # a user's own instance-level call
    layers = observed_layers(model)
    with pytest.raises(RuntimeError):
        with Taps(layers):
            assert dense.call is not patched
            raise RuntimeError("inside")
    assert dense.__dict__["call"] is patched
    assert all(
        "call" not in layer.__dict__ for layer in layers if layer is not dense
    )


def test_dtype_policies_restore_the_same_objects():
    model = _model()
    layers = model._flatten_layers(include_self=True)
    layers = list(layers)
    before = [layer._dtype_policy for layer in layers]
    with pytest.raises(KeyError):
        with dtype_policies(layers, "mixed_bfloat16"):
            assert {layer.compute_dtype for layer in layers} == {"bfloat16"}
            raise KeyError("inside")
    assert [layer._dtype_policy for layer in layers] == before
    assert all(
        a is b for a, b in zip(before, [la._dtype_policy for la in layers])
    )


def test_a_sublayer_output_returned_by_its_parent_is_tapped_once():
    class Wrapper(keras.layers.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.inner = keras.layers.Dense(3, name="inner")

        def call(self, x):
            return self.inner(x)

    wrapper = Wrapper(name="wrapper")
    model = keras.Sequential([keras.Input((2,)), wrapper])
    layers = observed_layers(model)
    assert [layer.name for layer in layers] == ["wrapper", "inner"]
    seen = []
    with Taps(layers) as taps:
        taps.start(lambda key, value: seen.append(key) or value)
        model(np.ones((1, 2), "float32"))
        taps.stop()
    assert seen == [1]  # inner's output; the wrapper returns the same tensor
