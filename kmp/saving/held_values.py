"""Keras's load of a checkpoint directory, a saved value whose path names
a variable of another shape held back for `mend_paths`.

Keras's load assigns a checkpoint's values by path (`set_state_tree`),
and Keras names a layer made without `name=` after what the process made
before it. Where the layers a layer makes in code are of two widths
(keras-io's `TransformerBlock`: `Dense(ff_dim)`, `Dense(embed_dim)`), a
load in a new process gives the second the first's path, and Keras's
`variable.assign` raised a `ValueError` halfway through the load: no
model came back. `assigning_by_path` holds such values back from
Keras's assignment and names them, so that `mend_paths` pairs them by
rank (`keras_names`) with the variables they belong to, or says they
are lost.
"""

import contextlib

import keras
import numpy as np

from kmp.errors import InputError

# The state tree's groups that `set_state_tree` assigns to a model's
# variables, and where those are.
_GROUPS = {
    "trainable_variables": lambda model: model.trainable_variables,
    "non_trainable_variables": lambda model: model.non_trainable_variables,
    "optimizer_variables": lambda model: (
        model.optimizer.variables
        if getattr(model, "optimizer", None) is not None
        else []
    ),
}


@contextlib.contextmanager
def assigning_by_path(filepath, held):
    """Runs Keras's load of the checkpoint directory `filepath` with the
    saved values whose path names a variable of another shape left out of
    its assignment, and added to `held` as `(group, path)`.

    A model class with its own `set_state_tree` assigns as it does; a
    value it assigns to a variable of another shape is an `InputError`
    that says why.

    Args:
        filepath: the directory, for the error.
        held: a set the values held back are added to.
    """
    stock = keras.Model.set_state_tree

    def set_state_tree(model, state_tree):
        kept = {}
        for group, tree in state_tree.items():
            if group in _GROUPS:
                shapes = {v.path: tuple(v.shape) for v in _GROUPS[group](model)}
                tree = _fitting(tree, shapes, group, held)
            kept[group] = tree
        return stock(model, kept)

    keras.Model.set_state_tree = set_state_tree
    try:
        yield
    except ValueError as error:
        if "variable.assign" not in str(error):
            raise
        raise InputError(
            f"{filepath}: Keras's load assigns a checkpoint's values by "
            "path, and the model it builds has variables of those paths "
            "with other shapes: layers that a layer makes in code took "
            "other names in this load than in the run (Keras names them "
            "after what the process made before). Save .keras files "
            "(kmp.callbacks.ModelCheckpoint), which load by the model's "
            "structure, or name those layers in their code (name=...)."
            f" Keras said: {str(error).splitlines()[0]}"
        ) from None
    finally:
        keras.Model.set_state_tree = stock


def _fitting(tree, shapes, group, held, prefix=""):
    """The nested state `tree` without the values whose path names a
    variable of another shape (in `shapes`), those added to `held`."""
    kept = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            kept[key] = _fitting(value, shapes, group, held, path + "/")
        elif path in shapes and np.shape(value) != shapes[path]:
            held.add((group, path))
        else:
            kept[key] = value
    return kept
