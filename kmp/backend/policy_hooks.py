"""What kmp wraps in Keras while a 16-bit kmp policy is in force, and
the switch that puts it in place and takes it away.

`kmp.enable`, `kmp.disable` and `kmp.policy_scope` call
`note_dtype_errors`: under a 16-bit global policy `install` wraps, and
otherwise `remove` puts Keras's methods back as they were.

- `Layer._open_name_scope`, the name scope that `Layer.__call__` opens
  around `build` and around the call itself (symbolic, eager or traced):
  the scope's `__exit__` sees the exception Keras raises, after Keras has
  rewritten it ("Exception encountered when calling ..."), and adds
  `dtype_errors`' line; an `__exit__` adds no frame to the traceback.
- `keras.Model`'s `fit`, `evaluate`, `predict` and their `*_on_batch`
  forms, which the user calls: a train step's error passes through no
  layer (one frame of kmp's in such a traceback).
- Whatever another part of kmp registers with `while_16_bit`
  (`kmp.islands` registers `Normalization`'s `build` and `adapt`: the
  switch is `kmp.enable`'s, which a core part beneath the islands
  keeps).

A layer call that succeeds goes through one more `__enter__`/`__exit__`
per scope, two per call (`benchmarks/dtype_notes_cost.py`); a compiled
step runs none. BUILD_NOTES, "What kmp reaches in Keras's private code".
"""

import functools

import keras

from kmp.backend.dtype_errors import dtype_note
from kmp_config.names import HALF_DTYPES

# The Model methods a user calls to run a step (`train_step`, ...).
ENTRY_POINTS = (
    "fit",
    "evaluate",
    "predict",
    "train_on_batch",
    "test_on_batch",
    "predict_on_batch",
)

_installed = {}  # (owner, name) -> what the owner's __dict__ held, or None


class _NotingScope:
    """A layer's name scope whose exit notes a mixed-dtype error."""

    __slots__ = ("scope", "layer")

    def __init__(self, scope, layer):
        self.scope = scope
        self.layer = layer

    def __enter__(self):
        return self.scope.__enter__()

    def __exit__(self, kind, error, tb):
        if error is not None:
            dtype_note(error, self.layer)
        return self.scope.__exit__(kind, error, tb)


def _noting_scope(open_scope):
    @functools.wraps(open_scope)
    def _open_name_scope(self):
        return _NotingScope(open_scope(self), self)

    _open_name_scope._kmp_original = open_scope
    return _open_name_scope


def _noting_entry(method):
    @functools.wraps(method)
    def entry(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except Exception as error:
            dtype_note(error)
            raise

    entry._kmp_original = method
    return entry


# Wrappers other parts of kmp keep on the same switch: `(owner, name,
# wrap)`.
_OTHERS = []


def while_16_bit(owner, name, wrap) -> None:
    """Has kmp wrap `owner.name` (a Keras method) with `wrap(method)`
    while a 16-bit kmp policy is in force, and put Keras's back
    otherwise. `wrap`'s result must carry the method as
    `_kmp_original`."""
    if (owner, name, wrap) not in _OTHERS:
        _OTHERS.append((owner, name, wrap))


def _targets():
    layer = keras.layers.Layer
    yield layer, "_open_name_scope", _noting_scope
    for name in ENTRY_POINTS:
        yield keras.Model, name, _noting_entry
    yield from _OTHERS


def install() -> None:
    """Adds kmp's line to mixed-dtype errors of the user's layers and
    steps, and puts the wrappers `while_16_bit` registered in place
    (idempotent; `remove` undoes it)."""
    if _installed:
        return
    for owner, name, wrap in _targets():
        method = getattr(owner, name, None)
        if method is None:  # a Keras without it: no line, nothing fails
            continue
        _installed[owner, name] = owner.__dict__.get(name)
        setattr(owner, name, wrap(method))


def remove() -> None:
    """Undoes `install`: Keras's methods as they were."""
    for (owner, name), held in _installed.items():
        if not hasattr(owner.__dict__.get(name), "_kmp_original"):
            continue  # wrapped again since (a test's spy): left as it is
        if held is None:
            delattr(owner, name)
        else:
            setattr(owner, name, held)
    _installed.clear()


def dtype_notes_on() -> bool:
    """Whether kmp's line is being added (and the other wrappers are in
    place)."""
    return bool(_installed)


def note_dtype_errors() -> bool:
    """Adds kmp's line to mixed-dtype errors while the global policy
    computes in 16 bits, and stops otherwise (`kmp.enable`,
    `kmp.disable` and `kmp.policy_scope` call it); returns whether it is
    on."""
    if keras.config.dtype_policy().compute_dtype in HALF_DTYPES:
        install()
    else:
        remove()
    return dtype_notes_on()
