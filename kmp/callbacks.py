"""Callbacks for a long mixed-precision run: what it does, seen, and what
it did, kept.

`LossScaleMonitor` puts the loss scale and the count of skipped steps into
the logs of `model.fit`, so they appear in the progress bar, in
`History.history`, in `CSVLogger` files and as TensorBoard scalars, like
any metric; and it stops a run that no loss scale can save.
`ProgressBar` is Keras's progress bar, except that `fit` need not wait
for each step's logs to draw it. `BackupAndRestore` is Keras's backup,
except that a run killed while it writes leaves one a rerun restores.
"""

import contextlib
import glob
import json
import os
import re
import secrets
import shutil
import threading
import warnings

import keras
from keras import ops

from kmp import backend
from kmp.errors import InputError
from kmp.scaling import LossScaleOptimizer

# The optimizer's count of non-finite steps in a row, in the step's logs
# for the monitor only: it removes it before the progress bar and History
# (which Keras runs after the user's callbacks) see it.
_STREAK = "overflow_streak"


def _scale_logs(model, read, streak):
    """Extra train-step logs for `model`'s optimizer; `{}` if it has none.
    With `streak`, also the optimizer's overflow streak (the stop rule's)."""
    optimizer = getattr(model, "optimizer", None)
    if not isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return {}
    logs = {"loss_scale": read(optimizer.dynamic_scale)}
    if isinstance(optimizer, LossScaleOptimizer):
        logs["skipped_steps"] = read(optimizer.skipped_steps)
    if isinstance(optimizer, LossScaleOptimizer) and streak:
        # Read for the stop rule, then taken out of the logs (`_STREAK`).
        # As a float: on JAX a log that is the state's own int32 array (a
        # constant 0 on finite steps) can share its buffer, which the next
        # step donates.
        logs[_STREAK] = ops.cast(read(optimizer.overflow_streak), "float32")
    return logs


class StepCount(float):
    """A count of steps in `fit`'s logs: a float to every callback (logs
    are floats), shown as an integer by Keras's progress bar.

    `keras.utils.Progbar` formats every log value as `{:.4f}`, or `{:.4e}`
    below 1e-3, so zero skipped steps would read `0.0000e+00`. It divides
    the value by 1 before formatting, hence `__truediv__`.
    """

    def __format__(self, spec):
        return str(int(self))

    def __truediv__(self, other):
        return StepCount(float(self) / other)


class LossScaleMonitor(keras.callbacks.Callback):
    """Reports the loss scale and skipped steps during `model.fit`.

    Adds two entries to every training log: `loss_scale`, the scale after
    the step, and `skipped_steps`, the total number of steps skipped for
    non-finite gradients (only with `kmp.LossScaleOptimizer`; the stock
    Keras scaler does not count them). The values are computed inside the
    compiled train step and leave the device together with the loss, so
    monitoring adds no device-to-host transfer. Because they are part of
    the step's own logs, every callback sees them, whatever its position
    in the `callbacks` list.

    With an optimizer that does not scale the loss (bfloat16 or float32
    training), it adds nothing, so the same training code works in every
    mode.

    It also stops a run that loss scaling cannot save. A scale at its
    floor (`min_scale`) that still overflows means the gradients are
    non-finite for another reason (a NaN or inf in the data, a float16
    activation beyond 65504, a diverging learning rate), and kmp would
    otherwise skip every step, silently, to the end of the run. The rule,
    with kmp's optimizer, checked after each step:

    ```
    if overflow_streak >= stop_after and loss_scale == min_scale:
        model.stop_training = True   # with a RuntimeWarning saying why
    ```

    where `overflow_streak` is the optimizer's count of non-finite steps
    in a row (the steps it took the scale to back off to the floor
    included). Fit stops after that step, or a step or two later where
    Keras runs batch-end callbacks on its thread pool (JAX, torch, when
    every callback is async-safe); the skipped steps changed nothing.
    `kmp doctor` / `kmp.diagnose(model, data)` then shows which layers
    overflow. The reason stays in `stop_reason`.

    The per-step values of the latest `fit` are also kept in
    `self.history`, a dict of lists (`"epoch"`, `"batch"`, `"loss_scale"`,
    `"skipped_steps"`), for plots.

    Args:
        stop_after: Int >= 1, or `None` never to stop. Default 100.

    Example:

    ```python
    monitor = kmp.callbacks.LossScaleMonitor()
    history = model.fit(x, y, epochs=3, callbacks=[monitor])
    history.history["loss_scale"]       # one value per epoch
    monitor.history["loss_scale"]       # one value per step
    ```
    """

    # Only reads the logs it is given, so Keras may keep dispatching batch
    # callbacks asynchronously; records may then arrive out of order and
    # are sorted when read.
    async_safe = True

    def __init__(self, stop_after: int | None = 100):
        super().__init__()
        if stop_after is not None and (
            isinstance(stop_after, bool)
            or not isinstance(stop_after, int)
            or stop_after < 1
        ):
            raise InputError(
                "stop_after must be a positive int (non-finite steps in a "
                "row, with the scale at min_scale, before fit stops) or "
                f"None (never stop); got {stop_after!r}."
            )
        self.stop_after = stop_after
        self.stop_reason = None
        self._records = []
        self._epoch = 0

    def set_model(self, model):
        super().set_model(model)
        # Batch-end calls may run on Keras's thread pool, where
        # `self.model` would sync JAX's state from under the running
        # step (Keras's Callback.model does that): keep the model here.
        self._fitting = model
        stops = self.stop_after is not None
        backend.add_train_step_logs(
            model, lambda read: _scale_logs(model, read, stops)
        )

    def on_train_begin(self, logs=None):
        # Like keras.callbacks.History: each fit starts a new record.
        self._records = []
        self.stop_reason = None

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        streak = logs.pop(_STREAK, None) if logs else None
        if streak is not None:
            self._stop_if_hopeless(float(streak), float(logs["loss_scale"]))
        if logs and "skipped_steps" in logs:
            # Callbacks share one logs dict, and Keras appends its progress
            # bar after the user's callbacks: it shows the count.
            logs["skipped_steps"] = StepCount(logs["skipped_steps"])
        if logs and "loss_scale" in logs:
            self._records.append(
                (
                    self._epoch,
                    batch,
                    logs["loss_scale"],
                    logs.get("skipped_steps"),
                )
            )

    def on_epoch_end(self, epoch, logs=None):
        if logs:
            logs.pop(_STREAK, None)
        if logs and "skipped_steps" in logs:
            logs["skipped_steps"] = StepCount(logs["skipped_steps"])

    def _stop_if_hopeless(self, streak, scale):
        optimizer = self._fitting.optimizer
        if (
            self.stop_after is None
            or self.stop_reason is not None
            or streak < self.stop_after
            or scale > optimizer.min_scale
        ):
            return
        self.stop_reason = (
            f"kmp: {int(streak)} steps in a row had non-finite gradients, "
            f"the loss scale at its floor (min_scale={optimizer.min_scale:g})"
            ": a lower scale cannot help, so fit stops here. The cause is "
            "not the loss scale: look for a NaN or inf in the data, a "
            "float16 overflow in a layer, or a diverging learning rate; "
            "`kmp doctor` (kmp.diagnose(model, data)) shows which layers "
            "overflow. LossScaleMonitor(stop_after=None) never stops."
        )
        self._fitting.stop_training = True
        warnings.warn(self.stop_reason, RuntimeWarning, stacklevel=2)

    @property
    def history(self):
        """Per-step values, in step order, as a dict of lists."""
        columns = zip(*sorted(self._records, key=lambda r: r[:2]))
        names = ("epoch", "batch", "loss_scale", "skipped_steps")
        return {n: list(c) for n, c in zip(names, columns)} or {
            n: [] for n in names
        }


class ProgressBar(keras.callbacks.ProgbarLogger):
    """Keras's progress bar, without making `fit` wait for each step.

    Keras's `CallbackList` waits for every step's logs on the main thread,
    before it starts the next step, while any callback has a batch-end
    method and does not say `async_safe = True`; its own progress bar is
    one. On a GPU the host's work between steps (the next batch, the
    call) then leaves the device idle. Given this bar (in place of the
    one `fit` would add), and with every other callback async-safe (as
    `LossScaleMonitor` is), Keras on JAX and torch reads the logs on its
    own threads and starts the next step at once (TensorFlow's Keras
    always waits). A batch end that arrives after a later one's is not
    drawn: the bar never steps back.

    Example:

    ```python
    model.fit(
        x, y, epochs=3,
        callbacks=[kmp.callbacks.LossScaleMonitor(),
                   kmp.callbacks.ProgressBar()],
    )
    ```
    """

    # Batch ends may arrive on Keras's threads, a few at a time and out
    # of order.
    async_safe = True

    def __init__(self):
        super().__init__()
        self._draw_lock = threading.Lock()
        self._drawn = -1

    def on_epoch_begin(self, epoch, logs=None):
        self._drawn = -1
        super().on_epoch_begin(epoch, logs)

    def on_train_batch_end(self, batch, logs=None):
        with self._draw_lock:
            if batch <= self._drawn:
                return
            self._drawn = batch
            super().on_train_batch_end(batch, logs)


# The key of Keras's backup record (`training_metadata.json`) that names
# the weights a save staged; Keras reads only the record's "epoch".
_STAGED = "kmp_staged_weights"
_STAGED_PATTERN = "next-*.weights.h5"


class BackupAndRestore(keras.callbacks.BackupAndRestore):
    """Keras's `BackupAndRestore`, whose backup a kill cannot break.

    Keras writes the backup's two files in place: the weights (and the
    optimizer's state), then the record of the epochs done
    (`training_metadata.json`). A run killed while it writes (a Ctrl-C as
    an epoch ends, a preemption's SIGKILL, the out-of-memory killer)
    leaves weights a rerun cannot load (`OSError: truncated file`), or
    the next epoch's weights beside the last epoch's record, from which
    the rerun trains that epoch again, silently. This class writes the
    weights whole under a name of their own, then puts the record, which
    names them, in place by a rename (the commit), then the weights by
    another: a kill at any moment leaves the backup of before the save or
    of after it, and the next `fit` finishes a committed save before
    Keras restores (`on_train_begin`).

    Everything else is Keras's: `save_freq`, `double_checkpoint`,
    `delete_checkpoint`, the files' names and their format (a backup of
    either class restores with the other). A remote `backup_dir`
    (`gs://...`) is written as Keras writes it. With the default
    `save_freq="epoch"` the callback is `async_safe` (see `ProgressBar`):
    its batch-end method saves nothing.

    Args:
        backup_dir: Where the backup lives (one run's, nothing else's).
        save_freq: `"epoch"`, or an integer: save every that many batches.
        double_checkpoint: Also keep the backup before the last one.
        delete_checkpoint: Delete the backup when `fit` ends.

    Example:

    ```python
    model.fit(x, y, epochs=100,
              callbacks=[kmp.callbacks.BackupAndRestore("/shared/backup")])
    # killed at any moment; the same call again resumes after the last
    # epoch backed up
    ```
    """

    @property
    def async_safe(self):
        return self.save_freq == "epoch"

    def on_train_begin(self, logs=None):
        if not _is_remote(self.backup_dir):
            self._settle()
        super().on_train_begin(logs)

    def _save_model(self):
        if _is_remote(self.backup_dir):
            return super()._save_model()
        os.makedirs(self.backup_dir, exist_ok=True)
        staged = _STAGED_PATTERN.replace("*", secrets.token_hex(4))
        self.model.save_weights(os.path.join(self.backup_dir, staged))
        if self.double_checkpoint:
            _copy_whole(self._weights_path, self._prev_weights_path)
            _copy_whole(
                self._training_metadata_path,
                self._prev_training_metadata_path,
            )
        record = {
            "epoch": self._current_epoch,
            "batch": self._last_batch_seen,
            _STAGED: staged,
        }
        _write_whole(self._training_metadata_path, json.dumps(record))
        os.replace(os.path.join(self.backup_dir, staged), self._weights_path)

    def _settle(self):
        """Puts in place the weights the record names, if a kill came
        between the commit and their rename, and deletes what saves that
        never committed left."""
        try:
            with open(self._training_metadata_path) as f:
                staged = json.load(f).get(_STAGED)
        except (OSError, ValueError, AttributeError):
            staged = None  # no backup, or Keras's: nothing was staged
        # FileNotFoundError: another worker sharing the directory did it.
        if staged:
            with contextlib.suppress(FileNotFoundError):
                path = os.path.join(self.backup_dir, staged)
                os.replace(path, self._weights_path)
        leftovers = glob.glob(os.path.join(self.backup_dir, _STAGED_PATTERN))
        leftovers += glob.glob(os.path.join(self.backup_dir, "*.part"))
        for path in leftovers:
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)


def _is_remote(path) -> bool:
    """`gs://...`, `s3://...`: an object store, where each object appears
    whole (and a rename is a copy)."""
    return re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*://", str(path)) is not None


def _write_whole(path, text) -> None:
    with open(path + ".part", "w") as f:
        f.write(text)
    os.replace(path + ".part", path)


def _copy_whole(source, destination) -> None:
    if os.path.exists(source):
        shutil.copyfile(source, destination + ".part")
        os.replace(destination + ".part", destination)
