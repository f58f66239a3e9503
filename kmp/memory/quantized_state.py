"""8-bit optimizer state: each slot of a block or more stored in
`kmp.memory.block_codes` (int8 codes, a float32 scale a block: about a
byte an element), dequantized to float32 for the update and requantized
once a step, stochastically.

A slot is three variables (`Slot`): `codes` and `scales`, which the
optimizer tracks, saves and maps into a stateless step, and `working`,
a float32 variable the stock `update_step` reads and writes, which holds
storage only inside `dequantized`. A slot of fewer elements than a
block stays float32 (biases, norms: a few bytes).

Each requantization draws its noise from `kmp.memory.rounding`'s hash
of (seed, step, the codes' place among the optimizer's variables,
element): every replica and process draws the same bits, and nothing
is saved for it.
"""

import contextlib
import math
import typing

import keras

from kmp import backend
from kmp.memory import rounding
from kmp.memory.block_codes import BLOCK
from kmp.memory.block_codes import dequantize
from kmp.memory.block_codes import dequantize_many
from kmp.memory.block_codes import padded_size
from kmp.memory.block_codes import quantize
from kmp.memory.block_codes import quantize_many

# The slots of the optimizers 8-bit state is offered for, and which map
# each takes: signed (a first moment, a momentum) or not (a second
# moment, its running maximum).
SIGNED = {"momentum": True, "velocity": False, "velocity_hat": False}
OPTIMIZERS = ("Adam", "AdamW", "Lion", "SGD")


def quantizes(shape, name) -> bool:
    """Whether a slot `name` of this shape is stored in 8 bits: a slot
    8-bit state knows, of at least a block's elements."""
    size = math.prod(int(dim) for dim in shape)
    return name in SIGNED and size >= BLOCK


class Slot(typing.NamedTuple):
    """A slot stored in 8 bits: what the optimizer's `update_step` sees
    (`working`: a float32 variable that holds storage only during an
    update) and the variables that hold it (`codes`, `scales`)."""

    working: keras.Variable
    codes: keras.Variable
    scales: keras.Variable
    signed: bool


def add_slot(optimizer, shape, initializer, name, layout, signed):
    """Makes an 8-bit slot of `optimizer` named `name`: its codes and
    scales through `add_variable` (tracked, saved), its working variable
    apart (untracked); returns the working variable, which Keras's
    `build` keeps where it keeps the slot."""
    start = keras.initializers.get(initializer)

    def first(part):
        # The first codes or scales, computed where Keras runs the
        # initializer, not here: under a stateless scope it runs later
        # (a deferred start), and on TensorFlow outside the trace the
        # slot may be made in (Keras 3.16 builds an optimizer inside the
        # traced step), where this trace's tensors are out of scope.
        # Both calls quantize the same start: slots start from a
        # constant (Keras's from zeros).
        def initializer(shape_, dtype):
            return quantize(start(shape, dtype="float32"), signed)[part]

        return initializer

    codes = optimizer.add_variable(
        shape=shape,
        initializer=first(0),
        dtype="int8",
        layout=layout,
        name=f"{name}_codes",
    )
    scales = optimizer.add_variable(
        shape=(padded_size(shape) // BLOCK,),
        initializer=first(1),
        dtype="float32",
        name=f"{name}_scales",
    )
    # No storage of its own but an empty array: a float32 copy of the
    # slot exists only inside `dequantized`.
    # An initializer, not a value: inside a stateless scope (kmp's JAX
    # start, `kmp.backend.initialized_together`) Keras defers it.
    working = keras.Variable(
        "zeros",
        shape=(0,),
        dtype="float32",
        trainable=False,
        autocast=False,
        name=name,
    )
    slot = Slot(working, codes, scales, signed)
    optimizer.__dict__.setdefault("_quantized", {})[id(working)] = slot
    return working


def untrack_working(optimizer):
    """Takes the working variables off `optimizer.variables` (Keras
    tracks every variable an optimizer's attribute holds): what is saved,
    counted and mapped into a stateless step is the codes and scales."""
    for slot in optimizer.__dict__.get("_quantized", {}).values():
        optimizer._tracker.untrack(slot.working)


def slots_of(optimizer, weights):
    """The 8-bit slots of `weights` (the optimizer's `_made_from`)."""
    quantized = optimizer.__dict__.get("_quantized", {})
    made_from = optimizer.__dict__.get("_made_from", {})
    return [
        quantized[id(made)]
        for weight in weights
        for made in made_from.get(optimizer._var_key(weight), ())
        if id(made) in quantized
    ]


def is_working(optimizer, variable) -> bool:
    """Whether `variable` is the working variable of an 8-bit slot."""
    return id(variable) in optimizer.__dict__.get("_quantized", {})


def hold(working, value):
    """Makes `working` read as `value` (float32). Keras reads a
    variable's storage (`_value`) where no stateless scope maps it; the
    optimizer's `assign` writes 8-bit slots here, never through Keras's
    `assign` (whose shape is the empty array's)."""
    working._value = value


@contextlib.contextmanager
def dequantized(optimizer, weights, after=None, pass_elements=None):
    """A scope in which the 8-bit slots of `weights` read as float32 (the
    stock `update_step` reads and writes them); on exit each is
    requantized, rounded stochastically, into its codes and scales.

    Args:
        optimizer: The 8-bit optimizer.
        weights: The weights whose slots to dequantize.
        after: The gradients: dequantized once they exist, not earlier
            (`kmp.backend.ordered_after`); None: no order asked.
        pass_elements: None: a slot at a time (a compiled step fuses
            each). A number: slots of one map at once, in passes of up
            to that many elements (`_passes`), the same bits in a fixed
            number of operations a pass (eager torch: a kernel each).
    """
    slots = slots_of(optimizer, weights)
    empty = [slot.working._value for slot in slots]
    passes = _passes(optimizer, slots, pass_elements)
    try:
        with backend.stored_reads():
            for run, layout in passes:
                codes = [slot.codes.value for slot in run]
                scales = [slot.scales.value for slot in run]
                if after is not None:
                    codes, scales = backend.ordered_after(
                        (codes, scales), after
                    )
                signed = run[0].signed
                if layout is None:
                    values = [dequantize(codes[0], scales[0], signed)]
                else:
                    values = dequantize_many(codes, scales, signed)
                for slot, value in zip(run, values):
                    hold(slot.working, value)
        yield
        with backend.stored_reads():
            for run, layout in passes:
                _store(optimizer, run, layout)
    finally:
        for slot, value in zip(slots, empty):
            hold(slot.working, value)


def _passes(optimizer, slots, pass_elements):
    """`[(slots, layout)]`: `slots` a slot at a time, or (with a number
    of elements) runs of slots of one map, each with the
    `rounding.many_layout` of its codes' draws, made once and kept."""
    if pass_elements is None:
        return [([slot], None) for slot in slots]
    kept = optimizer.__dict__.setdefault("_quantized_passes", {})
    key = (pass_elements, *(id(slot.codes) for slot in slots))
    if key in kept:
        return kept[key]
    passes = []
    for signed in (True, False):
        alike = [slot for slot in slots if slot.signed == signed]
        padded = [padded_size(slot.codes.shape) for slot in alike]
        for run in runs(padded, pass_elements):
            passes.append(
                (
                    [alike[i] for i in run],
                    rounding.many_layout(
                        [(padded[i],) for i in run],
                        optimizer._rounding_seed,
                        [_place(optimizer, alike[i]) for i in run],
                    ),
                )
            )
    kept[key] = passes
    return passes


def runs(sizes, elements):
    """Consecutive runs of indices into `sizes` (element counts), each
    of at most `elements` elements (or one larger size alone)."""
    run, total = [], 0
    for i, size in enumerate(sizes):
        if run and total + size > elements:
            yield run
            run, total = [], 0
        run.append(i)
        total += size
    if run:
        yield run


def _store(optimizer, slots, layout):
    """Requantizes `slots` (of one map) from their working values: one
    alone (`layout` None) or all in one pass (their `_passes` layout)."""
    values = [slot.working.value for slot in slots]
    # The draws once the new values exist, not hoisted to the step's
    # start (`kmp.backend.ordered_after`).
    step = backend.ordered_after(optimizer.iterations, values)
    if layout is None:
        (slot,) = slots
        size = padded_size(slot.codes.shape)
        noise = rounding.noise_bits(
            (size,), optimizer._rounding_seed, step, _place(optimizer, slot)
        )
        quantized = [quantize(values[0], slot.signed, noise)]
    else:
        noise = rounding.many_noise(layout, step)
        quantized = quantize_many(values, slots[0].signed, noise)
    for slot, (codes, scales) in zip(slots, quantized):
        slot.codes.assign(codes)
        slot.scales.assign(scales)


def _place(optimizer, slot):
    """The index the slot's draws hash: after the trainable variables,
    its codes' place among the optimizer's variables."""
    return len(optimizer._trainable_variables) + _index(optimizer, slot)


def _index(optimizer, slot):
    """The codes' place among the optimizer's variables (its draws')."""
    places = optimizer.__dict__.setdefault("_quantized_places", {})
    if id(slot.codes) not in places:
        for i, variable in enumerate(optimizer.variables):
            places[id(variable)] = i
    return places[id(slot.codes)]
