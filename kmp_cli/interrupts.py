"""Ctrl-C: the command stops within a step, in one line, exit status 130.

Python turns SIGINT into a `KeyboardInterrupt` in the code the main
thread runs next, and the command ends on it (`kmp_cli.main` prints
`line` and returns 130, the shell's code for a SIGINT) instead of a
traceback through Keras's `fit`. One place in Keras would swallow it:
`keras.src.utils.python_utils.pythonify_logs`, which converts each
batch's logs to floats inside a bare `except: pass`. On JAX that is
where the main thread waits for the step it dispatched (converting the
loss blocks until the step is done), so a SIGINT there nearly always
landed in it and training went on. `handled`'s handler raises the
interrupt at once, except inside that function: there it raises it in
the function's caller, on the line after the call, through a trace
function that lives until then (how `pdb.set_trace` stops a frame).

    handled   the SIGINT handler, in a `with` block
    line      the command's last line: where it stopped, how to resume
"""

import contextlib
import json
import os
import signal
import sys

# Functions that catch everything, KeyboardInterrupt included: (file
# path's ending, function name).
_SWALLOWING = (("keras/src/utils/python_utils.py", "pythonify_logs"),)
# Keras's record of the epochs a `BackupAndRestore` directory holds.
_KERAS_BACKUP_RECORD = "training_metadata.json"


@contextlib.contextmanager
def handled():
    """Inside, SIGINT is handled as the module says; the handler before
    comes back after (a no-op outside the main thread, where Python
    allows no handler)."""
    try:
        previous = signal.signal(signal.SIGINT, _interrupt)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _interrupt(signum, frame):
    outer = _swallowing_frame(frame)
    if outer is None or outer.f_back is None:
        raise KeyboardInterrupt
    _raise_on_next_line(outer.f_back)


def _swallowing_frame(frame):
    """The outermost frame on `frame`'s stack running a function of
    `_SWALLOWING`, or None."""
    found = None
    while frame is not None:
        code = frame.f_code
        path = code.co_filename.replace(os.sep, "/")
        if any(
            path.endswith(end) and code.co_name == name
            for end, name in _SWALLOWING
        ):
            found = frame
        frame = frame.f_back
    return found


def _raise_on_next_line(frame):
    """Raises `KeyboardInterrupt` in `frame` when it runs its next line
    (or returns, if no line is left).

    A frame's `f_trace` is called only while a global trace function is
    set; this one traces nothing else (it returns None for every new
    frame) and is removed when the interrupt is raised."""

    def raise_here(traced, event, arg):
        if event in ("line", "return"):
            sys.settrace(None)
            traced.f_trace = None
            raise KeyboardInterrupt
        return raise_here

    frame.f_trace = raise_here
    frame.f_trace_lines = True
    sys.settrace(lambda *_: None)


def epochs_backed_up(backup_dir) -> int:
    """The epochs Keras's backup in `backup_dir` holds (the epoch a rerun
    resumes at, counting from 0); 0 without a backup."""
    path = os.path.join(backup_dir, _KERAS_BACKUP_RECORD)
    try:
        with open(path) as f:
            return int(json.load(f)["epoch"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def line(args) -> str:
    """What an interrupted `kmp` command prints last: for `kmp train`,
    the epochs done and backed up and how to resume; else that it was
    interrupted."""
    if args.command != "train" or getattr(args, "config", None) is None:
        return f"kmp {args.command}: interrupted."
    config = args.config
    name = f"kmp train {args.example}"
    backup_dir = os.path.join(config.output_dir, "backup")
    done = epochs_backed_up(backup_dir)
    rerun = (
        "the same command without --restart"
        if config.restart
        else "the same command"
    )
    if done == 0:
        return (
            f"{name}: interrupted before its first epoch ended; nothing is "
            f"backed up: {rerun} starts over."
        )
    return (
        f"{name}: interrupted after {done} of {config.epochs} epochs, "
        f"backed up in {backup_dir}: {rerun} resumes at epoch {done + 1}."
    )
