"""The 16-bit update on eager torch, a group of variables at a time.

Keras's torch optimizers update every variable in one call
(`_parallel_update_step`: a `torch._foreach_*` kernel per operation over
all the tensors), in place, in each tensor's dtype. kmp's 16-bit modes
compute in float32 and round once, so they ran Keras's per-variable
`update_step` instead: on eager torch each of its operations, and each
of the rounding's twenty, a kernel and a Python call of its own (0.57x
float32's tokens/s with bfloat16 state, on a 2-core CPU). Here, for
each group of weights (at most `GROUP_ELEMENTS` of them):

    copies = float32 copies of the group's bfloat16 weights and slots,
             swapped in for their storage (backend.float32_working_copies)
    Keras's own weight decay and multi-tensor update, on the copies
             (8-bit slots dequantized for it: quantized_state.dequantized)
    storage back; each copy written rounded as `assign` rounds it, the
             stochastic ones in one pass (rounding.stochastic_round_many)

The result is the per-variable update's float32 arithmetic in the
kernels' order, each write rounded once, with the draws of the same
places (`tests/memory/grouped_update_test.py`). Not for Nadam: its torch
update also moves a product shared by all variables, once per call.
"""

import math
import typing

from keras import ops

from kmp import backend
from kmp.memory import quantized_state
from kmp.memory.rounding import many_layout
from kmp.memory.rounding import stochastic_round_many

# Keras's torch twins of these update any group of variables in one call.
GROUPED = ("Adam", "AdamW", "SGD", "Lion", "RMSprop", "Adamax")
# Elements of weights updated together. A group costs, on top of the
# stored state, float32 copies of its weights and slots, the update's
# temporaries and the rounding's (some 20 bytes an element of each):
# with Adam's two slots, about 250 MiB.
GROUP_ELEMENTS = 2**22
# Elements rounded stochastically in one pass (whole tensors; one larger
# tensor alone). The rounding's twenty integer operations each make a
# temporary the pass's size: on a 2-core CPU, with AdamW over 4.5M
# parameters, passes of 2**18-2**20 elements rounded 1.2-1.3x faster than
# passes of 2**22, whose temporaries left the cache
# (`benchmarks/optimizer_update.py --rounded_elements`). A GPU pays a
# launch per operation and pass instead: there larger passes should do
# better (unmeasured).
ROUNDED_ELEMENTS = 2**20


def groups(variables, elements):
    """Consecutive runs of `variables`' indices, each of at most
    `elements` elements (or one variable larger than that)."""
    return quantized_state.runs(
        [math.prod(int(dim) for dim in v.shape) for v in variables], elements
    )


class _Group(typing.NamedTuple):
    """One group's update, decided once per list of variables."""

    indices: list  # of the weights, in the list `apply` was given
    variables: list  # the weights
    widened: list  # their bfloat16 weights and slots
    decayed: list  # the weights whose decay is computed here
    # Runs of positions in `widened` rounded stochastically, each with
    # its `rounding.many_layout`.
    rounded: list


def _plan(optimizer, trainable_variables):
    """The groups of `trainable_variables`, made on the first step that
    updates them and kept: each step after only runs them (no host
    array to build, nothing found again)."""
    plans = optimizer.__dict__.setdefault("_group_plans", {})
    key = tuple(id(v) for v in trainable_variables)
    if key in plans:
        return plans[key]
    made = []
    for indices in groups(trainable_variables, GROUP_ELEMENTS):
        variables = [trainable_variables[i] for i in indices]
        widened = [
            v
            for weight in variables
            for v in optimizer._bfloat16_of.get(optimizer._var_key(weight), ())
        ]
        places = [optimizer._rounding_place(v) for v in widened]
        stochastic = [i for i, place in enumerate(places) if place is not None]
        rounded = [
            (
                [stochastic[j] for j in run],
                many_layout(
                    [tuple(widened[stochastic[j]].shape) for j in run],
                    optimizer._rounding_seed,
                    [places[stochastic[j]] for j in run],
                ),
            )
            for run in groups(
                [widened[i] for i in stochastic], ROUNDED_ELEMENTS
            )
        ]
        decayed = [
            v for v in variables if optimizer._stochastic_index(v) is not None
        ]
        made.append(_Group(indices, variables, widened, decayed, rounded))
    plans[key] = made
    return made


def update_in_groups(
    optimizer,
    grads,
    trainable_variables,
    learning_rate,
    stock_decay,
    stock_update,
):
    """Applies `grads` to `trainable_variables` a group at a time (module
    doc).

    Args:
        optimizer: A `kmp.memory` low-precision optimizer, built.
        grads: The gradients, one per variable.
        trainable_variables: The variables.
        learning_rate: The learning rate of this step.
        stock_decay: The stock class's `_apply_weight_decay`, bound.
        stock_update: The stock class's `_backend_update_step`, bound
            (torch's multi-tensor one).
    """
    for group in _plan(optimizer, trainable_variables):
        with backend.outside_autograd(), backend.stored_reads():
            with backend.float32_working_copies(group.widened) as copies:
                if optimizer.weight_decay is not None and group.decayed:
                    # In float32 here, rounded stochastically below (the
                    # optimizer's `_apply_weight_decay` left them out).
                    stock_decay(group.decayed)
                with quantized_state.dequantized(
                    optimizer, group.variables, pass_elements=ROUNDED_ELEMENTS
                ):
                    stock_update(
                        [ops.cast(grads[i], "float32") for i in group.indices],
                        group.variables,
                        learning_rate,
                    )
            _write_back(optimizer, group, copies)


def _write_back(optimizer, group, copies):
    """Each of the group's widened variables gets its float32 copy,
    rounded as the optimizer's `assign` rounds it, the stochastic ones
    in one pass."""
    values = list(copies)
    for positions, layout in group.rounded:
        rounded = stochastic_round_many(
            [values[i] for i in positions],
            optimizer._rounding_seed,
            optimizer.iterations,
            None,  # the layout holds the indices
            layout,
        )
        for i, value in zip(positions, rounded):
            values[i] = value
    with backend.stored_reads():  # the write reaches the variable
        for variable, value in zip(group.widened, values):
            variable.assign(value)  # to nearest, where not rounded
