"""`kmp.layers.TokenAndPositionEmbedding` (`kmp.embedding`): the IMDB
example's embedding, which loads wherever kmp is imported."""

import os
import subprocess
import sys
import textwrap

import keras
import numpy as np

import kmp
from kmp import backend
from kmp import embedding


def test_it_sums_token_and_position_embeddings():
    layer = kmp.layers.TokenAndPositionEmbedding(4, 10, 3)
    ids = np.array([[1, 2, 2, 0]])
    out = keras.ops.convert_to_numpy(layer(ids))
    assert out.shape == (1, 4, 3)
    tokens, positions = (
        keras.ops.convert_to_numpy(w)
        for w in (layer.tokens.embeddings, layer.positions.embeddings)
    )
    np.testing.assert_allclose(out[0], tokens[[1, 2, 2, 0]] + positions[:4])


def test_the_position_table_s_gradient_is_the_sum_over_the_batch():
    layer = kmp.layers.TokenAndPositionEmbedding(5, 10, 3)
    ids = np.array([[1, 2, 2, 0], [3, 3, 3, 3], [0, 1, 2, 9]])
    layer(ids)
    weights = np.random.default_rng(0).standard_normal((3, 4, 3))

    def loss_fn(values, args, tap):
        out, _ = layer.stateless_call(values, [], args[0])
        return keras.ops.sum(out * args[1])

    run = backend.taped_gradients(loss_fn)
    values = [
        v.value for v in (layer.tokens.embeddings, layer.positions.embeddings)
    ]
    _, _, _, (tokens, positions), _ = run(
        values, ids, keras.ops.convert_to_tensor(weights, "float32")
    )
    want_tokens = np.zeros((10, 3))
    np.add.at(want_tokens, ids.reshape(-1), weights.reshape(-1, 3))
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(tokens), want_tokens, rtol=1e-5
    )
    want_positions = np.concatenate([weights.sum(0), np.zeros((1, 3))])
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(positions), want_positions, rtol=1e-5
    )


def test_one_unbatched_sequence_is_embedded_too():
    layer = kmp.layers.TokenAndPositionEmbedding(4, 10, 3)
    ids = np.array([1, 2, 2, 0])
    out = keras.ops.convert_to_numpy(layer(ids))
    tokens, positions = (
        keras.ops.convert_to_numpy(w)
        for w in (layer.tokens.embeddings, layer.positions.embeddings)
    )
    np.testing.assert_allclose(out, tokens[ids] + positions[:4])


def test_a_file_with_it_loads_in_a_process_that_only_imported_kmp(tmp_path):
    # What `kmp train imdb` writes, loaded the way a user (or `kmp audit`)
    # loads it: no example imported, and no warning that the layer was
    # not built.
    inputs = keras.Input((4,), dtype="int32")
    x = kmp.layers.TokenAndPositionEmbedding(4, 10, 8)(inputs)
    outputs = keras.layers.Dense(2)(keras.layers.GlobalAveragePooling1D()(x))
    path = str(tmp_path / "model.keras")
    keras.Model(inputs, outputs).save(path)
    script = textwrap.dedent(
        f"""
        import warnings
        import keras
        import kmp
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model = keras.saving.load_model({path!r})
        print(type(model.layers[1]).__name__, model.layers[1].built)
        print([str(w.message) for w in caught if "build" in str(w.message)])
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "KERAS_BACKEND": backend.name()},
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.splitlines() == [
        "TokenAndPositionEmbedding True",
        "[]",
    ]


def test_the_name_kmp_0_1_0_wrote_still_finds_the_class():
    found = keras.saving.get_registered_object(embedding.OLD_NAME)
    assert found is kmp.layers.TokenAndPositionEmbedding
    assert (
        keras.saving.get_registered_name(kmp.layers.TokenAndPositionEmbedding)
        == "kmp>TokenAndPositionEmbedding"
    )
