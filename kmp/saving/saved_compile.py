"""A model whose class has its own `compile` (KerasHub's tasks, keras-io's
GANs, SimCLR and diffusion model), compiled on load as the file says,
with the optimizer state Keras's load leaves out (`kmp.load_model`).

Keras's load skips such a `compile` and warns; the file's compile config
and optimizer state stay unread. `compile_as_saved` compiles the model
from that config and loads the state, and says in one line each what a
model's own `compile` keeps it from putting back. For any model,
`saved_unbuilt` reads from a file whether its optimizer ever took a
step: a load that skips an unbuilt one's state loses nothing.
"""

import contextlib
import inspect
import re
import warnings
import zipfile

import h5py
import keras
import numpy as np

from kmp.scaling.scaled_losses import held_optimizers

# Keras's warning when the file's optimizer state does not fit the
# optimizer the load built, which then starts afresh.
SKIPPED_OPTIMIZER = "Skipping variable loading for optimizer"
_SKIPPED_COUNTS = re.compile(
    SKIPPED_OPTIMIZER + r" '([^']+)', because it has (\d+) variables "
    r"whereas the saved optimizer has (\d+) variables"
)

# Where a `.keras` archive keeps its weights (Keras's `saving_lib`).
_WEIGHTS = "model.weights.h5"


def compile_as_saved(
    model, config, filepath, custom_objects, safe_mode, unnamed=False
):
    """Compiles `model` with the file's compile config and loads the saved
    optimizer state (Keras's `load_weights` reads both from the file).

    What a model's own `compile` keeps from that is one warning line each:
    a `compile` that does not take the file's arguments (keras-io's
    SimCLR: `compile(contrastive_optimizer, probe_optimizer)`) leaves the
    model uncompiled, as Keras's load does; a model saved unbuilt (a
    diffusion model whose `call` never ran) cannot load state; and the
    optimizers a `compile` makes afresh, whose variables only the train
    step knows, start at iteration 0. `unnamed`: the file's compile
    config names no optimizer (`kmp.load_model` says so itself)."""
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
    optimizers = _optimizers(model)
    # Counted before any is built: a file whose optimizer has no more
    # variables than these was saved unbuilt, and loses nothing.
    counts = {id(o): len(o.variables) for _, o in optimizers}
    model.optimizer.build(model.trainable_variables)
    with _named_by_attribute(optimizers, counts) as unbuilt:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model.load_weights(filepath)
    lost, keras_says = [], None
    for warning in caught:
        skipped = _SKIPPED_COUNTS.match(str(warning.message))
        if skipped is None or not skipped.group(1).startswith(_TAG):
            # Not of an optimizer held as an attribute (one in a list,
            # say): Keras's own words, which name it.
            warnings.warn_explicit(
                warning.message,
                warning.category,
                warning.filename,
                warning.lineno,
            )
        elif int(skipped.group(3)) != unbuilt.get(skipped.group(1), -1):
            # Saved built: its state is lost.
            attribute = skipped.group(1).removeprefix(_TAG).split(":")[0]
            if attribute == "optimizer":
                keras_says = keras_says or str(warning.message)
            elif attribute not in lost:
                lost.append(attribute)
    # A file saved before the first step (a KerasHub task compiles
    # itself, so its file holds an optimizer even untrained) loses
    # nothing, whichever scaler the load built around it.
    if keras_says is not None and not unnamed and not saved_unbuilt(filepath):
        warnings.warn(lost_optimizer(filepath, keras_says), stacklevel=3)
    if lost:
        warnings.warn(_afresh(filepath, name, lost), stacklevel=3)


# Optimizers get this prefix and their attribute's name while the file's
# state loads: Keras's warnings name an optimizer by its `name`, and a
# `compile`'s fresh `Adam()` may take the name of the file's ("adam").
_TAG = "kmp_loading:"


def _optimizers(model):
    """`(attribute, optimizer)` for each optimizer `model` holds and each
    one's inner optimizer (under its scaler's attribute), once each."""
    found = []
    for attribute, optimizer in held_optimizers(
        model, keras.optimizers.Optimizer
    ):
        inner = getattr(optimizer, "inner_optimizer", None)
        for each, suffix in ((optimizer, ""), (inner, ":inner")):
            if each is not None and not any(each is o for _, o in found):
                found.append((attribute + suffix, each))
    return found


@contextlib.contextmanager
def _named_by_attribute(optimizers, counts):
    """Names each of `optimizers` (`_optimizers`' pairs) after the
    attribute that holds it, for the duration (after any build: a
    variable's path takes its optimizer's name when made); yields that
    name -> `counts`' entry."""
    names = [o.name for _, o in optimizers]
    for attribute, optimizer in optimizers:
        optimizer.name = f"{_TAG}{attribute}"
    try:
        yield {o.name: counts[id(o)] for _, o in optimizers}
    finally:
        for (_, optimizer), name in zip(optimizers, names):
            optimizer.name = name


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


def saved_unbuilt(filepath, group="optimizer") -> bool:
    """Whether the `.keras` file at `filepath` holds no more state of an
    optimizer (`group`, its path among the file's weights) than an
    unbuilt one has: scalars only (a built one holds slots shaped as the
    weights it trains) and integer counters at 0 (one without slots,
    SGD without momentum, still counts its iterations). Its state is
    then not lost when a load skips it (a model saved before its first
    step: Keras warns all the same), whatever class the load builds.

    Read from the file, not counted on the optimizer the load built:
    loaded under another policy, that is another class (Keras's scaler
    around the file's Adam, or the Adam alone)."""
    with zipfile.ZipFile(filepath) as archive:
        if _WEIGHTS not in archive.namelist():
            return False  # weights kept elsewhere: cannot tell
        with archive.open(_WEIGHTS) as stream, h5py.File(stream, "r") as h5:
            if group not in h5:
                return False  # Keras's layout moved: cannot tell
            datasets = []
            h5[group].visititems(
                lambda _, node: (
                    datasets.append(node)
                    if isinstance(node, h5py.Dataset)
                    else None
                )
            )
            # Shapes first: a slot is told by its shape, never read (a
            # large model's slots are gigabytes).
            return all(node.shape == () for node in datasets) and not any(
                np.issubdtype(node.dtype, np.integer) and node[()]
                for node in datasets
            )


def lost_optimizer(filepath, keras_says):
    """The line that says a load dropped the model's optimizer's saved
    state (`keras_says`: Keras's warning, with both variable counts)."""
    counts = re.findall(r"(\d+) variables", keras_says)
    detail = (
        f" (the file's has {counts[1]} variables, the one built here "
        f"{counts[0]})"
        if len(counts) == 2
        else ""
    )
    return (
        f"kmp.load_model: {filepath}: the optimizer's saved state was not "
        f"restored{detail}: it starts afresh at iteration 0 (slots, loss "
        "scale). The file was saved with another optimizer than this load "
        "built: Keras's compile adds a LossScaleOptimizer under "
        "mixed_float16 only, so its variables are on one side only when a "
        "file saved under one policy is loaded under another (here, "
        f"loaded under {keras.config.dtype_policy().name}). To restore it, "
        "load under the policy it was trained with "
        '(kmp.load_model(path, policy="saved")); to keep the scaler in the '
        "file, compile with optimizer=kmp.wrap(...)."
    )
