"""The doctor's progress lines: each stage said as it starts and timed as
it ends, so that a large model on a CPU is never silent for minutes.

    kmp doctor: 2 batches of 128, each run in float32 and in mixed_float16
    kmp doctor: batch 1/2: float32 pass ... 31 s
    kmp doctor: batch 1/2: mixed_float16 pass ... 36 s
    kmp doctor: batch 1/2: counting ... 2 s

A quiet `Progress` (`verbose=False`) prints nothing, so the pipeline reads
the same either way (Keras's `verbose` argument, as `fit` takes it).
"""

import contextlib
import sys
import time


class Progress:
    """Prints `kmp doctor: WHAT ...` as a stage starts, its seconds as it
    ends; nothing when `verbose` is false.

    Args:
        verbose: Whether to print.
        stream: Where to print; default: `sys.stdout` at the time of
            printing (a test's captured output, a redirection).

    Example:

    ```python
    progress = Progress(verbose=True)
    with progress.step("batch 1/2: float32 pass"):
        reference = run_the_pass()
    # kmp doctor: batch 1/2: float32 pass ... 31 s
    ```
    """

    def __init__(self, verbose: bool = True, stream=None):
        self.verbose = verbose
        self.stream = stream

    def _print(self, text, end="\n"):
        if self.verbose:
            print(text, end=end, file=self.stream or sys.stdout, flush=True)

    def say(self, text: str) -> None:
        """Prints one line, `kmp doctor: TEXT`."""
        self._print(f"kmp doctor: {text}")

    @contextlib.contextmanager
    def step(self, what: str):
        """Says `what` as the block starts and its seconds as it ends (or
        that it failed, before the error goes on)."""
        self._print(f"kmp doctor: {what} ...", end="")
        start = time.perf_counter()
        try:
            yield
        except BaseException:
            self._print(" failed")
            raise
        self._print(f" {time.perf_counter() - start:.0f} s")
