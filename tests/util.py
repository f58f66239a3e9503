"""Helpers shared by the tests."""

import keras
import numpy as np
import pytest

from kmp import backend

tf_only = pytest.mark.skipif(
    backend.name() != "tensorflow", reason="TensorFlow backend only"
)
jax_only = pytest.mark.skipif(
    backend.name() != "jax", reason="JAX backend only"
)


def classification_data(n=256, features=8, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, features)).astype("float32")
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).astype("int32")
    return x, y


def mlp(features=8, units=16, seed=0):
    """A small classifier whose output softmax is float32."""
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [
            keras.Input((features,)),
            keras.layers.Dense(units, activation="relu"),
            keras.layers.Dense(2),
            keras.layers.Activation("softmax", dtype="float32"),
        ]
    )
