"""Keras's version, and the private names of Keras that kmp reaches.

kmp is tested with the Keras versions in `TESTED_KERAS` (`pyproject.toml`
allows that range). Where Keras has no public hook, kmp uses a private
name (`Layer._remat_mode`, `keras.src...`): BUILD_NOTES.md lists each
one ("What kmp reaches in Keras's private code"), and
`tests/backend/keras_internals_test.py` checks each one on the Keras it
runs with. `private_import` and `private_attribute` get such a name at
its point of use and, where this Keras lacks it, raise
`KerasInternalsError` naming the kmp feature, the Keras version and the
ones kmp is tested with, not an `AttributeError` deep in a step.

Where Keras's behaviour differs between the tested versions, kmp branches
on `keras_version()`, here and nowhere else.
"""

import importlib
import re

import keras

# Keras 3.15.1: the `test` extra's pin, CI's. keras-nightly
# 3.16.0.dev2026102704: `.ci/nightly`.
TESTED_KERAS = ("3.15.1", "3.16.0.dev2026102704")


class KerasInternalsError(RuntimeError):
    """This Keras lacks a private name a kmp feature uses."""


def keras_version() -> tuple:
    """The running Keras's release as integers: `(3, 16, 0)` for
    3.16.0.dev2026102704 (a nightly counts as its release)."""
    release = re.match(r"(\d+)\.(\d+)\.(\d+)", keras.__version__)
    return tuple(int(part) for part in release.groups())


def changed(what: str, feature: str) -> KerasInternalsError:
    """The error for `feature` when this Keras lacks `what`."""
    return KerasInternalsError(
        f"{feature} uses Keras's private {what}, which Keras "
        f"{keras.__version__} does not have. kmp is tested with Keras "
        f"{' and '.join(TESTED_KERAS)}: install one of them (pip install "
        f'"keras=={TESTED_KERAS[0]}"), or see BUILD_NOTES.md, "What kmp '
        "reaches in Keras's private code\"."
    )


def private_import(module: str, name: str, feature: str):
    """`from module import name`, for `feature`; `KerasInternalsError`
    if this Keras has no such module or name."""
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        raise changed(f"`{module}.{name}`", feature) from None


def private_attribute(owner, name: str, feature: str):
    """`getattr(owner, name)`, for `feature`; `KerasInternalsError` if
    `owner` (a Keras object or class) has no such attribute."""
    try:
        return getattr(owner, name)
    except AttributeError:
        kind = owner if isinstance(owner, type) else type(owner)
        raise changed(f"`{kind.__name__}.{name}`", feature) from None
