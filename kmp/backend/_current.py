"""Which Keras backend runs: the test every other module of
`kmp.backend` branches on."""

import keras


def name() -> str:
    """Returns the Keras backend name (`"tensorflow"`, `"jax"`, ...)."""
    return keras.backend.backend()


def is_stateless() -> bool:
    """Whether `fit` runs the optimizer through `stateless_apply`."""
    return name() == "jax"
