"""An activation whose backward pass recomputes it from its input, so
that XLA can fuse it into the matmul before it (JAX).

Differentiated as written, an activation keeps for its backward pass
the intermediate values its derivative reads: the approximate GELU's
`tanh`, the exact GELU's `erf` term. On a GPU that costs twice. The
forward kernel writes that value (a tensor the size of the activation,
read again by the backward kernel), and, for the approximate GELU, the
`tanh` gets a second user, so XLA's GEMM rewriter no longer fuses the
bias add and the GELU into cuBLASLt's `BIAS_GELU_AUX` epilogue (the
matmul writing the activation and its input in one pass; the rewriter
fuses only a GELU whose intermediate values have no other user).

Recomputed in the backward pass (`jax.checkpoint`), the activation
keeps only its input, which the matmul wrote anyway: the GEMM takes
the bias and the GELU into its epilogue (writing the GELU and its input
in one pass) and the backward kernel recomputes the `tanh` from the
input in registers. Compiled for an H200 (`benchmarks/gpu_compile.py
--programs activation`), a feed-forward block's step (16384 tokens,
1024 -> 4096 -> 1024) moves 0.40 GB less with the approximate GELU and
0.27 GB less with the exact one, the GEMMs' own bytes counted. The
values are the same operations run again: the same forward values, the
gradients to rounding (XLA may fuse the recomputation differently). On
a GPU the epilogue computes the GELU from the GEMM's float32 result,
before it is rounded to 16 bits: the same values to 16-bit rounding
(where the GELU is steep relative to its value, its negative tail, a
few 16-bit steps).

Only GELU gains. ReLU's and SiLU's backward passes read the input
alone already (compiled, the same bytes either way). JAX only:
TensorFlow's and torch's activations are returned as they are (torch's
eager kernels have no epilogue to fuse into, and TensorFlow's XLA path
is not compiled here for a GPU to check).
"""

import functools

from kmp.backend._current import name


def recompute_in_backward(activation):
    """`activation`, recomputed from its input in the backward pass on
    JAX (module docstring); elsewhere `activation` itself.

    The wrapper takes `activation`'s name and docstring
    (`functools.wraps`; `__wrapped__` gives `activation` back). Keras
    serializes an activation by identity, so a layer should not keep
    the wrapper in an attribute its config reads
    (`kmp.islands.recompute_gelu` swaps it in for the call only).

    Args:
        activation: An elementwise function of one tensor, stateless (it
            runs twice: no random draws, no variable writes).

    Returns:
        A function with `activation`'s values.
    """
    if name() != "jax":
        return activation
    import jax

    @functools.wraps(activation)
    def call(x, *args, **kwargs):
        # Only `x` is traced: the other arguments (GELU's `approximate`)
        # are Python values the function branches on. `prevent_cse` (the
        # default) keeps XLA from merging the recomputation back into
        # the forward pass's values.
        return jax.checkpoint(lambda t: activation(t, *args, **kwargs))(x)

    return call
