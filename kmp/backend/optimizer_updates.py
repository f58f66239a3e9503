"""How variables read: as float32, as stored, or in the dtype a layer's
call set (Keras's autocast), for `kmp.memory`'s 16-bit optimizer state,
whose storage is narrower than its arithmetic, and its
rematerialization, which must recompute in the layer's dtype.

    float32_reads       a scope in which every float variable reads as
                        float32 (Keras's `AutocastScope`)
    stored_reads        a scope in which variables read as stored: where
                        a write must reach the variable itself
    stored_dtype        the dtype a variable is stored in, in any scope
    reads_in_force      the scope in force now: entered again later, a
                        recomputation reads variables as the call did
    updates_per_replica whether the backend's optimizer applies each
                        variable's update through `tf.distribute`
                        (TensorFlow: `_distributed_tf_update_step`)
    outside_autograd    torch's `no_grad` (an optimizer's writes are not
                        part of the graph); nothing elsewhere

Keras exports no `AutocastScope`: it is imported here, once, from
`keras.src`. Two of its effects are why `stored_reads` exists: under a
float32 scope torch's `Variable.assign` copies into a cast copy (the
write is lost), and TensorFlow's optimizer keys a variable by
`variable.value._unique_id`, which a cast value lacks.
"""

import contextlib

from keras.backend import standardize_dtype
from keras.src.backend.common.variables import AutocastScope
from keras.src.backend.common.variables import get_autocast_scope

from kmp.backend._current import name


def float32_reads():
    """Every float variable reads as float32 inside this scope."""
    return AutocastScope("float32")


def stored_reads():
    """Variables read as stored (no autocast) inside this scope."""
    return AutocastScope(None)


def reads_in_force():
    """A scope that makes variables read as they read now (a layer's
    `__call__` sets Keras's autocast dtype for its own call only)."""
    scope = get_autocast_scope()
    return AutocastScope(scope.dtype if scope is not None else None)


def stored_dtype(variable) -> str:
    """The dtype `variable` is stored in (its `dtype` is the scope's)."""
    with stored_reads():
        return standardize_dtype(variable.value.dtype)


def updates_per_replica() -> bool:
    """Whether Keras's optimizer on this backend applies each variable's
    update through `tf.distribute` (its gradients all-reduced first)."""
    return name() == "tensorflow"


def outside_autograd():
    """torch's `no_grad()` on torch; a null context elsewhere."""
    if name() == "torch":
        import torch

        return torch.no_grad()
    return contextlib.nullcontext()
