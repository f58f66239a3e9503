"""A model whose class has its own `compile` (KerasHub's tasks, keras-io's
GANs, SimCLR and diffusion model), compiled on load as the file says,
with the optimizer state Keras's load leaves out (`kmp.load_model`).

Keras's load skips such a `compile` and warns; the file's compile config
and optimizer state stay unread. `compile_as_saved` compiles the model
from that config and loads the state, and says in one line each what a
model's own `compile` keeps it from putting back.
"""

import inspect
import re
import warnings

import keras

from kmp.scaling.scaled_losses import held_optimizers

# Keras's warning when the file's optimizer state does not fit the
# optimizer the load built, which then starts afresh.
SKIPPED_OPTIMIZER = "Skipping variable loading for optimizer"
_SKIPPED_COUNTS = re.compile(
    SKIPPED_OPTIMIZER + r" '([^']+)', because it has (\d+) variables "
    r"whereas the saved optimizer has (\d+) variables"
)


def compile_as_saved(model, config, filepath, custom_objects, safe_mode):
    """Compiles `model` with the file's compile config and loads the saved
    optimizer state (Keras's `load_weights` reads both from the file).

    What a model's own `compile` keeps from that is one warning line each:
    a `compile` that does not take the file's arguments (keras-io's
    SimCLR: `compile(contrastive_optimizer, probe_optimizer)`) leaves the
    model uncompiled, as Keras's load does; a model saved unbuilt (a
    diffusion model whose `call` never ran) cannot load state; and the
    optimizers a `compile` makes afresh, whose variables only the train
    step knows, start at iteration 0."""
    compile_config = config.get("compile_config")
    if not compile_config:
        return
    arguments = keras.saving.deserialize_keras_object(
        compile_config, custom_objects=custom_objects, safe_mode=safe_mode
    )
    name = type(model).__name__
    try:
        inspect.signature(model.compile).bind(**arguments)
    except TypeError as error:
        warnings.warn(
            f"kmp.load_model: {filepath}: {name}.compile does not take the "
            f"file's compile config ({error}), so the model comes back "
            "uncompiled, as Keras's load gives it, and its optimizers' saved "
            "state (slots, loss scale) is not restored. Compile it as you "
            "did before training on.",
            stacklevel=3,
        )
        return
    model.compile(**arguments)
    if not model.built:
        warnings.warn(
            f"kmp.load_model: {filepath}: the model was saved unbuilt (its "
            "call never ran), and Keras loads no optimizer state into an "
            "unbuilt model: compiled from the file, its optimizer starts "
            "afresh at iteration 0 (slots, loss scale). Build the model "
            "before saving it (model.build(input_shape), or a call on data)"
            " to keep its optimizer's state.",
            stacklevel=3,
        )
        return
    unbuilt = _variable_counts(model)
    model.optimizer.build(model.trainable_variables)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.load_weights(filepath)
    lost = []
    for warning in caught:
        skipped = _SKIPPED_COUNTS.match(str(warning.message))
        if skipped is None:
            warnings.warn_explicit(
                warning.message,
                warning.category,
                warning.filename,
                warning.lineno,
            )
        elif int(skipped.group(3)) != unbuilt.get(skipped.group(1)):
            lost.append(skipped.group(1))  # saved built: state lost
    held = _attributes(model)
    lost = list(dict.fromkeys(held.get(each, each) for each in lost))
    if lost:
        warnings.warn(_afresh(filepath, name, lost), stacklevel=3)


def _variable_counts(model) -> dict:
    """Optimizer name -> variable count, for each optimizer the model
    holds and each one's inner optimizer, as compiled (unbuilt): a file
    whose optimizer has no more was saved unbuilt, and loses nothing."""
    counts = {}
    for _, optimizer in held_optimizers(model, keras.optimizers.Optimizer):
        for each in (optimizer, getattr(optimizer, "inner_optimizer", None)):
            if each is not None:
                counts[each.name] = len(each.variables)
    return counts


def _attributes(model) -> dict:
    """Optimizer name -> the attribute of `model` that holds it (an inner
    optimizer: its scaler's)."""
    names = {}
    for attribute, optimizer in held_optimizers(
        model, keras.optimizers.Optimizer
    ):
        for each in (optimizer, getattr(optimizer, "inner_optimizer", None)):
            if each is not None:
                names.setdefault(each.name, attribute)
    return names


def _afresh(filepath, name, attributes):
    """The line that says which optimizers a model's own compile remade."""
    listed = ", ".join(f"self.{attribute}" for attribute in attributes)
    builds = "; ".join(
        f"model.{attribute}.build(<the variables it trains>)"
        for attribute in attributes
    )
    return (
        f"kmp.load_model: {filepath}: the saved state (slots, loss scale, "
        f"iterations) of {listed} was not restored: {name}.compile makes "
        "them afresh, and only its train step knows which variables each "
        "trains, so each starts at iteration 0. To resume, build each on "
        f"its variables and load the file's weights again: {builds}; "
        "model.load_weights(path)."
    )
