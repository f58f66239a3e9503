"""The integer operations of stochastic rounding (`kmp.backend.integer_ops`):
on torch, `kmp.backend._torch_int_ops`, whose every function gives what
`keras.ops`' function of the same name gives, bit for bit; elsewhere
`keras.ops` itself."""

import hypothesis
import keras
import numpy as np
from hypothesis import strategies as st
from keras import ops

from kmp import backend

_INT32 = st.integers(-(2**31), 2**31 - 1)


def _same(a, b):
    a, b = ops.convert_to_numpy(a), ops.convert_to_numpy(b)
    assert a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_array_equal(a, b)


def test_the_operations_are_keras_s_off_torch():
    if backend.name() != "torch":
        assert backend.integer_ops() is ops
    else:
        assert backend.integer_ops() is not ops


@hypothesis.settings(max_examples=30, deadline=None)
@hypothesis.given(st.lists(_INT32, min_size=1, max_size=8), _INT32)
def test_each_operation_is_keras_s_bit_for_bit(values, constant):
    own = backend.integer_ops()
    x = ops.convert_to_tensor(np.array(values, "int32"))
    for name in ("add", "subtract", "multiply", "bitwise_and", "bitwise_xor"):
        _same(getattr(own, name)(x, constant), getattr(ops, name)(x, constant))
        _same(getattr(own, name)(x, x), getattr(ops, name)(x, x))
    for shift in (0, 15, 16, 31):
        _same(own.right_shift(x, shift), ops.right_shift(x, shift))
    _same(own.view(own.view(x, "float32"), "int32"), x)
    _same(own.cast(x, "float32"), ops.cast(x, "float32"))
    assert own.shape(x) == tuple(ops.shape(x))


def test_arrays_are_made_repeated_split_and_joined_as_keras_makes_them():
    own = backend.integer_ops()
    _same(own.arange(6, dtype="int32"), ops.arange(6, dtype="int32"))
    _same(
        own.convert_to_tensor([1, 2], "int32"),
        ops.convert_to_tensor([1, 2], "int32"),
    )
    x = ops.arange(6, dtype="int32")
    _same(own.reshape(x, (2, 3)), ops.reshape(x, (2, 3)))
    offsets = ops.convert_to_tensor([7, -8, 9, 2**31 - 1], "int32")
    for repeats in ([2, 0, 3, 1], [1, 1, 1, 1], [0, 0, 0, 5]):
        _same(
            own.repeat(offsets, np.array(repeats), axis=0),
            ops.repeat(offsets, np.array(repeats), axis=0),
        )
    _same(own.concatenate([x, x]), ops.concatenate([x, x]))
    for a, b in zip(own.split(x, [1, 4]), ops.split(x, [1, 4])):
        _same(a, b)
    # A Keras variable (the optimizer's step) reads as its value.
    step = keras.Variable(5, dtype="int64", trainable=False)
    _same(own.cast(step, "int32"), ops.cast(step, "int32"))
