"""examples/lm.py (kmp.examples.lm): KerasHub's GPT-2
from a config, bfloat16 and float8, on bytes of Python's sources."""

import keras
import numpy as np
import pytest

import kmp
from kmp import backend
from kmp.app import flops
from kmp.examples import lm


def small(tmp_path, **overrides):
    settings = dict(
        epochs=1,
        steps=3,
        batch_size=4,
        hidden_dim=32,
        heads=2,
        layers=2,
        sequence_length=32,
        text_bytes=8_000,
        output_dir=str(tmp_path),
        verbose=0,
    )
    settings.update(overrides)
    return lm.Config(**settings)


def test_the_text_is_python_s_own_sources_cut_into_next_byte_pairs():
    config = small("unused")
    splits = lm.load_data(config)
    x, y = splits.train
    assert splits.source == "python-stdlib"
    assert x["token_ids"].shape == y.shape == ((8_000 - 1) // 32, 32)
    # Each target is the next byte of the text (the training sequences
    # are shuffled; the test split is in order).
    np.testing.assert_array_equal(x["token_ids"][:, 1:], y[:, :-1])
    tx, ty = splits.test
    np.testing.assert_array_equal(tx["token_ids"][1, 0], ty[0, -1])
    text = bytes(x["token_ids"][0].astype(np.uint8))
    assert text.isascii()  # source code
    assert splits.test[1].shape == ((800 - 1) // 32, 32)  # the last tenth


@pytest.mark.slow
@pytest.mark.parametrize(
    "float8, matmul",
    [
        (False, "keras"),
        (True, "keras"),
        pytest.param(
            True,
            "kmp",
            marks=pytest.mark.skipif(
                backend.name() == "tensorflow",
                reason="kmp's float8 matmul is JAX's and torch's",
            ),
        ),
    ],
)
def test_trains_saves_and_reloads_with_and_without_float8(
    float8, matmul, tmp_path
):
    results = lm.train(small(tmp_path, float8=float8, float8_matmul=matmul))
    steps = results["step_losses"]
    assert len(steps) == 3 and np.all(np.isfinite(steps))
    assert results["policy"] == "mixed_bfloat16"
    assert results["tokens_per_s"] == pytest.approx(
        results["examples_per_s"] * 32
    )
    assert results["peak_memory_mib"] > 0
    # Two blocks: query, key, value, output, and the two feed-forward
    # Dense layers of each.
    assert results["float8_layers"] == (12 if float8 else 0)
    model = kmp.load_model(str(tmp_path / "lm.keras"))
    modes = [
        layer.quantization_mode
        for layer in model._flatten_layers()
        if isinstance(layer, keras.layers.Dense | keras.layers.EinsumDense)
    ]
    assert modes.count("float8") == results["float8_layers"]
    report = kmp.audit(model, verbose=False)
    assert not [f for f in report if "softmax" in f.problem.lower()], report


def test_the_memory_modes_halve_weights_and_state_and_still_learn(tmp_path):
    plain = lm.train(small(tmp_path / "float32"))
    half = lm.train(
        small(
            tmp_path / "bfloat16",
            master_weights="bfloat16",
            optimizer_states="bfloat16",
            remat=True,
        )
    )
    assert half["policy"] == "bfloat16"  # Keras's: bfloat16 variables
    assert half["state_bytes"]["weights"] * 2 == plain["state_bytes"]["weights"]
    total = sum(half["state_bytes"].values()) / sum(
        plain["state_bytes"].values()
    )
    assert 0.5 <= total < 0.5001  # the optimizer's scalars stay as they are
    # Model FLOPs: PaLM's count per token, 2 blocks of width 32 on
    # sequences of 32; no peak, so no MFU, on a CPU (kmp.app.flops).
    per_token = flops.causal_lm_flops_per_token(2, 32, 32, lm.VOCABULARY)
    for results in (plain, half):
        assert results["model_tflops"] == pytest.approx(
            per_token * results["tokens_per_s"] / 1e12
        )
        if kmp.backend.list_devices()[0].platform == "cpu":
            assert results["mfu"] is None
    assert np.all(np.isfinite(half["step_losses"]))
    model = kmp.load_model(str(tmp_path / "bfloat16" / "lm.keras"))
    assert {str(w.dtype) for w in model.trainable_weights} == {"bfloat16"}
    assert kmp.memory.rounding_of(model.optimizer) == "stochastic"


@pytest.mark.parametrize("dropout", [0.1, 0.0])
def test_dropout_reaches_every_attention_layer_and_block(dropout):
    # --dropout: KerasHub's 0.1 keeps Keras's attention unfused; at 0
    # MultiHeadAttention calls ops.dot_product_attention (fusable).
    model = lm.build_model(small("unused", dropout=dropout))
    assert model.backbone.dropout == dropout
    rates = {
        layer._dropout
        for layer in model._flatten_layers()
        if isinstance(layer, keras.layers.MultiHeadAttention)
    }
    assert rates == {dropout}


def test_synthetic_text_is_learnable_counting_with_noise():
    text = lm.synthetic_text(6_400, seed=0)
    steps = np.diff(text.astype(int).reshape(-1, 64), axis=1) % 256
    assert np.mean(np.isin(steps, (1, 2, 3))) > 0.85


@pytest.mark.parametrize(
    "overrides, phrase",
    [
        ({"hidden_dim": 30, "heads": 4}, "multiple of heads"),
        ({"float8": True, "policy": "float32"}, "--float8 trains under"),
        ({"data": "tfds"}, "data must be one of auto, synthetic"),
        ({"strategy": "mirrored"}, "runs on one device"),
        ({"master_weights": "bfloat16", "float8": True}, "with --float8"),
        ({"dropout": 1.0}, r"dropout must be in \[0, 1\), got 1.0"),
        ({"dropout": -0.1}, "dropout must be >= 0.0, got -0.1"),
    ],
)
def test_bad_settings_are_refused_before_anything_loads(
    overrides, phrase, tmp_path
):
    with pytest.raises(kmp.InputError, match=phrase):
        lm.train(small(tmp_path, **overrides))


@pytest.mark.slow
def test_an_interrupted_run_resumes_from_its_backup(tmp_path, monkeypatch):
    from util import Interrupted
    from util import interrupt_runs

    config = small(tmp_path, epochs=2, float8=True)
    with monkeypatch.context() as patch:
        interrupt_runs(patch, after_epochs=1)
        with pytest.raises(Interrupted):
            lm.train(config)
    assert (tmp_path / "backup").exists()
    results = lm.train(config)
    assert results["epochs"] == 2
    # Epoch 1's three steps from the first run, epoch 2's from the rerun.
    assert len(results["step_losses"]) == 6
    assert not (tmp_path / "backup").exists()  # done: Keras deletes it
