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
