"""Run reports for the examples and `kmp bench`: a table, JSON, a PNG.

A run's results are a plain dict (what `examples/cifar10.py` returns and
writes as JSON); this module shows them as a rich table or Markdown and
draws the loss and the loss scale over steps.
"""

import math
import statistics
import threading
import time

import keras

from kmp import backend
from kmp.console import make_console

# (key in the results dict, column title, format[, factor]); a dotted key
# reads a nested dict ("config.master_weights": the run's flag).
COLUMNS = (
    ("policy", "policy", "{}"),
    ("config.master_weights", "master weights", "{}"),
    ("config.optimizer_states", "optimizer state", "{}"),
    ("data", "data", "{}"),
    ("epochs", "epochs", "{}"),
    ("examples_per_s", "examples/s", "{:.0f}"),
    ("step_time_s", "step time (ms)", "{:.1f}", 1000.0),
    ("peak_memory_mib", "peak memory (MiB)", "{:.0f}"),
    # Keras's running mean over the last epoch's steps; the accuracy is
    # the test split's (the last epoch's validation).
    ("final_loss", "training loss (last epoch)", "{:.4f}"),
    ("accuracy", "test accuracy", "{:.4f}"),
    ("loss_scale", "loss scale", "{:g}"),
    ("skipped_steps", "skipped steps", "{:g}"),
)


def _value(results, key):
    for part in key.split("."):
        if not isinstance(results, dict):
            return None
        results = results.get(part)
    return results


def _cell(results, column):
    key, _, fmt, *factor = column
    value = _value(results, key)
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if factor:
        value = value * factor[0]
    return fmt.format(value)


def rows(runs, columns=COLUMNS):
    """The table's header and rows, as strings."""
    header = [column[1] for column in columns]
    return header, [[_cell(r, c) for c in columns] for r in runs]


def markdown(runs, columns=COLUMNS) -> str:
    """A Markdown table of runs (one dict each)."""
    header, body = rows(runs, columns)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    return "\n".join(lines)


def show(runs, title, columns=COLUMNS, note=None) -> None:
    """Prints runs as a rich table: one row per run, or, for a single
    run, one row per figure (readable in 80 columns)."""
    from rich.table import Table

    console = make_console()
    table = Table(title=title, caption=note, show_header=len(runs) > 1)
    header, body = rows(runs, columns)
    if len(body) == 1:
        table.add_column("")
        table.add_column("", justify="right")
        for name, value in zip(header, body[0]):
            table.add_row(name, value)
    else:
        for name in header:
            # Headers wrap where the columns are many; values do not.
            table.add_column(
                name,
                justify="left" if name == "policy" else "right",
                min_width=max(len(row[len(table.columns)]) for row in body),
            )
        for row in body:
            table.add_row(*row)
    console.print(table)


class StepLog(keras.callbacks.Callback):
    """Wall time and loss of each training step, without holding a step
    back.

    It is `async_safe`, so Keras need not wait for each step's logs
    (`kmp.callbacks.ProgressBar` says why that matters: on an H100 `fit`
    ran at 0.83x `kmp bench`'s rate while it waited). A step's time is the
    time between its logs' arrival and the step's before it: the rate at
    which steps finish, which is the step time whether Keras waits or not.
    (The first step of an epoch counts from the epoch's start.)

    Attributes:
        times: Seconds per step, in step order.
        losses: The `loss` log per step (Keras's running mean over the
            epoch so far), in step order.
    """

    # Batch ends may arrive on Keras's threads, a few at a time and out
    # of order: each is recorded with its place, under a lock.
    async_safe = True

    def __init__(self):
        super().__init__()
        self._arrivals_lock = threading.Lock()
        self._records = []  # (epoch, batch, arrival, loss)
        self._starts = {}
        self._epoch = 0

    def on_train_begin(self, logs=None):
        self._records, self._starts = [], {}

    def on_epoch_begin(self, epoch, logs=None):
        # Keras has waited for the last epoch's batch ends by now.
        self._epoch = epoch
        self._starts[epoch] = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        arrival = time.perf_counter()
        loss = float(logs["loss"]) if logs and "loss" in logs else None
        with self._arrivals_lock:
            self._records.append((self._epoch, batch, arrival, loss))

    def _in_order(self):
        with self._arrivals_lock:
            return sorted(self._records, key=lambda record: record[:2])

    def _intervals(self):
        """`(first of its epoch?, seconds)` per step, in step order."""
        intervals, previous = [], None
        for epoch, _, arrival, _ in self._in_order():
            first = previous is None or previous[0] != epoch
            if first:
                previous = (epoch, self._starts.get(epoch, arrival))
            intervals.append((first, arrival - previous[1]))
            previous = (epoch, arrival)
        return intervals

    @property
    def times(self):
        return [seconds for _, seconds in self._intervals()]

    @property
    def losses(self):
        return [r[3] for r in self._in_order() if r[3] is not None]

    def median_step_time(self, skip=2) -> float:
        """Median step time, without the first `skip` (compiling) steps."""
        return _median_after(self.times, skip)

    def steady_step_time(self) -> float:
        """Mean step time from each epoch's first step's end to its last's.

        What a long `fit` runs at: the time before an epoch's first step
        ends (the call's and the epoch's start, a first batch's copy) is
        left out, and so is what follows its last (the epoch's end, the
        call's return). Over an epoch this is the last step's arrival
        minus the first step's (in step order), over `steps - 1`; NaN
        when no epoch had two steps.

        On JAX and torch an arrival waits for the interpreter lock while
        `fit`'s loop runs Python: up to `sys.getswitchinterval()` late
        (5 ms by default), except the last, for which `fit` waits. So
        the first step's arrival may be late and this figure short by
        that wait over `steps - 1`; `kmp.app.bench.prompt_batch_ends`
        lowers the interval.
        """
        steady = [seconds for first, seconds in self._intervals() if not first]
        return statistics.fmean(steady) if steady else math.nan


def _median_after(times, skip):
    times = times[skip:] or times
    return statistics.median(times) if times else math.nan


class ValidationProgress(keras.callbacks.Callback):
    """A progress bar for the validation that `fit` runs after each epoch.

    Keras's own bar stays silent while `fit` validates, so a long
    validation looked like a hang. This one counts the validation batches
    (on its own line, before the epoch's final line) when `verbose` is 1;
    `evaluate` outside `fit` has Keras's bar already.

    Args:
        steps: Validation batches, or `None` when unknown.
        verbose: `fit`'s verbosity; only 1 draws a bar.
    """

    def __init__(self, steps, verbose=1):
        super().__init__()
        self.steps, self.verbose = steps, verbose
        self._in_fit = False
        self._bar = None

    def on_train_begin(self, logs=None):
        self._in_fit = True

    def on_train_end(self, logs=None):
        self._in_fit = False

    def on_test_begin(self, logs=None):
        if self._in_fit and self.verbose == 1:
            print("validation")
            self._bar = keras.utils.Progbar(self.steps, unit_name="step")

    def on_test_batch_end(self, batch, logs=None):
        if self._bar is not None:
            self._bar.update(batch + 1)

    def on_test_end(self, logs=None):
        if self._bar is not None and self.steps is None:
            self._bar.update(self._bar._seen_so_far, finalize=True)
        self._bar = None


def peak_memory_mib() -> tuple[float, str]:
    """`(MiB, what was measured)`: the accelerator's peak allocation, or
    the process's peak resident memory on a CPU."""
    measured, what = backend.peak_memory()
    return (measured / 2**20 if measured is not None else math.nan), what


def plot(results, path, loss_scales=None) -> str:
    """Draws the loss over steps and the loss scale over steps as a PNG.

    Args:
        results: A run's results with `history` (per epoch) and
            `step_losses` (per step).
        path: Where to write the PNG.
        loss_scales: The loss scale per step
            (`LossScaleMonitor.history`), if any.

    Returns:
        `path`.
    """
    # A bare Figure, not pyplot: the user's matplotlib backend and open
    # figures stay as they are.
    from matplotlib.figure import Figure

    figure = Figure(figsize=(11, 4))
    left, right = figure.subplots(1, 2)
    steps = results.get("step_losses") or []
    left.plot(range(1, len(steps) + 1), steps, label="train (running mean)")
    val = results.get("history", {}).get("val_loss")
    if val and steps:
        per_epoch = len(steps) / len(val)
        left.plot(
            [per_epoch * (i + 1) for i in range(len(val))],
            val,
            "o-",
            label="validation",
        )
    left.set(xlabel="step", ylabel="loss", title="Loss")
    left.legend()
    if loss_scales:
        right.step(range(1, len(loss_scales) + 1), loss_scales, where="post")
        right.set_yscale("log", base=2)
        right.set(title="Loss scale")
    else:
        right.text(0.5, 0.5, "no loss scaling", ha="center", va="center")
        right.set(title=f"Loss scale ({results.get('policy')})")
    right.set(xlabel="step")
    label = " (SYNTHETIC data)" if results.get("data") == "synthetic" else ""
    figure.suptitle(
        f"{results.get('model', '')} {results.get('policy', '')}{label}"
    )
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    return path
