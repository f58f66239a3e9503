"""The audit's check of a `train_step` of the user's own under a loss
scaler: which optimizers it applies (a GAN's `d_optimizer` and
`g_optimizer`, not the scaler Keras's `compile` made of its own), whether
it scales their losses, read from its source (`source_reading`) and from
what its steps did (`scaling.scaled_losses`), and which loss each
optimizer applies the gradients of, for the fix.

Each `check_*` appends `(severity, where, problem, fix)` tuples to
`findings`, as in `model_checks`.
"""

import ast
import re

import keras

from kmp.auditing import source_reading
from kmp.scaling import LossScaleOptimizer
from kmp.scaling import scaled_losses


def _step_source(methods) -> str | None:
    """The text of a step's methods (None if one has no source, or an
    expression too deep for `ast.unparse`)."""
    if any(method.tree is None for method in methods):
        return None
    try:
        return "\n".join(ast.unparse(method.tree) for method in methods)
    except RecursionError:
        return None


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
    if not methods:  # not a plain function: a decorator's object
        return None, f"kmp cannot read {type(model).__name__}.train_step"
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


def applied_losses(methods) -> dict:
    """What each optimizer of `self` applies the gradients of, read from
    a train step's source: `{attribute: loss name}`, where a name holds
    gradients that a tape takes of a named loss (`grads =
    tape.gradient(total_loss_G, ...)`, then
    `self.gen_G_optimizer.apply_gradients(zip(grads, ...))`), or where
    an apply follows a named loss's `.backward()` (torch). The name is
    no guess from the optimizer's: keras-io's CycleGAN's `gen_G_loss` is
    one term of the `total_loss_G` its optimizer applies."""
    found = {}
    for method in methods:
        if method.tree is None:
            continue
        grads_of, backwards, applies = {}, [], []
        for node in ast.walk(method.tree):
            if isinstance(node, ast.Assign) and _call_named(
                node.value, "gradient"
            ):
                loss = _name(node.value.args[0] if node.value.args else None)
                for target in node.targets:
                    if loss and isinstance(target, ast.Name):
                        grads_of.setdefault(target.id, []).append(
                            (node.lineno, loss)
                        )
            elif _call_named(node, "backward") and _name(node.func.value):
                backwards.append((node.lineno, node.func.value.id))
            elif _call_named(node, "apply_gradients", "apply"):
                attribute = _self_attribute(node.func.value)
                if attribute and node.args:
                    applies.append((node.lineno, attribute, node.args[0]))
        for line, attribute, grads in applies:
            zipped = isinstance(grads, ast.Call) and _name(grads.func) == "zip"
            if zipped and grads.args:
                grads = grads.args[0]
            # The name's latest gradients before the apply: keras-io's
            # GAN takes `grads` of d_loss, applies, then of g_loss.
            earlier = grads_of.get(_name(grads), [])
            taken = [name for at, name in sorted(earlier) if at < line]
            loss = taken[-1] if taken else None
            if _call_named(grads, "gradient") and grads.args:  # inline
                loss = _name(grads.args[0])
            before = [name for at, name in sorted(backwards) if at < line]
            if loss is None and before:
                loss = before[-1]
            if loss is not None:
                found.setdefault(attribute, loss)
    return found


def _call_named(node, *functions) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in functions
    )


def _name(node):
    return node.id if isinstance(node, ast.Name) else None


def _self_attribute(node):
    """`d_optimizer` of `self.d_optimizer`, else None."""
    if isinstance(node, ast.Attribute) and _name(node.value) == "self":
        return node.attr
    return None


def _loss_name(attribute) -> str:
    """A name for the loss an optimizer held as `attribute` applies the
    gradients of, where the source does not say: `d_optimizer` ->
    `d_loss`, `probe_optimizer` -> `probe_loss`."""
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
    read = applied_losses(reached[0])
    # Where the source does not say, a name for each optimizer's loss
    # (the fix read "loss ...; loss ...", one loss for two), said to be
    # the whole loss it applies the gradients of: keras-io's CycleGAN's
    # `gen_G_loss` is a term of it, and scaling that term alone shrinks
    # the others' gradients 32768x.
    guessed = {
        name: "loss" if len(named) == 1 else _loss_name(name)
        for name, _ in named
        if name not in read
    }
    losses = {**guessed, **read}
    lines = [
        scaled_losses.fix(f"self.{name}", losses[name]) for name, _ in named
    ]
    fix = lines[0]
    if len(named) > 1:
        fix = (
            "scale each loss by the optimizer that applies its gradients: "
            + "; ".join(lines)
        )
    if guessed:
        fix += (
            f" ({', '.join(guessed.values())}: the whole loss whose "
            "gradients that optimizer applies, every term of it)"
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
        fix = "None needed"  # (it scales: the line would be its own)
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
