"""The errors kmp raises on input a user can fix, and how a command ends
on one (`fail`).

`InputError` is a `ValueError` and `InputTypeError` also a `TypeError`,
so code that catches those keeps working. They exist so that a caller,
the `kmp` command first of all, can tell "the argument, flag, file or
cluster configuration is wrong" (one line, no traceback) from a bug in
kmp, Keras or the model (a traceback, which is what it takes to fix one).
"""

import sys


class InputError(ValueError):
    """An argument, flag, file or cluster configuration kmp refuses; the
    message says what was passed, what is allowed and how to fix it.

    Example:

    ```python
    try:
        kmp.enable("mixed_float8")
    except kmp.InputError as error:
        print(error)  # names the policies kmp.enable accepts
    ```
    """


class InputTypeError(InputError, TypeError):
    """An argument of a type kmp does not accept (for example a layer
    where a model is expected)."""


def fail(command: str, message) -> None:
    """Ends a command on bad input or configuration: one line on stderr,
    exit status 2 (as argparse's usage errors). A bug keeps its
    traceback: only what a user can fix comes here."""
    print(f"{command}: {message}", file=sys.stderr)
    raise SystemExit(2)
