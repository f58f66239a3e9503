"""What the `kmp` command prints on stderr: kmp's own lines and real errors.

TensorFlow's C++ side logs through absl: about six lines on every start
(`I0000 ... port.cc] oneDNN custom operations are on`, `cudart_stub.cc]
Could not find cuda drivers`, on a CPU machine `E0000 ... failed call to
cuInit`, which reads like a failure and is not one). Some of them are
written while TensorFlow's libraries load, before absl reads any setting,
so `TF_CPP_MIN_LOG_LEVEL` alone does not remove them (TF 2.21, measured:
with `TF_CPP_MIN_LOG_LEVEL=3`, the setting users export to silence
TensorFlow, six lines print). `quiet_start` therefore does two things
before Keras is imported:

1. sets `TF_CPP_MIN_LOG_LEVEL=3` unless the user set a level (theirs
   stands for what TensorFlow logs once started; errors that matter
   reach Python as exceptions, with their message);
2. while TensorFlow loads, captures the process's stderr (file descriptor
   2, where C++ writes) and writes back every line that is not a
   TensorFlow/absl log line, so a Python warning or error still shows.
   It does so whatever level the user set: one who asked for fewer logs
   never gets more than one who asked for none.

Under `KERAS_BACKEND=jax` or `torch`, Keras does not import TensorFlow,
but a command that trains does, later (Keras's `set_random_seed` seeds
`tf.data` when TensorFlow is installed, and the examples feed through
it): for those commands `quiet_start(tensorflow=True)` imports it here,
under the filter, where it is installed.

It also shows kmp's own log records as plain lines, and keeps absl's
Python logger (TFDS's "Variant folder ... has no dataset_info.json") to
errors. None of this happens with `kmp --verbose` or `KMP_VERBOSE=1` in
the environment (a run under a launcher whose arguments one cannot
change): then TensorFlow prints as it would anyway. The library never
does any of it: `import kmp` leaves logging alone.
"""

import contextlib
import importlib
import logging
import os
import re
import sys
import tempfile

# absl's C++ log line: severity letter, MMDD, time, thread id, file:line]
_ABSL_LINE = re.compile(r"^[IWEF]\d{4} [\d:.]+ +\d+ [^ ]+:\d+\] ")
_ABSL_BANNER = "WARNING: All log messages before absl::InitializeLog()"
# cpu_feature_guard's second line has no prefix of its own.
_CONTINUATION = "To enable the following instructions:"


def is_tensorflow_log(line: str) -> bool:
    """Whether `line` is one of TensorFlow's C++ (absl) log lines."""
    return bool(
        _ABSL_LINE.match(line)
        or line.startswith(_ABSL_BANNER)
        or line.startswith(_CONTINUATION)
    )


def filter_tensorflow_logs(text: str) -> str:
    """`text` without TensorFlow's C++ log lines."""
    return "".join(
        line
        for line in text.splitlines(keepends=True)
        if not is_tensorflow_log(line)
    )


@contextlib.contextmanager
def _stderr_filtered():
    """Runs the block with file descriptor 2 captured; then writes back
    what it received, less TensorFlow's log lines."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as capture:
        os.dup2(capture.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            text = capture.read().decode(errors="replace")
            sys.stderr.write(filter_tensorflow_logs(text))
            sys.stderr.flush()


def quiet_start(verbose: bool = False, tensorflow: bool = False) -> None:
    """Imports Keras (and TensorFlow, on its backend or with
    `tensorflow=True` where it is installed) with the logging described
    above. Call it before anything imports Keras; a second call, or one
    after Keras and TensorFlow were imported, only sets up kmp's own log
    lines."""
    _show_kmp_records()
    if verbose or wants_tensorflow_logs():
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    logging.getLogger("absl").setLevel(logging.ERROR)
    loaded = "keras" in sys.modules and (
        not tensorflow or "tensorflow" in sys.modules
    )
    if loaded:
        return
    with _stderr_filtered():
        import keras  # noqa: F401  (loads TensorFlow on its backend)

        if tensorflow:
            try:
                importlib.import_module("tensorflow")
            except ImportError:  # a machine without it: nothing to filter
                pass


def wants_tensorflow_logs() -> bool:
    """Whether `KMP_VERBOSE` asks for TensorFlow's start-up lines (set,
    and not "0" or empty)."""
    return os.environ.get("KMP_VERBOSE", "0").strip() not in ("", "0")


def _show_kmp_records() -> None:
    """kmp's warnings as they are written (they start with "kmp: "), not
    behind "WARNING:kmp:" from a root handler someone configured."""
    logger = logging.getLogger("kmp")
    if any(isinstance(h, _StderrHandler) for h in logger.handlers):
        return
    handler = _StderrHandler()
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger.addHandler(handler)
    logger.propagate = False


class _StderrHandler(logging.StreamHandler):
    """Writes to `sys.stderr` as it is when a record comes, not as it was
    when the handler was made: a stream replaced since (a redirect, a
    test's capture, closed by now) would fail, and logging would print a
    traceback instead of the line."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):
        pass  # StreamHandler sets it; `sys.stderr` is read on each write
