import os
import warnings

import keras
import numpy as np
import pytest
from keras import ops
from util import jax_only
from util import run_script

import kmp
from kmp.saving.checkpoint_dirs import _leaves
from kmp.saving.checkpoint_dirs import is_checkpoint_dir
from kmp.saving.checkpoint_dirs import read_checkpoint


@keras.saving.register_keras_serializable(package="kmp_tests")
class Net(keras.Model):
    """A subclassed model, its layers named by Keras or (`named`) by it."""

    def __init__(self, named=False, **kwargs):
        super().__init__(**kwargs)
        self.named = named
        self.hidden = keras.layers.Dense(
            8, activation="relu", name="hidden" if named else None
        )
        self.head = keras.layers.Dense(2, name="head" if named else None)

    def call(self, x):
        return self.head(self.hidden(x))

    def get_config(self):
        return {**super().get_config(), "named": self.named}


def _data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 4)).astype("float32")
    return x, x[:, :2] * 0.5


def _trained(model, directory):
    """`model` compiled under kmp's scaler and fit for 8 steps, its
    checkpoint written at the end of each of its 2 epochs."""
    x, y = _data()
    model.compile(
        optimizer=kmp.wrap(keras.optimizers.Adam(name="adam")), loss="mse"
    )
    model.fit(
        x,
        y,
        batch_size=16,
        epochs=2,
        verbose=0,
        callbacks=[
            kmp.callbacks.OrbaxCheckpoint(directory, save_on_background=False)
        ],
    )
    return model


def _numpy(variables):
    return [ops.convert_to_numpy(v).astype("float32") for v in variables]


def _assert_same_state(restored, model):
    x, _ = _data()
    np.testing.assert_array_equal(
        restored.predict(x, verbose=0), model.predict(x, verbose=0)
    )
    for a, b in zip(
        _numpy(restored.optimizer.variables), _numpy(model.optimizer.variables)
    ):
        np.testing.assert_array_equal(a, b)


def _sequential():
    return keras.Sequential(
        [
            keras.Input((4,)),
            keras.layers.Dense(8, activation="relu"),
            keras.layers.Dense(2),
        ]
    )


def test_a_sequential_model_s_checkpoint_comes_back_whole(tmp_path):
    # Keras's load gives back the initial weights: the run saved them as
    # "sequential/dense/kernel", the load made "dense/kernel"
    # (`stock_keras_test`). Weights, Adam's moments, the loss scale.
    kmp.enable("mixed_float16")
    directory = str(tmp_path / "ckpt")
    model = _trained(_sequential(), directory)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        restored = kmp.load_model(directory)
    assert not [w for w in caught if "kmp.load_model" in str(w.message)]
    assert isinstance(restored.optimizer, kmp.LossScaleOptimizer)
    _assert_same_state(restored, model)
    x, y = _data()
    went_on = model.fit(x, y, batch_size=16, shuffle=False, verbose=0)
    resumed = restored.fit(x, y, batch_size=16, shuffle=False, verbose=0)
    assert went_on.history["loss"] == resumed.history["loss"]


def test_only_the_values_keras_s_load_dropped_are_read_again(
    tmp_path, monkeypatch
):
    # Keras's load read the whole tree once; a second whole read would
    # hold the model and its optimizer state twice in host memory. The
    # metrics' saved variables are neither dropped nor read.
    from orbax.checkpoint import v1 as ocp

    kmp.enable("mixed_float16")
    directory = str(tmp_path / "ckpt")
    model = _trained(Net(named=True), directory)
    load = ocp.training.Checkpointer.load_checkpointables
    asked = []

    def recorded(self, step, abstract=None):
        asked.append(abstract)
        return load(self, step, abstract)

    monkeypatch.setattr(
        ocp.training.Checkpointer, "load_checkpointables", recorded
    )
    restored = kmp.load_model(directory)
    _assert_same_state(restored, model)
    trees = [a["pytree"] for a in asked if a and "pytree" in a]
    read = [p for t in trees if t for p, _ in _leaves(t)]
    # A subclassed model's weights ("net/hidden/kernel": Keras's load
    # drops them on every backend, defect 43) and Adam's moments
    # ("adam/net_hidden_kernel_momentum"): not the scaler's state nor
    # Adam's iteration, which the load restored.
    paths = read_checkpoint(directory).paths
    assert sorted(read) == sorted(
        [f"trainable_variables/{p}" for p in paths["trainable_variables"]]
        + [
            f"optimizer_variables/{p}"
            for p in paths["optimizer_variables"]
            if p.startswith("adam/net_")
        ]
    )


def test_a_subclassed_model_with_named_layers_comes_back_whole(tmp_path):
    kmp.enable("mixed_float16")
    directory = str(tmp_path / "ckpt")
    model = _trained(kmp.pin_float32(Net(named=True)), directory)
    restored = kmp.load_model(directory)
    assert ops.convert_to_numpy(restored(_data()[0])).dtype == np.float32
    _assert_same_state(restored, model)


def test_a_load_that_names_its_layers_after_others_comes_back_whole(tmp_path):
    # Layers Keras names are named after what the process made before:
    # here the load's are dense_2 and dense_3, the run's net/dense and
    # net/dense_1. No path ends another's; their ranks do.
    kmp.enable("mixed_float16")
    directory = str(tmp_path / "ckpt")
    model = _trained(Net(), directory)
    keras.layers.Dense(1), keras.layers.Dense(1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        restored = kmp.load_model(directory)
    assert not [w for w in caught if "kmp.load_model" in str(w.message)]
    assert restored.weights[0].path not in ("net/dense/kernel", "dense/kernel")
    _assert_same_state(restored, model)


def test_a_pinned_model_whose_outputs_are_cast_comes_back_pinned(tmp_path):
    # Its one output, a layer of layers, is cast, not pinned: no config
    # shows it. The mark in the checkpoint's assets does
    # (`kmp.islands.pin_mark`).
    kmp.enable("mixed_float16")
    inputs = keras.Input((4,))
    model = keras.Model(inputs, Residual(name="block")(inputs))
    directory = str(tmp_path / "ckpt")
    kmp.pin_float32(model)
    x = _data()[0]
    model.compile(optimizer=kmp.wrap("sgd"), loss="mse")
    checkpoint = kmp.callbacks.OrbaxCheckpoint(
        directory, save_on_background=False
    )
    model.fit(x, x, verbose=0, callbacks=[checkpoint])
    assert read_checkpoint(directory).pinned
    stock = keras.saving.load_model(directory)
    assert ops.convert_to_numpy(stock(x)).dtype == np.float16
    restored = kmp.load_model(directory)
    np.testing.assert_array_equal(
        ops.convert_to_numpy(restored(x)), ops.convert_to_numpy(model(x))
    )
    assert ops.convert_to_numpy(restored(x)).dtype == np.float32


@keras.saving.register_keras_serializable(package="kmp_tests")
class Residual(keras.layers.Layer):
    """A layer of layers: pinning casts its output."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.dense = keras.layers.Dense(4, name="inner")

    def call(self, x):
        return x + self.dense(x)


def test_what_is_not_a_checkpoint_is_said(tmp_path):
    assert not is_checkpoint_dir(str(tmp_path))
    with pytest.raises(kmp.InputError, match="OrbaxCheckpoint directories"):
        kmp.load_model(str(tmp_path))
    os.mkdir(tmp_path / "1")  # a TensorFlow SavedModel export's version
    (tmp_path / "1" / "saved_model.pb").write_bytes(b"")
    assert not is_checkpoint_dir(str(tmp_path))


def test_a_directory_loads_compiled_only(tmp_path):
    # Keras's load of a directory fails uncompiled ("no attribute
    # 'optimizer'"): said before it runs, with the way that works.
    kmp.enable("mixed_float16")
    directory = str(tmp_path / "ckpt")
    _trained(_sequential(), directory)
    with pytest.raises(kmp.InputError, match="load it with compile=True"):
        kmp.load_model(directory, compile=False)


def test_layers_named_one_apart_come_back_each_its_own(tmp_path):
    # The run made a Dense before its model (its layers dense_1, dense_2),
    # the load none (dense, dense_1): `net/dense_1/...`, the run's
    # hidden layer, ends the path of the load's head. A first version
    # assigned it there (a reviewer); the next assigned nothing and said
    # so. Paired by rank in their scope, each layer gets its own values,
    # and its own Adam moments.
    kmp.enable("mixed_float16")
    keras.layers.Dense(1)
    directory = str(tmp_path / "ckpt")
    model = _trained(Square(), directory)
    keras.utils.clear_session()
    kmp.enable("mixed_float16")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        restored = kmp.load_model(directory)
    assert not [w for w in caught if "kmp.load_model" in str(w.message)]
    assert [v.path for v in restored.weights] == [
        "dense/kernel",
        "dense/bias",
        "dense_1/kernel",
        "dense_1/bias",
    ]
    _assert_same_state(restored, model)


@keras.saving.register_keras_serializable(package="kmp_tests")
class Square(keras.Model):
    """Two layers of one shape, named by Keras."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.hidden = keras.layers.Dense(4, activation="relu")
        self.head = keras.layers.Dense(4)

    def call(self, x):
        return self.head(self.hidden(x))[:, :2]


def test_keras_s_own_scaler_s_checkpoint_comes_back_whole(tmp_path):
    # Saved by stock Keras's scaler under mixed_float16, no kmp in the
    # run: on TensorFlow its slots are "loss_scale_optimizer/adam/..."
    # (defect 42), the load's "adam/..." (a reviewer: all lost).
    keras.config.set_dtype_policy("mixed_float16")
    x, y = _data()
    model = _sequential()
    model.compile(optimizer=keras.optimizers.Adam(name="adam"), loss="mse")
    directory = str(tmp_path / "ckpt")
    checkpoint = keras.callbacks.OrbaxCheckpoint(
        directory, save_on_background=False
    )
    model.fit(x, y, batch_size=16, verbose=0, callbacks=[checkpoint])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        restored = kmp.load_model(directory, policy="saved")
    assert not [w for w in caught if "kmp.load_model" in str(w.message)]
    assert type(restored.optimizer) is type(model.optimizer)
    _assert_same_state(restored, model)


def test_a_weights_only_checkpoint_says_how_to_load_it(tmp_path):
    kmp.enable("mixed_float16")
    x, y = _data()
    model = _sequential()
    model.compile(optimizer=kmp.wrap("sgd"), loss="mse")
    directory = str(tmp_path / "ckpt")
    checkpoint = kmp.callbacks.OrbaxCheckpoint(
        directory, save_weights_only=True, save_on_background=False
    )
    model.fit(x, y, verbose=0, callbacks=[checkpoint])
    with pytest.raises(
        kmp.InputError, match=r"model.load_weights\(directory\)"
    ):
        kmp.load_model(directory)


@keras.saving.register_keras_serializable(package="kmp_tests")
class TwoDense(keras.layers.Layer):
    """A layer that makes two layers in code, named by Keras."""

    def __init__(self, width=4, **kwargs):
        super().__init__(**kwargs)
        self.width = width
        self.first = keras.layers.Dense(width)
        self.second = keras.layers.Dense(4)

    def call(self, x):
        return self.second(self.first(x))

    def get_config(self):
        return {**super().get_config(), "width": self.width}


def _saved_in_another_session(model, tmp_path):
    """The directory of `model`'s checkpoint (`_trained`), Keras's names
    counted afresh after it, as in a new process."""
    directory = str(tmp_path / "ckpt")
    _trained(model, directory)
    keras.utils.clear_session()
    kmp.enable("mixed_float16")
    return directory


def _with_block(width):
    # The run names the block's layers dense_1 and dense_2 (the Dense
    # before it took "dense"); a load builds the outer layers from their
    # config's names, and the block's from "dense" again.
    inputs = keras.Input((4,))
    hidden = keras.layers.Dense(4)(inputs)
    outputs = TwoDense(width, name="block")(hidden)
    return keras.Model(inputs, keras.layers.Dense(2)(outputs))


def test_layers_keras_s_load_crosses_come_back_each_its_own(tmp_path):
    # Keras gives the load's block/dense_1 (the block's second layer)
    # the run's block/dense_1 (its first), and its Adam moments: no path
    # tells, and kmp said which restored weights were suspect (a
    # reviewer). By rank in the block, each gets its own.
    kmp.enable("mixed_float16")
    model = _with_block(4)
    directory = _saved_in_another_session(model, tmp_path)
    stock = keras.saving.load_model(directory).get_layer("block")
    assert stock.second.kernel.path == "block/dense_1/kernel"
    np.testing.assert_array_equal(
        *_numpy([stock.second.kernel, model.get_layer("block").first.kernel])
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        restored = kmp.load_model(directory)
    assert not [w for w in caught if "kmp.load_model" in str(w.message)]
    _assert_same_state(restored, model)


@keras.saving.register_keras_serializable(package="kmp_tests")
class BuiltAtOnce(keras.layers.Layer):
    """Builds its Dense as it is made: the Dense's variables sit at the
    root, beside the model's own layers."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.proj = keras.layers.Dense(6)
        self.proj.build((None, 6))

    def call(self, x):
        return self.proj(x)


@keras.saving.register_keras_serializable(package="kmp_tests")
class NamedLikeKeras(keras.layers.Layer):
    """A Dense named by Keras beside one its code names "dense_1"."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.auto = keras.layers.Dense(6)
        self.named = keras.layers.Dense(6, name="dense_1")

    def call(self, x):
        return self.named(self.auto(x))


@keras.saving.register_keras_serializable(package="kmp_tests")
class OneDense(keras.layers.Layer):
    """A Dense named by Keras, built in `call`: in the layer's scope."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.dense = keras.layers.Dense(6)

    def call(self, x):
        return self.dense(x)


def _config_name_made_up_elsewhere():
    """A second reviewer's: a Dense made before the hidden one and called
    after it (the run's `dense_1` after one Dense made before the model,
    6 x 6), BuiltAtOnce's Dense at the root beside it, and OneDense's,
    whose name the load makes up as `dense_1`: the config's string."""
    later = keras.layers.Dense(6)
    inputs = keras.Input((4,))
    hidden = later(keras.layers.Dense(6)(inputs))
    hidden = OneDense(name="block")(BuiltAtOnce(name="at_once")(hidden))
    return keras.Model(inputs, keras.layers.Dense(2)(hidden))


def _between_dense(block):
    """`block` made between two Dense layers."""
    inputs = keras.Input((4,))
    hidden = keras.layers.Dense(6)(inputs)
    hidden = block(name="block")(hidden)
    return keras.Model(inputs, keras.layers.Dense(2)(hidden))


@pytest.mark.parametrize(
    "build, before",
    [
        (lambda: _between_dense(BuiltAtOnce), 2),
        (lambda: _between_dense(NamedLikeKeras), 2),
        (_config_name_made_up_elsewhere, 1),
    ],
    ids=["built_at_once", "named_like_keras", "config_name_made_up"],
)
def test_names_keras_did_not_make_up_keep_their_place(tmp_path, build, before):
    # A reviewer's two cases, each in a run that made Dense layers before
    # its model: the root holds the config's dense_2 and dense_4 beside
    # BuiltAtOnce's (the run's dense_3, the load's dense); or the block
    # holds NamedLikeKeras's "dense_1", named in its code, beside the
    # Dense Keras named (the run's dense_2, the load's dense). Ranked with
    # the names Keras did not make up, two layers traded values,
    # silently, where Keras's load left one at its initial values. And a
    # second reviewer's: a name Keras made up in one place (OneDense's
    # dense_1) that is the config's own in another, told apart by the
    # layer that holds it.
    kmp.enable("mixed_float16")
    for _ in range(before):  # a notebook's layers, made before
        keras.layers.Dense(1)
    model = build()
    directory = _saved_in_another_session(model, tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        restored = kmp.load_model(directory)
    assert not [w for w in caught if "kmp.load_model" in str(w.message)]
    _assert_same_state(restored, model)
    keras.utils.clear_session()  # names counted afresh, as in a new process
    kmp.enable("mixed_float16")
    stock = keras.saving.load_model(directory)
    assert not all(
        np.array_equal(a, b)
        for a, b in zip(_numpy(stock.weights), _numpy(model.weights))
    )


@keras.saving.register_keras_serializable(package="kmp_tests")
class CountedBlock(keras.layers.Layer):
    """Layers named `dense_0`, `dense_1` in code, and one named by Keras."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.hidden = [keras.layers.Dense(6, name=f"dense_{i}") for i in (0, 1)]
        self.proj = keras.layers.Dense(6)

    def call(self, x):
        for layer in self.hidden:
            x = layer(x)
        return self.proj(x)


@keras.saving.register_keras_serializable(package="kmp_tests")
class CountedNet(keras.Model):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.block = CountedBlock(name="mlp")
        self.head = keras.layers.Dense(2)

    def call(self, x):
        return self.head(self.block(x))


def test_a_name_given_in_code_and_made_up_elsewhere_keeps_its_place(
    tmp_path,
):
    # A second reviewer's: the load makes up the head's `dense_1`, the
    # string of the block's own `dense_1`; the block's `dense` (the run's
    # `dense_4`) ranked beside it swapped the two, silently.
    kmp.enable("mixed_float16")
    keras.layers.Dense(1), keras.layers.Dense(1)
    model = CountedNet()
    directory = _saved_in_another_session(model, tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        restored = kmp.load_model(directory)
    assert not [w for w in caught if "kmp.load_model" in str(w.message)]
    _assert_same_state(restored, model)


@pytest.mark.parametrize(
    "width, lost",
    # Of width 8, the run's block/dense_1 (its first layer, 4 -> 8) meets
    # the load's second (8 -> 4): held back from Keras's assignment, and
    # counted as lost with the dropped ones, none restored beside them.
    [(4, "4 saved weights (first: 'block/dense_2/bias')"), (8, "6 saved")],
)
def test_what_no_variable_fits_is_said_in_one_line_each(tmp_path, width, lost):
    # The block's code made three layers in the run and makes two now:
    # ranks cannot pair every weight, so kmp assigns nothing more. It
    # says what was dropped (weights; the optimizer's values), and which
    # weights Keras restored beside them, by path, in the same scope.
    kmp.enable("mixed_float16")
    two = TwoDense.__init__, TwoDense.call

    def init(self, width=4, **kwargs):
        two[0](self, width, **kwargs)
        self.third = keras.layers.Dense(4)

    TwoDense.__init__ = init
    TwoDense.call = lambda self, x: self.third(two[1](self, x))
    try:
        directory = _saved_in_another_session(_with_block(width), tmp_path)
    finally:
        TwoDense.__init__, TwoDense.call = two
    with pytest.warns(UserWarning) as caught:
        kmp.load_model(directory)
    said = [
        str(w.message) for w in caught if "kmp.load_model" in str(w.message)
    ]
    assert lost in said[0]
    assert "initial values" in said[0] and "name=..." in said[0]
    if width == 4:
        assert "'block/dense_1/" in said[1]
        assert "may hold another layer's values" in said[1]
    assert "of the optimizer's saved values" in said[-1]
    assert 'policy="saved"' in said[-1]
    assert len(said) == (3 if width == 4 else 2), said


def test_layers_of_two_widths_keras_s_load_crosses_come_back_whole(tmp_path):
    # keras-io's TransformerBlock shape: the block's layers of two widths
    # swap names on load, and Keras's load raised its own ValueError from
    # `variable.assign`, no model back (then an InputError of kmp's).
    # The values of another shape are held back, and paired by rank.
    kmp.enable("mixed_float16")
    model = _with_block(8)
    directory = _saved_in_another_session(model, tmp_path)
    with pytest.raises(ValueError, match="variable.assign"):
        keras.saving.load_model(directory)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        restored = kmp.load_model(directory)
    assert not [w for w in caught if "kmp.load_model" in str(w.message)]
    _assert_same_state(restored, model)


@pytest.mark.slow
@jax_only
def test_keras_io_s_orbax_guide_s_layouts_under_kmp(tmp_path):
    # Its model parallel and cross-layout sections (tests/orbax_layouts.py):
    # trained with both kernels split over a 2 x 2 mesh, loaded with one.
    # A subclassed model: Keras's load gives back its initial weights,
    # kmp's the run's, in the new layout.
    out = run_script(
        "orbax_layouts.py", tmp_path / "ckpt", backend="jax", timeout=600
    )
    assert out["paths"][0] == "regressor/dense_1/kernel"
    assert not out["stock_weights_equal"]
    assert out["weights_equal"] and out["optimizer_equal"], out
    assert out["prediction_gap"] == 0.0
    assert out["loss_scale"] == 2.0**15
    assert out["said"] == []
    assert out["parts"] == {
        "dense_1/kernel": 1,
        "dense_1/bias": 1,
        "dense_2/kernel": 2,
        "dense_2/bias": 1,
    }
