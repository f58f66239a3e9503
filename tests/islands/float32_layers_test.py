from unittest import mock

import keras
import numpy as np
import pytest
from keras import ops

import kmp
from kmp.model_layers import swap_class


def _spy_softmax_inputs():
    """Patches keras.layers.Softmax.call to record its inputs' dtypes."""
    seen = []
    original = keras.layers.Softmax.call

    def call(self, inputs, *args, **kwargs):
        seen.append(keras.backend.standardize_dtype(inputs.dtype))
        return original(self, inputs, *args, **kwargs)

    return seen, mock.patch.object(keras.layers.Softmax, "call", call)


@pytest.mark.parametrize(
    "make",
    [
        lambda: kmp.layers.Float32Softmax(),
        lambda: kmp.layers.Float32Activation("softmax"),
        lambda: kmp.layers.Float32Activation("sigmoid"),
        lambda: kmp.layers.Float32Activation("log_softmax"),
    ],
)
@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_float32_layers_compute_in_float32_and_return_compute_dtype(
    make, policy
):
    kmp.enable(policy)
    layer = make()
    x = np.random.default_rng(0).normal(size=(3, 7)).astype("float32") * 4
    y = layer(x)
    half = policy.replace("mixed_", "")
    assert keras.backend.standardize_dtype(y.dtype) == half
    # Computed in float32, rounded once at the end.
    if isinstance(layer, keras.layers.Activation):
        reference = keras.layers.Activation(layer.activation, dtype="float32")
    else:
        reference = keras.layers.Softmax(dtype="float32")
    expected = ops.cast(reference(ops.cast(ops.cast(x, half), "float32")), half)
    np.testing.assert_array_equal(
        ops.convert_to_numpy(ops.cast(y, "float32")),
        ops.convert_to_numpy(ops.cast(expected, "float32")),
    )


def test_float32_softmax_runs_the_keras_softmax_on_float32_inputs():
    kmp.enable("mixed_float16")
    seen, patch = _spy_softmax_inputs()
    with patch:
        kmp.layers.Float32Softmax()(np.ones((2, 4), "float32"))
    assert seen == ["float32"]


def test_float32_softmax_keeps_mask_semantics():
    kmp.enable("mixed_float16")
    x = np.array([[1.0, 2.0, 3.0]], "float32")
    mask = np.array([[True, True, False]])
    y = ops.convert_to_numpy(kmp.layers.Float32Softmax()(x, mask=mask))
    e = np.exp([1.0, 2.0])
    np.testing.assert_allclose(y[0], [*(e / e.sum()), 0.0], atol=1e-3)


@pytest.mark.parametrize("built", [True, False])
def test_multi_head_attention_softmax_is_float32_matmuls_stay_float16(built):
    kmp.enable("mixed_float16")
    mha = keras.layers.MultiHeadAttention(num_heads=2, key_dim=8)
    q = np.random.default_rng(0).normal(size=(2, 5, 16)).astype("float32")
    if built:
        mha(q, q)
    swap_class(mha, kmp.layers.MultiHeadAttention)
    seen, patch = _spy_softmax_inputs()
    with patch:
        # Returning the scores takes Keras's unfused path, whose softmax
        # was float16 before the swap.
        out, scores = mha(q, q, return_attention_scores=True)
    assert seen == ["float32"]
    assert type(mha._softmax) is kmp.layers.Float32Softmax
    assert keras.backend.standardize_dtype(scores.dtype) == "float16"
    assert keras.backend.standardize_dtype(out.dtype) == "float16"
    for dense in (mha._query_dense, mha._key_dense, mha._value_dense):
        assert dense.compute_dtype == "float16"
    assert all(w.dtype == "float32" for w in mha.weights)


@pytest.mark.parametrize(
    "layer",
    [
        kmp.layers.Float32Softmax(axis=-2, name="s"),
        kmp.layers.Float32Activation("sigmoid", name="a"),
        kmp.layers.MultiHeadAttention(num_heads=3, key_dim=4, name="m"),
    ],
)
def test_config_round_trip(layer):
    restored = keras.saving.deserialize_keras_object(
        keras.saving.serialize_keras_object(layer)
    )
    assert type(restored) is type(layer)
    assert restored.get_config() == layer.get_config()
