"""`.keras` files saved by earlier versions of kmp still load.

tests/fixtures/kmp_<version>_mixed_float16.keras was written by that
version (tests/fixtures/make_saved_model.py says how): a mixed-float16
model holding every class kmp registers (`kmp>LossScaleOptimizer`,
`kmp>Float32Softmax`, `kmp>Float32Activation`, `kmp>MultiHeadAttention`)
and the IMDB example's `kmp_examples>TokenAndPositionEmbedding` (now
`kmp.layers.TokenAndPositionEmbedding`, which loads under both names),
after 4 training steps; the `.npz` beside it holds its inputs, predictions and
optimizer state. Loading is checked on every backend.
"""

import pathlib

import keras
import numpy as np
import pytest

import kmp

FIXTURES = sorted(
    (pathlib.Path(__file__).parent / "fixtures").glob("kmp_*.keras")
)


def test_there_is_a_fixture_of_the_first_version():
    assert [p.name for p in FIXTURES][:1] == ["kmp_0.1.0_mixed_float16.keras"]


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_a_saved_model_loads_with_its_classes_state_and_outputs(path):
    expected = np.load(path.with_suffix(".npz"))
    model = keras.saving.load_model(path)

    by_class = {type(layer) for layer in model._flatten_layers()}
    assert {
        kmp.layers.Float32Softmax,
        kmp.layers.Float32Activation,
        kmp.layers.MultiHeadAttention,
        kmp.layers.TokenAndPositionEmbedding,
    } <= by_class
    attention = [
        layer
        for layer in model.layers
        if isinstance(layer, keras.layers.MultiHeadAttention)
    ]
    assert isinstance(attention[0]._softmax, kmp.layers.Float32Softmax)
    assert model.layers[-1].dtype_policy.name == "float32"  # the output
    assert model.get_layer(index=3).dtype_policy.name == "mixed_float16"

    optimizer = model.optimizer
    assert type(optimizer) is kmp.LossScaleOptimizer
    assert optimizer.dynamic_growth_steps == 3
    assert float(optimizer.loss_scale) == float(expected["loss_scale"])
    assert int(optimizer.skipped_steps) == int(expected["skipped_steps"])
    assert int(optimizer.iterations) == int(expected["iterations"])

    predictions = model.predict(expected["x"], verbose=0)
    assert predictions.dtype == np.float32
    # float16 compute: the backends round differently.
    np.testing.assert_allclose(predictions, expected["y_pred"], atol=2e-3)
