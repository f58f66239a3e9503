"""`kmp.backend.initialized_together`: one compiled program for every new
variable's first value on JAX, each value Keras's own to within one unit
in the last place of its tensor's largest, and the same on every run."""

import logging
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
from util import HERE
from util import jax_only
from util import small_imdb_config

from kmp import backend
from kmp.examples import cifar10
from kmp.examples import imdb


def many_initializers():
    """A model with Keras's initializers of every kind: uniform, normal,
    truncated normal, orthogonal, constant, ones and zeros."""
    inputs = keras.Input((6, 8))
    x = keras.layers.LSTM(8, return_sequences=True)(inputs)  # orthogonal
    x = keras.layers.Dense(16, kernel_initializer="he_normal")(x)
    x = keras.layers.Dense(
        16,
        kernel_initializer=keras.initializers.RandomNormal(seed=3),
        bias_initializer=keras.initializers.Constant(0.5),
    )(x)
    x = keras.layers.LayerNormalization()(x)
    x = keras.layers.Dense(4, kernel_initializer="lecun_normal")(x)
    return keras.Model(inputs, x)


def small_imdb():
    return imdb.build_model(small_imdb_config())


BUILDERS = {
    "resnet9": lambda: cifar10.build_model(8),
    "encoder": small_imdb,
    "initializers": many_initializers,
}


def weights(build, together):
    keras.utils.set_random_seed(0)
    if together:
        with backend.initialized_together():
            model = build()
    else:
        model = build()
    return model, [np.asarray(w) for w in model.weights]


BUILDERS["resnet9 width 16"] = lambda: cifar10.build_model(16)


def built_in_a_fresh_process(*runs):
    """Builds each `(mode, out)` of `runs` in turn in one new process (the
    first in a fresh one); returns their values."""
    subprocess.run(
        [sys.executable, os.path.join(HERE, "initial_values.py")]
        + [str(arg) for run in runs for arg in run],
        check=True,
        capture_output=True,
        env=dict(os.environ, KERAS_BACKEND="jax"),
    )
    return [np.load(out) for _, out in runs]


@pytest.mark.slow
@jax_only
def test_values_are_keras_own_to_one_unit_and_the_same_every_run(tmp_path):
    # Keras's own and the block's each first in a fresh process, as `kmp
    # train` starts; the block's second run follows Keras's in its process
    # (two processes, not three: one process start less), and
    # must equal the fresh run to the bit.
    keras_own, again = built_in_a_fresh_process(
        ("keras", tmp_path / "keras.npz"), ("together", tmp_path / "2.npz")
    )
    (together,) = built_in_a_fresh_process(("together", tmp_path / "1.npz"))
    assert sorted(keras_own.files) == sorted(together.files)
    assert sorted(again.files) == sorted(together.files)
    assert len(keras_own.files) > 100
    for name in keras_own.files:
        a, b = keras_own[name], together[name]
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert b.tobytes() == again[name].tobytes(), name  # every run alike
        if a.dtype != np.float32 or not a.size:
            assert a.tobytes() == b.tobytes(), name
            continue
        unit = np.spacing(np.abs(a).max())  # of the tensor's largest value
        assert np.abs(a - b).max() <= unit, name


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_the_block_builds_every_model_with_values(name):
    model, values = weights(BUILDERS[name], together=True)
    assert len(values) == len(model.weights) > 0
    assert all(np.isfinite(v).all() for v in values)


@jax_only
def test_one_program_compiles_where_keras_compiles_one_per_shape(caplog):
    import jax

    def compiled(together):
        jax.clear_caches()
        caplog.clear()
        with jax.log_compiles(), caplog.at_level(logging.WARNING):
            weights(BUILDERS["resnet9"], together)
        return [
            r.getMessage()
            for r in caplog.records
            if "Finished XLA compilation" in r.getMessage()
        ]

    keras_own, together = compiled(False), compiled(True)
    assert len(keras_own) >= 8  # a program per initializer and shape
    assert len(together) == 1, together


@jax_only
def test_a_failed_build_leaves_no_variable_waiting():
    from keras.src.backend.common import global_state

    with pytest.raises(RuntimeError, match="mid-build"):
        with backend.initialized_together():
            layer = keras.layers.Dense(3)
            layer.build((None, 2))
            raise RuntimeError("mid-build")
    assert not global_state.get_global_attribute("uninitialized_variables")
    assert layer.kernel.numpy().shape == (2, 3)  # Keras's value, given


def test_the_optimizer_s_slots_too():
    model = many_initializers()
    optimizer = keras.optimizers.Adam()
    with backend.initialized_together():
        optimizer.build(model.trainable_variables)
    assert all(
        float(np.abs(v.numpy()).sum()) == 0 for v in optimizer.variables[2:]
    )
    assert int(optimizer.iterations.numpy()) == 0
