"""The audit's check of softmaxes that no layer of their own computes:
a softmax op in a 16-bit layer of the user's, and Keras's `Attention`
layers, whose score softmax is an op inside them.

`kmp.pin_float32` computes each `Softmax` layer, each softmax or sigmoid
`Activation` and each `MultiHeadAttention`'s score softmax in float32.
A softmax written as an op in a layer's `call` (`keras.ops.softmax`,
`keras.activations.softmax`, `tf.nn.softmax`, `jax.nn.softmax`,
`torch.softmax`) has no layer to pin: it computes in the layer's compute
dtype, its exponentials and their sum rounded to 16 bits, and a mask's
large negative number meets float16's range. keras-io's Swin
Transformer's window attention, its CCT's sequence pooling and its
Perceiver's cross-attention write theirs so (a helper's runs,
2026-11-30); so do `keras.layers.Attention` and `AdditiveAttention`.

It reads the layer's `call` and the methods of `self` it reaches
(`source_reading`) for such a call whose first argument is not a cast to
float32 (`keras.ops.cast(scores, "float32")`, `tf.cast(..., tf.float32)`,
`x.float()`), and warns once per class. Each `check_*` appends
`(severity, where, problem, fix)` tuples to `findings`, as in
`model_checks`.
"""

import ast

import keras

from kmp import backend
from kmp.auditing import source_reading
from kmp.auditing.model_checks import _path

_SOFTMAXES = ("softmax", "log_softmax")
# The packages whose softmax ops the check knows.
_FRAMEWORKS = ("keras", "tensorflow", "jax", "torch")


def _to_float32(node) -> bool:
    """Whether an expression is a cast to float32: a `cast`/`astype`
    call naming float32 (`"float32"`, `tf.float32`, `jnp.float32`), or
    torch's `x.float()`."""
    if not isinstance(node, ast.Call):
        return False
    # The called name's last part: `ops.cast`, `(x * 2).to`, `cast`.
    function = getattr(node.func, "attr", getattr(node.func, "id", ""))
    if function == "float" and not node.args:
        return True
    if function not in ("cast", "astype", "to"):
        return False
    named = [*node.args, *(k.value for k in node.keywords)]
    return any(
        (isinstance(a, ast.Constant) and a.value == "float32")
        or (isinstance(a, ast.Attribute) and a.attr == "float32")
        for a in named
    )


def softmax_ops(method) -> list:
    """The dotted names of the softmax ops a method calls on a tensor
    that is not cast to float32 where it is passed, in the order they
    are written."""
    found = []
    for node, name, package, function in source_reading.module_calls(method):
        if function not in _SOFTMAXES or package not in _FRAMEWORKS:
            continue
        if node.args and _to_float32(node.args[0]):
            continue
        found.append((node.lineno, node.col_offset, name))
    return [name for *_, name in sorted(found)]


def check_softmax_ops(half, findings):
    """A 16-bit layer of the user's whose `call` computes a softmax op
    on a tensor in its compute dtype."""

    def ops_of(method):  # in the user's code, not a library's
        users = backend.is_users(method.owner)
        return softmax_ops(method) if users else []

    for layer, method, op in source_reading.first_in_calls(half, ops_of):
        cls = type(layer).__name__
        findings.append(
            (
                "warning",
                _path(layer),
                f"{method.where} computes {op}(...) in "
                f"{layer.compute_dtype}: an op, not a layer, so "
                "kmp.pin_float32 does not reach it; its exponentials and "
                "their sum are rounded to 16 bits (and a mask's large "
                "negative number meets float16's range).",
                f"{op}(keras.ops.cast(x, 'float32')), cast back to "
                "self.compute_dtype for the next matmul; or run the layer "
                f"in float32: kmp.pin_float32(model, also=[{cls}]).",
            )
        )


def check_attention_layers(half, findings):
    """Keras's `Attention` and `AdditiveAttention` in 16 bits: their
    score softmax is an op inside them, which pinning does not reach."""
    kinds = (keras.layers.Attention, keras.layers.AdditiveAttention)
    for layer in half:
        if not isinstance(layer, kinds):
            continue
        cls = type(layer).__name__
        findings.append(
            (
                "warning",
                _path(layer),
                f"{cls} computes its score softmax in "
                f"{layer.compute_dtype} (an op inside it: kmp.pin_float32 "
                "pins MultiHeadAttention's softmax, not this one's).",
                f"Make it with dtype='float32', or kmp.pin_float32(model, "
                f"also=['{_path(layer)}']) (it holds no matmul weights: "
                "its two matmuls then run in float32 too).",
            )
        )
