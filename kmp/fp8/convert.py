"""`kmp.float8(model)`: a model's eligible matmuls in float8, in place."""

import collections
import warnings

import keras

from kmp import islands
from kmp.errors import InputError
from kmp.errors import InputTypeError
from kmp.fp8 import float8_layers
from kmp.model_layers import check_patterns
from kmp.model_layers import matches

HALF = ("float16", "bfloat16")
_MATMULS = (
    keras.layers.Dense,
    keras.layers.EinsumDense,
    keras.layers.MultiHeadAttention,
)
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
# Exact classes only: a subclass's own `call` would be lost.
_CONVERTIBLE = (*_MATMULS, islands.MultiHeadAttention)
_FLOAT8 = (
    float8_layers.Float8Dense,
    float8_layers.Float8EinsumDense,
    float8_layers.Float8MultiHeadAttention,
)


def float8(model, also=(), skip=()):
    """Runs a mixed-precision model's eligible matmuls in float8.

    Call it after building the model under `kmp.enable("mixed_bfloat16")`
    (or `"mixed_float16"`), after `kmp.pin_float32` if you use it, and
    before `compile`. It changes the model in place and returns it:

    - each `Dense` becomes a `kmp.layers.Float8Dense`, each `EinsumDense`
      a `kmp.layers.Float8EinsumDense`, and each `MultiHeadAttention` a
      `kmp.layers.Float8MultiHeadAttention` (float8 projections, float32
      softmax). Weights, names and configs are kept, and the classes are
      registered, so a `.keras` file restores them;
    - a layer is eligible when its contracting and output sizes are
      multiples of 16 (what float8 tensor cores take) and it computes in
      float16 or bfloat16. The head, the last matmul before each model
      output, is left in the compute dtype: its error would fall straight
      on the loss. Embeddings are lookups, not matmuls, and are left.

    Only the exact Keras classes are converted (a subclass keeps its own
    `call`). Calling it again changes nothing.

    Args:
        model: A built Functional or Sequential Keras model (nested ones
            are opened).
        also: Layers to convert even though they are a head: layer
            classes, or regular expressions matched against a layer's
            `path` or `name`.
        skip: Layers to leave, in the same forms.

    Returns:
        The same model.

    Raises:
        ValueError: If the model computes in float32 (float8 training needs
            the mixed_bfloat16 or mixed_float16 policy), is a subclassed
            model, or is not built.

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
    if not _lists_its_layers(model):
        raise InputError(
            f"kmp.float8 converts Functional and Sequential models, whose "
            f"saved config names each layer's class; {type(model).__name__} "
            "is subclassed. Build its layers as kmp.layers.Float8Dense / "
            "Float8EinsumDense / Float8MultiHeadAttention instead."
        )
    if not model.built or not getattr(model, "outputs", None):
        raise InputError(
            f"Model {model.name!r} is not built: give it an Input (or call "
            "it once) before kmp.float8, which needs its layers' sizes."
        )
    also = check_patterns(also, "also")
    skip = check_patterns(skip, "skip")
    heads = _heads(model)
    layers = list(_layers(model))
    matmuls = [layer for layer in layers if isinstance(layer, _MATMULS)]
    # A model that computes in float32 is refused; one whose only matmuls
    # are float32 (a pinned head over convolutions) has nothing eligible,
    # which the warning below says.
    if matmuls and all(layer.compute_dtype not in HALF for layer in layers):
        raise InputError(
            f"Every matmul layer of {model.name!r} computes in float32. "
            "Float8 training works under the mixed_bfloat16 and "
            "mixed_float16 policies: call kmp.enable('mixed_bfloat16') (or "
            "'mixed_float16') before building the model."
        )
    reasons = collections.Counter()
    converted = 0
    for layer in matmuls:
        if isinstance(layer, _FLOAT8):
            reasons["float8 already"] += 1
            continue
        reason = _ineligible(layer, heads, also, skip)
        if reason:
            reasons[reason] += 1
            continue
        float8_layers.convert(layer)
        converted += 1
    if converted == 0 and not reasons["float8 already"]:
        warnings.warn(_nothing_eligible(model, layers, reasons), stacklevel=2)
        return model
    if converted == 0:
        return model  # called again: nothing to do
    # A compiled model's step functions were traced with the old layers.
    model.train_function = model.test_function = None
    model.predict_function = None
    return model


def _nothing_eligible(model, layers, reasons) -> str:
    """Why no layer of `model` converts, in one sentence or two."""
    found = ", ".join(f"{n} {r}" for r, n in sorted(reasons.items()))
    message = (
        f"kmp.float8: no matmul layer of {model.name!r} is eligible "
        f"({found or 'no Dense, EinsumDense or MultiHeadAttention'}); the "
        "model is unchanged."
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


def _lists_its_layers(model):
    """Whether `model`'s saved config lists its layers with their classes:
    Sequential, and Functional itself (`keras.Model(inputs, outputs)`; a
    subclass of it, such as a KerasHub backbone, rebuilds its layers
    from its own arguments)."""
    cls = type(model)
    return isinstance(model, keras.Sequential) or (
        cls.__name__ == "Functional" and cls.__module__.startswith("keras.")
    )


def _layers(model):
    """The layers of `model`, nested Functional/Sequential models opened
    (their configs name their layers' classes too)."""
    for layer in model.layers:
        if isinstance(layer, keras.Model) and _lists_its_layers(layer):
            yield from _layers(layer)
        else:
            yield layer


def _ineligible(layer, heads, also, skip):
    """Why `layer` stays as it is, or `None` if it converts."""
    if type(layer) not in _CONVERTIBLE:
        return "not a Dense, EinsumDense or MultiHeadAttention"
    if skip and matches(layer, skip):
        return "skipped"
    if id(layer) in heads and not (also and matches(layer, also)):
        return "head (last matmul before an output)"
    if layer.compute_dtype not in HALF:
        return "computes in float32"
    if getattr(layer, "quantization_mode", None) or getattr(
        layer, "lora_enabled", False
    ):
        return "quantized or LoRA"
    if not layer.built:
        return "not built"
    if isinstance(layer, keras.layers.MultiHeadAttention):
        if not any(
            float8_layers.is_eligible_einsum(dense)
            for dense in float8_layers.projections(layer)
        ):
            return "sizes not multiples of 16"
        return None
    if not float8_layers.is_eligible_einsum(layer):
        return "sizes not multiples of 16"
    return None


def _heads(model):
    """Ids of the matmul layers nearest each output: walking back from the
    outputs, the first Dense, EinsumDense or MultiHeadAttention met."""
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
            heads |= _heads(layer)
            continue
        if isinstance(layer, _MATMULS):
            heads.add(id(layer))
            continue
        node = layer._inbound_nodes[history.node_index]
        stack.extend(keras.tree.flatten(node.input_tensors))
    return heads
