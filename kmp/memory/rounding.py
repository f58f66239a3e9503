"""Stochastic rounding from float32 to bfloat16: the same bits on every
backend, drawn without any random state.

A bfloat16 is a float32 whose low 16 bits are zero. Rounding to nearest
drops an update smaller than half the gap between two bfloat16 values (a
weight of 1.0 ignores any step under 2**-9), so a run whose weights are
stored in bfloat16 stops learning once its updates get small (Zamirai et
al., "Revisiting BFloat16 Training", 2020). Rounding up with probability
equal to the dropped fraction keeps the expected value of every write:

    bits  = float32 bits of x                  (an int32)
    noise = uniform integer in [0, 2**16)
    y     = (bits + noise) with the low 16 bits cleared, as bfloat16

`bits + noise` carries into bit 16 exactly when `noise` is at least
`2**16 - (bits mod 2**16)`: with probability (bits mod 2**16) / 2**16, the
fraction rounding to nearest would have thrown away. The sign bit is
apart from the magnitude's bits, so negative numbers round the same way.

The noise is a hash of (seed, step, variable index, element index) in
32-bit integer arithmetic (`keras.ops`, wrapping on overflow: TensorFlow,
JAX and torch agree), not a draw from `keras.random`: nothing to save, to
restore or to keep equal across replicas (each replica hashes the same
numbers), and the same seed rounds the same way on all three backends.
On torch the operations are torch's own (`kmp.backend.integer_ops`: the
same bits, without eager `keras.ops`' cost per call).
"""

import math
import typing

import numpy as np

from kmp import backend

# Chris Wellons's "lowbias32" integer hash: multipliers found by search
# for the lowest bias of any 32-bit two-multiply hash.
_MULTIPLIERS = (0x7FEB352D, 0x846CA68B)
_GOLDEN = 0x9E3779B9  # spreads consecutive element indices apart


def _signed(constant):
    """A uint32 constant as the int32 with the same bits."""
    return constant - (1 << 32) if constant >= 1 << 31 else constant


def _shift_right(x, bits):
    # `right_shift` of an int32 copies the sign bit in; a hash needs zeros.
    ops = backend.integer_ops()
    return ops.bitwise_and(ops.right_shift(x, bits), (1 << (32 - bits)) - 1)


def hash32(x):
    """A bijective mix of int32 `x` (elementwise), as int32."""
    ops = backend.integer_ops()
    x = ops.bitwise_xor(x, _shift_right(x, 16))
    x = ops.multiply(x, _signed(_MULTIPLIERS[0]))
    x = ops.bitwise_xor(x, _shift_right(x, 15))
    x = ops.multiply(x, _signed(_MULTIPLIERS[1]))
    return ops.bitwise_xor(x, _shift_right(x, 16))


def _mixed(x):
    """`hash32` of one Python int, in Python (uint32 arithmetic)."""
    mask = 0xFFFFFFFF
    x &= mask
    x ^= x >> 16
    x = (x * _MULTIPLIERS[0]) & mask
    x ^= x >> 15
    x = (x * _MULTIPLIERS[1]) & mask
    return x ^ (x >> 16)


def _base(seed, index):
    """The part of a tensor's key fixed for a run, mixed in Python: fewer
    operations per write (each one a kernel of its own on eager torch)."""
    return _signed(_mixed(_mixed(seed) + index))


def _key(bases, step):
    """`hash32(base + step)`: the part of the noise's input a tensor's
    elements share, this step. `bases` a Python int, or an array of
    them (added as they are: no array made from the host per write)."""
    ops = backend.integer_ops()
    return hash32(ops.add(ops.cast(step, "int32"), bases))


def _noise(counter, key):
    """The top 16 bits of `hash32(counter * golden + key)`."""
    ops = backend.integer_ops()
    mixed = hash32(ops.add(ops.multiply(counter, _signed(_GOLDEN)), key))
    return _shift_right(mixed, 16)


def _size(shape):
    return math.prod(int(dim) for dim in shape)


def noise_bits(shape, seed, step, index):
    """Uniform integers in [0, 2**16) of `shape`, a function of its args.

    Args:
        shape: The shape of the tensor to round.
        seed: A Python int.
        step: The optimizer's step (a scalar tensor or int).
        index: The variable's index among the optimizer's variables (a
            Python int).
    """
    ops = backend.integer_ops()
    counter = ops.reshape(ops.arange(_size(shape), dtype="int32"), shape)
    return _noise(counter, _key(_base(seed, index), step))


def _rounded(x, noise):
    """float32 `x` with `noise` added to its bits, the low 16 cleared."""
    ops = backend.integer_ops()
    bits = ops.view(ops.cast(x, "float32"), "int32")
    rounded = ops.bitwise_and(ops.add(bits, noise), -(1 << 16))
    # The low 16 bits are zero: the cast is exact.
    return ops.cast(ops.view(rounded, "float32"), "bfloat16")


def stochastic_round(x, seed, step, index):
    """`x` rounded to bfloat16 stochastically (module doc), as bfloat16.

    Unbiased: the expected result is `x` (to float32's precision), and a
    value already in bfloat16 comes back unchanged.

    Args:
        x: A float tensor (computed in float32: it is cast first).
        seed: A Python int; the same seed, step and index give the same
            bits on every backend.
        step: The optimizer's step (a scalar tensor or int).
        index: The variable's index among the optimizer's variables.
    """
    ops = backend.integer_ops()
    return _rounded(x, noise_bits(ops.shape(x), seed, step, index))


class Layout(typing.NamedTuple):
    """What `stochastic_round_many` needs of the tensors it rounds that
    stays from step to step (`many_layout`): made once, its arrays where
    Keras puts arrays, so that a step copies nothing from the host."""

    shapes: list
    sizes: list  # elements in each tensor
    total: int  # elements in all
    cuts: list  # where the second tensor starts, the third, ...
    shifts: object  # int32 array: each tensor's start times the golden step
    bases: object  # int32 array: each tensor's fixed part of the key


def many_layout(shapes, seed, indices) -> Layout:
    """The `Layout` of tensors of `shapes`, the variables at `indices`
    of an optimizer rounding under `seed`."""
    ops = backend.integer_ops()
    sizes = [_size(shape) for shape in shapes]
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    return Layout(
        shapes=[tuple(shape) for shape in shapes],
        sizes=sizes,
        total=sum(sizes),
        cuts=starts[1:],
        shifts=ops.convert_to_tensor(
            [_signed((start * _GOLDEN) & 0xFFFFFFFF) for start in starts],
            "int32",
        ),
        bases=ops.convert_to_tensor(
            [_base(seed, index) for index in indices], "int32"
        ),
    )


def stochastic_round_many(tensors, seed, step, indices, layout=None):
    """`stochastic_round` of each of `tensors` (the same bits), in one
    pass over all of them: a fixed number of operations, where one tensor
    at a time takes some twenty each (a kernel each, on eager torch).

    Args:
        tensors: float tensors, at least one.
        seed: A Python int.
        step: The optimizer's step (a scalar tensor or int).
        indices: Each tensor's index among the optimizer's variables.
        layout: Their `many_layout(shapes, seed, indices)`, made once
            by a caller that rounds the same tensors every step; None:
            made here.

    Returns:
        The bfloat16 tensors, in order.
    """
    ops = backend.integer_ops()
    if layout is None:
        layout = many_layout([ops.shape(x) for x in tensors], seed, indices)
    flat = ops.concatenate(
        [ops.reshape(ops.cast(x, "float32"), (-1,)) for x in tensors]
    )
    rounded = _rounded(flat, many_noise(layout, step))
    pieces = ops.split(rounded, layout.cuts)
    return [ops.reshape(p, shape) for p, shape in zip(pieces, layout.shapes)]


def many_noise(layout, step):
    """`noise_bits` of each tensor of `layout` (`many_layout`), joined
    flat in one pass."""
    ops = backend.integer_ops()
    # The hash's input for element i of a tensor starting at `start` is
    # i * golden + key = position * golden + (key - start * golden),
    # wrapping: one number per tensor, repeated over its elements, and
    # no element has to find its tensor (a search and two gathers, which
    # cost this rounding more than its hash did on a CPU).
    offsets = ops.subtract(_key(layout.bases, step), layout.shifts)
    position = ops.arange(layout.total, dtype="int32")
    inputs = ops.add(
        ops.multiply(position, _signed(_GOLDEN)),
        # Host counts (NumPy: jnp.repeat refuses a list), static to XLA.
        ops.repeat(offsets, np.asarray(layout.sizes), axis=0),
    )
    return _shift_right(hash32(inputs), 16)
