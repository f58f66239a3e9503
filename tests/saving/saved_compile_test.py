"""A model with its own `compile`, loaded by `kmp.load_model`: keras-io's
SimCLR (`compile(contrastive_optimizer, probe_optimizer)`), its GANs and
its diffusion model (`kmp.saving.saved_compile`). Keras's load gives each back
uncompiled with a warning; kmp's raised on them, or remade their
optimizers in silence. And `saved_unbuilt`, which reads from a file
whether its optimizer ever took a step."""

import io
import warnings
import zipfile

import h5py
import keras
import numpy as np
import pytest

import kmp
from kmp.saving.saved_compile import saved_unbuilt


def _lines(caught):
    return [str(w.message) for w in caught if "kmp.load_model" in str(w)]


@keras.saving.register_keras_serializable("saved_compile_test")
class TwoOptimizers(keras.Model):
    """SimCLR's shape: two sub-models, an optimizer for each, held as
    attributes that the model's own `compile` sets."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.encoder = keras.layers.Dense(4)
        self.probe = keras.layers.Dense(2)

    def call(self, x):
        return self.probe(self.encoder(x))

    def compile(self, encoder_optimizer, probe_optimizer, **kwargs):
        super().compile(**kwargs)
        self.encoder_optimizer = encoder_optimizer
        self.probe_optimizer = probe_optimizer


@keras.saving.register_keras_serializable("saved_compile_test")
class TwoDefaultOptimizers(TwoOptimizers):
    """The same, with optimizers its `compile` makes when none is given."""

    def compile(self, encoder_optimizer=None, probe_optimizer=None, **kw):
        super().compile(
            encoder_optimizer or kmp.wrap(keras.optimizers.Adam()),
            probe_optimizer or kmp.wrap(keras.optimizers.Adam()),
            **kw,
        )


def _trained(cls, path):
    """A model of `cls`, each optimizer applied (the encoder's twice),
    saved to `path`."""
    kmp.enable("mixed_float16")
    model = cls()
    model(np.ones((1, 3), "float32"))
    model.compile()
    for optimizer, layer, steps in (
        (model.encoder_optimizer, model.encoder, 2),
        (model.probe_optimizer, model.probe, 1),
    ):
        for _ in range(steps):
            grads = [keras.ops.ones(v.shape) for v in layer.trainable_variables]
            optimizer.apply(grads, layer.trainable_variables)
    model.save(path)
    return model


def test_a_compile_that_takes_other_arguments_leaves_it_uncompiled(tmp_path):
    # Was: TypeError, TwoOptimizers.compile() missing 2 required arguments.
    path = str(tmp_path / "two.keras")
    kmp.enable("mixed_float16")
    model = TwoOptimizers()
    model(np.ones((1, 3), "float32"))
    model.compile(kmp.wrap("adam"), kmp.wrap("adam"))
    model.save(path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = kmp.load_model(path)
    (line,) = _lines(caught)
    assert "TwoOptimizers.compile does not take the file's compile config" in (
        line
    )
    assert "missing a required argument: 'encoder_optimizer'" in line
    assert "comes back uncompiled" in line and "\n" not in line
    assert not hasattr(loaded, "encoder_optimizer")
    for saved, restored in zip(model.weights, loaded.weights):
        np.testing.assert_array_equal(
            keras.ops.convert_to_numpy(restored),
            keras.ops.convert_to_numpy(saved),
        )


def test_an_unbuilt_model_loads_and_says_its_state_is_not_restored(tmp_path):
    # keras-io's diffusion model trains its networks in its own step and
    # never runs its own call: saved unbuilt. Was: ValueError from
    # load_weights ("has not yet been built").
    @keras.saving.register_keras_serializable("saved_compile_test")
    class Unbuilt(keras.Model):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.network = keras.Sequential(
                [keras.Input((4,)), keras.layers.Dense(2)]
            )

        def compile(self, **kwargs):
            super().compile(**kwargs)

    kmp.enable("mixed_float16")
    model = Unbuilt()
    model.compile(optimizer=kmp.wrap("adam"), loss="mae")
    model.network.layers[0].kernel.assign(np.full((4, 2), 0.5))
    path = str(tmp_path / "unbuilt.keras")
    with pytest.warns(UserWarning, match="not yet been built"):
        model.save(path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = kmp.load_model(path)
    (line,) = _lines(caught)
    assert "the model was saved unbuilt" in line
    assert "starts afresh at iteration 0" in line
    assert isinstance(loaded.optimizer, kmp.LossScaleOptimizer)
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(loaded.network.layers[0].kernel), 0.5
    )


def test_optimizers_a_compile_remakes_are_named_with_the_way_back(tmp_path):
    # Was: six of Keras's lines, one per optimizer and inner optimizer,
    # the unused `model.optimizer` (saved unbuilt) among them.
    path = str(tmp_path / "two.keras")
    model = _trained(TwoDefaultOptimizers, path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = kmp.load_model(path)
    (line,) = _lines(caught)
    assert not [w for w in caught if "Skipping variable" in str(w.message)]
    assert (
        "the saved state (slots, loss scale, iterations) of "
        "self.encoder_optimizer, self.probe_optimizer was not restored: "
        "TwoDefaultOptimizers.compile makes them afresh"
    ) in line
    assert int(loaded.encoder_optimizer.iterations) == 0
    # The way back the line gives.
    loaded.encoder_optimizer.build(loaded.encoder.trainable_variables)
    loaded.probe_optimizer.build(loaded.probe.trainable_variables)
    loaded.load_weights(path)
    for name in ("encoder_optimizer", "probe_optimizer"):
        saved, restored = getattr(model, name), getattr(loaded, name)
        assert int(restored.iterations) == int(saved.iterations)
        for a, b in zip(saved.variables, restored.variables):
            np.testing.assert_array_equal(
                keras.ops.convert_to_numpy(b), keras.ops.convert_to_numpy(a)
            )
    assert int(loaded.encoder_optimizer.iterations) == 2


@keras.saving.register_keras_serializable("saved_compile_test")
class OwnCompile(keras.Model):
    """A Functional model with its own `compile` (a KerasHub task's shape),
    which makes a probe's optimizer when given none."""

    def compile(self, probe_optimizer=None, **kwargs):
        super().compile(**kwargs)
        self.probe_optimizer = probe_optimizer or keras.optimizers.Adam(
            name="adam"  # the name the file's own Adam loads with
        )


def _own_compile(optimizer):
    """An `OwnCompile` model, one step of `fit` and one of its probe's
    optimizer taken (small errors: no float16 gradient overflows at the
    first loss scale, so the step counts)."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((3,))
    model = OwnCompile(inputs, keras.layers.Dense(2)(inputs))
    model.compile(optimizer=optimizer, loss="mse")
    x, y = np.full((4, 3), 0.01, "float32"), np.zeros((4, 2), "float32")
    model.fit(x, y, verbose=0)
    variables = model.trainable_variables
    model.probe_optimizer.apply(
        [keras.ops.ones(v.shape) for v in variables], variables
    )
    return model


def test_keras_s_scaler_loaded_under_another_policy_is_told_as_such(tmp_path):
    # Keras's compile wrapped Adam in its scaler under mixed_float16; under
    # float32 the load builds Adam alone. The line said the model's compile
    # remade it and named a way back that fails; the fix is the policy.
    kmp.enable("mixed_float16")
    path = str(tmp_path / "own.keras")
    _own_compile(keras.optimizers.Adam()).save(path)
    kmp.disable()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kmp.load_model(path)
    lines = _lines(caught)
    assert not [m for m in lines if "self.optimizer" in m]
    (line,) = [m for m in lines if "the optimizer's saved state" in m]
    assert "the optimizer's saved state was not restored" in line
    assert 'kmp.load_model(path, policy="saved")' in line
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        restored = kmp.load_model(path, policy="saved")
    assert not [m for m in _lines(caught) if "self.optimizer" in m]
    assert int(restored.optimizer.iterations) == 1


def test_the_optimizer_lost_is_named_where_two_share_a_name(tmp_path):
    # The file's Adam loads as "adam", and the probe's fresh one is
    # "adam" too: the line named self.optimizer (restored), not the
    # probe's (lost).
    kmp.enable("mixed_float16")
    path = str(tmp_path / "own.keras")
    _own_compile(kmp.wrap(keras.optimizers.Adam(name="adam"))).save(path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = kmp.load_model(path)
    (line,) = _lines(caught)
    assert "of self.probe_optimizer was not restored" in line
    assert "self.optimizer" not in line
    assert int(loaded.optimizer.iterations) == 1
    assert loaded.probe_optimizer.name == "adam"  # its own name, back


@keras.saving.register_keras_serializable("saved_compile_test")
class ListedOptimizers(TwoOptimizers):
    """Optimizers its `compile` keeps in a list, where no attribute names
    each."""

    def compile(self, **kwargs):
        super().compile(kmp.wrap("adam"), kmp.wrap("adam"), **kwargs)
        self.listed = [keras.optimizers.Adam()]


def test_an_optimizer_in_a_list_keeps_keras_s_own_words(tmp_path):
    path = str(tmp_path / "listed.keras")
    model = _trained(ListedOptimizers, path)
    variables = model.encoder.trainable_variables
    model.listed[0].apply(
        [keras.ops.ones(v.shape) for v in variables], variables
    )
    model.save(path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kmp.load_model(path)
    said = [str(w.message) for w in caught]
    assert [m for m in said if m.startswith("Skipping variable loading")]
    (line,) = _lines(caught)
    assert "self.encoder_optimizer, self.probe_optimizer was not" in line


def _archive(path, variables):
    """A `.keras` archive whose weights hold `variables` (name -> array)."""
    buffer = io.BytesIO()
    with h5py.File(buffer, "w") as weights:
        for name, value in variables.items():
            weights[name] = value
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("model.weights.h5", buffer.getvalue())
    return str(path)


def test_saved_unbuilt_reads_whether_the_optimizer_took_a_step(tmp_path):
    unbuilt = {
        "optimizer/vars/0": np.int64(0),  # iterations
        "optimizer/vars/1": np.float32(1e-3),  # learning rate
        "optimizer/inner_optimizer/vars/0": np.int64(0),
    }
    assert saved_unbuilt(_archive(tmp_path / "a.keras", unbuilt))
    # A slot shaped as a weight; a step counted (SGD without slots).
    slot = {**unbuilt, "optimizer/vars/2": np.zeros((4, 3), "float32")}
    assert not saved_unbuilt(_archive(tmp_path / "b.keras", slot))
    stepped = {**unbuilt, "optimizer/vars/0": np.int64(2)}
    assert not saved_unbuilt(_archive(tmp_path / "c.keras", stepped))
    # Not where Keras keeps it: cannot tell, so the state counts as lost.
    moved = {"optimizers/vars/0": np.int64(0)}
    assert not saved_unbuilt(_archive(tmp_path / "d.keras", moved))
