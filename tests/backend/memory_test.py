"""`kmp.backend.memory`: bytes of weights and optimizer state, exact from
shapes and dtypes; a compiled train step's buffers from XLA's memory
analysis before anything runs (JAX)."""

import keras
import numpy as np
import pytest
from util import jax_only

import kmp
from kmp import backend


def _mlp(width=64):
    return keras.Sequential(
        [
            keras.Input((32,)),
            keras.layers.Dense(width, activation="relu"),
            keras.layers.Dense(10),
        ]
    )


def _compiled(optimizer, width=64):
    model = _mlp(width)
    model.compile(optimizer, "sparse_categorical_crossentropy")
    model.optimizer.build(model.trainable_variables)
    return model


PARAMETERS = 32 * 64 + 64 + 64 * 10 + 10  # 2762


def test_weights_and_adam_state_are_counted_exactly():
    model = _compiled(keras.optimizers.Adam())
    sizes = backend.state_bytes(model)
    assert sizes["weights"] == 4 * PARAMETERS
    # Adam: two float32 slots per weight, and its scalars (the iteration
    # count and the learning rate: 8 or 12 bytes as the backend types them).
    slots = 2 * 4 * PARAMETERS
    assert slots + 8 <= sizes["optimizer_state"] <= slots + 12


def test_mixed_precision_keeps_float32_masters_and_adds_the_scale():
    kmp.enable("mixed_float16")
    model = _compiled(kmp.wrap(keras.optimizers.Adam()))
    sizes = backend.state_bytes(model)
    assert sizes["weights"] == 4 * PARAMETERS  # float32 variables
    plain = _compiled(keras.optimizers.Adam())
    scaler = (
        sizes["optimizer_state"] - backend.state_bytes(plain)["optimizer_state"]
    )
    assert 0 < scaler <= 64  # a few scalars: the scale, its counters


def test_a_shared_variable_counts_once_and_16_bit_dtypes_count_two_bytes():
    half = keras.Variable(np.zeros((3, 5)), dtype="bfloat16")
    single = keras.Variable(np.zeros(7), dtype="float32")
    assert backend.variable_bytes([half, single, half]) == 3 * 5 * 2 + 7 * 4


def test_an_optimizer_not_built_holds_nothing_yet():
    model = _mlp()
    model.compile("adam", "mse")
    assert backend.state_bytes(model)["optimizer_state"] == 0


@jax_only
def test_the_step_s_buffers_are_known_before_it_runs():
    model = _mlp(width=256)
    crossentropy = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile(keras.optimizers.Adam(), crossentropy)
    x = np.random.default_rng(0).random((4, 32)).astype("float32")
    y = np.zeros((4,), "int32")
    small = backend.train_step_memory(model, x, y, batch_size=16)
    large = backend.train_step_memory(model, x, y, batch_size=4096)
    assert model.optimizer.iterations.numpy() == 0  # nothing ran
    state = sum(backend.state_bytes(model).values())
    for sizes in (small, large):
        # The state goes in and comes out (donated: aliased, counted once).
        assert sizes["argument"] >= state and sizes["alias"] >= state
        assert sizes["footprint"] == (
            sizes["argument"] + sizes["output"] - sizes["alias"] + sizes["temp"]
        )
    # A batch of 4096 rows of 32 float32 inputs and 256 activations costs
    # more than one of 16.
    grown = large["footprint"] - small["footprint"]
    assert grown >= (4096 - 16) * (32 + 256) * 4
    history = model.fit(x, y, epochs=1, verbose=0)  # still trains
    assert np.isfinite(history.history["loss"][0])


@pytest.mark.skipif(
    keras.backend.backend() == "jax", reason="JAX has the analysis"
)
def test_other_backends_have_no_analysis_before_a_step():
    model = _compiled(keras.optimizers.SGD())
    x = np.zeros((4, 32), "float32")
    assert backend.train_step_memory(model, x, np.zeros(4), 8) is None
