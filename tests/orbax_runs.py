"""A short run under a loss scaler with Keras's Orbax checkpoints, its
first steps skipped: kmp's `OrbaxCheckpoint` tests and stock Keras's
(`stock_keras_test`)."""

import os

import keras
import numpy as np

import kmp


def _data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(160, 16)).astype("float32")
    return x, rng.integers(0, 5, 160)


def compiled_model(scaler=kmp.LossScaleOptimizer):
    """A small classifier under kmp's scaler (or `scaler`), its first
    steps skipped: an initial scale of 2**24 overflows float16's
    gradients."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((16,))
    hidden = keras.layers.Dense(32, activation="relu")(inputs)
    outputs = keras.layers.Dense(5, activation="softmax", dtype="float32")
    model = keras.Model(inputs, outputs(hidden))
    model.compile(
        optimizer=scaler(keras.optimizers.Adam(1e-3), initial_scale=2.0**24),
        loss="sparse_categorical_crossentropy",
    )
    return model


def fit(model, batches, directory, callback=kmp.callbacks.OrbaxCheckpoint):
    x, y = _data()
    checkpoint = callback(
        directory, save_freq=2, max_to_keep=3, save_on_background=False
    )
    return model.fit(
        x[: 16 * batches],
        y[: 16 * batches],
        batch_size=16,
        shuffle=False,
        verbose=0,
        callbacks=[checkpoint],
    )


def steps(directory):
    return sorted(int(name) for name in os.listdir(directory) if name.isdigit())
