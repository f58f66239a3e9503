"""The audit's checks of the optimizer: loss scaling where float16 needs
it (and kmp's scaler rather than Keras's), none where nothing is
float16, and a scaler that a `.keras` file would not record.

Each `check_*` appends `(severity, where, problem, fix)` tuples to
`findings`, as in `model_checks`.
"""

import keras

from kmp.scaling import LossScaleOptimizer


def check_scaling(half, optimizer, findings):
    float16 = [layer for layer in half if layer.compute_dtype == "float16"]
    first = float16 and (float16[0].path or float16[0].name)
    scaled = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
    if optimizer is None:
        findings.append(
            (
                "info",
                "model",
                "No optimizer given and the model is not compiled: loss "
                "scaling was not checked.",
                "Pass optimizer= or compile the model first.",
            )
        )
    elif float16 and not scaled:
        findings.append(
            (
                "error",
                "model",
                f"{len(float16)} layer(s), e.g. {first!r}, "
                "compute in float16 but the "
                f"optimizer ({type(optimizer).__name__}) does not scale the "
                "loss: small gradients underflow to zero.",
                "compile with optimizer=kmp.wrap(optimizer) under "
                "mixed_float16, or kmp.LossScaleOptimizer(optimizer).",
            )
        )
    if scaled and not isinstance(optimizer, LossScaleOptimizer):
        findings.append(
            (
                "warning",
                "model",
                "The stock keras LossScaleOptimizer has no floor or cap on "
                "its scale (it can reach 0 and write NaN into the weights) "
                "and counts no skipped steps.",
                "compile with optimizer=kmp.wrap(inner_optimizer).",
            )
        )
    if scaled and not float16:
        findings.append(
            (
                "info",
                "model",
                "The optimizer scales the loss but no layer computes in "
                "float16 (bfloat16 and float32 need no loss scaling).",
                "Use kmp.wrap(optimizer), which scales only under float16.",
            )
        )


def check_saving(model, optimizer, findings):
    """A scaler that Keras made at compile time, which a `.keras` file
    does not record."""
    if type(optimizer) is not keras.optimizers.LossScaleOptimizer or not (
        getattr(model, "compiled", False)
    ):
        return
    compiled_with = model.get_compile_config().get("optimizer")
    if isinstance(compiled_with, dict):
        compiled_with = compiled_with.get("class_name")
    if "LossScaleOptimizer" in str(compiled_with):
        return  # the file records the scaler itself
    findings.append(
        (
            "warning",
            "model",
            f"Keras wrapped the compiled {compiled_with} in its "
            "LossScaleOptimizer itself, and a .keras file records only "
            f"the {compiled_with}: keras.saving.load_model gives this "
            "model back without a loss scale and drops the optimizer's "
            "state, unless the global policy is mixed_float16 when it "
            "loads.",
            "compile with optimizer=kmp.wrap(...), which the file records.",
        )
    )
