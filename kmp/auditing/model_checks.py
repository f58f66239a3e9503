"""The audit's checks of the model itself: its outputs, inner softmaxes,
tensor-core sizes and compiled loss.

Like every `check_*` function of `kmp.auditing`, each reads the model
(layers, policies, compiled loss) and runs nothing on it, and appends
`(severity, where, problem, fix)` tuples to `findings`; `kmp.audit` turns
them into `kmp.Finding`s. Severities: "error" (results are wrong),
"warning" (results or speed are at risk), "info".
"""

import functools

import keras

from kmp import backend
from kmp import islands
from kmp.auditing.held_outputs import output_losses
from kmp.auditing.loss_checks import loss_names
from kmp.auditing.loss_checks import probabilities_finding
from kmp.auditing.loss_flow import trainer_losses
from kmp.islands import activation_name
from kmp.islands import is_sensitive
from kmp.model_layers import all_layers
from kmp.model_layers import held_models
from kmp.model_layers import output_layers
from kmp_config.names import HALF_DTYPES

# Tensor cores tile float16/bfloat16 matmuls in multiples of 8.
_MULTIPLE = 8


def _path(layer):
    """Where a finding about `layer` is: its path, or its name (a layer
    without weights may have no path)."""
    return layer.path or layer.name


def half_layers(model):
    """Layers computing in half precision, excluding inputs and the
    softmax inside each MultiHeadAttention (reported with the attention)."""
    layers = [layer for layer in all_layers(model) if layer is not model]
    attention_softmaxes = {
        id(getattr(layer, "_softmax", None))
        for layer in layers
        if isinstance(layer, keras.layers.MultiHeadAttention)
    }
    return [
        layer
        for layer in layers
        if layer.compute_dtype in HALF_DTYPES
        and not isinstance(layer, keras.layers.InputLayer)
        and id(layer) not in attention_softmaxes
    ]


def _padded(n):
    return -(-n // _MULTIPLE) * _MULTIPLE


def check_outputs(model, outputs, findings, losses=None):
    """Outputs not float32, and 16-bit probability outputs by the loss
    that reads them: `losses(layer)`, names of those a trainer applies
    to that output (`held_outputs.output_losses`), or those the model
    was compiled with."""
    if outputs is None:
        _check_subclassed_outputs(model, findings)
        return
    for tensor in keras.tree.flatten(getattr(model, "outputs", None) or []):
        operation = tensor._keras_history.operation
        dtype = keras.backend.standardize_dtype(tensor.dtype)
        if (
            not isinstance(operation, keras.layers.Layer)
            and dtype in HALF_DTYPES
        ):
            findings.append(
                (
                    "warning",
                    "model",
                    f"A model output comes from the op {operation.name!r}, "
                    f"not a layer, and is {dtype}; kmp.pin_float32 cannot "
                    "pin an op.",
                    "Produce the output with a layer (e.g. "
                    "keras.layers.Activation('softmax', dtype='float32')).",
                )
            )
    for layer in outputs:
        # A layer of layers that pinning casts is float32 out, but one
        # that holds probabilities and is cast (a nested model) computed
        # them in 16 bits.
        cast = islands.returns_float32(layer)
        if layer.compute_dtype == "float32" or (
            cast and not islands.holds_probabilities(layer)
        ):
            continue
        if is_sensitive(layer):
            if losses is None:
                names = [name for name, _ in loss_names(model)]
            else:
                names = losses(layer)
            findings.append(probabilities_finding(layer, names, _path(layer)))
        else:
            findings.append(
                (
                    "warning",
                    _path(layer),
                    f"Model output is {layer.compute_dtype}, not float32.",
                    "kmp.pin_float32(model), or dtype='float32' on this layer.",
                )
            )


def _subclassed_output_dtypes(model):
    """Output dtypes of a built subclassed model, or None if unknown."""
    shapes = getattr(model, "_build_shapes_dict", None)
    if not model.built or not shapes or len(shapes) != 1:
        return None
    shape = next(iter(shapes.values()))
    try:
        spec = model.compute_output_spec(keras.KerasTensor(tuple(shape)))
    except Exception:  # an audit reports what it can; it must not crash
        return None
    return {
        keras.backend.standardize_dtype(t.dtype)
        for t in keras.tree.flatten(spec)
    }


def _under(name, where):
    """Where a finding in the held model `name` is (a layer path that
    starts with the model's name already keeps it once)."""
    if where == "model":
        return name
    return where if where.startswith(f"{name}/") else f"{name}/{where}"


def _check_subclassed_outputs(model, findings):
    # A trainer of models it holds (keras-io's VAE: no `call` of its
    # own, the loss on its decoder's output in `train_step`): their
    # outputs are what its loss reads. Under Keras's mixed_float16 the
    # VAE's float16 sigmoid made its crossentropy inf, every epoch.
    # `kmp.pin_float32(model)` pins them too.
    held = held_models(model)
    # Read once: a read of the trainer's `train_step` source.
    losses = trainer_losses(model) if held else {}
    for name, inner in held:
        found = []
        # Each output by the losses that read it: a combined model's
        # images are not its score's crossentropy's.
        read = functools.partial(output_losses, losses, name)
        check_outputs(inner, output_layers(inner), found, read)
        findings.extend(
            (severity, _under(name, where), *rest)
            for severity, where, *rest in found
        )
    if islands.returns_float32(model):
        # Pinned: its outputs are cast to float32, whatever made them (a
        # fused softmax inside is `check_inner_softmaxes`' to report).
        if not model.built:
            findings.append(
                (
                    "info",
                    "model",
                    "Subclassed model, not built: kmp.pin_float32 casts "
                    "its outputs to float32 and pins the layers it makes "
                    "in build once Keras builds it; those were not "
                    "checked.",
                    "Call the model on a batch, then audit again.",
                )
            )
        return
    dtypes = _subclassed_output_dtypes(model)
    if dtypes is None:
        if held:
            return  # what its loss reads was checked above
        findings.append(
            (
                "info",
                "model",
                "Subclassed model, not built with one input: its output "
                "dtype was not checked.",
                "Call the model on a batch, then audit again.",
            )
        )
        return
    if dtypes != {"float32"}:
        findings.append(
            (
                "warning",
                "model",
                f"Subclassed model's output is {', '.join(sorted(dtypes))}, "
                "not float32 (a half-precision softmax or sigmoid there "
                "corrupts crossentropy).",
                "Give the layer that produces it dtype='float32': Keras "
                "records no output layers for subclassed models, so "
                "kmp.pin_float32 cannot find it.",
            )
        )


_SUBCLASS_NOTE = (
    "; a subclass of MultiHeadAttention (KerasHub's CachedMultiHeadAttention"
    " among them) keeps its own code, so kmp.pin_float32 pins its built "
    "softmax only, and a .keras file does not keep that pin: load it with "
    "kmp.load_model, which pins a pinned model again"
)


def _is_subclass(layer) -> bool:
    """A user's or a library's MultiHeadAttention subclass (not Keras's
    own class, not kmp's)."""
    return type(layer) is not keras.layers.MultiHeadAttention and not (
        isinstance(layer, islands.MultiHeadAttention)
    )


def _attention_softmax_in_half(layer) -> bool:
    """Whether a MultiHeadAttention's softmax computes in half precision:
    kmp's class makes it float32 when it builds; any other keeps the
    softmax it built, unless that one is float32."""
    if isinstance(layer, islands.MultiHeadAttention):
        return False
    softmax = getattr(layer, "_softmax", None)
    if isinstance(softmax, islands.Float32Softmax):
        return False
    return softmax is None or softmax.compute_dtype in HALF_DTYPES


def check_inner_softmaxes(half, outputs, findings):
    output_ids = {id(layer) for layer in outputs or []}
    for layer in half:
        if id(layer) in output_ids or isinstance(
            layer,
            (islands.Float32Softmax, islands.Float32Activation),
        ):
            continue
        if isinstance(layer, keras.layers.MultiHeadAttention):
            if not _attention_softmax_in_half(layer):
                continue
            problem = (
                f"Attention softmax computes in {layer.compute_dtype} "
                "whenever Keras takes its unfused path (dropout > 0 or "
                "returned attention scores)"
            )
            fix = "kmp.pin_float32(model)."
            if _is_subclass(layer):
                problem += _SUBCLASS_NOTE
                fix = "kmp.pin_float32(model), once the model is built."
            findings.append(("warning", _path(layer), problem + ".", fix))
        elif is_sensitive(layer) and isinstance(
            layer, (keras.layers.Softmax, keras.layers.Activation)
        ):
            findings.append(
                (
                    "warning",
                    _path(layer),
                    f"{activation_name(layer).capitalize()} computes in "
                    f"{layer.compute_dtype}.",
                    "kmp.pin_float32(model).",
                )
            )
        elif is_sensitive(layer) and activation_name(layer) != "sigmoid":
            # An inner fused sigmoid is a gate (EfficientNet's and
            # MobileNetV3's squeeze-and-excite, a GLU): values in (0, 1)
            # that float16 holds to 3 digits. A sigmoid output is checked
            # with the outputs, against its loss.
            findings.append(
                (
                    "warning",
                    _path(layer),
                    f"Fused {activation_name(layer)} activation computes in "
                    f"{layer.compute_dtype} (kmp.pin_float32 pins separate "
                    "activation layers only).",
                    _fused_fix(layer, outputs),
                )
            )


def _fused_fix(layer, outputs):
    """The fix for a fused softmax in 16 bits. A split-off `Activation`
    computes in float32 and returns 16 bits, right for a softmax inside;
    where the softmax may make the model's output (a subclassed model's
    head: Keras records no output layers) that returns probabilities
    rounded to 16 bits, cast to float32 after (helper, keras-io's NER
    transformer): the layer in float32 then."""
    pin = f"kmp.pin_float32(model, also=['{_path(layer)}'])"
    split = f"keras.layers.Activation('{activation_name(layer)}')"
    if outputs is None:
        return (
            f"{pin}, which computes its probabilities in float32 where "
            "they are the model's output; if it is inside the model, "
            f"split it into {split}."
        )
    return f"Split it into {split}, or {pin}."


def _dims(layer):
    """(name, value) pairs of a layer's tensor-core-relevant sizes."""
    if isinstance(layer, keras.layers.Dense):
        dims = [("units", layer.units)]
        if layer.built:
            dims.append(("input features", layer.kernel.shape[0]))
        return dims
    if isinstance(layer, keras.layers.Embedding):
        # A lookup is no matmul: its table's rows (a vocabulary, 20
        # positions) matter only where the table is one too, the logits
        # of a reversible embedding (KerasHub's, tied or not).
        dims = [("output_dim", layer.output_dim)]
        if hasattr(layer, "tie_weights"):
            dims.insert(0, ("input_dim", layer.input_dim))
        return dims
    if isinstance(layer, keras.layers.MultiHeadAttention):
        return [
            ("key_dim", layer.key_dim),
            ("value_dim", layer.value_dim),
        ]
    if hasattr(layer, "filters") and hasattr(layer, "kernel_size"):
        dims = [("filters", layer.filters)] if layer.filters else []
        if layer.built and hasattr(layer, "kernel"):
            # Transposed convolutions store (..., filters, in_channels).
            transposed = "Transpose" in type(layer).__name__
            in_axis = -1 if transposed else -2
            dims.append(("input channels", layer.kernel.shape[in_axis]))
        return dims
    return []


def check_tensor_core_dims(half, findings):
    for layer in half:
        for name, value in _dims(layer):
            if (
                value
                and value % _MULTIPLE
                and not (name == "input channels" and value <= 4)
            ):
                findings.append(
                    (
                        "info",
                        _path(layer),
                        f"{name}={value} is not a multiple of {_MULTIPLE}: "
                        "tensor cores pad or fall back for this "
                        f"{layer.compute_dtype} op.",
                        f"Use {_padded(value)}.",
                    )
                )


def check_loss(model, outputs, findings):
    names = loss_names(model)
    sigmoid_half = [
        layer
        for layer in outputs or []
        if layer.compute_dtype in HALF_DTYPES
        and activation_name(layer) == "sigmoid"
    ]
    probabilities = [
        layer
        for layer in outputs or []
        if activation_name(layer) in ("softmax", "sigmoid")
    ]
    for name, from_logits in names:
        if (
            "crossentropy" in name
            and not from_logits
            and probabilities
            and not backend.crossentropy_reads_logits()
        ):
            # Info, not a warning: float32 gives the same, pinning cannot
            # change it, and such an example is rare outside label noise.
            findings.append(
                (
                    "info",
                    _path(probabilities[0]),
                    f"{name} on {activation_name(probabilities[0])} "
                    f"probabilities: on the {backend.name()} backend Keras "
                    "computes it from probabilities clipped to [1e-7, "
                    "1 - 1e-7] (only TensorFlow recovers the logits), so "
                    "an example whose true class trails by more than ~16 "
                    "in logits gets a loss of 16.1 and no gradient, in "
                    "float32 as in float16.",
                    "Output logits (no activation, dtype='float32') and "
                    "use the loss with from_logits=True.",
                )
            )
            break
    for name, from_logits in names:
        if "binary_crossentropy" in name and not from_logits and sigmoid_half:
            findings.append(
                (
                    "error",
                    _path(sigmoid_half[0]),
                    "binary_crossentropy on float16 sigmoid probabilities: "
                    "values near 0 and 1 round away and the loss is "
                    "clipped.",
                    "Output logits (no activation, dtype='float32') and use "
                    "BinaryCrossentropy(from_logits=True).",
                )
            )
