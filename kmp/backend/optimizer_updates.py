"""How an optimizer's update reads and writes variables whose storage is
narrower than its arithmetic (`kmp.memory`'s 16-bit optimizer state).

    float32_reads       a scope in which every float variable reads as
                        float32 (Keras's `AutocastScope`)
    stored_reads        a scope in which variables read as stored: where
                        a write must reach the variable itself
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

from keras.src.backend.common.variables import AutocastScope

from kmp.backend._current import name


def float32_reads():
    """Every float variable reads as float32 inside this scope."""
    return AutocastScope("float32")


def stored_reads():
    """Variables read as stored (no autocast) inside this scope."""
    return AutocastScope(None)


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
