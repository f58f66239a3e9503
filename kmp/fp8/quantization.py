"""Float8 quantization's arithmetic, per tensor: the scale that fills a
format's range, rounding to it, and the custom gradients that put E4M3
on the forward operands and E5M2 on the output gradient.

Scaling: `scale = amax / float8_max`, so that `x / scale` fills the float8
range; a zero amax gives 1, a non-finite one a non-finite scale (an
overflow stays visible). `kmp.fp8.float8_layers` builds its matmuls from
these; `operands` reads Keras's layers' scales in the same units.
"""

import ml_dtypes
from keras import ops

E4M3 = "float8_e4m3fn"
E5M2 = "float8_e5m2"
FLOAT8_MAX = {
    dtype: float(ml_dtypes.finfo(dtype).max) for dtype in (E4M3, E5M2)
}
_TINY = {"float16": float(ml_dtypes.finfo("float16").tiny)}


def scale_for(amax, dtype, compute_dtype):
    """The per-tensor scale, in `compute_dtype`, that maps `amax` to the
    largest `dtype` value: `amax / max(dtype)`.

    A zero `amax` gives 1 (nothing to scale). A non-finite one gives a
    non-finite scale, so what is quantized with it turns NaN rather than
    saturating: an overflow stays visible. Under float16 the scale is at
    least float16's smallest normal number, which it must be to be
    represented at all; E5M2 has float16's exponent range, so nothing
    that float16 can hold is lost by that floor.
    """
    amax = ops.cast(amax, "float32")
    scale = ops.where(amax > 0, amax / FLOAT8_MAX[dtype], 1.0)
    if compute_dtype in _TINY:
        scale = ops.maximum(scale, _TINY[compute_dtype])
    return ops.cast(scale, compute_dtype)


def quantize(x, scale, dtype):
    """`x` rounded to `dtype` at `scale` (a scalar in the compute dtype),
    returned in the scale's dtype: `convert(q) * scale`, the form XLA
    rewrites into an FP8 GEMM.

    The division is done in float32 (a float16 quotient could overflow
    before the clip); values beyond the float8 range saturate."""
    limit = FLOAT8_MAX[dtype]
    scaled = ops.divide(ops.cast(x, "float32"), ops.cast(scale, "float32"))
    q = ops.cast(ops.clip(scaled, -limit, limit), dtype)
    return ops.multiply(ops.cast(q, scale.dtype), scale)


def amax(x):
    """`max|x|` in float32."""
    return ops.max(ops.abs(ops.cast(x, "float32")))


@ops.custom_gradient
def quantize_forward(x, scale):
    """E4M3 quantization with a straight-through gradient."""

    def grad(*args, upstream=None):
        if upstream is None:  # TensorFlow passes it positionally
            (upstream,) = args
        return upstream, ops.zeros_like(scale)

    return quantize(x, scale, E4M3), grad


@ops.custom_gradient
def quantize_gradient(y):
    """The identity forward; the backward quantizes the gradient to E5M2
    at its own (current) scale. Placed right after the matmul, so both
    gradient GEMMs read the quantized gradient."""

    def grad(*args, upstream=None):
        if upstream is None:
            (upstream,) = args
        scale = scale_for(amax(upstream), E5M2, upstream.dtype)
        return quantize(upstream, scale, E5M2)

    return y, grad
