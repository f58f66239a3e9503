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
    integer_ops         the integer operations stochastic rounding runs:
                        `keras.ops`, on torch torch's own (`_torch_int_ops`)
    updates_in_groups   whether the stock update can run on many variables
                        at once, over float32 copies (torch's multi-tensor
                        kernels, outside a stateless scope)
    float32_working_copies  a scope in which variables are stored in
                        float32 copies of themselves (torch)
    optimizer_class     the class Keras makes for a stock optimizer class
                        (torch: its twin with the multi-tensor update)
    ordered_after       values XLA may not compute from before another
                        exists (JAX's optimization barrier; as they are
                        elsewhere): an 8-bit slot's dequantization waits
                        for its gradient

Keras exports no `AutocastScope` nor `in_stateless_scope`: they are
imported here, once, from `keras.src`, and here alone is the torch
variable's storage (`_value`) reached, which `float32_working_copies`
swaps. Two effects of `AutocastScope` are why `stored_reads` exists:
under a float32 scope torch's `Variable.assign` copies into a cast copy (the
write is lost), and TensorFlow's optimizer keys a variable by
`variable.value._unique_id`, which a cast value lacks.
"""

import contextlib

import keras
from keras import ops
from keras.backend import standardize_dtype
from keras.src.backend.common.stateless_scope import in_stateless_scope
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
    if not isinstance(variable, keras.Variable):
        # A framework's own (a `tf.Variable`, which Keras's optimizers
        # take on TensorFlow: keras-io's style transfer optimizes one):
        # no autocast, and `value` is a method.
        return standardize_dtype(variable.dtype)
    with stored_reads():
        return standardize_dtype(variable.value.dtype)


def ordered_after(values, after):
    """`values` (a structure of tensors), as values XLA computes nothing
    from before `after` exists: JAX's `optimization_barrier` over both;
    `values` as they are elsewhere.

    Without it XLA is free to hoist work on `values` that does not need
    `after` (an 8-bit slot's dequantization needs only the slot, not the
    gradient) to the start of the step, where its float32 result then
    lives through the whole backward pass.
    """
    if name() != "jax":
        return values
    import jax

    # Keras variables in `values` as their arrays (a pytree's leaves).
    values = jax.tree.map(ops.convert_to_tensor, values)
    return jax.lax.optimization_barrier((values, after))[0]


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


def integer_ops():
    """The module whose operations `kmp.memory.rounding` runs: `keras.ops`,
    or on torch the same names in torch's own calls (`_torch_int_ops`:
    Keras's make a tensor of every Python constant, per call)."""
    if name() == "torch":
        from kmp.backend import _torch_int_ops

        return _torch_int_ops
    return ops


def updates_in_groups() -> bool:
    """Whether Keras's optimizer here updates many variables in one call
    (torch's `_parallel_update_step`: a multi-tensor kernel per operation
    over all of them) that kmp can run on `float32_working_copies`.

    Not in a stateless scope: there a variable reads the scope's value,
    not its storage.
    """
    return name() == "torch" and not in_stateless_scope()


@contextlib.contextmanager
def float32_working_copies(variables):
    """Stores each of `variables` in a float32 copy of itself for the
    scope; yields the copies.

    Keras's torch optimizers update `variable.value` in place (the
    `_foreach_*_` kernels): inside this scope the update lands in the
    float32 copy, computed in float32 and not rounded after each
    operation. On exit each variable has its own storage back, unchanged:
    the caller writes the copies back, rounded once.
    """
    if name() != "torch":
        raise NotImplementedError(
            "float32_working_copies swaps torch storage; on "
            f"{name()} the optimizer reads variables as float32 instead "
            "(float32_reads)."
        )
    import torch

    stored = [v._value for v in variables]
    copies = [s.detach().to(torch.float32, copy=True) for s in stored]
    try:
        for variable, copy in zip(variables, copies):
            variable._value = copy
        yield copies
    finally:
        for variable, value in zip(variables, stored):
            variable._value = value


def optimizer_class(stock):
    """The class of the object `stock(...)` makes: on torch, the twin
    `TorchOptimizer.__new__` picks for Keras's own classes (with the
    multi-tensor `_parallel_update_step`; `__new__` alone builds
    nothing); elsewhere `stock` itself."""
    if name() == "torch":
        return type(stock.__new__(stock))
    return stock
