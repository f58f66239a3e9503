"""Which Keras backend runs: the test every other module of
`kmp.backend` branches on."""

import keras


def name() -> str:
    """Returns the Keras backend name (`"tensorflow"`, `"jax"`, ...)."""
    return keras.backend.backend()


def is_stateless() -> bool:
    """Whether `fit` runs the optimizer through `stateless_apply`."""
    return name() == "jax"


def fit_calls_apply_gradients() -> bool:
    """Whether Keras's `fit` hands a plain optimizer its gradients through
    `apply_gradients` (TensorFlow's `train_step`), which a subclass may
    override; JAX's runs `stateless_apply`, torch's `apply`."""
    return name() == "tensorflow"
