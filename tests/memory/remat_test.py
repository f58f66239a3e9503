"""`kmp.rematerialize`: layers recomputed in the backward pass, under
their dtype policy (Keras's own `RematScope` fails the step on
TensorFlow and torch under mixed_float16: tests/stock_keras_test.py),
chosen after the model is built, with the same gradients as without;
KerasHub's decoder blocks train under it on every backend."""

import keras
import numpy as np
import pytest
from util import JIT_COMPILE
from util import DropoutBlock
from util import DtypeRecordingDense
from util import small_gpt2_backbone

import kmp
from kmp import backend
from kmp.memory import remat


def _mlp():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((8,))
    x = DtypeRecordingDense(16, activation="relu")(inputs)
    x = DtypeRecordingDense(16, activation="relu")(x)
    return keras.Model(inputs, keras.layers.Dense(1, dtype="float32")(x))


def _fit_one_step(model):
    model.compile(
        optimizer=kmp.wrap(keras.optimizers.SGD(0.1)),
        loss="mse",
        jit_compile=JIT_COMPILE[0],
    )
    x = np.linspace(-1, 1, 64, dtype="float32").reshape(8, 8)
    DtypeRecordingDense.seen = []
    model.fit(x, x[:, :1], batch_size=8, verbose=0, shuffle=False)
    return DtypeRecordingDense.seen


def test_a_remat_scope_model_recomputes_under_the_policy():
    kmp.enable("mixed_float16")
    with keras.RematScope(mode="full"):
        model = _mlp()
    kmp.rematerialize(model)  # no layers named: Keras's choice, fixed
    assert all(remat.recomputes_in_policy(x) for x in model.layers[1:3])
    seen = _fit_one_step(model)
    assert set(seen) == {("float16", "float16")}
    # TensorFlow and torch call each layer again in the backward pass;
    # JAX traces the recomputation inside the forward call.
    assert len(seen) >= 4


def test_layers_chosen_after_building_give_the_same_step():
    kmp.enable("mixed_float16")
    plain = _mlp()
    chosen = kmp.rematerialize(_mlp(), DtypeRecordingDense)
    assert [type(x).__name__ for x in remat.rematerialized_layers(chosen)] == [
        "DtypeRecordingDense",
        "DtypeRecordingDense",
    ]
    assert len(_fit_one_step(chosen)) > len(_fit_one_step(plain)) or (
        backend.name() == "jax"
    )
    for a, b in zip(plain.get_weights(), chosen.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-4)
    assert (
        kmp.rematerialize(chosen, DtypeRecordingDense) is chosen
    )  # again: same


def _block_model(rematerialized, fused_norm=False):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((8,))
    block = DropoutBlock()
    model = keras.Model(inputs, block(inputs))
    if fused_norm:  # kmp's BatchNormalization, one kernel on torch
        block.norm.__class__ = kmp.layers.BatchNormalization
    if rematerialized:
        kmp.rematerialize(model, DropoutBlock)
    model.compile(
        optimizer=keras.optimizers.SGD(0.1),
        loss="mse",
        jit_compile=JIT_COMPILE[0],
    )
    x = np.linspace(-1, 1, 128, dtype="float32").reshape(16, 8)
    model.fit(x, x[:, :1], batch_size=8, epochs=2, verbose=0, shuffle=False)
    return model


@pytest.mark.parametrize(
    "fused_norm",
    [
        False,
        pytest.param(
            True,
            marks=pytest.mark.skipif(
                backend.name() != "torch", reason="Keras's call elsewhere"
            ),
        ),
    ],
)
def test_the_recomputation_draws_the_forward_s_dropout_and_updates_once(
    fused_norm,
):
    # Recomputed from the advanced seed, the backward pass would use
    # another dropout mask (TensorFlow, torch: wrong gradients, silently)
    # and update the moving statistics twice; on JAX the seed's write
    # inside the checkpoint would leak out of its trace. Keras's
    # BatchNormalization and kmp's (which writes its statistics itself).
    plain = _block_model(False, fused_norm)
    recomputed = _block_model(True, fused_norm)
    for a, b in zip(plain.weights, recomputed.weights):
        np.testing.assert_allclose(
            keras.ops.convert_to_numpy(a),
            keras.ops.convert_to_numpy(b),
            rtol=1e-5,
            atol=1e-6,
            err_msg=a.path,
        )


def test_kerashub_decoder_blocks_train_rematerialized_and_reload(tmp_path):
    import keras_hub

    kmp.enable("mixed_bfloat16")
    model = keras_hub.models.GPT2CausalLM(
        small_gpt2_backbone(), preprocessor=None
    )
    kmp.rematerialize(
        kmp.pin_float32(model), keras_hub.layers.TransformerDecoder
    )
    assert len(remat.rematerialized_layers(model)) == 2
    model.compile(
        optimizer=kmp.wrap("adam"),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=JIT_COMPILE[0],
    )
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 64, (8, 16)).astype("int32")
    x = {"token_ids": ids, "padding_mask": np.ones((8, 16), bool)}
    history = model.fit(x, ids, batch_size=4, epochs=2, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    # A file keeps what the model is, not how it trains: no remat.
    path = str(tmp_path / "lm.keras")
    model.save(path)
    loaded = kmp.load_model(path)
    assert remat.rematerialized_layers(loaded) == []


def test_a_bad_choice_is_one_clear_error():
    with pytest.raises(kmp.InputTypeError, match="layer class"):
        kmp.rematerialize(_mlp(), "dense")
    with pytest.raises(kmp.InputTypeError, match="Keras model"):
        kmp.rematerialize("model")
