"""kmp's float8 matmul in torch's own calls: `torch._scaled_mm` on two
float8 operands, forward and both backward matmuls, in a
`torch.autograd.Function`; this module branches on nothing
(`kmp.fp8.scaled_matmul` picks it on torch, whose docstring has the rule).

What torch adds to the rule:

- `_scaled_mm` takes the dequantizing scales themselves (`amax / max`,
  kmp's units) and applies them in the GEMM's float32 epilogue, so it
  writes every result dtype directly, float16 included: the unscaled
  product never leaves the GEMM.
- CUDA's FP8 GEMM takes its first operand row-major and its second
  column-major, with the contracting and output sizes multiples of 16;
  the kernel gradient contracts over the rows (`m`, the tokens), so rows
  are padded with zeros to a multiple of 16 where they are not (zeros
  add nothing to a product, nor to an amax). The kernel is quantized
  once and laid out twice (a one-byte transpose): column-major for the
  forward, row-major for the input gradient.
- Where `_scaled_mm` is not a fast kernel (a CUDA GPU under compute
  capability 8.9, whose tensor cores have no float8; a CPU, where it is
  a reference loop), the same float8 values are multiplied as bfloat16
  (a GPU) or float32 (a CPU), both of which hold them exactly, and
  scaled after: float8's numerics, not its speed. `kmp.audit` says so
  for such a device.
- Where it is fast (a CUDA GPU), each quantization runs compiled
  (`torch.compile` of `quantize` itself; its speed in a step there is
  unmeasured). Eager torch runs its six passes (absolute value, amax,
  float32 copy, division, clamp, cast) as six kernels over memory,
  which made the float8 step slower than bfloat16's on an H200
  (0.57x-0.88x, BENCHMARKS.md); compiled, they are a reduction and one
  elementwise pass, as XLA makes them on JAX. Inside a compiled step
  (Keras's `jit_compile=True`) it is traced like the rest. If torch
  cannot compile it (no Triton, say; any Dynamo or Inductor error, a
  transient one included), kmp warns once and quantizes eagerly from
  then on. The values: on a CPU the eager bits; on a GPU
  Inductor may divide by multiplying by a reciprocal, so a scale may
  differ from the eager one by its last bit, and a value at a rounding
  boundary may round the other way; the GEMM uses the scale returned,
  so the product is as exact either way.
"""

import warnings

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

from kmp.fp8.quantization import E4M3
from kmp.fp8.quantization import E5M2
from kmp.fp8.quantization import FLOAT8_MAX
from kmp.fp8.scaled_matmul import _TINY

_FORMATS = {E4M3: torch.float8_e4m3fn, E5M2: torch.float8_e5m2}
_ALIGN = 16


def float8_matmul(x, w, out_dtype):
    """`x[..., k] @ w[k, n]` in `out_dtype` (Keras's name of a dtype),
    with float8 gradients; the arguments are checked by `scaled_matmul`."""
    leading = tuple(x.shape[:-1])
    out_dtype = getattr(torch, out_dtype)
    y = _Float8Matmul.apply(x.reshape(-1, x.shape[-1]), w, out_dtype)
    return y.reshape(*leading, w.shape[1])


def quantize(x, dtype):
    """`(q, scale)`: `x / scale` cast to the float8 `dtype` (kmp's name,
    `"float8_e4m3fn"` or `"float8_e5m2"`), `scale` a float32 scalar
    tensor from `x`'s current amax: `amax / max(dtype)`, 1 for a zero
    amax, non-finite for a non-finite one. Compiled where `_scaled_mm`
    is fast (the module docstring), eager elsewhere."""
    global _compiled
    if (
        not _compiles(x.device)
        # Traced into a compiled step as the rest of it is.
        or torch.compiler.is_compiling()
        # A dispatch mode (a profiler's, FlopCounterMode, a count of
        # aten calls) sees the eager calls.
        or _get_current_dispatch_mode() is not None
    ):
        return _quantize(x, dtype)
    # Read once: autograd's device thread quantizes gradients while the
    # main thread may quantize the next step's operands.
    compiled = _compiled
    if compiled is None:
        try:
            # Shapes vary with the batch and the layer: one program for
            # all.
            compiled = _compiled = torch.compile(_quantize, dynamic=True)
        except RuntimeError as error:  # torch.compile refuses this Python
            compiled = _give_up(error)
    if compiled is not False:
        try:
            # Detached: the gradient's quantization and an operand's are
            # then one program, not two that Dynamo guards apart.
            return compiled(x.detach(), dtype)
        # Dynamo or Inductor failed (their errors: a missing Triton is
        # Inductor's). An error of the computation itself, an
        # out-of-memory say, is no such error and propagates.
        except torch._dynamo.exc.TorchDynamoException as error:
            _give_up(error)
    return _quantize(x, dtype)


def _give_up(error):
    """Warns that `quantize` runs eagerly from now on, and makes it so."""
    global _compiled
    warnings.warn(
        "kmp.float8 on torch: torch.compile could not compile the float8 "
        f"quantization ({type(error).__name__}: {error}); it runs eagerly "
        "from now on, as several passes over memory each, slower. Install "
        "Triton (it comes with CUDA builds of torch) for the compiled form.",
        stacklevel=3,
    )
    _compiled = False
    return False


# `quantize`'s compiled form: None until first used, False where torch
# could not compile it.
_compiled = None


def _quantize(x, dtype):
    # The amax of a 16-bit tensor is exact in it: no float32 copy for it.
    amax = x.detach().abs().amax().float()
    limit = FLOAT8_MAX[dtype]
    scale = torch.where(amax > 0, amax / limit, torch.ones_like(amax))
    # clamp_min keeps a NaN scale NaN; the floor only lifts underflow.
    scale = scale.clamp_min(_TINY)
    q = (x.detach().float() / scale).clamp(-limit, limit)
    return q.to(_FORMATS[dtype]), scale


def keep(y, values):
    """`y`, with each tensor of `values` given a copy of its own value as
    its gradient (see `kmp.fp8.scaled_layers`)."""
    return _Keep.apply(y, *values)


class _Float8Matmul(torch.autograd.Function):
    """The 2-D matmul: `x[m, k] @ w[k, n]`, forward and backward on
    float8 operands."""

    @staticmethod
    def forward(ctx, x, w, out_dtype):
        m = x.shape[0]
        xq, sx = quantize(_pad_rows(x), E4M3)
        wq, sw = quantize(w, E4M3)
        y = _gemm(xq, sx, _column_major(wq), sw, out_dtype)
        ctx.save_for_backward(xq, sx, wq, sw)
        ctx.dtypes = (x.dtype, w.dtype)
        return y[:m]

    @staticmethod
    def backward(ctx, g):
        xq, sx, wq, sw = ctx.saved_tensors
        x_dtype, w_dtype = ctx.dtypes
        m = g.shape[0]
        gq, sg = quantize(_pad_rows(g), E5M2)
        dx = dw = None
        if ctx.needs_input_grad[0]:
            # [m, n] . [n, k]: w^T column-major is w row-major.
            dx = _gemm(gq, sg, wq.t(), sw, x_dtype)[:m]
        if ctx.needs_input_grad[1]:
            # [k, m] . [m, n], over the padded rows.
            dw = _gemm(xq.t().contiguous(), sx, _column_major(gq), sg, w_dtype)
        return dx, dw, None


class _Keep(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y, *values):
        ctx.save_for_backward(*values)
        return y.view_as(y)

    @staticmethod
    def backward(ctx, g):
        # Copies: autograd may keep a gradient tensor as the variable's
        # `.grad`, which must not share the variable's storage.
        return (g, *(v.detach().clone() for v in ctx.saved_tensors))


def _pad_rows(x):
    """`x[m, k]` with zero rows to a multiple of 16 (no copy when it is)."""
    extra = -x.shape[0] % _ALIGN
    if not extra:
        return x
    return torch.nn.functional.pad(x, (0, 0, 0, extra))


def _column_major(q):
    """`q[a, b]`, the same values laid out column by column."""
    return q.t().contiguous().t()


def _gemm(a, a_scale, b, b_scale, out_dtype):
    """`(a * a_scale) @ (b * b_scale)` in `out_dtype`, accumulated in
    float32: `a` row-major, `b` column-major."""
    if _scaled_mm_runs(a.device) and all(
        size % _ALIGN == 0 for size in (*a.shape, b.shape[1])
    ):
        return torch._scaled_mm(
            a, b, scale_a=a_scale, scale_b=b_scale, out_dtype=out_dtype
        )
    # Float8 values are exact in bfloat16 and float32: a GPU multiplies
    # them in bfloat16 on its tensor cores, a CPU fastest in float32.
    wide = torch.float32 if a.device.type == "cpu" else torch.bfloat16
    product = a.to(wide) @ b.to(wide)
    return (product.float() * (a_scale * b_scale)).to(out_dtype)


def _compiles(device):
    """Whether `quantize` runs compiled on `device`: a CUDA GPU where
    `_scaled_mm` is fast. Not on a CPU, where float8 is numerics only,
    and where Inductor's C++ code failed to compile it inside Keras's
    `train_on_batch` (torch 2.13.0+cpu: "used before it has been
    defined"; alone it compiles, to the eager bits)."""
    return device.type == "cuda" and _scaled_mm_runs(device)


def _scaled_mm_runs(device):
    """Whether `torch._scaled_mm` multiplies float8 fast on `device`: a
    CUDA GPU of compute capability 8.9 or more (float8 tensor cores).

    Not on a CPU: torch's CPU `_scaled_mm` is a reference loop, tens
    to a thousand times slower than a float32 matmul of the same sizes
    on this project's CPU (BUILD_NOTES, "kmp's float8 matmul on torch").
    Not cached: torch caches the device's properties, and torch.compile
    traces through a plain function."""
    if device.type != "cuda":
        return False
    return torch.cuda.get_device_capability(device) >= (8, 9)
