"""Which Keras backend runs, and whether its layers are Flax NNX
modules: the tests every other module of `kmp.backend` branches on."""

import keras


def name() -> str:
    """Returns the Keras backend name (`"tensorflow"`, `"jax"`, ...)."""
    return keras.backend.backend()


def is_stateless() -> bool:
    """Whether `fit` runs the optimizer through `stateless_apply`."""
    return name() == "jax"


def is_nnx() -> bool:
    """Whether Keras's layers are Flax NNX modules (JAX, with
    `KERAS_NNX_ENABLED=true` when Keras was imported). NNX's transforms
    (`nnx.jit`, `nnx.grad`) then run a copy of a model, and Keras's
    compiled `fit` calls the class's `train_step`, not the instance's."""
    return name() == "jax" and keras.config.is_nnx_enabled()
