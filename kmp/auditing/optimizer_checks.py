"""The audit's checks of the optimizer: loss scaling where float16 needs
it (and kmp's scaler rather than Keras's), none where nothing is
float16, one that is no Keras optimizer, the memory modes, and a scaler
that a `.keras` file would not record (a `train_step` of the user's own:
`train_step_checks`).

Each `check_*` appends `(severity, where, problem, fix)` tuples to
`findings`, as in `model_checks`.
"""

import keras

from kmp import backend
from kmp.memory import recomputes_in_policy
from kmp.memory import rematerialized_layers
from kmp.memory import rounding_of
from kmp.memory import state_dtype_of
from kmp.scaling import LossScaleOptimizer
from kmp.scaling import scaled_losses


def check_scaling(half, optimizer, findings, attribute="optimizer"):
    """Loss scaling where float16 needs it, kmp's rather than Keras's,
    none where nothing is float16; `attribute`: what the model holds the
    optimizer as (a GAN's `g_optimizer`, which its `compile` takes)."""
    float16 = _trained_float16(half, optimizer)
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
                f"compute in float16 but the {attribute} "
                f"({type(optimizer).__name__}) does not scale the "
                "loss: small gradients underflow to zero.",
                f"compile with {attribute}=kmp.wrap(optimizer) under "
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
                f"compile with {attribute}=kmp.wrap(inner_optimizer).",
            )
        )
    if scaled and not float16:
        fix = "Use kmp.wrap(optimizer), which scales only under float16."
        if keras.config.dtype_policy().compute_dtype == "float16":
            # kmp.wrap's own scaler, where pinning left no float16 layer
            # (a one-Dense model): it goes by the global policy.
            fix = (
                "None needed (a scale rarely overflows float32 gradients); "
                f"to drop it, compile with {attribute}.inner_optimizer "
                "(kmp.wrap scales under a float16 global policy, whatever "
                "the layers compute in)."
            )
        findings.append(
            (
                "info",
                "model",
                "The optimizer scales the loss but no layer computes in "
                "float16 (bfloat16 and float32 need no loss scaling).",
                fix,
            )
        )


def _trained_float16(half, optimizer) -> list:
    """The float16 layers (a nested model is no layer here) among `half`
    whose weights `optimizer` trains, once it is built (a GAN's
    `disc_optimizer` trains its discriminator's); all of them before."""
    float16 = [
        layer
        for layer in half
        if layer.compute_dtype == "float16"
        and not isinstance(layer, keras.Model)
    ]
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    trained = {id(v) for v in getattr(inner, "_trainable_variables", ())}
    if not trained:
        return float16
    return [
        layer
        for layer in float16
        if any(id(w) in trained for w in layer.trainable_weights)
    ]


def check_foreign(half, optimizer, findings) -> bool:
    """An optimizer that is no Keras optimizer (keras-io's loop guide's
    `torch.optim.Adam(model.parameters())`, an optax transformation):
    kmp's scaling does not reach it, and the other optimizer checks read
    Keras's. Returns whether it was one."""
    if optimizer is None or isinstance(optimizer, keras.Optimizer):
        return False
    kind = f"{type(optimizer).__module__}.{type(optimizer).__qualname__}"
    yourself = " (torch.amp.GradScaler)" if backend.name() == "torch" else ""
    float16 = any(layer.compute_dtype == "float16" for layer in half)
    findings.append(
        (
            "warning" if float16 else "info",
            "optimizer",
            f"The optimizer is a {kind}, not a Keras optimizer: kmp's loss "
            "scaling does not reach it, nor do its other checks"
            + (
                ", and float16 gradients of an unscaled loss can underflow "
                "to zero."
                if float16
                else " (nothing computes in float16: no scaling needed)."
            ),
            "Train with optimizer = kmp.wrap(keras.optimizers.Adam(...)): "
            f"{scaled_losses.fix('optimizer', stateless=False)}, then "
            "optimizer.apply(grads, model.trainable_variables) "
            f"(docs/custom-loops.md); or scale the loss yourself{yourself}.",
        )
    )
    return True


def check_memory(model, optimizer, findings):
    """Which memory mode the model and optimizer are in: bfloat16 master
    weights (a warning unless rounded stochastically: updates under half
    a step vanish), 16-bit state, and float16 state (whose range
    underflows Adam's second moment of small gradients)."""
    bfloat16 = [
        v.path
        for v in model.trainable_variables
        if keras.backend.standardize_dtype(v.dtype) == "bfloat16"
    ]
    _check_remat(model, findings)
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    if bfloat16 and optimizer is not None:
        if rounding_of(inner) == "stochastic":
            findings.append(
                (
                    "info",
                    "model",
                    f"{len(bfloat16)} trainable variable(s) are bfloat16 "
                    f"master weights, which {type(inner).__name__} writes "
                    "by stochastic rounding (seed "
                    f"{inner._rounding_seed}).",
                    "None needed: 2 bytes per weight instead of 4.",
                )
            )
        else:
            findings.append(
                (
                    "warning",
                    "model",
                    f"{len(bfloat16)} trainable variable(s), e.g. "
                    f"{bfloat16[0]!r}, are bfloat16 and the optimizer "
                    "rounds their updates to nearest: an update under half "
                    "a bfloat16 step (2**-9 of the weight) is lost, so "
                    "training stalls as its updates get small.",
                    "Compile with kmp.wrap(optimizer) under kmp.enable("
                    "'mixed_bfloat16', master_weights='bfloat16'), which "
                    "rounds stochastically (or pass rounding='stochastic').",
                )
            )
    if optimizer is None:
        return
    state_dtype = state_dtype_of(inner)
    if state_dtype:
        weights = "bfloat16" if bfloat16 else "float32"
        stored = (
            "as 8-bit codes in blocks of 256 with a float32 scale each "
            "(smaller slots float32)"
            if state_dtype == "int8"
            else f"in {state_dtype}"
        )
        findings.append(
            (
                "info",
                "optimizer",
                f"{type(inner).__name__} stores its slots {stored} "
                "and computes its update in float32 (kmp.wrap(..., "
                f"state_dtype={state_dtype!r})); weights are {weights}.",
                "None needed: fewer bytes than Keras's state.",
            )
        )
    float16 = [v.path for v in inner.variables if v.dtype == "float16"]
    if float16:
        findings.append(
            (
                "warning",
                "optimizer",
                f"{len(float16)} optimizer variable(s), e.g. {float16[0]!r}, "
                "are float16: a second moment of gradients below ~1e-4 "
                "underflows to 0 (float16's smallest normal is 6e-5), and "
                "Adam's step divides by its square root.",
                "Keep float32 variables (a mixed policy), or store the "
                "state in bfloat16: kmp.wrap(optimizer, "
                "state_dtype='bfloat16').",
            )
        )


def _check_remat(model, findings):
    """Rematerialized layers, and those Keras's `RematScope` made that
    `kmp.rematerialize` did not fix (BUILD_NOTES defects 29 and 30)."""
    layers = rematerialized_layers(model)
    stock = [layer for layer in layers if not recomputes_in_policy(layer)]
    if stock:
        findings.append(
            (
                "warning",
                stock[0].path or stock[0].name,
                f"{len(stock)} layer(s) made under keras.RematScope are "
                "recomputed by Keras alone: under a mixed policy the "
                "recomputation reads float32 variables (TensorFlow and "
                "torch fail), TensorFlow refuses keyword arguments "
                "(training=...), JAX a layer's `if training:`, and torch "
                "recomputes dropout with another mask (wrong gradients).",
                "kmp.rematerialize(model) after building it.",
            )
        )
    elif layers:
        findings.append(
            (
                "info",
                "model",
                f"{len(layers)} layer(s) are recomputed in the backward "
                "pass (kmp.rematerialize): less memory, more compute.",
                "None needed.",
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
