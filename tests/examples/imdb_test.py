"""examples/imdb.py (importable as kmp.examples.imdb), for a few steps:
synthetic data, the real TFDS code path on mock data, the BiLSTM."""

import os
import pathlib

import keras
import numpy as np
import pytest
from util import once_per_session
from util import small_imdb_config

import kmp
from kmp.app import data
from kmp.app import run
from kmp.examples import imdb
from kmp.fp8 import scaled_layers


def small(tmp_path, **overrides):
    return small_imdb_config(output_dir=str(tmp_path), **overrides)


@pytest.fixture(scope="session")
def trained(tmp_path_factory):
    """One mixed-float16 training run: its results and output folder.
    120 steps on reviews of 64 tokens, enough to learn the synthetic
    sentiment words: test accuracy 0.84 (TF), 0.81 (JAX), 0.80 (torch)
    measured, on the whole test split (128 reviews)."""

    def train():
        folder = tmp_path_factory.mktemp("imdb")
        config = small(
            folder,
            policy="mixed_float16",
            steps=40,
            epochs=3,
            batch_size=16,
            learning_rate=4e-3,
            sequence_length=64,
            vocabulary_size=128,
            synthetic_size=640,
            eval_steps=100,  # all of the test split
        )
        return imdb.train(config), str(folder)

    results, folder = once_per_session(tmp_path_factory, "imdb_float16", train)
    return results, pathlib.Path(folder)


@pytest.mark.slow
def test_trains_on_synthetic_data_with_float16(trained):
    results, tmp_path = trained
    assert results["data"] == "synthetic"
    assert results["model"] == "imdb_transformer"
    # kmp's rule with its defaults: x0.5 for each skipped step (the first
    # steps of a float16 Transformer overflow at 2^15), no growth before
    # 2000 finite steps.
    skipped = results["skipped_steps"]
    assert results["loss_scale"] == 2.0**15 * 0.5**skipped
    assert results["history"]["loss_scale"][-1] == results["loss_scale"]
    assert results["accuracy"] > 0.7  # chance: 0.5
    assert sorted(os.listdir(tmp_path)) == [
        "imdb.keras",
        "results.json",
        "results.png",
    ]
    assert "(SYNTHETIC data)" in run.summary("imdb", results)


@pytest.mark.slow
def test_saved_model_loads_with_its_float32_islands(trained):
    _, tmp_path = trained
    model = keras.saving.load_model(tmp_path / "imdb.keras")
    tokens = np.ones((2, 64), "int32")
    assert keras.backend.standardize_dtype(model(tokens).dtype) == "float32"
    attention = [
        layer
        for layer in model.layers
        if isinstance(layer, keras.layers.MultiHeadAttention)
    ]
    assert isinstance(attention[0], kmp.layers.MultiHeadAttention)


@pytest.mark.slow
def test_bilstm_variant(tmp_path):
    results = imdb.train(small(tmp_path, model="bilstm"))
    assert results["model"] == "imdb_bilstm"


@pytest.mark.backend_independent
@pytest.mark.slow
def test_real_tfds_code_path_on_mock_data(tmp_path, monkeypatch):
    tfds = pytest.importorskip("tensorflow_datasets")
    monkeypatch.setattr(data, "_reachable", lambda: True)
    with tfds.testing.mock_data(num_examples=32):
        results = imdb.train(small(tmp_path, data="tfds"))
    assert results["data"] == "tfds"


@pytest.mark.backend_independent
def test_synthetic_text_is_deterministic_and_learnable_with_headroom():
    (x, y), (tx, ty) = data.synthetic_text(400, 200, 128, 500, seed=1)
    assert x.shape == (400, 128) and x.dtype == np.int32
    assert x.max() < 500 and x.min() >= 0
    again = data.synthetic_text(400, 200, 128, 500, seed=1)
    np.testing.assert_array_equal(x, again[0][0])

    # Naive Bayes on word counts separates the test set about as well as
    # the redrawn labels (10%, half of them alike) allow: 95%.
    def counts(tokens):
        return np.stack([np.bincount(t, minlength=500) for t in tokens])

    per_class = [counts(x[y == c]).sum(0)[2:] + 1.0 for c in (0, 1)]
    log_ratio = np.log(per_class[1] / per_class[1].sum()) - np.log(
        per_class[0] / per_class[0].sum()
    )
    guess = counts(tx)[:, 2:] @ log_ratio > 0
    assert 0.9 < (guess == ty).mean() < 0.98
    (_, clean), _ = data.synthetic_text(
        400, 200, 128, 500, seed=1, label_noise=0
    )
    assert 0.02 < (clean != y).mean() < 0.09  # 10% redrawn, half alike


def test_float8_flag_trains_float8_layers_and_saves_them(tmp_path):
    results = imdb.train(
        small(tmp_path, policy="mixed_bfloat16", float8=True, steps=3)
    )
    # Trained: three finite steps in bfloat16 (no loss scale) that moved
    # the loss.
    steps = results["step_losses"]
    assert len(steps) == 3 and np.all(np.isfinite(steps))
    assert len(set(steps)) > 1
    assert results["loss_scale"] is None and results["skipped_steps"] == 0
    model = keras.saving.load_model(tmp_path / "imdb.keras")
    float8 = [
        layer
        for layer in model._flatten_layers(include_self=False)
        if layer.quantization_mode == "float8"
    ]
    # The attention's four projections and the feed-forward Dense layers.
    assert sum("attention" in layer.path for layer in float8) == 4
    assert any(isinstance(layer, keras.layers.Dense) for layer in float8)
    assert model.layers[-1].quantization_mode is None  # the head
    if keras.backend.backend() in ("jax", "torch"):
        # kmp's float8 matmul (kmp.float8's default on JAX and torch)
        # scales each operand from its current amax: the file keeps its
        # class for the feed-forward layers, and Keras's histories stay
        # unused.
        assert any(type(layer) is scaled_layers.Dense for layer in float8)
        return
    # Keras's float8: the scales were learned from the data, the amax
    # histories of the trained layers hold more than their initial zeros.
    histories = [
        variable
        for layer in float8
        for variable in layer.variables
        if "amax_history" in variable.path
    ]
    assert histories
    assert any(np.any(keras.ops.convert_to_numpy(v) > 0) for v in histories)


@pytest.mark.backend_independent
def test_d_model_must_split_over_heads_and_is_refused_before_training(
    tmp_path, monkeypatch
):
    def loaded(*args):
        raise AssertionError("the data was loaded: checked too late")

    monkeypatch.setattr(imdb, "load_data", loaded)
    with pytest.raises(kmp.InputError, match="d_model \\(16\\) must be"):
        imdb.train(small(tmp_path, heads=3))
