"""The `kmp` command's start: what runs before Keras does.

`import kmp` loads the whole library, and with it Keras and (on its
backend) TensorFlow: 4-25 s. The console script's entry point is here,
outside the `kmp` package, so that what needs none of that answers at
once: `kmp --help`, a command's `--help`, and every flag or path the
command refuses (one line, exit status 2). Then it sets up the command's
stderr, imports kmp and runs the command (`kmp.app.cli.run`).

    parser      the command line: argparse, and each command's checks
    logs        stderr: TensorFlow's C++ log lines filtered while it loads
    interrupts  Ctrl-C and SIGTERM: one line (where a run stopped, how
                it resumes), exit status 130 or 143, on every backend

The flags of `kmp train` and `kmp doctor`, the examples' settings they
fill and `fail` are the leaf's (`kmp_config`), which the application
and the examples import too. Nothing here imports Keras or kmp at module
level; `python -m kmp_cli` is the same command (`kmp bench --backend`
starts it afresh that way). Nothing imports this package: it imports
the application, which never imports it back.
"""

import os
import sys

from kmp_cli import interrupts
from kmp_cli import logs
from kmp_cli import parser

# Commands that train or run a model: they import TensorFlow where it is
# installed, whatever the backend (Keras's set_random_seed seeds tf.data;
# the examples feed through it), so it loads under the log filter.
RUNS_MODELS = ("demo", "train", "bench", "doctor")


def main(argv=None) -> int:
    """Runs `kmp ARGV` (default: the process's arguments); returns the
    exit status. Bad input ends it with status 2 before Keras loads."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse(argv)
    if args.help_text is not None:
        print(args.help_text)
        return 0
    _start_afresh_for_another_backend(args, argv)
    with interrupts.handled():
        try:
            return _run(args)
        except KeyboardInterrupt as interrupt:
            # Ctrl-C or SIGTERM: one line, not a traceback through fit; a
            # progress bar may have left the terminal's line unfinished.
            start = "\n" if sys.stderr.isatty() else ""
            print(start + interrupts.line(args, interrupt), file=sys.stderr)
            return interrupts.status(interrupt)  # 130, or 143 for SIGTERM


def _run(args) -> int:
    try:
        logs.quiet_start(
            verbose=args.verbose, tensorflow=args.command in RUNS_MODELS
        )
        import kmp  # noqa: F401  (the API; registers kmp's Keras classes)
    except ImportError as error:
        _backend_missing(error)
    from kmp.app import cli

    return cli.run(args)


def _start_afresh_for_another_backend(args, argv) -> None:
    """`kmp bench --backend NAME`: Keras fixes its backend when it is
    imported, so the command starts again under `KERAS_BACKEND=NAME`."""
    backend = getattr(args, "backend", None)
    if backend and backend != os.environ.get("KERAS_BACKEND", "tensorflow"):
        os.environ["KERAS_BACKEND"] = backend
        os.execv(sys.executable, [sys.executable, "-m", "kmp_cli", *argv])


def _backend_missing(error: ImportError):
    """Keras's own error for a backend whose framework is not installed,
    in one line (exit status 2); any other import error is re-raised."""
    backend = os.environ.get("KERAS_BACKEND", "tensorflow")
    if (error.name or "").split(".")[0] != backend:
        raise error
    parser.fail(
        "kmp",
        f"{type(error).__name__}: {error} (KERAS_BACKEND={backend}). "
        f"Install it (pip install {backend}), or choose another backend "
        "with KERAS_BACKEND.",
    )
