"""kmp's own float8 matmul on JAX and torch: a GEMM on two float8
operands, each scaled from its current amax, with a custom gradient whose
two backward matmuls also run on float8.

Keras's float8 layers write quantize-dequantize around a bfloat16 matmul
and leave it to XLA to pattern-match an FP8 GEMM, with amax histories on
every step. This matmul hands XLA the float8 operands themselves:

    forward, y = x @ w:
        sx = amax(x) / max(E4M3);  xq = cast(x / sx, E4M3)
        sw = amax(w) / max(E4M3);  wq = cast(w / sw, E4M3)
        y  = dot_general(xq, wq, wide(out_dtype)) * (sx * sw) -> out_dtype
    backward, from g = dL/dy:
        sg = amax(g) / max(E5M2);  gq = cast(g / sg, E5M2)
        dx = dot_general(gq, wq^T, wide(x.dtype)) * (sg * sw)  -> x.dtype
        dw = dot_general(xq^T, gq, wide(w.dtype)) * (sx * sg)  -> w.dtype
    where wide(bfloat16) = bfloat16, wide(anything else) = float32

Every GEMM accumulates in float32; `wide` is the dtype it writes. A
bfloat16 result is written as bfloat16 and rescaled after: half the
bytes of a float32 output, written and read again (on the 2026-11-28
H200, the 4 x 8192^2 stack's step 1.478x bfloat16's against 1.422x with
a float32 output; 1.324x against 1.166x at 4096). bfloat16 has
float32's exponent range, so the unscaled product (at most
max(E5M2) * max(E4M3) * k, about 2.6e7 * k) cannot overflow it;
float16's range would, so float16 and float32 results are written as
float32.

A zero amax gives a scale of 1, a non-finite one a non-finite scale, so
an overflow turns the result NaN instead of saturating: kmp's dynamic
loss scale still sees it and skips the step. Each tensor is quantized
once per step: the forward's `xq`, `wq` and their scales are the
backward's residuals. The amax is a reduction that must end before the
cast starts, so under XLA each quantization is two fusions over the
tensor (no histories, no third read).

Loss-scale independence: the gradient's scale comes from its own amax,
so `g * S` quantizes to the same E5M2 values as `g` (exactly, for a
power-of-two `S`) and never overflows E5M2 because of `S`; the
gradients of `loss * S` are `S` times those of `loss`.

The scales are in `kmp.fp8.quantization`'s units (`amax / max`), but
its functions return the dequantized tensor in the compute dtype (the
pattern XLA rewrites); `quantize` here returns the float8 tensor itself,
which `dot_general` takes.

On JAX the GEMMs are `jax.lax.dot_general`s (below); on torch
`torch._scaled_mm`, which applies both scales inside the GEMM and so
writes every result dtype directly (`kmp.fp8._torch_matmul`: its
layouts, padding and the devices it runs on). TensorFlow has no float8
GEMM to call: Keras's float8 layers are what runs there. jax and torch
are imported inside the functions, so the module imports on every
backend.
"""

import functools

import keras

from kmp import backend
from kmp.fp8.quantization import E4M3
from kmp.fp8.quantization import E5M2
from kmp.fp8.quantization import FLOAT8_MAX

# The smallest normal float32: a floor for the scale, so that an amax
# in float32's subnormal range never divides by a scale rounded to zero.
_TINY = 2.0**-126


def float8_matmul(x, w, out_dtype=None):
    """`x[..., k] @ w[k, n]` on float8 operands, with float8 gradients.

    The operands are cast to E4M3, each with a per-tensor scale from its
    current amax; the output gradient to E5M2 the same way. The three
    matmuls (the forward, `dx` and `dw`) run on float8 operands and
    accumulate in float32: on JAX `jax.lax.dot_general`s, which a GPU's
    XLA compiles to cuBLASLt FP8 GEMMs (on a CPU XLA emulates them); on
    torch `torch._scaled_mm` (cuBLASLt's FP8 GEMM on a GPU of compute
    capability 8.9 or more, oneDNN's on a CPU). See the module docstring
    for the rule.

    Args:
        x: the activations, `[..., k]`, any float dtype.
        w: the kernel, `[k, n]`.
        out_dtype: the output's dtype; defaults to `x`'s.

    Returns:
        `[..., n]` in `out_dtype`.

    Example:

    >>> import numpy as np
    >>> x = np.ones((4, 8), "float32")
    >>> w = np.full((8, 2), 0.5, "float32")
    >>> keras.ops.convert_to_numpy(float8_matmul(x, w)).tolist()[0]
    [4.0, 4.0]
    """
    if backend.name() not in ("jax", "torch"):
        raise ValueError(
            "kmp.fp8.float8_matmul runs on the JAX and torch backends; "
            f"Keras's backend is {backend.name()!r}. Set KERAS_BACKEND=jax "
            "(or torch) before importing Keras; on TensorFlow, kmp.float8 "
            "gives Keras's float8 layers."
        )
    x_shape, w_shape = tuple(x.shape), tuple(w.shape)
    if len(w_shape) != 2 or not x_shape or x_shape[-1] != w_shape[0]:
        raise ValueError(
            "float8_matmul multiplies x[..., k] by w[k, n]; got x of shape "
            f"{x_shape} and w of shape {w_shape}. Pass a 2-D "
            "kernel whose first dimension is x's last."
        )
    if backend.name() == "torch":
        from kmp.fp8 import _torch_matmul

        x, w = keras.ops.convert_to_tensor(x), keras.ops.convert_to_tensor(w)
        dtype = keras.backend.standardize_dtype(out_dtype or x.dtype)
        return _torch_matmul.float8_matmul(x, w, dtype)
    import jax.numpy as jnp

    x, w = jnp.asarray(x), jnp.asarray(w)
    # Static (hashable) for the custom VJP: the output's and the two
    # gradients' dtypes.
    dtypes = (jnp.dtype(out_dtype or x.dtype), x.dtype, w.dtype)
    leading = x.shape[:-1]
    y = _matmul()(x.reshape(-1, x.shape[-1]), w, dtypes)
    return y.reshape(*leading, w.shape[1])


def keep_state(y, state):
    """`y`, with each variable of `state` given its own value as its
    gradient: how kmp's float8 layers keep Keras's float8 scales and amax
    histories, which they do not read, as they were (see
    `kmp.fp8.scaled_layers`)."""
    if not state:
        return y
    values = [keras.ops.convert_to_tensor(v) for v in state]
    if backend.name() == "torch":
        from kmp.fp8 import _torch_matmul

        return _torch_matmul.keep(y, values)
    return _keeper()(y, values)


def quantize(x, dtype):
    """`(q, scale)`: `x / scale` cast to the float8 `dtype`, `scale` in
    float32 from `x`'s current amax (`amax / max(dtype)`, 1 for a zero
    amax, non-finite for a non-finite one)."""
    import jax.numpy as jnp

    x = x.astype(jnp.float32)
    amax = jnp.max(jnp.abs(x))
    scale = jnp.where(amax > 0, amax / FLOAT8_MAX[dtype], 1.0)
    # maximum() keeps a NaN amax NaN; the floor only lifts underflow.
    scale = jnp.maximum(scale, _TINY)
    limit = FLOAT8_MAX[dtype]
    return jnp.clip(x / scale, -limit, limit).astype(dtype), scale


def _dot(a, a_scale, b, b_scale, contract, dtype):
    """`dot_general(a, b)` over `contract` (`(a_axis, b_axis)`), float32
    accumulation, written as `wide(dtype)` (the module docstring), times
    both scales in float32, cast to `dtype`.

    `benchmarks/float8_matmul.py --forms` times other ways to write it
    (a float32 output for every dtype; XLA's dequantize-then-dot
    pattern) by replacing this function: keep its signature."""
    import jax
    import jax.numpy as jnp

    bfloat16 = jnp.dtype(dtype) == jnp.bfloat16
    written = jnp.bfloat16 if bfloat16 else jnp.float32
    y = jax.lax.dot_general(
        a,
        b,
        (((contract[0],), (contract[1],)), ((), ())),
        preferred_element_type=written,
    )
    return (y.astype(jnp.float32) * (a_scale * b_scale)).astype(dtype)


@functools.cache
def _matmul():
    """The 2-D matmul with its custom VJP, built at first use (so jax is
    imported only then)."""
    import jax

    def forward(x, w, dtypes):
        xq, sx = quantize(x, E4M3)
        wq, sw = quantize(w, E4M3)
        y = _dot(xq, sx, wq, sw, (1, 0), dtypes[0])
        return y, (xq, sx, wq, sw)

    def backward(dtypes, residuals, g):
        xq, sx, wq, sw = residuals
        _, x_dtype, w_dtype = dtypes
        gq, sg = quantize(g, E5M2)
        dx = _dot(gq, sg, wq, sw, (1, 1), x_dtype)  # [m, n] . [k, n]
        dw = _dot(xq, sx, gq, sg, (0, 0), w_dtype)  # [m, k] . [m, n]
        return dx, dw

    def matmul(x, w, dtypes):
        return forward(x, w, dtypes)[0]

    matmul = jax.custom_vjp(matmul, nondiff_argnums=(2,))
    matmul.defvjp(forward, backward)
    return matmul


@functools.cache
def _keeper():
    """`keep(y, values) = y`, whose gradient by `values` is `values` (JAX):
    built at first use, so that jax is imported only then."""
    import jax

    @jax.custom_vjp
    def keep(y, values):
        return y

    def forward(y, values):
        return y, values

    def backward(values, g):
        return g, values

    keep.defvjp(forward, backward)
    return keep
