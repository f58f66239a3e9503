"""Callbacks that make mixed-precision training visible.

`LossScaleMonitor` puts the loss scale and the count of skipped steps into
the logs of `model.fit`, so they appear in the progress bar, in
`History.history`, in `CSVLogger` files and as TensorBoard scalars, like
any metric.
"""

import keras

from kmp import backend
from kmp.loss_scale_optimizer import LossScaleOptimizer


def _scale_logs(model, read):
    """Extra train-step logs for `model`'s optimizer; `{}` if it has none."""
    optimizer = getattr(model, "optimizer", None)
    if not isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return {}
    logs = {"loss_scale": read(optimizer.dynamic_scale)}
    if isinstance(optimizer, LossScaleOptimizer):
        logs["skipped_steps"] = read(optimizer.skipped_steps)
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

    The per-step values of the latest `fit` are also kept in
    `self.history`, a dict of lists (`"epoch"`, `"batch"`, `"loss_scale"`,
    `"skipped_steps"`), for plots.

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

    def __init__(self):
        super().__init__()
        self._records = []
        self._epoch = 0

    def set_model(self, model):
        super().set_model(model)
        backend.add_train_step_logs(
            model, lambda read: _scale_logs(model, read)
        )

    def on_train_begin(self, logs=None):
        # Like keras.callbacks.History: each fit starts a new record.
        self._records = []

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
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
        if logs and "skipped_steps" in logs:
            logs["skipped_steps"] = StepCount(logs["skipped_steps"])

    @property
    def history(self):
        """Per-step values, in step order, as a dict of lists."""
        columns = zip(*sorted(self._records, key=lambda r: r[:2]))
        names = ("epoch", "batch", "loss_scale", "skipped_steps")
        return {n: list(c) for n, c in zip(names, columns)} or {
            n: [] for n in names
        }
