"""kmp.load_model: what Keras's load leaves out, put back."""

import json
import warnings
import zipfile

import keras
import keras_hub
import numpy as np
import pytest
from util import damage
from util import saved_under_keras_s_scaler
from util import small_gpt2_backbone

import kmp
from kmp import backend

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


def test_a_kerashub_task_saved_untrained_loads_without_a_line(tmp_path):
    # A task compiles itself (Keras's scaler around Adam under
    # mixed_float16), so its file holds an optimizer before any step; the
    # load said its state "was not restored (the file's has 4 variables,
    # the one built here 52)" and blamed the policy (a review).
    kmp.enable("mixed_float16")
    model = keras_hub.models.GPT2CausalLM(
        small_gpt2_backbone(), preprocessor=None
    )
    path = str(tmp_path / "untrained.keras")
    kmp.pin_float32(model).save(path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = kmp.load_model(path)
    assert [str(w.message) for w in caught if "kmp" in str(w.message)] == []
    assert loaded.optimizer is not None
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


def _softmax_block(policy, master_weights="float32", inner_dtype=None):
    """An unpinned Functional model, trained and saved under `policy`, whose
    attention softmax a custom block makes in code (keras-io's
    `TransformerBlock` does so), and its data; `inner_dtype`: a Dense
    before the block, in that dtype."""
    kmp.enable(policy, master_weights=master_weights)

    @keras.saving.register_keras_serializable("saving_test")
    class Block(keras.layers.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.attention = keras.layers.MultiHeadAttention(2, 8, dropout=0.1)

        def call(self, x):
            return self.attention(x, x)

    keras.utils.set_random_seed(0)
    inputs = keras.Input((8, 16))
    x = keras.layers.Dense(16, dtype=inner_dtype)(inputs)
    outputs = keras.layers.Dense(4, activation="softmax")(Block()(x))
    model = keras.Model(inputs, outputs)
    model.compile(optimizer=kmp.wrap("adam"), loss="mse")
    x = RNG.standard_normal((4, 8, 16)).astype("float32")
    model.fit(x, np.full((4, 8, 4), 0.25), verbose=0)
    return model, x


@pytest.mark.parametrize(
    "policy, master_weights, inner_dtype",
    [
        ("mixed_float16", "float32", None),
        # A float32 layer of the user's (kmp's lines advise some) is no
        # pin; bfloat16 masters' bare "bfloat16" policies are mixed too.
        ("mixed_float16", "float32", "float32"),
        ("mixed_bfloat16", "bfloat16", None),
    ],
)
def test_a_model_saved_unpinned_comes_back_as_saved(
    tmp_path, policy, master_weights, inner_dtype
):
    # keras-io's saving guide checks that a loaded model predicts as the
    # saved one. kmp.load_model pinned every mixed model it loaded: this
    # one came back with a float32 output softmax, predicting otherwise.
    model, x = _softmax_block(policy, master_weights, inner_dtype)
    path = str(tmp_path / "unpinned.keras")
    model.save(path)
    loaded = kmp.load_model(path)
    assert loaded.layers[-1].compute_dtype != "float32"
    assert len(_unpinned(loaded)) == len(_unpinned(model)) == 1
    np.testing.assert_array_equal(
        loaded.predict(x, verbose=0), model.predict(x, verbose=0)
    )
    # Asked for, the pins come: the output and the block's softmax.
    pinned = kmp.load_model(path, pin=True)
    assert pinned.layers[-1].compute_dtype == "float32"
    assert _unpinned(pinned) == []


def test_a_pinned_model_s_islands_made_in_code_come_back(tmp_path):
    # The file keeps the float32 output, not the block's softmax, which
    # the block's code rebuilds in float16: the output says it was pinned.
    model, x = _softmax_block("mixed_float16")
    kmp.pin_float32(model)
    path = str(tmp_path / "pinned.keras")
    model.save(path)
    assert _unpinned(keras.saving.load_model(path)) != []
    loaded = kmp.load_model(path)
    assert _unpinned(loaded) == []
    np.testing.assert_array_equal(
        loaded.predict(x, verbose=0), model.predict(x, verbose=0)
    )


def test_a_float32_file_made_mixed_on_load_is_pinned(tmp_path):
    # Loaded under kmp.enable("mixed_float16") to train on in float16:
    # pinned as a model built there would be.
    model, _ = _softmax_block("float32")
    path = str(tmp_path / "float32.keras")
    model.save(path)
    kmp.enable("mixed_float16")
    loaded = kmp.load_model(path)
    assert loaded.layers[-1].dtype_policy.name == "float32"
    assert _unpinned(loaded) == []


def test_other_files_are_refused_with_keras_s_loader_named(tmp_path):
    with pytest.raises(ValueError, match="reads .keras files.*keras.saving"):
        kmp.load_model("model.h5")
    junk = tmp_path / "junk.keras"
    junk.write_text("not a zip")
    with pytest.raises(kmp.InputError, match="is not a Keras archive"):
        kmp.load_model(str(junk))


@pytest.mark.parametrize("member", ["model.weights.h5", "config.json"])
def test_a_damaged_archive_is_one_input_error(tmp_path, member):
    # The zip's directory reads fine; the member fails its checksum (the
    # weights inside Keras's load, the config in kmp's first read).
    path = str(tmp_path / "damaged.keras")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    model.compile(optimizer="adam", loss="mse")
    model.save(path)
    damage(path, member)
    with pytest.raises(kmp.InputError) as error:
        kmp.load_model(path)
    message = str(error.value)
    assert message.startswith(f"{path} is a damaged Keras archive")
    assert f"Bad CRC-32 for file {member!r}" in message
    assert "\n" not in message


def test_lost_optimizer_state_is_said_in_one_line_with_the_fix(tmp_path):
    # The stock side: test_stock_keras_loads_a_mixed_model_s_file_without_
    # its_optimizer_state. Before issue 33, kmp.load_model hid Keras's
    # warning for every model and said nothing.
    path = str(tmp_path / "m.keras")
    saved_under_keras_s_scaler(path)
    with pytest.warns(UserWarning) as caught:
        loaded = kmp.load_model(path)
    (line,) = [str(w.message) for w in caught if "kmp.load_model" in str(w)]
    assert "optimizer's saved state was not restored" in line
    assert "(the file's has 14 variables, the one built here 10)" in line
    assert "loaded under float32" in line
    assert 'policy="saved"' in line and "kmp.wrap" in line
    assert "\n" not in line
    assert not any("Skipping variable" in str(w.message) for w in caught)
    assert int(loaded.optimizer.iterations) == 0
    # The fix it names: loaded as trained, the scaler and state are back.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        restored = kmp.load_model(path, policy="saved")
    assert isinstance(restored.optimizer, keras.optimizers.LossScaleOptimizer)
    assert int(restored.optimizer.iterations) == 2
    assert keras.config.dtype_policy().name == "float32"  # left as it was


@pytest.mark.parametrize(
    "compiled, loaded_under",
    [
        (None, "mixed_float16"),
        ("keras", "mixed_float16"),
        ("kmp", "mixed_float16"),
        # Another class than the file's: Keras's scaler taken off, or
        # put around the file's Adam.
        ("keras", "float32"),
        ("float32", "mixed_float16"),
    ],
)
def test_a_model_saved_before_its_first_step_loads_without_a_line(
    tmp_path, compiled, loaded_under
):
    # Nothing was lost: the file's optimizer was never built. Keras warns
    # all the same ("it has 6 variables whereas the saved optimizer has
    # 2"); kmp had said the state was lost, once per optimizer (the
    # scaler's inner one too), and of an uncompiled model's file that
    # its compile config names no optimizer.
    kmp.enable("float32" if compiled == "float32" else "mixed_float16")
    inputs = keras.Input((4,))
    model = keras.Model(inputs, keras.layers.Dense(3)(inputs))
    if compiled is not None:
        optimizer = kmp.wrap("adam") if compiled == "kmp" else "adam"
        model.compile(optimizer=optimizer, loss="mse")
    path = str(tmp_path / "m.keras")
    model.save(path)
    kmp.enable(loaded_under)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # Keras's own get_config on torch, through NumPy's deprecated path.
        warnings.simplefilter("ignore", DeprecationWarning)
        loaded = kmp.load_model(path)
    assert (getattr(loaded, "optimizer", None) is None) == (compiled is None)
    if compiled is not None:
        loaded.fit(np.ones((4, 4)), np.ones((4, 3)), verbose=0)


def test_state_lost_under_another_policy_is_one_line_with_custom_objects(
    tmp_path,
):
    # An optimizer class given to the load only (not registered): the
    # line reads the file, and makes no optimizer of that class.
    class MyAdam(keras.optimizers.Adam):
        pass

    inputs = keras.Input((4,))
    model = keras.Model(inputs, keras.layers.Dense(3)(inputs))
    model.compile(optimizer=MyAdam(), loss="mse")
    model.fit(np.ones((4, 4)), np.ones((4, 3)), verbose=0)
    path = str(tmp_path / "m.keras")
    model.save(path)
    kmp.enable("mixed_float16")  # Keras's compile wraps it in its scaler
    with pytest.warns(UserWarning) as caught:
        loaded = kmp.load_model(path, custom_objects={"MyAdam": MyAdam})
    (line,) = [str(w.message) for w in caught if "kmp.load_model" in str(w)]
    assert "optimizer's saved state was not restored" in line
    assert isinstance(loaded.optimizer.inner_optimizer, MyAdam)


def test_a_file_holding_a_layer_loads_as_keras_loads_it(tmp_path):
    # keras-io's "FeatureSpace advanced use cases" saves its FeatureSpace,
    # a layer: no `compile` (on torch, torch.nn.Module's).
    kmp.enable("mixed_float16")
    space = keras.utils.FeatureSpace(
        {"price": "float_normalized"}, output_mode="concat"
    )
    space.adapt({"price": RNG.normal(5000, 3000, (64, 1))})
    path = str(tmp_path / "space.keras")
    space.save(path)
    loaded = kmp.load_model(path)
    price = {"price": np.array([[2000.0], [8000.0]])}
    np.testing.assert_array_equal(
        np.asarray(loaded(price), "float32"),
        np.asarray(space(price), "float32"),
    )


def _scaled_model():
    """A trained mixed_float16 model compiled with kmp's scaler."""
    kmp.enable("mixed_float16")
    inputs = keras.Input((4,))
    model = keras.Model(inputs, keras.layers.Dense(3)(inputs))
    model.compile(optimizer=kmp.wrap(keras.optimizers.Adam(0.01)), loss="mse")
    model.fit(np.ones((4, 4)), np.ones((4, 3)), verbose=0)
    return model


def _without_optimizer(path):
    """The `.keras` file at `path` with no optimizer in its compile
    config, as Keras 3.15's `.h5` save leaves every later one."""
    with zipfile.ZipFile(path) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    config = json.loads(members["config.json"])
    del config["compile_config"]["optimizer"]
    members["config.json"] = json.dumps(config)
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)


@pytest.mark.filterwarnings("ignore:You are saving your model as an HDF5")
def test_a_keras_3_15_h5_save_drops_the_optimizer_from_later_files(tmp_path):
    # keras-io examples checkpoint to .h5 (ModelCheckpoint("x.h5")); Keras
    # 3.15 then drops the optimizer from the model's compile config (popped
    # in place), so each later .keras file loads with RMSprop, in Keras's
    # own scaler under mixed_float16. Keras 3.16 pops it from a copy.
    model = _scaled_model()
    model.save(str(tmp_path / "a.h5"))
    path = str(tmp_path / "b.keras")
    model.save(path)
    with zipfile.ZipFile(path) as archive:
        config = json.loads(archive.read("config.json"))
    named = "optimizer" in config["compile_config"]
    assert named == (backend.keras_version() >= (3, 16))
    if named:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            kept = kmp.load_model(path)
        assert isinstance(kept.optimizer, kmp.LossScaleOptimizer)
        return
    with pytest.warns(UserWarning, match="names no optimizer"):
        lost = kmp.load_model(path)
    assert type(lost.optimizer) is keras.optimizers.LossScaleOptimizer


def test_a_file_that_names_no_optimizer_is_said_in_one_line(tmp_path):
    model = _scaled_model()
    before, after = str(tmp_path / "before.keras"), str(tmp_path / "b.keras")
    model.save(before)
    model.save(after)
    _without_optimizer(after)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kept = kmp.load_model(before)  # the optimizer named: no warning
    assert isinstance(kept.optimizer, kmp.LossScaleOptimizer)
    with pytest.warns(UserWarning) as caught:
        lost = kmp.load_model(after)
    said = [str(w.message) for w in caught]
    (line,) = [m for m in said if m.startswith("kmp.load_model")]
    assert line.startswith(
        f"kmp.load_model: {after}: the file's compile config names no "
        "optimizer, so the model was compiled with a default one (RMSprop, "
        "in Keras's LossScaleOptimizer)"
    )
    assert "ModelCheckpoint('x.h5')" in line and "kmp.wrap" in line
    assert "\n" not in line
    assert not any("Skipping variable" in m for m in said)
    assert type(lost.optimizer) is keras.optimizers.LossScaleOptimizer


def test_saved_policy_reads_the_layers_policies(tmp_path):
    from kmp.saving import saved_policy

    def layer(dtype):
        return {"class_name": "Dense", "config": {"dtype": dtype}}

    def policy(name, key="name", cls="DTypePolicy"):
        return {"class_name": cls, "config": {key: name}}

    assert saved_policy({"layers": [layer("float32")]}) == "float32"
    assert saved_policy(layer(policy("mixed_bfloat16"))) == "mixed_bfloat16"
    assert saved_policy(layer("mixed_float16")) == "mixed_float16"
    quantized = policy("mixed_float16", "source_name", "QuantizedDTypePolicy")
    assert saved_policy({"layers": [layer(quantized)]}) == "mixed_float16"
    both = [layer(policy("mixed_bfloat16")), layer(policy("mixed_float16"))]
    assert saved_policy({"layers": both}) == "mixed_float16"


def test_a_class_nothing_registered_is_named(tmp_path, registry):
    from util import saved_keras_io_transformer

    path = str(tmp_path / "t.keras")
    saved_keras_io_transformer(path)
    with pytest.raises(kmp.InputError, match="'TokenAndPositionEmbedding'"):
        kmp.load_model(path)
