"""The integer operations of `kmp.memory.rounding` in torch's own calls,
under `keras.ops`'s names and with its results; this module branches on
nothing (`kmp.backend.integer_ops` picks it on torch).

Keras's torch ops turn each Python constant into a tensor, on every
call, and run eagerly: a stochastic write is about twenty of them (a
hash of the element index), for every bfloat16 weight and slot, every
step. The same operations through torch directly take a constant as a
scalar (BUILD_NOTES, "The 16-bit update on eager torch"). The rounding
tests check these bits against the reference on every backend, so
torch still draws what TensorFlow and JAX draw.
"""

import torch
from keras import ops


def convert_to_tensor(x, dtype=None):
    if not isinstance(x, torch.Tensor):
        # A Python number, a NumPy array or a Keras variable: Keras puts
        # it on its device.
        return ops.convert_to_tensor(x, dtype)
    return x if dtype is None else cast(x, dtype)


def cast(x, dtype):
    return convert_to_tensor(x).to(getattr(torch, dtype))


def view(x, dtype):
    return convert_to_tensor(x).view(getattr(torch, dtype))


def shape(x):
    return tuple(convert_to_tensor(x).shape)


def reshape(x, new_shape):
    return x.reshape(tuple(new_shape))


def arange(size, dtype):
    return ops.arange(size, dtype=dtype)  # on Keras's device


def subtract(x, y):
    return torch.sub(x, y)


def repeat(x, repeats, axis):
    """1-D `x`'s elements, each `repeats[i]` times (a list of Python
    ints): joined from views, so torch needs no output size from the
    device and gathers nothing (`torch.repeat_interleave` with a tensor
    of repeats does both, or reads the size back)."""
    if axis != 0 or len(shape(x)) != 1:
        raise ValueError(
            f"repeat here takes a 1-D tensor along axis 0; got shape "
            f"{shape(x)} and axis={axis}."
        )
    return torch.cat([x[i].expand(n) for i, n in enumerate(repeats)])


def concatenate(xs):
    return torch.cat(xs)


def split(x, indices):
    return torch.tensor_split(x, list(indices))


def add(x, y):
    return torch.add(x, y)


def multiply(x, y):
    return torch.mul(x, y)  # int32 wraps on overflow, as in keras.ops


def bitwise_and(x, y):
    return torch.bitwise_and(x, y)


def bitwise_xor(x, y):
    return torch.bitwise_xor(x, y)


def right_shift(x, y):
    return torch.bitwise_right_shift(x, y)
