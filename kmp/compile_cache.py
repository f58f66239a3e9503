"""A persistent XLA compilation cache: a job's second run skips compiling.

On a GPU most of a short run's start is XLA compiling the train and eval
steps (on an H100, 39 of the CIFAR-10 example's 56 seconds, and a warm
cache took the run to 20.5 s; `../shared/gpu-results/2026-11-22/`).
`enable_compile_cache` keeps the compiled programs on disk, keyed by the
program, the compiler's version and flags and the device, so a later
process that compiles the same step loads it instead.

What it caches: XLA executables (and, on JAX, GPU autotuning results),
never weights or data. Entries are keyed by a hash of the whole program
and of the JAX/XLA version, so one directory is safe to share between
runs of different models, policies and versions: a changed model is a new
key, never a stale hit. Where: `~/.cache/kmp/xla/<backend>` (or
`$XDG_CACHE_HOME/kmp/xla/<backend>`), or the directory you pass. To clear
it, delete the directory. A corrupted entry is recompiled (JAX warns and
compiles); an unwritable or full directory is a one-line warning, and
training goes on uncached.

Backends: JAX uses its persistent compilation cache. TensorFlow persists
the executables of `jit_compile` functions when `TF_XLA_FLAGS` names a
directory before its runtime starts, so on TensorFlow call this before
any TensorFlow op (after one, it warns and returns None); a hit still
traces the step and saves the XLA compile only. Torch has none.
BUILD_NOTES.md, "Warm starts", has the evidence.
"""

import logging
import os
import tempfile

from kmp import backend
from kmp.errors import InputError

logger = logging.getLogger("kmp")


def default_directory() -> str:
    """`$XDG_CACHE_HOME/kmp/xla`, or `~/.cache/kmp/xla`."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(
        os.path.expanduser("~"), ".cache"
    )
    return os.path.join(base, "kmp", "xla")


def enable_compile_cache(directory=None) -> str | None:
    """Turns on the persistent XLA compilation cache for this process.

    Call it before the first `fit` (or any compiled step); programs
    compiled afterwards are written to the cache and read from it. The
    `kmp` command and the examples call it by default
    (`--compile_cache=PATH|off`).

    Args:
        directory: Where the cache lives; `None` for `default_directory()`.
            Each backend gets a subdirectory of it.

    Returns:
        The backend's cache directory, or `None` when the cache could not
        be turned on (the backend has none, or the directory is not
        writable; a warning says which).

    Example:

    ```python
    kmp.enable_compile_cache()      # ~/.cache/kmp/xla/jax
    model.fit(...)                  # compiles; the next run loads
    ```
    """
    directory = default_directory() if directory is None else directory
    if not isinstance(directory, (str, os.PathLike)):
        raise InputError(
            f"enable_compile_cache expects a directory path, got {directory!r}."
        )
    directory = os.path.abspath(os.fspath(directory))
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise InputError(
            f"The compile cache {directory} is a file; pass a directory "
            "(it is created if missing), or turn the cache off."
        )
    folder = os.path.join(directory, backend.name())
    try:
        os.makedirs(folder, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as error:
        logger.warning(
            "kmp: compile cache %s is not writable (%s); compiling without it.",
            folder,
            error.strerror or error,
        )
        return None
    why_not = backend.use_compile_cache(folder)
    if why_not:
        logger.warning("kmp: no compile cache: %s", why_not)
        return None
    return folder
