"""An Orbax checkpoint directory, read as `kmp.load_model` reads a `.keras`
file.

Keras's `OrbaxCheckpoint` (and `kmp.callbacks.OrbaxCheckpoint`, which
numbers its steps) writes, at each step, the model's config (the JSON of
a `.keras` file's `config.json`), its assets (what each saveable's
`save_assets` writes, `kmp.pin_float32`'s mark among them) and its
variables, named by path (`model.get_state_tree()`).
`keras.saving.load_model(directory)` rebuilds the model from the latest
step's config and assigns each saved value to the variable with its path
(`set_state_tree`); a saved value whose path no variable of the rebuilt
model has is dropped without a word. A KerasHub task, whose own
`compile` Keras's load skips, came back with the default optimizer its
constructor compiles, its saved scaler and Adam's moments dropped so
(2026-12-01); a file's optimizer loaded under another policy (Keras's
scaler under mixed_float16 only) loses its state the same way.

`read_checkpoint` reads what `kmp.load_model` needs before it loads: the
latest step's config, whether the saved model was pinned, and the paths
of the saved variables (from the arrays' metadata: no array is read).
After the load, `restore_dropped` puts back the values Keras's load
dropped, or gave another layer, where it can tell their variable
(`mend_paths`, by the ranks of `keras_names`), and says in one line
what is still lost (`unrestored`).
"""

import contextlib
import json
import os
import re
import warnings
from typing import NamedTuple

from kmp.errors import InputError
from kmp.islands.pin_mark import MARK
from kmp.saving.keras_names import SEED_STATE
from kmp.saving.keras_names import known_places
from kmp.saving.keras_names import pair_weights

# The parts of the state tree the model's load assigns (Keras's
# `set_state_tree`). Metrics are left out: a loaded model makes its
# metrics' variables at its first step, after the load.
_GROUPS = ("trainable_variables", "non_trainable_variables")
_OPTIMIZER = "optimizer_variables"
# Why a saved value fits no variable, when `mend_paths` cannot tell.
_WHY = (
    "A path is made of layer names, and a layer Keras names (dense_3) is "
    "named after what the process made before it; kmp pairs those by "
    "their order, and here the model the config builds has other layers "
    "than the run's (its code changed?): load in a new process with the "
    "run's code, or name the model's layers in its code (name=...)."
)


class Checkpoint(NamedTuple):
    """What `read_checkpoint` reads from a directory's latest step."""

    step: int
    config: dict  # the model's, parsed: a `.keras` file's `config.json`
    pinned: bool  # `kmp.pin_float32`'s mark of the saved model
    paths: dict  # state tree group -> {saved path: its shape}


def is_checkpoint_dir(path) -> bool:
    """Whether `path` is a directory of Orbax checkpoint steps (`0/`,
    `12/`, each with Orbax's metadata or a `pytree/`), as an
    `OrbaxCheckpoint` writes (a TensorFlow SavedModel export's `1/` is
    none)."""
    return os.path.isdir(path) and any(
        name.isdigit()
        and any(
            os.path.exists(os.path.join(path, name, marker))
            for marker in ("_CHECKPOINT_METADATA", "pytree")
        )
        for name in os.listdir(path)
    )


def read_checkpoint(path) -> Checkpoint:
    """The latest step of the Orbax checkpoint directory at `path`: its
    model's config, its pin mark and its variables' paths.

    Raises:
        kmp.InputError: orbax-checkpoint is not installed, the latest
            step holds nothing, or no model config (saved with
            `save_weights_only=True`).
    """
    try:
        from orbax.checkpoint import v1 as ocp
    except ImportError:
        raise InputError(
            f"{path} is an Orbax checkpoint directory, and reading one "
            "needs the orbax-checkpoint package: pip install "
            "orbax-checkpoint."
        ) from None
    checkpointer = ocp.training.Checkpointer(directory=path)
    with contextlib.closing(checkpointer), ocp.Context():
        latest = checkpointer.latest
        saved = {}
        if latest is not None:
            found = checkpointer.checkpointables_metadata(latest.step)
            saved = found.metadata
        if "pytree" not in saved:
            step = "" if latest is None else f", step {latest.step},"
            raise InputError(
                f"{path}{step} holds no checkpoint's arrays (a save that "
                "never finished): delete that step's directory to load the "
                "one before it, or save again."
            )
        if "model_config" not in saved:
            raise InputError(
                f"{path}, step {latest.step}, holds weights but no model "
                "config (OrbaxCheckpoint(save_weights_only=True)): build "
                "the model in code, then model.load_weights(directory)."
            )
        wanted = {"model_config": None}
        if "assets" in saved:
            wanted["assets"] = None
        loaded = checkpointer.load_checkpointables(latest.step, wanted)
    tree = saved.get("pytree") or {}
    return Checkpoint(
        step=latest.step,
        config=json.loads(loaded["model_config"]["config"]),
        # At the root of the assets: the saved model's own mark (a model
        # it holds writes its own under its path).
        pinned=MARK in (loaded.get("assets") or {}),
        paths={
            group: {
                key: getattr(leaf, "shape", ())
                for key, leaf in _leaves(tree.get(group) or {})
            }
            for group in (*_GROUPS, _OPTIMIZER)
        },
    )


def mend_paths(model, path, checkpoint, optimizer=True, names=None) -> set:
    """Assigns the saved values that Keras's load dropped for want of a
    variable with their path, or gave a variable of another layer, to
    the variables they belong to; returns the paths of the values it
    assigned.

    A model that Keras builds in `fit` (a Sequential or subclassed one)
    made its variables inside its own name scope, and a load builds it
    outside: the run saved `net/dense/kernel` and Adam's
    `adam/net_dense_kernel_momentum`, the load made `dense/kernel` and
    `adam/dense_kernel_momentum`, and `keras.saving.load_model` gave back
    the initial weights, without a word (keras-team/keras#23251;
    Keras 3.15.1, and 3.16.0.dev2026102704 for a subclassed model, or a
    Sequential one on JAX). And on TensorFlow, Keras's own scaler saved
    its inner optimizer's slots under its scope
    (`loss_scale_optimizer/adam/...`, defect 42).

    And Keras names a layer made without `name=` after what the process
    made before it: the run's `dense_1` and `dense_2` are the load's
    `dense` and `dense_1`, so the load dropped the first and gave the
    second the first's values (`keras_names`).

    The weights first, all or none (`keras_names.pair_weights`): every
    saved weight must pair with one variable, and each variable with
    one, by their paths with the counts of the names Keras made up in
    the load (`names`, `keras_names.names_made`) as ranks, in the
    model's scope or not, and by shape; where they do not (the model's
    code made other layers in the run), nothing more is assigned, and
    what is lost is said (`restore_dropped`). Then the optimizer's
    (`optimizer`), each variable one at a time: a slot is named after
    its variable's path, so it takes the saved value named after the
    saved variable's path, under the same optimizer (in an outer scope,
    or none), with its shape. A dropout's seed state need not fit: a
    fresh one loses nothing."""
    known = known_places(model, names) if names is not None else None
    weights = pair_weights(
        _saved_weights(checkpoint), _weights(model), names, model.name, known
    )
    pairs = {
        group: {
            s: v
            for s, v in weights.items()
            if s in checkpoint.paths[group] and s != v.path
        }
        for group in _GROUPS
    }
    if optimizer and getattr(model, "optimizer", None) is not None:
        renamed = {v.path: s for s, v in weights.items()}
        pairs[_OPTIMIZER] = _slot_pairs(model.optimizer, checkpoint, renamed)
    if not any(pairs.values()):
        return set()
    values = _read_values(
        path,
        checkpoint.step,
        {f"{group}/{s}" for group, matched in pairs.items() for s in matched},
    )
    for group, matched in pairs.items():
        for saved_path, variable in matched.items():
            variable.assign(values[f"{group}/{saved_path}"])
    return {p for matched in pairs.values() for p in matched}


def _read_values(path, step, wanted) -> dict:
    """`{group/path: value}` of the `wanted` saved values of `step`, and
    of no other: Keras's load has read the whole tree once already, and a
    second whole read would hold the model and its optimizer state twice
    in host memory, where `mend_paths` needs the few values it dropped."""
    from orbax.checkpoint import v1 as ocp

    context = ocp.Context()
    context.pytree.loading.partial_load = True
    checkpointer = ocp.training.Checkpointer(directory=path, context=context)
    with contextlib.closing(checkpointer), context:
        saved = checkpointer.checkpointables_metadata(step).metadata["pytree"]
        tree = checkpointer.load_checkpointables(
            step, {"pytree": _pruned(saved, wanted)}
        )["pytree"]
    return dict(_leaves(tree))


def _pruned(tree, wanted, prefix=""):
    """The nested `tree` with only the leaves whose paths are `wanted`."""
    kept = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            below = _pruned(value, wanted, f"{prefix}{key}/")
            if below:
                kept[key] = below
        elif f"{prefix}{key}" in wanted:
            kept[key] = value
    return kept


def _slot_pairs(optimizer, checkpoint, renamed) -> dict:
    """`{saved path: variable}` for the optimizer's variables whose saved
    values Keras's load dropped or gave another variable, through the
    weights' saved paths (`renamed`: the loaded path of each weight
    `pair_weights` paired -> its saved path)."""
    saved = checkpoint.paths[_OPTIMIZER]
    pairs = {}
    for variable in optimizer.variables:
        owner, _, name = variable.path.partition("/")
        # A slot's name is its variable's path with `_` for `/`: the
        # longest such prefix names the variable.
        prefix = max(
            (p for p in renamed if name.startswith(p.replace("/", "_") + "_")),
            key=len,
            default=None,
        )
        if prefix is not None:
            name = renamed[prefix].replace("/", "_") + name[len(prefix) :]
        wanted = f"{owner}/{name}"
        if wanted == variable.path and wanted in saved:
            continue  # Keras's load assigned it
        found = [
            p
            for p in saved
            if (p == wanted or p.endswith("/" + wanted))
            and tuple(saved[p]) == tuple(variable.shape)
            and p not in pairs
        ]
        if len(found) == 1:
            pairs[found[0]] = variable
    return pairs


def restore_dropped(
    model, filepath, checkpoint, optimizer, held=(), names=None
):
    """After Keras's load of a checkpoint directory: puts back the saved
    values it dropped where their variable is known (`mend_paths`), and
    says in one line each what is still lost: weights, the optimizer's
    state (`optimizer`: the load compiled the model, with the optimizer
    the checkpoint names); `held`: the values the load held back for
    another shape (`held_values`); `names`: the load's
    (`keras_names.names_made`)."""
    mended = mend_paths(model, filepath, checkpoint, optimizer, names)
    dropped = unrestored(model, checkpoint, optimizer, mended, held)
    weights = [
        path
        for group in _GROUPS
        for path in dropped.get(group, ())
        # A fresh dropout state draws other masks, and loses nothing.
        if not path.endswith(SEED_STATE)
    ]
    if weights:
        warnings.warn(
            f"kmp.load_model: {filepath}: {len(weights)} saved weights "
            f"(first: {weights[0]!r}) fit no variable of the model the "
            "checkpoint's config builds, so those variables keep their "
            f"initial values. {_WHY}",
            stacklevel=3,
        )
        suspect = _suspects(model, checkpoint, weights, held)
        if suspect:
            warnings.warn(
                f"kmp.load_model: {filepath}: {len(suspect)} weights Keras's "
                f"load did restore (first: {suspect[0]!r}) are of layers "
                "named like those above, which took other names in this load"
                " than in the run: Keras assigns by path, so they may hold "
                "another layer's values. A checkpoint directory cannot tell;"
                " a .keras file (kmp.callbacks.ModelCheckpoint) loads by the "
                "model's structure.",
                stacklevel=3,
            )
    lost = dropped.get(_OPTIMIZER)
    if lost:
        warnings.warn(
            f"kmp.load_model: {filepath}: {len(lost)} of the optimizer's "
            f"saved values (first: {lost[0]!r}) fit no variable of the "
            "optimizer this load built, so those start afresh (slots, loss "
            f"scale, iterations). {_WHY} Loaded under another policy than "
            "the run's, Keras's compile adds or drops its LossScaleOptimizer"
            ': load with kmp.load_model(directory, policy="saved").',
            stacklevel=3,
        )


def _suspects(model, checkpoint, dropped, held) -> list:
    """The paths of the weights Keras's load assigned by path that sit
    beside the ones it `dropped`, or the variables it left: in one
    scope, of one class's Keras names (`block/dense_1` beside a dropped
    `block/dense_2` and a left `block/dense`: the load named the block's
    layers from `dense`, the run from `dense_1`, so the load's
    `block/dense_1`, the block's second layer, took its first's values;
    a reviewer, 2026-12-01), where `mend_paths` could not pair them all
    by rank and assigned nothing; not those it `held` back for another
    shape, which it assigned none."""
    saved = _saved_weights(checkpoint)
    variables = _weights(model)
    left = [v.path for v in variables if v.path not in saved]
    shifted = {_layer_key(p) for p in [*dropped, *left]}
    held = {path for _, path in held}
    return [
        v.path
        for v in variables
        if v.path in saved
        and v.path not in held
        and not v.path.endswith(SEED_STATE)
        and _layer_key(v.path) in shifted
    ]


def _saved_weights(checkpoint) -> dict:
    """`{path: shape}` of the weights the checkpoint saved, trainable or
    not."""
    return {
        path: shape
        for group in _GROUPS
        for path, shape in checkpoint.paths[group].items()
    }


def _weights(model) -> list:
    """The loaded model's weights, trainable or not."""
    return [*model.trainable_variables, *model.non_trainable_variables]


def _layer_key(path):
    """`(scope, name)` of a variable's layer, the name without Keras's
    count: `block/dense_2/kernel` -> `("block", "dense")`."""
    parts = path.split("/")
    layer = parts[-2] if len(parts) > 1 else ""
    scope = parts[-3] if len(parts) > 2 else ""
    return scope, re.sub(r"_\d+$", "", layer)


def unrestored(model, checkpoint, optimizer=True, mended=(), held=()) -> dict:
    """`{group: [paths]}`: the values `checkpoint` saved that no variable of
    the loaded `model` has the path of, so that the load dropped them,
    and those it held back for another shape (`held`: `(group, path)`,
    `held_values`), but for those `mend_paths` assigned (`mended`);
    `optimizer`: its optimizer's too. Groups with none are left out."""
    dropped = {}
    for group, variables in _groups(model, optimizer).items():
        have = {variable.path for variable in variables}
        have -= {path for g, path in held if g == group}
        missing = sorted(set(checkpoint.paths[group]) - have - set(mended))
        if missing:
            dropped[group] = missing
    return dropped


def _groups(model, optimizer):
    """The loaded model's variables, by state tree group."""
    groups = {
        "trainable_variables": model.trainable_variables,
        "non_trainable_variables": model.non_trainable_variables,
    }
    held = getattr(model, "optimizer", None)
    if optimizer and held is not None:
        groups[_OPTIMIZER] = held.variables
    return groups


def _leaves(tree, prefix=""):
    """`(path, leaf)` of a nested state tree, paths as Keras joins them."""
    for key, value in tree.items():
        if isinstance(value, dict):
            yield from _leaves(value, f"{prefix}{key}/")
        else:
            yield f"{prefix}{key}", value
