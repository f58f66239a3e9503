"""`kmp.float8(model)`: a model's eligible matmuls in float8, in place.

The conversion is Keras's own: each eligible `Dense` and `EinsumDense`
gets a `QuantizedFloat8DTypePolicy` (what `layer.quantize("float8")`
sets), so it quantizes its inputs and kernel to E4M3 and its output
gradient to E5M2 with delayed scales. The policy is part of the layer's
config, which every model class saves (a KerasHub backbone records it in
its `DTypePolicyMap`), so a `.keras` file keeps the conversion for
Functional, Sequential and subclassed models alike. What kmp adds to
Keras's float8: which layers pay (sizes, heads, the compute dtype), and
in `kmp.LossScaleOptimizer` the output-gradient scales kept in units of
the loss scale (`kmp.scaling.keras_float8`) and agreed across replicas.
"""

import collections
import warnings

import keras

from kmp import backend
from kmp.errors import InputError
from kmp.errors import InputTypeError
from kmp.fp8 import float8_layers
from kmp.fp8 import scaled_layers
from kmp.fp8.matmuls import is_eligible_einsum
from kmp.fp8.matmuls import matmul_sizes
from kmp.layer_policies import record_policies
from kmp.model_layers import all_layers
from kmp.model_layers import check_patterns
from kmp.model_layers import matches
from kmp.model_layers import nested_layers
from kmp.model_layers import retrace_steps
from kmp_config.names import HALF_DTYPES

_MATMULS = (keras.layers.Dense, keras.layers.EinsumDense)
_CONVOLUTIONS = (
    keras.layers.Conv1D,
    keras.layers.Conv2D,
    keras.layers.Conv3D,
    keras.layers.Conv1DTranspose,
    keras.layers.Conv2DTranspose,
    keras.layers.Conv3DTranspose,
    keras.layers.DepthwiseConv1D,
    keras.layers.DepthwiseConv2D,
    keras.layers.SeparableConv1D,
    keras.layers.SeparableConv2D,
)


def float8(model, also=(), skip=(), matmul=None, min_size=None):
    """Runs a mixed-precision model's eligible matmuls in float8.

    Call it after building the model under `kmp.enable("mixed_bfloat16")`
    (or `"mixed_float16"`), after `kmp.pin_float32` if you use it, and
    before `compile`. It changes the model in place and returns it: each
    eligible `Dense` and `EinsumDense`, the projections of attention
    layers included, becomes Keras's float8 layer (the dtype policy
    `layer.quantize("float8")` sets: E4M3 inputs and kernels, E5M2
    output gradients). On JAX and torch it computes with kmp's own
    float8 matmul, each operand scaled from its current amax; on
    TensorFlow as Keras's does, with delayed scales from an amax history
    (`matmul`). Weights and names are kept, and the policy is saved with
    the layer, so a `.keras` file restores it for any model class,
    KerasHub's included. On a GPU with float8 tensor cores only the
    kernels large enough to pay are converted (`min_size`).

    A layer is eligible when it is exactly a Keras `Dense` or
    `EinsumDense` (a subclass stays as it is: Keras's `quantize` refuses
    subclasses, whose code may bypass its float8 path), computes in
    float16 or bfloat16, and
    its contracting and output sizes are multiples of 16 (what float8
    tensor cores take). The head, the last matmul before each model
    output, is left in the compute dtype: its error would fall straight
    on the loss. In a subclassed model with no recorded graph, the head
    is its last matmul layer. Embeddings are lookups, not matmuls, and
    convolutions are left. Calling it again changes nothing.

    Train it with a `kmp.LossScaleOptimizer` (`kmp.wrap`): on Keras's
    path, Keras's own scaler leaves the float8 gradient scales at 1
    while the gradients carry the loss scale, so a run depends on its
    loss scale (kmp's matmul scales each gradient from its own amax, so
    no scaler changes it).

    Args:
        model: A built Keras model of any class (nested models and layers
            are opened).
        also: Layers to convert even though they are a head: layer
            classes, or regular expressions matched against a layer's
            `path` or `name`.
        skip: Layers to leave, in the same forms.
        matmul: How each converted layer computes. `"kmp"` (JAX and
            torch; the default there) uses kmp's own float8 matmul
            (`kmp.fp8.scaled_matmul`): a GEMM on float8 operands scaled
            from their current amax (`dot_general` on JAX,
            `torch._scaled_mm` on torch), both backward matmuls in
            float8 too (on an H200, JAX, 1.18x bfloat16 in `fit` on a
            stack of 8192-wide Dense layers, where Keras's float8 ran at
            0.90x on an H100; on an H200 with eager torch 0.57x-0.88x
            bfloat16 with its quantization eager, which kmp compiles on
            a GPU since: unmeasured). `"keras"`
            (the default on TensorFlow, the only choice there) computes
            as Keras's float8 does: quantize-dequantize around a 16-bit
            matmul, which XLA may rewrite into an FP8 GEMM (nothing
            rewrites it on torch), with delayed scales from amax
            histories. `None` picks the backend's default. The file is
            the same either way (Keras's float8 layers and policies, which
            stock Keras loads); `kmp.load_model` gives the loaded float8
            layers the backend's default matmul again.
        min_size: Converts only matmuls whose kernel, `k` inputs by `n`
            outputs, has `k * n / (k + n)` (half the harmonic mean of
            the two) at least `min_size`: float8 saves matmul time in
            proportion to `k * n` per row, and costs a quantization of
            each operand and gradient, in proportion to `k + n` per row.
            Measured on an H200 (BENCHMARKS.md, "On an H200 ...
            2026-11-28"), kmp's matmul on JAX, 8192 rows of square kernels,
            forward and backward: 0.72x bfloat16's speed at 1024
            (`min_size` 512), 0.98x at 2048 (1024), 1.32x at 4096
            (2048), 1.48x at 8192 (4096). `None` (the default) is 2048
            where kmp's matmul runs on float8 tensor cores (a GPU of
            compute capability 8.9 or more: the square kernels of 4096
            and up, which pay there), and 0 elsewhere: every eligible
            layer, for Keras's path (which paid at no size on an H100)
            and on a CPU (float8's numerics, not its speed). `0`
            converts every eligible layer anywhere.

    Returns:
        The same model.

    Raises:
        ValueError: If the model computes in float32 (float8 training needs
            the mixed_bfloat16 or mixed_float16 policy) or is not built.

    Example:

    ```python
    kmp.enable("mixed_bfloat16")
    model = kmp.float8(kmp.pin_float32(build_model()))
    model.compile(optimizer=kmp.wrap("adam"), loss="...")
    ```
    """
    if not isinstance(model, keras.Model):
        raise InputTypeError(
            f"kmp.float8 expects a Keras model, got {model!r}."
        )
    if not model.built:
        raise InputError(
            f"Model {model.name!r} is not built: give it an Input (or call "
            "it once) before kmp.float8, which needs its layers' sizes."
        )
    matmul = _check_matmul(matmul)
    if min_size is None:
        min_size = default_min_size(matmul)
    if (
        isinstance(min_size, bool)
        or not isinstance(min_size, (int, float))
        or not min_size >= 0
    ):
        raise InputError(
            f"kmp.float8: min_size={min_size!r} is not a number >= 0. Pass "
            "0 to convert every eligible layer, or the kernel size from "
            "which float8 pays (2048 on an H200 with matmul='kmp')."
        )
    also = check_patterns(also, "also")
    skip = check_patterns(skip, "skip")
    layers = all_layers(model)[1:]
    matmuls = [layer for layer in layers if isinstance(layer, _MATMULS)]
    heads = _heads(model, matmuls)
    # A model that computes in float32 is refused; one whose only matmuls
    # are float32 (a pinned head over convolutions) has nothing eligible,
    # which the warning below says.
    if matmuls and all(
        getattr(layer, "compute_dtype", None) not in HALF_DTYPES
        for layer in layers
    ):
        raise InputError(
            f"Every matmul layer of {model.name!r} computes in float32. "
            "Float8 training works under the mixed_bfloat16 and "
            "mixed_float16 policies: call kmp.enable('mixed_bfloat16') (or "
            "'mixed_float16') before building the model."
        )
    reasons = collections.Counter()
    converted = []
    for layer in matmuls:
        if is_float8(layer):
            reasons["float8 already"] += 1
            if matmul == "kmp":
                scaled_layers.use_kmp_matmul(layer)
            continue
        reason = _ineligible(layer, heads, also, skip, min_size)
        if reason:
            reasons[reason] += 1
            continue
        # Keras's float8 with its default amax history (1024 steps): a
        # layer rebuilt from a DTypePolicyMap (an attention's projections,
        # KerasHub's blocks) reads the history length from the map, which
        # has none, so only the default survives a .keras round trip.
        layer.quantize("float8")
        if matmul == "kmp":
            scaled_layers.use_kmp_matmul(layer)
        converted.append(layer)
    if not converted and not reasons["float8 already"]:
        warnings.warn(_nothing_eligible(model, layers, reasons), stacklevel=2)
        return model
    if not converted:
        if matmul == "kmp":  # Keras's float8 layers given kmp's matmul
            retrace_steps(model)
        return model  # called again: nothing else to do
    unsure = record_policies(
        model, {layer: layer.dtype_policy for layer in converted}
    )
    if unsure:
        warnings.warn(
            f"kmp.float8: {len(unsure)} converted layers of {model.name!r} "
            f"(first: {unsure[0].path!r}) are made by code of yours: a "
            ".keras file keeps their float8 only if that code names them "
            "and passes its dtype on (name=..., dtype=self.dtype_policy), "
            "as Keras's and KerasHub's layers do; otherwise the file will "
            "not load, as with Keras's model.quantize. They compute in "
            "float8 now.",
            stacklevel=2,
        )
    retrace_steps(model)
    return model


# The kernel size (`k * n / (k + n)`) from which kmp's float8 matmul
# paid on an H200 (BENCHMARKS.md, 2026-11-28: square 4096 and up).
GPU_MIN_SIZE = 2048


def default_min_size(matmul) -> int:
    """`min_size=None`'s value for `matmul` on this machine (see
    `float8`): `GPU_MIN_SIZE` for kmp's matmul where a GPU of compute
    capability 8.9 or more computes, else 0."""
    if matmul != "kmp":
        return 0
    float8_cores = any(
        device.platform == "gpu"
        and device.compute_capability is not None
        and tuple(device.compute_capability) >= (8, 9)
        for device in backend.list_devices()
    )
    return GPU_MIN_SIZE if float8_cores else 0


def use_default_matmul(model) -> int:
    """Gives a model's float8 Keras `Dense` and `EinsumDense` layers the
    matmul `kmp.float8` gives by default (kmp's own on JAX and torch; on
    TensorFlow they stay Keras's), in place: what a `.keras` file cannot
    keep for the layers a model rebuilds from its code (`kmp.load_model`
    calls it). Returns how many layers it changed."""
    if _check_matmul(None) != "kmp":
        return 0
    changed = [
        layer
        for layer in all_layers(model)[1:]
        if type(layer) in _MATMULS and is_float8(layer)
    ]
    for layer in changed:
        scaled_layers.use_kmp_matmul(layer)
    if changed:
        retrace_steps(model)
    return len(changed)


def _check_matmul(matmul):
    """`matmul`, `None` resolved to this backend's default."""
    kmp_runs = backend.name() in _KMP_MATMUL_BACKENDS
    if matmul is None:
        return "kmp" if kmp_runs else "keras"
    if matmul not in ("keras", "kmp"):
        raise InputError(
            f"kmp.float8: matmul={matmul!r} is not one of 'keras' (Keras's "
            "float8 layers) and 'kmp' (kmp's own float8 matmul, JAX and "
            "torch)."
        )
    if matmul == "kmp" and not kmp_runs:
        raise InputError(
            "kmp.float8(matmul='kmp') runs kmp's float8 matmul, which is "
            f"JAX's and torch's; Keras's backend is {backend.name()!r}. Use "
            "matmul='keras' (the default) here, or KERAS_BACKEND=jax "
            "(or torch)."
        )
    return matmul


# Where kmp's float8 matmul runs (`kmp.fp8.scaled_matmul`): TensorFlow
# has no float8 GEMM to call.
_KMP_MATMUL_BACKENDS = ("jax", "torch")


def is_float8(layer) -> bool:
    """Whether `layer` is a float8 matmul: Keras's (its policy's mode is
    "float8") or one of kmp's own `kmp.layers.Float8*` classes."""
    return getattr(layer, "quantization_mode", None) == "float8" or isinstance(
        layer, float8_layers.FLOAT8_CLASSES
    )


def _nothing_eligible(model, layers, reasons) -> str:
    """Why no layer of `model` converts, in one sentence or two."""
    found = ", ".join(f"{n} {r}" for r, n in sorted(reasons.items()))
    message = (
        f"kmp.float8: no matmul layer of {model.name!r} is eligible "
        f"({found or 'no Dense or EinsumDense'}); the model is unchanged."
    )
    convolutions = sum(isinstance(layer, _CONVOLUTIONS) for layer in layers)
    if convolutions:
        message += (
            f" Its {convolutions} convolutions stay in the compute dtype: "
            "kmp.float8 converts matmul layers only."
        )
    if any(reason.startswith("head") for reason in reasons):
        message += (
            " The head, the last matmul before an output, stays in higher "
            "precision by design (its error falls straight on the loss); "
            "`also=` converts it anyway."
        )
    return message


def _ineligible(layer, heads, also, skip, min_size=0):
    """Why `layer` stays as it is, or `None` if it converts."""
    if type(layer) not in _MATMULS:
        return (
            f"{type(layer).__name__}, a subclass (Keras's quantize takes "
            "its own classes only)"
        )
    if skip and matches(layer, skip):
        return "skipped"
    if id(layer) in heads and not (also and matches(layer, also)):
        return "head (last matmul before an output)"
    if layer.compute_dtype not in HALF_DTYPES:
        return "computes in float32"
    if layer.quantization_mode or getattr(layer, "lora_enabled", False):
        return "quantized or LoRA"
    if not layer.built:
        return "not built"
    if not is_eligible_einsum(layer):
        return "sizes not multiples of 16"
    k, n = matmul_sizes(layer)
    if k * n / (k + n) < min_size and not (also and matches(layer, also)):
        return f"smaller than min_size={min_size}"
    return None


def _heads(model, matmuls):
    """Ids of the matmul layers nearest each output: walking back from the
    outputs through the recorded graph, the first Dense or EinsumDense
    met (all projections of an attention layer met). A model with no
    graph: its last matmul layer."""
    if not getattr(model, "outputs", None):
        return {id(matmuls[-1])} if matmuls else set()
    heads, seen = set(), set()
    stack = list(keras.tree.flatten(model.outputs))
    while stack:
        history = getattr(stack.pop(), "_keras_history", None)
        if history is None:
            continue
        layer = history.operation
        key = (id(layer), history.node_index)
        if key in seen:
            continue
        seen.add(key)
        if isinstance(layer, keras.Model) and layer is not model:
            heads |= _heads(layer, _nested(matmuls, layer))
            continue
        if isinstance(layer, _MATMULS):
            heads.add(id(layer))
            continue
        if isinstance(layer, keras.layers.MultiHeadAttention):
            heads |= {id(m) for m in _nested(matmuls, layer)}
            continue
        node = layer._inbound_nodes[history.node_index]
        stack.extend(keras.tree.flatten(node.input_tensors))
    return heads


def _nested(matmuls, outer):
    """The layers of `matmuls` nested in `outer`."""
    inside = {id(layer) for layer in nested_layers(outer)}
    return [m for m in matmuls if id(m) in inside]
