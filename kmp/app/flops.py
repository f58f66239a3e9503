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

A language model is counted per token, as PaLM counts it
(`causal_lm_flops_per_token`): KerasHub's GPT-2 keeps its matmuls in
decoder blocks that the functional graph does not open, so
`training_flops` counts a `GPT2CausalLM` that way. `utilization` turns
a run's examples/s into model TFLOP/s and MFU (model FLOPs utilization:
the share of the devices' peak those FLOPs would take).
"""

import math
import sys

import keras

from kmp import backend
from kmp_config.names import HALF_DTYPES
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


def causal_lm_flops_per_token(
    layers: int,
    hidden_dim: int,
    sequence_length: int,
    vocabulary_size: int,
    intermediate_dim: int | None = None,
) -> int:
    """Model FLOPs of training a GPT-2-style decoder on one token.

    PaLM's count (Chowdhery et al. 2022, appendix B):

        6 * N + 12 * L * T * d

    `N` is the matmul parameters: per decoder block the query, key,
    value and output projections (`4 * d * d`) and the two feed-forward
    kernels (`2 * d * intermediate_dim`), then the logits matmul
    (`vocabulary_size * d`, whether tied to the token embedding or not).
    Embedding lookups, biases and normalization are not matmuls and are
    not counted. Each parameter takes a multiply-add forward and two
    backward: `6 * N`. The attention products (scores and the weighted
    sum) add `12 * L * T * d`: PaLM counts the full `T x T` scores,
    though a causal mask hides half of them, and so does this. The
    count is the model's, not the hardware's: recomputation (remat) and
    padding are not in it.

    Args:
        layers: Decoder blocks, `L`.
        hidden_dim: Model width, `d` (heads times head size).
        sequence_length: Tokens per sequence, `T`.
        vocabulary_size: Rows of the logits matmul.
        intermediate_dim: The feed-forward width; `None`: `4 * d`, as
            GPT-2 has it.

    Returns:
        FLOPs per token of one training step (forward and backward).

    Example:

    >>> causal_lm_flops_per_token(2, 64, 128, 256)
    884736
    """
    d = hidden_dim
    intermediate = 4 * d if intermediate_dim is None else intermediate_dim
    matmul_parameters = layers * (4 * d * d + 2 * d * intermediate)
    matmul_parameters += vocabulary_size * d
    return 6 * matmul_parameters + 12 * layers * sequence_length * d


def _gpt2_backbone(model):
    """`model`'s backbone if it is KerasHub's `GPT2CausalLM`, else None
    (KerasHub is imported already wherever one was built)."""
    keras_hub = sys.modules.get("keras_hub")
    if keras_hub is None or not isinstance(
        model, keras_hub.models.GPT2CausalLM
    ):
        return None
    return model.backbone


def training_flops(model, sequence_length: int | None = None) -> int:
    """FLOPs of one example's training step: 3x the forward pass.

    For KerasHub's `GPT2CausalLM` an example is a sequence, counted as
    `causal_lm_flops_per_token` times its length: `sequence_length`, or
    the backbone's `max_sequence_length` where it is `None`.
    """
    backbone = _gpt2_backbone(model)
    if backbone is None:
        return 3 * forward_flops(model)
    length = sequence_length or backbone.max_sequence_length
    per_token = causal_lm_flops_per_token(
        backbone.num_layers,
        backbone.hidden_dim,
        length,
        backbone.vocabulary_size,
        backbone.intermediate_dim,
    )
    return per_token * length


def peak_tflops(device_name: str, policy: str, tf32: bool | None):
    """The device's dense peak for `policy`'s compute dtype, or `None`
    when kmp does not know the device (a CPU, an unlisted GPU).

    A mixed policy and a 16-bit one (`"bfloat16"`: bfloat16 master
    weights) take the 16-bit peak; float32 the TF32 peak where `tf32`,
    else the CUDA cores'. Float8 layers are measured against the 16-bit
    peak too: it is the peak of the policy the model runs under.
    """
    for model, peaks in PEAK_TFLOPS.items():
        if model in device_name.upper():
            if policy in MIXED_POLICIES or policy in HALF_DTYPES:
                return peaks["16-bit"]
            return peaks["tf32"] if tf32 else peaks["float32"]
    return None


def utilization(model, results: dict) -> dict:
    """A run's model TFLOP/s and MFU, for its record.

    Achieved model FLOP/s are `training_flops(model)` per example times
    `results["examples_per_s"]`; MFU is that over the peak of the
    devices the batch is split over (`results["replicas"]` devices of
    this process's first device's kind, under `results["policy"]`).

    Args:
        model: The trained model.
        results: The run's record (`kmp.app.run.Run.finish` passes it
            to its `more` function).

    Returns:
        `{"model_tflops": float, "mfu": float or None}`: `None` where
        kmp knows no peak for the device (a CPU, say).
    """
    achieved = training_flops(model) * results["examples_per_s"] / 1e12
    device = backend.list_devices()[0]
    peak = peak_tflops(device.name, results["policy"], backend.tf32_enabled())
    devices = results.get("replicas") or 1
    mfu = achieved / (peak * devices) if peak else None
    return {"model_tflops": achieved, "mfu": mfu}
