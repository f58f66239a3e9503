"""Token ids declared as floats (`kmp.islands.token_ids`): keras-io's
"Text classification with Transformer" as written (`keras_io_models`)
feeds `layers.Input(shape=(maxlen,))`, float32, to its
`TokenAndPositionEmbedding`, which casts the ids to 16 bits under a mixed
policy; `kmp.pin_float32` keeps them exact."""

import keras
import keras_hub
import numpy as np
import pytest
from keras_io_models import TokenAndPositionEmbedding
from keras_io_models import jax_cpu
from keras_io_models import reviews
from keras_io_models import text_classifier

import kmp
from kmp import backend
from kmp.islands import float_ids

independent = pytest.mark.backend_independent


def _only(found):
    (ids,) = found
    return ids


@independent
def test_keras_io_s_ids_reach_its_embedding_through_a_16_bit_cast():
    kmp.enable("mixed_float16")
    model = text_classifier()
    ids = _only(float_ids(model))
    embedding = model.layers[1]
    assert isinstance(embedding, TokenAndPositionEmbedding)
    assert ids.input == model.layers[0].name
    assert ids.lookup is embedding and ids.casts == (embedding,)
    assert (ids.vocabulary, ids.dtype, ids.rounded) == (20000, "float16", True)
    # bfloat16 rounds them too; float32 does not; int32 ids are no floats.
    kmp.enable("mixed_bfloat16")
    assert _only(float_ids(text_classifier())).dtype == "bfloat16"
    kmp.disable()
    ids = _only(float_ids(text_classifier()))
    assert (ids.casts, ids.dtype, ids.rounded) == ((), None, False)
    kmp.enable("mixed_float16")
    inputs = keras.Input((16,), dtype="int32")
    outputs = TokenAndPositionEmbedding(16, 3000, 8)(inputs)
    assert float_ids(keras.Model(inputs, outputs)) == []


@independent
def test_ids_are_followed_through_layers_without_weights_and_models():
    kmp.enable("mixed_float16")
    inner = keras.Sequential(
        [
            keras.Input((16,)),
            keras.layers.Reshape((16,), name="reshape"),
            keras.layers.Embedding(3000, 8, name="table"),
        ]
    )
    ids = _only(float_ids(inner))
    assert ids.lookup.name == "table" and ids.casts[0].name == "reshape"
    outer_inputs = keras.Input((16,), name="ids")
    ids = _only(float_ids(keras.Model(outer_inputs, inner(outer_inputs))))
    assert (ids.input, ids.lookup.name) == ("ids", "table")
    # Each tensor is followed once: 12 adds of x to itself are 4096 paths.
    x = inputs = keras.Input((16,))
    for _ in range(12):
        x = keras.layers.Add()([x, x])
    model = keras.Model(inputs, keras.layers.Embedding(3000, 8)(x))
    assert _only(float_ids(model)).casts[0] is model.layers[1]
    # A table of 2048 rows or fewer holds its ids in float16.
    small = keras.Input((16,))
    hub = keras_hub.layers.TokenAndPositionEmbedding(2048, 16, 8)
    ids = _only(float_ids(keras.Model(small, hub(small))))
    assert ids.lookup is hub and not ids.rounded
    kmp.enable("mixed_bfloat16")  # ... but not in bfloat16 (256)
    small = keras.Input((16,))
    hub = keras_hub.layers.TokenAndPositionEmbedding(2048, 16, 8)
    assert _only(float_ids(keras.Model(small, hub(small)))).rounded


class PositionalEmbedding(keras.layers.Layer):
    """keras-io's video transformer's: a position table added to float
    features (its input is no ids)."""

    def __init__(self, sequence_length, output_dim, **kwargs):
        super().__init__(**kwargs)
        self.position_embeddings = keras.layers.Embedding(
            input_dim=sequence_length, output_dim=output_dim
        )
        self.sequence_length = sequence_length

    def call(self, inputs):
        length = keras.ops.shape(inputs)[1]
        positions = keras.ops.arange(start=0, stop=length, step=1)
        embedded_positions = self.position_embeddings(positions)
        return inputs + embedded_positions


@independent
def test_float_features_are_not_ids():
    kmp.enable("mixed_float16")
    frames = keras.Input((20, 8))
    features = PositionalEmbedding(20000, 8)(frames)
    assert float_ids(keras.Model(frames, features)) == []
    # A layer with weights between the input and a table: no ids after.
    inputs = keras.Input((16,))
    hidden = keras.layers.Dense(16)(inputs)
    outputs = keras.layers.Embedding(3000, 8)(hidden)
    assert float_ids(keras.Model(inputs, outputs)) == []


def _lookups(model, x):
    """The keras-io embedding's output for `x` through the model's float
    input, and the same from its tables read at the true ids."""
    embedding = model.layers[1]
    through = keras.Model(model.inputs[0], embedding.output)
    expected = embedding.token_emb(x) + embedding.pos_emb(np.arange(x.shape[1]))
    return through, keras.ops.convert_to_numpy(expected)


def test_pin_float32_keeps_keras_io_s_ids_exact():
    # Issue 39: under kmp.enable alone the ids reach the lookup as
    # float16: 2049 -> 2048, and 19999 -> 20000, out of the table (torch:
    # IndexError; TensorFlow on a CPU: InvalidArgumentError; JAX: NaN).
    kmp.enable("mixed_float16")
    model = text_classifier()
    x, _ = reviews(n=2)
    x[:, 1] = 2049
    through, expected = _lookups(model, x)
    try:
        before = keras.ops.convert_to_numpy(through(x))
    except Exception as error:  # torch, TensorFlow
        assert "20000" in str(error) or "out of range" in str(error)
    else:  # JAX: the row of 19999 is NaN, 2049's is 2048's
        assert np.isnan(before[:, 0]).all()
        assert not np.array_equal(before[:, 1], expected[:, 1])
    kmp.pin_float32(model)
    assert model.layers[1].compute_dtype == "float32"
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(through(x)), expected
    )


def test_keras_io_s_classifier_trains_under_enable_and_pin():
    # JAX's CPU has no float16 x float16 -> float32 dot, which Keras's
    # fused float16 attention asks for: bfloat16 there.
    policy = "mixed_bfloat16" if jax_cpu() else "mixed_float16"
    kmp.enable(policy)
    x, y = reviews()

    def compiled(model):
        model.compile(
            optimizer=kmp.wrap("adam"),
            loss="sparse_categorical_crossentropy",
            metrics=["accuracy"],
        )
        return model

    model = compiled(kmp.pin_float32(text_classifier()))
    assert model.layers[1].compute_dtype == "float32"  # ids kept exact
    history = model.fit(x, y, batch_size=4, epochs=1, verbose=0).history
    assert np.isfinite(history["loss"][-1])
    if backend.name() == "torch":
        # The torch run of issue 39, unpinned: 19999 became 20000.
        with pytest.raises(IndexError, match="index out of range"):
            compiled(text_classifier()).fit(x, y, batch_size=4, verbose=0)
