"""Keras's own float8 layers under kmp's loss scale.

Keras's float8 `Dense` and `EinsumDense` (`layer.quantize("float8")`,
`model.quantize("float8")`) quantize each output gradient to E5M2 with a
delayed scale: the largest |gradient| of recent steps
(`outputs_grad_amax_history`) sets `outputs_grad_scale` for the next.
Those gradients carry the loss scale, but Keras starts the scale at 1
and keeps it when the loss scale changes, so a run depends on its loss
scale (BUILD_NOTES, defect 18: 48 steps at scale 1 and 2**15 part by
more than 1e-3). kmp's scaler keeps that state in units of its current
scale:

    when the optimizer builds:   outputs_grad_scale = loss_scale
                                 outputs_grad_amax_history = 0
    when the scale changes by f:  both are multiplied by f
    each step's new scale:       at least loss_scale * 2**-14

A power-of-two loss scale then commutes with every quantization, and
runs at different loss scales train to the same weights, bit for bit.
The reset at build also makes the state agree with the optimizer however
a model was loaded: Keras restores saved variables (the model's and the
optimizer's, in the same units) after it builds the optimizer, and a
model whose weights were loaded alone starts a fresh history.
"""

from keras import ops

# Float16's smallest normal number. Keras divides the output gradient by
# its scale cast to the compute dtype; under mixed_float16 a scale below
# float16's range (a layer whose gradients are tiny: an attention's query
# and key projections at the start of training) casts to 0, 0 / 0 gives
# NaN, the step is skipped, the loss scale halves and the scale with it:
# every later step is skipped (BUILD_NOTES, defect 26). Floored here in
# units of the loss scale, the scale is representable at every loss
# scale >= 1, and runs at different loss scales still floor alike.
SCALE_FLOOR = 2.0**-14

# The names of a Keras float8 layer's output-gradient state (its
# trainable variables with `overwrite_with_gradient`).
NAMES = ("outputs_grad_scale", "outputs_grad_amax_history")


def gradient_state(variables) -> list[int]:
    """The positions in `variables` of Keras float8 layers' output-gradient
    scales and amax histories."""
    return [
        i
        for i, v in enumerate(variables)
        if getattr(v, "overwrite_with_gradient", False) and v.name in NAMES
    ]


def reset(variables, positions, scale) -> None:
    """Starts the state at `positions` in units of the loss scale `scale`:
    each scale at `scale` (Keras starts it at 1), each history empty."""
    for i in positions:
        v = variables[i]
        if v.name == "outputs_grad_scale":
            v.assign(ops.ones(v.shape, v.dtype) * ops.cast(scale, v.dtype))
        else:
            v.assign(ops.zeros(v.shape, v.dtype))


def floored(value, scale):
    """A new output-gradient scale (in units of the loss scale `scale`) of
    at least `SCALE_FLOOR` in real units."""
    return ops.maximum(value, ops.cast(scale, value.dtype) * SCALE_FLOOR)


def rescale(value, factor):
    """One state value in the units of a scale `factor` times the old
    (the scale's change: new / old)."""
    return ops.multiply(value, ops.cast(factor, value.dtype))


def rescaled(values, positions, factor) -> list:
    """`values` with those at `positions` rescaled (the stateless path,
    which returns new values instead of assigning)."""
    values = list(values)
    for i in positions:
        values[i] = rescale(values[i], factor)
    return values
