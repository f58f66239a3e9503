"""`LossScaleMonitor`: the loss scale and the count of skipped steps in
`fit`'s logs, and a stop for a run no loss scale can save; `StepCount`,
a count the progress bar shows as an integer."""

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
