"""Training FLOPs of a Keras model, counted per layer, and device peaks.

`kmp bench` reports achieved TFLOP/s next to examples/s: a speed-up is
only worth as much as the share of the device it uses. The count is the
matmul and convolution work, where nearly all FLOPs of these models are:
a multiply-add is 2 FLOPs; Conv2D, Dense, EinsumDense, the two products
inside attention, and LSTM gates are counted; element-wise layers,
normalization and pooling are not (a few percent). Training is taken as
3x the forward pass (the backward pass computes two products per forward
product), the usual convention (e.g. airbench and MLPerf's counts).

The count reads shapes from the model's functional graph, so it is the
same on every backend. ResNet-9 at width 64: 0.76 GFLOP forward, 2.28
training, per 32x32 image.
"""

import math

import keras

from kmp_config.names import MIXED_POLICIES

# Dense (no sparsity) tensor-core peaks in TFLOP/s, from NVIDIA's data
# sheets (SXM parts): 16-bit (float16 and bfloat16) and TF32. float32
# without TF32 runs on the CUDA cores, far lower; it is listed as well.
PEAK_TFLOPS = {
    "H200": {"16-bit": 989.0, "tf32": 494.0, "float32": 67.0},
    "H100": {"16-bit": 989.0, "tf32": 494.0, "float32": 67.0},
    "A100": {"16-bit": 312.0, "tf32": 156.0, "float32": 19.5},
}


def _elements(shape):
    """Elements per example: the product of all but the batch dimension."""
    return math.prod(d for d in shape[1:] if d is not None)


def _dense_like(layer, inputs, outputs):
    kernel = layer.kernel if hasattr(layer, "kernel") else None
    if kernel is None:
        return 0
    # Each output element takes one multiply-add per input feature it
    # reads: kernel size / output features of the kernel.
    per_output = math.prod(kernel.shape) // kernel.shape[-1]
    return 2 * per_output * _elements(outputs.shape)


def _conv(layer, inputs, outputs):
    kernel = layer.kernel  # (kh, kw, in / groups, out)
    per_output = math.prod(kernel.shape[:-1])
    return 2 * per_output * _elements(outputs.shape)


def _attention(layer, inputs, outputs):
    query = inputs[0] if isinstance(inputs, (list, tuple)) else inputs
    value = inputs[1] if isinstance(inputs, (list, tuple)) else inputs
    steps_q, steps_v = query.shape[1], value.shape[1]
    heads, key_dim = layer.num_heads, layer.key_dim
    value_dim = layer.value_dim or key_dim
    projections = sum(
        2 * math.prod(sub.kernel.shape) * steps
        for sub, steps in (
            (layer.query_dense, steps_q),
            (layer.key_dense, steps_v),
            (layer.value_dense, steps_v),
            (layer.output_dense, steps_q),
        )
    )
    scores = 2 * heads * steps_q * steps_v * key_dim
    mixed = 2 * heads * steps_q * steps_v * value_dim
    return projections + scores + mixed


def _lstm(layer, inputs, outputs):
    cell = layer.cell
    steps = inputs.shape[1]
    features = inputs.shape[-1]
    return 2 * 4 * cell.units * (features + cell.units) * steps


def _bidirectional(layer, inputs, outputs):
    return _lstm(layer.forward_layer, inputs, outputs) + _lstm(
        layer.backward_layer, inputs, outputs
    )


def forward_flops(model) -> int:
    """FLOPs of one example's forward pass through a functional `model`
    (the layers counted are listed in the module docstring)."""
    total = 0
    for layer in model.layers:
        if isinstance(layer, keras.layers.InputLayer):
            continue
        inputs, outputs = layer.input, layer.output
        if isinstance(layer, keras.layers.MultiHeadAttention):
            total += _attention(layer, inputs, outputs)
        elif isinstance(layer, keras.layers.Bidirectional):
            total += _bidirectional(layer, inputs, outputs)
        elif isinstance(layer, keras.layers.LSTM):
            total += _lstm(layer, inputs, outputs)
        elif isinstance(layer, keras.layers.Conv2D):
            total += _conv(layer, inputs, outputs)
        elif isinstance(layer, (keras.layers.Dense, keras.layers.EinsumDense)):
            total += _dense_like(layer, inputs, outputs)
        elif isinstance(layer, keras.Model):
            total += forward_flops(layer)
    return total


def training_flops(model) -> int:
    """FLOPs of one example's training step: 3x the forward pass."""
    return 3 * forward_flops(model)


def peak_tflops(device_name: str, policy: str, tf32: bool | None):
    """The device's dense peak for `policy`'s compute dtype, or `None`
    when kmp does not know the device (a CPU, an unlisted GPU)."""
    for model, peaks in PEAK_TFLOPS.items():
        if model in device_name.upper():
            if policy in MIXED_POLICIES:
                return peaks["16-bit"]
            return peaks["tf32"] if tf32 else peaks["float32"]
    return None
