"""Ctrl-C, or a scheduler's SIGTERM: the command stops within a step, in
one line, exit status 130 (143 for SIGTERM).

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

A SIGTERM (what Slurm, Kubernetes or a preemptible VM sends before it
kills a job) is handled alike, as `Terminated`, a `KeyboardInterrupt`:
Python's default for it ends the process on the spot, without a word
of where the run stopped. The backup a kill may cut short is kmp's
(`kmp.callbacks.BackupAndRestore`), whole wherever the signal lands.

    handled     the SIGINT and SIGTERM handler, in a `with` block
    Terminated  what a SIGTERM raises
    status      the exit status for an interrupt: 128 + its signal
    line        the command's last line: where it stopped, how to resume
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


class Terminated(KeyboardInterrupt):
    """A SIGTERM, raised where a Ctrl-C's `KeyboardInterrupt` would be."""

    signum = signal.SIGTERM


@contextlib.contextmanager
def handled():
    """Inside, SIGINT and SIGTERM are handled as the module says; the
    handlers before come back after (a no-op outside the main thread,
    where Python allows no handler)."""
    try:
        previous = {
            signum: signal.signal(signum, _interrupt)
            for signum in (signal.SIGINT, signal.SIGTERM)
        }
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def status(interrupt: KeyboardInterrupt) -> int:
    """The shell's exit status for a process ended by the signal behind
    `interrupt`: 130 for SIGINT, 143 for SIGTERM."""
    return 128 + getattr(interrupt, "signum", signal.SIGINT)


def _interrupt(signum, frame):
    error = Terminated if signum == signal.SIGTERM else KeyboardInterrupt
    outer = _swallowing_frame(frame)
    if outer is None or outer.f_back is None:
        raise error
    _raise_on_next_line(outer.f_back, error)


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


def _raise_on_next_line(frame, error):
    """Raises `error` in `frame` when it runs its next line (or returns,
    if no line is left).

    A frame's `f_trace` is called only while a global trace function is
    set; this one traces nothing else (it returns None for every new
    frame) and is removed when the interrupt is raised."""

    def raise_here(traced, event, arg):
        if event in ("line", "return"):
            sys.settrace(None)
            traced.f_trace = None
            raise error
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


def line(args, interrupt=None) -> str:
    """What an interrupted `kmp` command prints last: for `kmp train`,
    the epochs done and backed up and how to resume; else that it was
    interrupted (or, for `Terminated`, stopped by SIGTERM)."""
    how = (
        "stopped by SIGTERM"
        if isinstance(interrupt, Terminated)
        else "interrupted"
    )
    if args.command != "train" or getattr(args, "config", None) is None:
        return f"kmp {args.command}: {how}."
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
            f"{name}: {how} before its first epoch ended; nothing is "
            f"backed up: {rerun} starts over."
        )
    return (
        f"{name}: {how} after {done} of {config.epochs} epochs, "
        f"backed up in {backup_dir}: {rerun} resumes at epoch {done + 1}."
    )
