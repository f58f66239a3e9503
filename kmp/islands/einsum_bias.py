"""An `EinsumDense`'s bias added on the flattened output, so that a GPU's
matmul adds it (JAX).

Keras's `MultiHeadAttention` (and KerasHub's attentions built on it)
projects the query, key and value with `EinsumDense("abc,cde->abde",
bias_axes="de")`: a kernel of shape `(width, heads, head_dim)` and a
bias of shape `(heads, head_dim)`. XLA lowers the einsum to one GEMM
whose output it views as `(batch, length, heads, head_dim)`, but does
not fuse a bias of two dimensions into the GEMM's epilogue: a kernel
writes the bias broadcast to the projection's whole output, which the
GEMM then reads and adds (cuBLAS's `beta = 1`), one more write and read
of the output's size. The same bias added to the GEMM's flat output,
`heads * head_dim` wide, is cuBLASLt's `BIAS` epilogue, which reads the
bias alone.
Compiled for an H200 (`benchmarks/gpu_compile.py`), KerasHub's GPT-2
at width 1024, batch 32 then moves 0.20 GB less a decoder block, its
GEMMs' bytes counted. The values are the same (on a GPU the epilogue
adds the bias before the product is rounded to 16 bits: the same to
16-bit rounding).

`flatten_bias(layer)` applies to an `EinsumDense` that runs Keras's own
call and whose equation contracts the input's last axis with the
kernel's first and keeps every other kernel axis at the end of the
output, in order (`...c,cde->...de` with the leading axes named), with
a bias over those axes. Its call then multiplies the input by the
kernel viewed as a matrix, adds the flat bias and views the result in
the output's shape: the kernel and bias variables are the layer's own,
unchanged. Anything else keeps Keras's call: other equations, a layer
without bias, a quantized layer (float8, int8: no 16-bit GEMM with an
epilogue; Keras sends it to `quantized_call`, and the wrapper checks
`quantization_mode` too, so `kmp.float8` after pinning is safe), a
subclass with a call of its own or a layer whose class was swapped to
one, an input whose leading sizes are unknown when the call runs.

How: an instance-level `call`, as `broadcast_once` and `recompute_gelu`
do, so `get_config` and a `.keras` file are unchanged; `kmp.pin_float32`
applies it on JAX before `recompute_gelu` (whose wrapper then runs this
one), and `kmp.load_model` applies it again. Deleting the instance's
`call` (`del layer.call`) undoes it.
"""

import math

import keras
from keras import ops

from kmp import backend

_STOCK_CALL = keras.layers.EinsumDense.call


def _has_flat_form(layer):
    """Whether `layer`'s equation and bias axes have the flattenable form
    (module docstring)."""
    equation = getattr(layer, "equation", "")
    bias_axes = getattr(layer, "bias_axes", None)
    if "->" not in equation or "." in equation or not bias_axes:
        return False
    inputs, output = equation.replace(" ", "").split("->")
    if inputs.count(",") != 1:
        return False
    x, kernel = inputs.split(",")
    return (
        len(kernel) >= 3  # a 2-D kernel's bias is 1-D: fused already
        and kernel[0] == x[-1]
        and kernel[0] not in output
        and output == x[:-1] + kernel[1:]
        and bias_axes == kernel[1:]
    )


def flattens_bias(layer):
    """Whether `flatten_bias` has been applied to `layer`: its `call` is
    the instance's own, kmp's wrapper, or a wrapper over it made with
    `kmp.backend.layer_call` (`recompute_gelu`'s), which copies its
    mark."""
    own = vars(layer).get("call")
    return getattr(own, "_kmp_flattens_bias", False)


def flatten_bias(layer):
    """Makes `layer` add its bias on the flattened output (module
    docstring). Other layers are left as they are; applying it twice
    changes nothing.

    Args:
        layer: A Keras layer; it changes an `EinsumDense` like the query,
            key and value projections of `MultiHeadAttention`.

    Returns:
        Whether `layer` now adds its bias flattened.
    """
    if flattens_bias(layer):
        return True
    if (
        not isinstance(layer, keras.layers.EinsumDense)
        or type(layer).call is not _STOCK_CALL
        or "call" in vars(layer)  # another wrapper: it would be bypassed
        or not _has_flat_form(layer)
    ):
        return False

    # Run on the layer running it, an NNX transform's copy too
    # (`kmp.backend.layer_call`).
    call = backend.layer_call(layer, _call_adding_bias_flat)
    call._kmp_flattens_bias = True
    layer.call = call
    return True


def _call_adding_bias_flat(layer, inputs, *args, **kwargs):
    leading = tuple(ops.shape(inputs))[:-1]
    if (
        type(layer).call is not _STOCK_CALL  # a class swapped in
        or getattr(layer, "quantization_mode", None) is not None
        or layer.bias is None
        or not all(isinstance(size, int) for size in leading)
    ):
        # Keras sends a quantized layer to `quantized_call`, which
        # this wrapper is not; `call` itself, called directly, gets
        # here. The class's call as it is when the layer runs.
        return type(layer).call(layer, inputs, *args, **kwargs)
    kernel = layer.kernel  # with its LoRA update, if enabled
    width, *axes = kernel.shape
    flat = math.prod(axes)
    x = ops.matmul(inputs, ops.reshape(kernel, (width, flat)))
    x = ops.add(x, ops.reshape(layer.bias, (flat,)))
    x = ops.reshape(x, leading + tuple(axes))
    if layer.activation is not None:
        x = layer.activation(x)
    return x
