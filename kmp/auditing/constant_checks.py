"""The audit's check of the constants in a layer of the user's that
float16 cannot hold.

A layer of one's own that masks attention scores as float32 code does,
`scores + (1 - mask) * -1e9`, computes it in its compute dtype: under
mixed_float16 `-1e9` is `-inf`, and where the mask keeps a position
`(1 - mask) * -inf` is `0 * -inf`, NaN. Every gradient is then
non-finite and every step skipped, in stock Keras too (a helper's
keras-io-style attention on TensorFlow, 2026-11-30: loss NaN, 16 of 16
steps skipped in two epochs, the scale down to its floor). Keras's own
masks use a number the compute dtype holds (its `Softmax`, which
`MultiHeadAttention` masks with, puts -3e4 where a mask hides in
float16). bfloat16 holds float32's range: the check is float16's only.

It reads the layer's `call` and the methods of `self` it reaches
(`source_reading`) for a number literal beyond 65504 that is an operand
of `+`, `-` or `*` (`+=` ... too; a Python int meets a float16 tensor as
float16 as well); a clip's or a `where`'s argument is not arithmetic on
it and is left alone, and so is a named constant (`NEG = -1e9`), which
it does not follow. Each `check_*` appends `(severity, where,
problem, fix)` tuples to `findings`, as in `model_checks`.
"""

import ast
import math

from kmp import backend
from kmp.auditing import source_reading
from kmp.auditing.model_checks import _path

# The largest finite float16.
FLOAT16_MAX = 65504.0


_ARITHMETIC = (ast.Add, ast.Sub, ast.Mult)


def _operand_value(node):
    """The number a `+`, `-` or `*` operand spells, signed (`-1e9` is a
    minus applied to `1e9`), or None."""
    sign = 1
    while isinstance(node, ast.UnaryOp) and isinstance(
        node.op, (ast.USub, ast.UAdd)
    ):
        sign = -sign if isinstance(node.op, ast.USub) else sign
        node = node.operand
    if (
        isinstance(node, ast.Constant)
        and isinstance(node.value, (int, float))
        and not isinstance(node.value, bool)
    ):
        return sign * node.value
    return None


def large_operands(tree) -> list:
    """Number literals beyond float16's range that are operands of `+`,
    `-` or `*` (or `+=`, `-=`, `*=`) in a method's syntax tree, signed,
    in the order they are written."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, _ARITHMETIC):
            operands = (node.left, node.right)
        elif isinstance(node, ast.AugAssign) and isinstance(
            node.op, _ARITHMETIC
        ):
            operands = (node.value,)
        else:
            continue
        for operand in operands:
            value = _operand_value(operand)
            if value is not None and math.isfinite(value):
                if abs(value) > FLOAT16_MAX:
                    found.append((operand.lineno, operand.col_offset, value))
    return [value for *_, value in sorted(found)]


def check_large_constants(half, findings):
    """A float16 layer of the user's whose `call` does arithmetic with a
    constant float16 cannot hold: inf there, and NaN where it meets 0."""
    float16 = [layer for layer in half if layer.compute_dtype == "float16"]

    def constants(method):  # in the user's code, not a library's
        users = backend.is_users(method.owner)
        return large_operands(method.tree) if users else []

    for layer, method, value in source_reading.first_in_calls(
        float16, constants
    ):
        cls = type(layer)
        findings.append(
            (
                "warning",
                _path(layer),
                f"{method.where} computes with the constant {value:g}, "
                "beyond float16's range (65504): in the layer's float16 "
                "arithmetic it is inf, and inf * 0 is NaN (an additive "
                "mask, `scores + (1 - mask) * -1e9`, makes every position "
                "it keeps NaN, and every step is skipped).",
                "Use a number float16 holds (Keras's Softmax masks with "
                "-3e4 in float16), or run the layer in float32: "
                f"{cls.__name__}(..., dtype='float32'), or "
                f"kmp.pin_float32(model, also=[{cls.__name__}]).",
            )
        )
