"""Block-wise 8-bit codes: the format of 8-bit optimizer state
(`kmp.memory.quantized_state` keeps an optimizer's slots in it).

A tensor of n elements is held as `codes`, int8 in its shape (n
bytes), and `scales`, float32, one per block of `BLOCK` consecutive
elements (the last block may be short). A code is an index into a
fixed table of 255 values in [-1, 1]:

    scale = max |x| over the block          (max x for the unsigned map)
    code  = the table entry next to x / scale, rounded stochastically
    x'    = table[code] * scale             (exact at the block's max)

The table is a dynamic map (Dettmers et al., "8-bit Optimizers via
Block-wise Quantization", 2022): its entries are spread over seven
decades below 1, in each decade twice as many as in the one below, so
that small values keep a relative precision where a linear map would
round them to 0. The first moment and momentum are signed (127
magnitudes each way and 0); Adam's second moment is never negative and
gets all 254 magnitudes (the unsigned map: twice the resolution).

Measured on an embedding of 1,024 x 16 trained by Adam on tokens drawn
by Zipf's law (rare rows' second moments lie up to 8 decades below the
frequent rows' in the same block; JAX, CPU): the error of Adam's update
direction `m / (sqrt(v) + epsilon)` after a round trip of both moments,
over its norm, is 0.027 with this map in blocks of 256 and 0.030 in
blocks of 2,048; with a linear map (255 even levels) 68 and 263: a
small second moment rounds to 0 and its update explodes, and training
that model with linear codes ends in NaN where this format reaches
0.93x float32 state's loss (`tests/memory/block_codes_test.py`
keeps the 256-block comparison). On a dense regression whose moments
span fewer decades, all four stay within 0.2 % of float32's loss.

Every write is rounded stochastically (with `kmp.memory.rounding`'s
hash: no random state). It matters most for the slowest slot: Adam's
second moment moves 0.1 % of its distance a step, far under a code's
gap (0.9 / 128 of the block's scale in its top decade: 0.7 % to 7 % of
a value there): rounded to nearest it freezes, as a bfloat16 one would
(the test measures both). Momentum (beta 0.9) and
Lion's (0.99) are rounded the same way; it costs nothing more.

The cost, on a 2-core CPU: an AdamW update of 4.5M parameters takes
6.8x a bfloat16-state one compiled on JAX and 6.7x on eager torch
(BENCHMARKS.md, "8-bit optimizer state": the quantization's some 20
elementwise operations per slot element; no fused kernel as
bitsandbytes' CUDA ones). Unmeasured on a GPU.

`BLOCK = 256` (as torchao's AdamW8bit): the scales add 4 / 256 bytes an
element (1.6 %), and a block is small enough that one large entry does
not push its neighbours' codes to the bottom of the table.

`quantize_many` and `dequantize_many` code many tensors in one pass,
with the same result as one at a time: eager torch's grouped update
runs them (a kernel per operation, not per operation and tensor).
"""

import math

import numpy as np
from keras import ops

from kmp import backend

BLOCK = 256
_DECADES = 7


def dynamic_map(signed: bool) -> np.ndarray:
    """The sorted table of 255 float32 values a code indexes (module
    doc): 0 and, in each decade `d` below 1 (d = 6, ..., 0), 2**(6 - d)
    magnitudes spaced evenly over (0.1, 1] x 10**-d (signed) or twice as
    many (unsigned), the top one 1.0; signed, the same negated."""
    magnitudes = []
    for level in range(_DECADES):
        count = 2**level if signed else 2 ** (level + 1)
        steps = np.arange(1, count + 1) / count
        magnitudes.extend((0.1 + 0.9 * steps) * 10.0 ** (level - 6))
    magnitudes = np.asarray(magnitudes)
    if signed:
        values = np.concatenate([-magnitudes[::-1], [0.0], magnitudes])
    else:
        values = np.concatenate([[0.0], magnitudes])
    return values.astype("float32")


_TABLES = {True: dynamic_map(True), False: dynamic_map(False)}
# Where 0 is in the signed table: after the 127 negative magnitudes.
_MAGNITUDES = 127
# A code is stored as its index minus 128, an int8.
_OFFSET = 128
_DECADE_TOPS = (10.0 ** np.arange(-6, 1)).astype("float32")
_LEVEL_SIZES = 2 ** np.arange(_DECADES, dtype="int32")
_torch_tables = {}


def _constant(key, value):
    if backend.name() == "torch":  # once on the device, not every step
        if key not in _torch_tables:
            _torch_tables[key] = ops.convert_to_tensor(value)
        return _torch_tables[key]
    return ops.convert_to_tensor(value)  # a constant of the trace


def _table(signed):
    return _constant(signed, _TABLES[signed])


def _magnitudes(signed):
    """0 and the map's magnitudes, ascending."""
    table = _TABLES[signed]
    return _constant(
        ("magnitudes", signed), table[_MAGNITUDES:] if signed else table
    )


def _blocks(size):
    return math.ceil(size / BLOCK)


def padded_size(shape) -> int:
    """Elements of a tensor of `shape` in whole blocks: the size of the
    noise its `quantize` takes."""
    return _blocks(math.prod(int(dim) for dim in shape)) * BLOCK


def _in_blocks(flat, size):
    """A flat tensor of `size` elements as (blocks, BLOCK), zero-padded."""
    padding = _blocks(size) * BLOCK - size
    if padding:
        flat = ops.pad(flat, [(0, padding)])
    return ops.reshape(flat, (-1, BLOCK))


def quantize(x, signed, noise=None):
    """`(codes, scales)` of float tensor `x` (module doc).

    Args:
        x: A float tensor of at least one element.
        signed: Which map: signed, or unsigned (negative entries are
            stored as 0).
        noise: Uniform int32 in [0, 2**16) of `blocks * BLOCK` elements:
            each code is rounded up with probability of the distance
            from the entry below (stochastic rounding); None: to nearest.

    Returns:
        int8 codes of `x`'s shape and float32 scales, one a block.
    """
    shape = ops.shape(x)
    size = math.prod(int(dim) for dim in shape)
    grid = _in_blocks(ops.reshape(ops.cast(x, "float32"), (-1,)), size)
    index, scales = _grid_codes(grid, signed, noise)
    codes = ops.cast(index[:size] - _OFFSET, "int8")
    return ops.reshape(codes, shape), scales


def _grid_codes(grid, signed, noise):
    """The table indices (int32, flat) and the scales of the blocks of
    `grid` (blocks, BLOCK): `quantize`'s work, block by block."""
    if not signed:
        grid = ops.maximum(grid, 0.0)
    scales = ops.max(ops.abs(grid), axis=1)
    # An all-zero block keeps scale 0 and codes of 0.
    safe = ops.where(ops.greater(scales, 0.0), scales, 1.0)
    lowest = -1.0 if signed else 0.0
    normal = ops.clip(ops.divide(grid, safe[:, None]), lowest, 1.0)
    normal = ops.reshape(normal, (-1,))
    magnitude = ops.abs(normal)
    below, fraction = _neighbours(magnitude, signed)
    if noise is None:
        up = ops.greater_equal(fraction, 0.5)
    else:
        uniform = ops.divide(ops.cast(noise, "float32") + 0.5, 2.0**16)
        up = ops.less(uniform, fraction)
    rank = below + ops.cast(up, "int32")  # among 0 and the magnitudes
    if not signed:
        return rank, scales
    # The table: the magnitudes negated, 0, the magnitudes.
    rank = ops.where(ops.less(normal, 0.0), -rank, rank)
    return rank + _MAGNITUDES, scales


def _joined_blocks(tensors):
    """`tensors` flat, each zero-padded to whole blocks, end to end."""
    parts = []
    for x in tensors:
        size = math.prod(int(dim) for dim in ops.shape(x))
        flat = ops.reshape(x, (-1,))
        padding = _blocks(size) * BLOCK - size
        parts.append(ops.pad(flat, [(0, padding)]) if padding else flat)
    return ops.concatenate(parts) if len(parts) > 1 else parts[0]


def _cut(flat, shapes, per_element=True):
    """`flat` (blocks of `_joined_blocks`, or with `per_element=False`
    their scales) cut back into one tensor of each of `shapes`."""
    pieces, start = [], 0
    for shape in shapes:
        size = math.prod(int(dim) for dim in shape)
        width = _blocks(size) * (BLOCK if per_element else 1)
        piece = flat[start : start + width]
        pieces.append(
            ops.reshape(piece[:size], shape) if per_element else piece
        )
        start += width
    return pieces


def quantize_many(tensors, signed, noise):
    """`quantize` of each of `tensors` (the same codes and scales), in one
    pass: a fixed number of operations where one slot at a time takes
    some forty (a kernel each on eager torch).

    Args:
        tensors: float32 tensors, each of at least one element.
        signed: The map all of them take.
        noise: Uniform int32 in [0, 2**16): each tensor's `quantize`
            noise, joined in order (`rounding.many_noise` over the
            tensors' padded sizes).

    Returns:
        A list of `(codes, scales)`, one per tensor.
    """
    shapes = [ops.shape(x) for x in tensors]
    grid = ops.reshape(_joined_blocks(tensors), (-1, BLOCK))
    index, scales = _grid_codes(grid, signed, noise)
    codes = ops.cast(index - _OFFSET, "int8")
    return list(
        zip(_cut(codes, shapes), _cut(scales, shapes, per_element=False))
    )


def _neighbours(magnitude, signed):
    """The rank of the table's magnitude just below each of `magnitude`
    (0 for 0, 1 for the smallest, ...) and the fraction of the way to the
    next, found from the map's layout: a search of the table costs some
    30 ms a million elements on a CPU (`ops.searchsorted`), this ~1 ms.

    In decade `d` (the level `6 - d`, 0 to 6) the map holds `n = first *
    2**level` magnitudes `(0.1 + 0.9 j / n) * 10**-d`, j = 1..n, after
    the `first * (2**level - 1)` of the decades below.
    """
    first = 1 if signed else 2
    # The decade's top and size, chosen by a compare a decade: selects
    # fuse with the arithmetic around them where gathers from 7-entry
    # tables did not (XLA on a CPU: half the time, the same values).
    top = ops.full(ops.shape(magnitude), float(_DECADE_TOPS[0]), "float32")
    sizes = ops.ones(ops.shape(magnitude), "int32")
    for level in range(1, _DECADES):
        above = ops.greater(magnitude, float(_DECADE_TOPS[level - 1]))
        top = ops.where(above, float(_DECADE_TOPS[level]), top)
        sizes = ops.where(above, int(_LEVEL_SIZES[level]), sizes)
    count = ops.cast(sizes * first, "float32")
    steps = ops.divide(ops.divide(magnitude, top) - 0.1, 0.9) * count
    step = ops.clip(ops.floor(steps), 0.0, count - 1.0)
    before = first * (sizes - 1)
    below = before + ops.cast(step, "int32")
    table = _magnitudes(signed)
    low = ops.take(table, below)
    high = ops.take(table, below + 1)
    # Within float32's rounding of the layout, clipped to the two codes.
    fraction = ops.clip(
        ops.divide(ops.subtract(magnitude, low), ops.subtract(high, low)),
        0.0,
        1.0,
    )
    return below, fraction


def dequantize(codes, scales, signed):
    """The float32 tensor `codes` and `scales` stand for (`quantize`)."""
    shape = ops.shape(codes)
    size = math.prod(int(dim) for dim in shape)
    index = ops.cast(ops.reshape(codes, (-1,)), "int32") + _OFFSET
    values = _in_blocks(ops.take(_table(signed), index), size)
    flat = ops.reshape(ops.multiply(values, scales[:, None]), (-1,))
    return ops.reshape(flat[:size], shape)


def dequantize_many(codes, scales, signed):
    """`dequantize` of each pair of `codes` and `scales` (lists, all of
    one map), in one pass; the float32 tensors, in order."""
    shapes = [ops.shape(c) for c in codes]
    index = ops.cast(_joined_blocks(codes), "int32") + _OFFSET
    values = ops.reshape(ops.take(_table(signed), index), (-1, BLOCK))
    joined = ops.concatenate(scales) if len(scales) > 1 else scales[0]
    flat = ops.reshape(ops.multiply(values, joined[:, None]), (-1,))
    return _cut(flat, shapes)
