"""kmp.load_model: what Keras's load leaves out, put back."""

import keras
import keras_hub
import numpy as np
import pytest
from util import small_gpt2_backbone

import kmp

RNG = np.random.default_rng(0)
TOKENS = {
    "token_ids": RNG.integers(0, 64, (8, 16)),
    "padding_mask": np.ones((8, 16), bool),
}
NEXT = RNG.integers(0, 64, (8, 16))


def _unpinned(model):
    report = kmp.audit(model, verbose=False)
    return sorted(f.where for f in report if "Attention softmax" in f.problem)


def _trained_gpt2(path):
    # KerasHub's GPT-2 from a small config: its attention softmaxes are
    # made in code (no path), and GPT2CausalLM has its own compile.
    keras.utils.set_random_seed(0)
    backbone = small_gpt2_backbone()
    model = kmp.pin_float32(
        keras_hub.models.GPT2CausalLM(backbone, preprocessor=None)
    )
    model.compile(
        optimizer=kmp.wrap(keras.optimizers.Adam(1e-3)),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    model.fit(TOKENS, NEXT, batch_size=4, epochs=1, verbose=0)
    model.save(path)
    return model


def test_a_kerashub_task_comes_back_pinned_compiled_and_resumable(tmp_path):
    kmp.enable("mixed_float16")
    path = str(tmp_path / "gpt2.keras")
    model = _trained_gpt2(path)
    decoders = [f"transformer_layer_{i}/self_attention" for i in range(2)]
    assert _unpinned(model) == []

    # Keras's load: both softmax pins lost (the audit says so), and the
    # task's own compile skipped, scaler and optimizer state with it.
    with pytest.warns(UserWarning, match="compile"):
        plain = keras.saving.load_model(path)
    assert _unpinned(plain) == decoders
    assert not isinstance(plain.optimizer, kmp.LossScaleOptimizer)

    loaded = kmp.load_model(path)
    assert _unpinned(loaded) == []
    assert isinstance(loaded.optimizer, kmp.LossScaleOptimizer)
    assert int(loaded.optimizer.iterations) == 2
    assert float(loaded.optimizer.dynamic_scale) == float(
        model.optimizer.dynamic_scale
    )
    for saved, restored in zip(
        model.optimizer.variables, loaded.optimizer.variables
    ):
        np.testing.assert_array_equal(
            keras.ops.convert_to_numpy(restored),
            keras.ops.convert_to_numpy(saved),
        )
    np.testing.assert_array_equal(
        loaded.predict(TOKENS, verbose=0), model.predict(TOKENS, verbose=0)
    )


def test_a_functional_model_loads_as_keras_loads_it(tmp_path):
    kmp.enable("mixed_float16")
    inputs = keras.Input((8, 16))
    # (Dropout: JAX's fused float16 attention does not run on a CPU.)
    x = keras.layers.MultiHeadAttention(2, 8, dropout=0.1)(inputs, inputs)
    model = kmp.pin_float32(keras.Model(inputs, keras.layers.Dense(4)(x)))
    model.compile(optimizer=kmp.wrap("adam"), loss="mse")
    x = RNG.standard_normal((4, 8, 16)).astype("float32")
    model.fit(x, np.zeros((4, 8, 4)), verbose=0)
    path = str(tmp_path / "m.keras")
    model.save(path)
    loaded = kmp.load_model(path)
    plain = keras.saving.load_model(path)
    assert [type(layer) for layer in loaded.layers] == [
        type(layer) for layer in plain.layers
    ]
    assert isinstance(loaded.optimizer, kmp.LossScaleOptimizer)
    np.testing.assert_array_equal(
        loaded.predict(x, verbose=0), plain.predict(x, verbose=0)
    )


def test_other_files_are_refused_with_keras_s_loader_named():
    with pytest.raises(ValueError, match="reads .keras files.*keras.saving"):
        kmp.load_model("model.h5")
