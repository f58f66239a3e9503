"""Which Keras backend runs: the test every other module of
`kmp.backend` branches on."""

import keras


def name() -> str:
    """Returns the Keras backend name (`"tensorflow"`, `"jax"`, ...)."""
    return keras.backend.backend()


def is_stateless() -> bool:
    """Whether `fit` runs the optimizer through `stateless_apply`."""
    return name() == "jax"


def fit_calls_own_apply_gradients(optimizer) -> bool:
    """Whether Keras's `fit` would hand `optimizer` its gradients through
    an `apply_gradients` of its class's own: TensorFlow's `train_step`
    calls `apply_gradients` (JAX's runs `stateless_apply`, torch's
    `apply`), and a subclass may override it."""
    own = type(optimizer).apply_gradients
    return (
        name() == "tensorflow"
        and own is not keras.optimizers.Optimizer.apply_gradients
    )
