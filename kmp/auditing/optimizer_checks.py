"""The audit's checks of the optimizer: loss scaling where float16 needs
it (and kmp's scaler rather than Keras's), none where nothing is
float16, a scaler that a `.keras` file would not record, and a
`train_step` of the user's own that may not scale its loss.

Each `check_*` appends `(severity, where, problem, fix)` tuples to
`findings`, as in `model_checks`.
"""

import ast
import re

import keras

from kmp.auditing import source_reading
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


def check_foreign(half, optimizer, findings) -> bool:
    """An optimizer that is no Keras optimizer (keras-io's loop guide's
    `torch.optim.Adam(model.parameters())`, an optax transformation):
    kmp's scaling does not reach it, and the other optimizer checks read
    Keras's. Returns whether it was one."""
    if optimizer is None or isinstance(optimizer, keras.Optimizer):
        return False
    kind = f"{type(optimizer).__module__}.{type(optimizer).__qualname__}"
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
            "Train with kmp.wrap(keras.optimizers.Adam(...)): "
            "loss = optimizer.scale_loss(loss), then optimizer.apply(grads, "
            "model.trainable_variables) (docs/custom-loops.md); or scale "
            "the loss yourself (torch.amp.GradScaler).",
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


def _step_source(methods) -> str | None:
    """The text of a step's methods (None if one has no source)."""
    if any(method.tree is None for method in methods):
        return None
    return "\n".join(ast.unparse(method.tree) for method in methods)


def _reads_compiled(source) -> bool:
    return re.search(r"\.optimizer\b", source) is not None


def applied_optimizers(model, optimizer) -> list:
    """`(attribute, optimizer)` for each optimizer the model's train step
    applies: `optimizer`, the compiled one (as "optimizer"), or, where a
    step of the user's own plainly never reads `self.optimizer` and the
    model holds optimizers itself, those (a GAN's `d_optimizer` and
    `g_optimizer`; its `compile()` passes none to Keras's, which makes an
    RMSprop of its own that no step applies)."""
    if type(model).train_step is keras.Model.train_step:
        return [("optimizer", optimizer)]
    held = scaled_losses.held_optimizers(model, keras.Optimizer, optimizer)
    source = _step_source(
        source_reading.reachable(type(model), "train_step")[0]
    )
    if held and source is not None and not _reads_compiled(source):
        return held
    return [("optimizer", optimizer)]


def _scalers(model, optimizer, source):
    """The loss-scaling optimizers a train step of the model may apply,
    each once, with its name: those the model holds as attributes (a
    GAN's `d_optimizer` and `g_optimizer`), and the compiled one unless
    the step plainly never reads it (a GAN's `compile` passes no
    optimizer to Keras's, which then makes and wraps an RMSprop of its
    own that no step applies)."""
    found = scaled_losses.held_optimizers(
        model, keras.optimizers.LossScaleOptimizer, optimizer
    )
    reads_compiled = source is None or _reads_compiled(source)
    # Held optimizers of any kind count: a GAN's plain `d_optimizer` and
    # `g_optimizer` under Keras's own mixed_float16 leave the compiled
    # scaler unapplied as much as kmp's would.
    holds_its_own = scaled_losses.held_optimizers(
        model, keras.Optimizer, optimizer
    )
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer) and (
        reads_compiled or not holds_its_own
    ):
        found = [("optimizer", optimizer), *found]
    return found


def _names_scaling(tree) -> bool:
    return any(
        isinstance(node, ast.Attribute)
        and node.attr.endswith(scaled_losses.SCALING_CALLS)
        for node in ast.walk(tree)
    )


def step_scales(model, reached=None):
    """Whether the model's `train_step` scales its loss, read from its
    source, the methods of `self` it reaches and the functions of the
    user's they call (`source_reading`, to `source_reading.DEPTH` calls
    deep).

    Args:
        model: The model.
        reached: What `source_reading.reachable` gave for its
            `train_step`, if the caller has it.

    Returns:
        `(scales, why)`: `scales` is True where a method the step
        reaches names a scaling call (`why`: which method), False where
        none does and everything the step reaches was read, None where
        kmp cannot tell (`why` says what it could not read or follow).
    """
    methods, deeper = reached or source_reading.reachable(
        type(model), "train_step"
    )
    functions, deeper_functions = source_reading.reached_functions(methods)
    for method in methods:
        if method.tree is not None and _names_scaling(method.tree):
            return True, method.where
    unread = [method.where for method in methods if method.tree is None]
    unread += [f.__qualname__ for _, f, tree in functions if tree is None]
    if unread:
        return None, f"kmp cannot read the source of {unread[0]}"
    for caller, function, tree in functions:
        if _names_scaling(tree):
            # A function may scale or not by its arguments (keras-io
            # steps' `_scaling(optimizer, scale)` in kmp's tests).
            return None, (
                f"{caller} calls {function.__qualname__}, a function that "
                "names a loss scaling, which may depend on its arguments"
            )
    if deeper or deeper_functions:
        return None, (
            "it calls methods or functions more than "
            f"{source_reading.DEPTH} calls deep, which kmp does not read"
        )
    return False, "never scales"


def _loss_name(attribute) -> str:
    """The loss an optimizer held as `attribute` scales, in a fix's
    words: `d_optimizer` -> `d_loss`, `probe_optimizer` -> `probe_loss`."""
    stem = scaled_losses.stem(attribute)
    return f"{stem}_loss" if stem else "loss"


def check_train_step(model, optimizer, findings):
    """A `train_step` of the user's own under a loss scaler: whether it
    scales its loss (`step_scales`), and what kmp does if not
    (`scaling.scaled_losses`).
    """
    if type(model).train_step is keras.Model.train_step:
        return
    reached = source_reading.reachable(type(model), "train_step")
    scalers = _scalers(model, optimizer, _step_source(reached[0]))
    if not scalers:
        return
    cls = type(model).__name__
    stock = [n for n, s in scalers if not isinstance(s, LossScaleOptimizer)]
    scales, why = step_scales(model, reached)
    where = f"in {why}"
    unscaled = scaled_losses.unscaled_in(model)
    if not unscaled and scales is not True and scaled_losses.scaled_in(model):
        # It ran, and kmp saw it scale what it applied: what its source
        # could not tell (a function two calls deep, a helper's helper).
        scales, where = True, "seen at a step it ran"
    # Once the step ran, only the scalers it gave unscaled gradients: a
    # GAN's step may scale one loss of two.
    named = [(n, s) for n, s in scalers if n in unscaled] or scalers
    names = ", ".join(name for name, _ in named)
    if len(named) == 1:
        fix = scaled_losses.fix(named[0][0]) + " before taking the gradients"
    else:
        # Each optimizer scales its own loss (a GAN's d_loss, g_loss).
        fix = (
            "scale each loss by the optimizer that applies its gradients, "
            "before taking them: "
            + "; ".join(
                scaled_losses.fix(name, _loss_name(name)) for name, _ in named
            )
        )
    if unscaled:
        severity, problem = (
            "warning",
            f"{cls}.train_step applied gradients of a loss that {names} "
            "did not scale (found at its first step): kmp applies them "
            "unscaled, and float16 gradients of an unscaled loss can "
            "underflow to zero.",
        )
    elif stock and scales is False:
        findings.append(
            (
                "error",
                "model",
                f"{cls} overrides train_step and its source never scales "
                f"the loss, under Keras's own LossScaleOptimizer "
                f"({', '.join(stock)}): it divides gradients that were "
                "never multiplied, so every gradient it applies is 32768x "
                "too small (an SGD update too; an adaptive optimizer's, "
                "Adam's, shrinks less, as far as its epsilon outweighs "
                "them).",
                f"compile with kmp.wrap(...), and {fix}.",
            )
        )
        return
    elif scales:
        severity, problem = (
            "info",
            f"{cls} overrides train_step and scales its loss ({names}, "
            f"{where}): kmp unscales the gradients of each loss its "
            "scaler scaled in that step, and applies any other gradients "
            "unscaled, saying so once.",
        )
    else:
        unscaled = (
            f"where it does not, Keras's own LossScaleOptimizer "
            f"({', '.join(stock)}) divides gradients that were never "
            "multiplied, so every gradient it applies is 32768x too small"
            if stock
            else "where the step does not scale, kmp applies the gradients "
            "unscaled and says so at the first step, but float16 gradients "
            "of an unscaled loss can underflow to zero"
        )
        severity, problem = (
            "warning",
            f"{cls} overrides train_step under a loss scaler ({names}) and "
            + (
                "its source never scales the loss"
                if scales is False
                else f"kmp cannot tell whether it scales the loss ({why})"
            )
            + f": {unscaled}.",
        )
    findings.append((severity, "model", problem, fix + "."))
