"""The loss scaler's ops where a backend needs its own: the skip branch,
the fused check-and-unscale, and copies for a stateless update.

XLA fuses and branches well on TensorFlow and JAX, so these are Keras's
own ops there. Keras runs torch eagerly, op by op, where each costs a
kernel or a host sync; `_torch_step` holds torch's bodies (BUILD_NOTES,
defects 19-22).
"""

from typing import Callable

from keras import ops

from kmp.backend._current import name


def cond(pred, true_fn: Callable, false_fn: Callable):
    """`keras.ops.cond`; on torch a Python `if` on the tensor, without
    the operation `ops.cond` builds per call (`kmp.backend._torch_step.cond`
    says why: torch.compile recompiles for each one)."""
    if name() != "torch":
        return ops.cond(pred, true_fn, false_fn)
    from kmp.backend import _torch_step

    return _torch_step.cond(pred, true_fn, false_fn)


def fused_unscale(grads: list, scale):
    """`(grads / scale, all finite)`, `None`s kept, in one fused kernel on
    torch (`kmp.backend._torch_step.fused_unscale`); `None` elsewhere (XLA fuses
    the stock ops itself) and on torch devices the kernel does not serve.
    """
    if name() != "torch":
        return None
    from kmp.backend import _torch_step

    return _torch_step.fused_unscale(grads, scale)


def own_values(values: list) -> list:
    """`values`, as tensors a stateless update may change in place: on
    torch, copies (`kmp.backend._torch_step.own_values`); elsewhere arrays are
    immutable and `values` is returned as it is."""
    if name() != "torch":
        return values
    from kmp.backend import _torch_step

    return _torch_step.own_values(values)


def held_by_the_step(variable) -> bool:
    """Whether a read of `variable` here has no value of its own: JAX,
    outside a `StatelessScope`, while Keras's `fit` holds the value in its
    step's state (it empties the variable for the epoch,
    `_purge_model_variables`, and a read gives a `TypeError` naming
    nothing). Never on TensorFlow and torch, whose variables are their
    values."""
    if name() != "jax":
        return False
    from keras.src.backend.common.stateless_scope import in_stateless_scope

    return not in_stateless_scope() and variable._value is None
