"""A tensor broadcast over the batch, whose gradient leaves XLA's GPU
layouts alone (JAX).

A learned tensor added to every example of a batch (a position
embedding) has as gradient the sum over the batch of the activation's
gradient. XLA's GPU layout assignment lays out the operand of a
reduction of 32 elements or more so that the reduction reads it
row-wise (`GpuLayoutAssignment::PropagateReductionLayoutToOperand` in
openxla/xla): the batch becomes the innermost dimension of that
gradient, and the layout spreads along the chain of elementwise ops it
meets, the residual stream of a Transformer and its LayerNorms. Every
matmul then needs its operands transposed back. Compiled for an H200
(`benchmarks/gpu_compile.py`), KerasHub's GPT-2 at width 1024, batch 32
moves 70 GB a step outside its matmuls with the sum, 47 GB without;
at batch 31 the sum is too short to trigger it (`--programs layout`
compiles the smallest program that shows the threshold).

Written as a product with a vector of ones, the broadcast's gradient is
a contraction over the batch instead: XLA gives it to a matmul, which
takes its operands as they are laid out. The values are the same
(each is its input times one); the forward product may cost a kernel
of its own where XLA does not fold it into its consumer.

Only for 16-bit values (what a mixed policy computes in). A float32
product would be a TF32 matmul on a GPU by default, rounding the
gradient's inputs, and at float32's full precision XLA rewrites it back
into the sum (compiled for an H200: the batch-innermost layout again),
so float32 values are broadcast as usual and summed exactly. So are
TensorFlow's and torch's: torch has no layout assignment, and
TensorFlow's XLA path is not compiled here for a GPU to check.
"""

import keras
from keras import ops

from kmp.backend._current import name

# XLA's GPU layout assignment relays a reduction's operand out for a row
# reduction from this many reduced elements (its source's threshold).
# Below it the sum keeps the layout, and the plain broadcast is cheaper:
# the product may cost a kernel of its own.
ROW_REDUCTION_MIN = 32


def broadcast_over_batch(values, batch_size):
    """`values` repeated `batch_size` times along a new leading axis.

    The result equals `ops.broadcast_to(values, (batch_size,
    *values.shape))`; on JAX, for 16-bit values and a batch of 32 or
    more, it is written as a product with ones, so that the gradient of
    `values` is a contraction over the batch, not a sum XLA would lay
    out batch-innermost on a GPU (module docstring).

    Args:
        values: A tensor, the same for every example (a position
            embedding of shape `(sequence_length, features)`).
        batch_size: The batch's size: an int, or a dimension from
            `ops.shape`.

    Returns:
        A tensor of shape `(batch_size, *values.shape)` and `values`'s
        dtype.
    """
    dtype = keras.backend.standardize_dtype(values.dtype)
    if (
        name() != "jax"
        or dtype not in ("float16", "bfloat16")
        or (isinstance(batch_size, int) and batch_size < ROW_REDUCTION_MIN)
    ):
        return ops.broadcast_to(values, (batch_size, *ops.shape(values)))
    ones = ops.ones((batch_size,), dtype=dtype)
    return ops.einsum("b,...->b...", ones, values)
