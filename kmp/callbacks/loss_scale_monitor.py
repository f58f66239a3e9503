"""`LossScaleMonitor`: the loss scale and the count of skipped steps in
`fit`'s logs, and a stop for a run no loss scale can save; `StepCount`,
a count the progress bar shows as an integer."""

import warnings

import keras
from keras import ops

from kmp import backend
from kmp.errors import InputError
from kmp.scaling import LossScaleOptimizer
from kmp.scaling import scaled_losses

# The optimizer's count of non-finite steps in a row, in the step's logs
# for the monitor only: it removes it before the progress bar and History
# see it (Keras runs them after the user's callbacks). A callback listed
# before the monitor sees it: the step's logs are its only way out of a
# JAX step, and Keras hands one logs dict down the list (the docstring
# says so).
_STREAK = "overflow_streak"
# A history with no record has these columns, as one with model.optimizer's.
_EMPTY_COLUMNS = ("loss_scale", "skipped_steps")


def _scales(optimizer):
    """Whether `optimizer` scales the loss and has its scale yet (an
    optimizer that no step applies, as a GAN's `model.optimizer` after a
    `compile()` that names none, is never built)."""
    return (
        isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
        and optimizer.built
    )


def _prefix(name):
    """The logs' prefix for the optimizer a model holds as `name`:
    `d_optimizer` -> `d_`, `gen_opt` -> `gen_opt_`."""
    return f"{scaled_losses.stem(name) or name}_"


def _held_scalers(model):
    """`(prefix, attribute, optimizer)` for each built loss-scaling
    optimizer `model` holds: `model.optimizer` (prefix "") and, where the
    step is stateful (TensorFlow, torch), the ones it holds as other
    attributes, as keras-io's GANs hold `d_optimizer` ("d_") and
    `g_optimizer`. JAX's step state holds `model.optimizer`'s values only.
    Which of them the step applies shows only once it ran
    (`_never_applied`).
    """
    optimizer = getattr(model, "optimizer", None)
    found = [("", "optimizer", optimizer)] if _scales(optimizer) else []
    if backend.is_stateless():
        return found
    held = scaled_losses.held_optimizers(
        model, keras.optimizers.LossScaleOptimizer, optimizer
    )
    found += [(_prefix(name), name, o) for name, o in held if _scales(o)]
    return found


def _never_applied(optimizer):
    """Whether no step has applied `optimizer`: no update and no skip
    (kmp's scaler counts skips; Keras's halves its scale on each)."""
    state = [optimizer.iterations, optimizer.step_counter]
    if isinstance(optimizer, LossScaleOptimizer):
        state += [optimizer.skipped_steps, optimizer.overflow_streak]
    return not any(int(ops.convert_to_numpy(v)) for v in state) and float(
        ops.convert_to_numpy(optimizer.dynamic_scale)
    ) == float(optimizer.initial_scale)


def _scale_logs(model, read, streak):
    """Extra train-step logs for `model`'s loss scalers; `{}` if it has
    none. With `streak`, also kmp's overflow streaks (the stop rule's)."""
    logs = {}
    for prefix, _, optimizer in _held_scalers(model):
        logs[f"{prefix}loss_scale"] = read(optimizer.dynamic_scale)
        if not isinstance(optimizer, LossScaleOptimizer):
            continue
        logs[f"{prefix}skipped_steps"] = read(optimizer.skipped_steps)
        if streak:
            # Read for the stop rule, then taken out of the logs
            # (`_STREAK`). As a float: on JAX a log that is the state's
            # own int32 array (a constant 0 on finite steps) can share its
            # buffer, which the next step donates.
            logs[f"{prefix}{_STREAK}"] = ops.cast(
                read(optimizer.overflow_streak), "float32"
            )
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
    in the `callbacks` list. So does the stop rule's input below,
    `overflow_streak`, which the monitor then removes: a callback listed
    before it that writes every entry (`CSVLogger`, `TensorBoard`) writes
    that one too. List the monitor first, or pass `stop_after=None`,
    which logs no streak.

    With an optimizer that does not scale the loss (bfloat16 or float32
    training), it adds nothing, so the same training code works in every
    mode.

    A model whose `train_step` applies optimizers it holds itself, as
    keras-io's GANs hold `d_optimizer` and `g_optimizer`, gets each
    one's entries under the attribute's name less `optimizer`:
    `d_loss_scale`, `d_skipped_steps`, `g_loss_scale`, ... (TensorFlow
    and torch; a JAX step's state holds `model.optimizer`'s values only).

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

    Before that, an epoch in which kmp's optimizer applied no update and
    skipped some gets a `RuntimeWarning` at its end, once per `fit`: the
    weights did not change in it (read from the optimizer's counters at
    the epoch's start and end). On a small dataset (a few hundred rows
    in batches of 32 are a handful of steps) the stop can be several
    epochs away, and the progress bar shows only a NaN loss. The
    first epochs of a run whose initial scale is too high can also skip
    every step while the scale falls (the warning gives the scale and its
    floor).

    The per-step values of the latest `fit` are also kept in
    `self.history`, a dict of lists (`"epoch"`, `"batch"`, `"loss_scale"`,
    `"skipped_steps"`, or each scaler's prefixed pair), for plots.

    Args:
        stop_after: Int >= 1, or `None` never to stop (nor to warn of
            an epoch that applied no update). Default 100.

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
        # Each kmp scaler's counters at the epoch's start (`_counters`).
        self._epoch_start = {}
        self._epoch_warned = False
        self._epoch = 0
        self._scalers = None
        self._named = frozenset()
        self._unused = []

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
        self._epoch_warned = False
        self.stop_reason = None
        # Found at the first step's end: a GAN's optimizers are built by
        # its first step.
        self._scalers = None

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch
        # Keras's JAX fit has synced its state into the variables here
        # and at on_epoch_end; one read each, outside the steps, and
        # none once there is nothing to warn of.
        if self._may_warn():
            self._epoch_start = self._counters()

    def _may_warn(self) -> bool:
        """Whether this epoch may still get `_warn_if_nothing_applied`'s
        line (once per fit, before any stop; never with stop_after=None)."""
        return not (
            self.stop_after is None
            or self._epoch_warned
            or self.stop_reason is not None
        )

    def _counters(self):
        """`{prefix: (attribute, optimizer, applied, skipped)}` for each
        of kmp's scalers the model holds: the updates it applied (its
        `iterations`) and the steps it skipped, so far."""
        counters = {}
        for prefix, attribute, optimizer in _held_scalers(self._fitting):
            if isinstance(optimizer, LossScaleOptimizer):
                applied, skipped = (
                    int(ops.convert_to_numpy(v))
                    for v in (optimizer.iterations, optimizer.skipped_steps)
                )
                named = attribute if prefix else None
                counters[prefix] = (named, optimizer, applied, skipped)
        return counters

    def _scalers_of_the_run(self, logs):
        """The scalers whose entries `logs` holds, found again when the
        logs name a scale they did not (an optimizer first applied after
        the first step)."""
        named = frozenset(k for k in logs if k.endswith("loss_scale"))
        if self._scalers is None or named != self._named:
            self._named = named
            found = _held_scalers(self._fitting)
            # A GAN's `compile()` names no optimizer, so Keras makes an
            # RMSprop in its own scaler, which torch's `fit` builds and no
            # step applies: beside the GAN's own, its entries are dropped.
            self._unused = [
                prefix
                for prefix, _, optimizer in found
                if not prefix and len(found) > 1 and _never_applied(optimizer)
            ]
            self._scalers = [s for s in found if s[0] not in self._unused]
        return self._scalers

    def _drop_unused(self, logs):
        for prefix in self._unused:
            for name in ("loss_scale", "skipped_steps", _STREAK):
                logs.pop(f"{prefix}{name}", None)

    def on_train_batch_end(self, batch, logs=None):
        if not logs:
            return
        record = {}
        scalers_now = self._scalers_of_the_run(logs)
        self._drop_unused(logs)
        for prefix, attribute, optimizer in scalers_now:
            scale = logs.get(f"{prefix}loss_scale")
            streak = logs.pop(f"{prefix}{_STREAK}", None)
            if streak is not None:
                self._stop_if_hopeless(
                    attribute if prefix else None,
                    optimizer,
                    float(streak),
                    float(scale),
                )
            skipped = f"{prefix}skipped_steps"
            if skipped in logs:
                # Callbacks share one logs dict, and Keras appends its
                # progress bar after the user's callbacks: it shows the
                # count.
                logs[skipped] = StepCount(logs[skipped])
            if scale is not None:
                record[f"{prefix}loss_scale"] = scale
                record[skipped] = logs.get(skipped)
        if record:
            self._records.append((self._epoch, batch, record))

    def on_epoch_end(self, epoch, logs=None):
        self._warn_if_nothing_applied(epoch)
        if not logs:
            return
        scalers_now = self._scalers_of_the_run(logs)
        self._drop_unused(logs)
        for prefix, _, _ in scalers_now:
            logs.pop(f"{prefix}{_STREAK}", None)
            skipped = f"{prefix}skipped_steps"
            if skipped in logs:
                logs[skipped] = StepCount(logs[skipped])

    def _warn_if_nothing_applied(self, epoch):
        """Warns, once per fit, of an epoch in which a scaler applied no
        update and skipped some (every one of a WGAN-GP critic's three
        a step, with `steps_per_execution` or an epoch cut short alike).
        """
        if not self._may_warn():
            return
        for prefix, now in self._counters().items():
            attribute, optimizer, applied, skipped = now
            # A scaler first built in this epoch (a GAN's) started at 0.
            _, _, applied_0, skipped_0 = self._epoch_start.get(
                prefix, (None, None, 0, 0)
            )
            if applied != applied_0 or skipped == skipped_0:
                continue
            whose = f" (self.{attribute})" if attribute else ""
            scale = float(ops.convert_to_numpy(optimizer.dynamic_scale))
            self._epoch_warned = True
            warnings.warn(
                f"kmp: epoch {epoch + 1} applied no update{whose}: all "
                f"{skipped - skipped_0} of its updates had non-finite "
                "gradients and were skipped, so the weights did not change. "
                "The loss "
                f"scale is now {scale:g} (min_scale={optimizer.min_scale:g}); "
                "if it is still falling, this can be the scale finding its "
                "level. Otherwise look for a NaN or inf in the data, a "
                "float16 overflow in a layer (a raw feature over 65504), or "
                "a diverging learning rate; `kmp doctor` "
                "(kmp.diagnose(model, data)) shows which layers overflow. "
                f"fit goes on, and stops after {self.stop_after} such "
                "steps in a row with the scale at its floor.",
                RuntimeWarning,
                stacklevel=2,
            )
            return

    def _stop_if_hopeless(self, attribute, optimizer, streak, scale):
        if (
            self.stop_after is None
            or self.stop_reason is not None
            or streak < self.stop_after
            or scale > optimizer.min_scale
        ):
            return
        whose = f" (self.{attribute})" if attribute else ""
        self.stop_reason = (
            f"kmp: {int(streak)} steps in a row had non-finite gradients"
            f"{whose}, the loss scale at its floor "
            f"(min_scale={optimizer.min_scale:g}): a lower scale cannot "
            "help, so fit stops here. The cause is not the loss scale: "
            "look for a NaN or inf in the data, a float16 overflow in a "
            "layer, or a diverging learning rate; `kmp doctor` "
            "(kmp.diagnose(model, data)) shows which layers overflow. "
            "LossScaleMonitor(stop_after=None) never stops."
        )
        self._fitting.stop_training = True
        warnings.warn(self.stop_reason, RuntimeWarning, stacklevel=2)

    @property
    def history(self):
        """Per-step values, in step order, as a dict of lists: `"epoch"`,
        `"batch"`, and each scaler's `loss_scale` and `skipped_steps`
        (None where its scaler does not count them)."""
        records = sorted(self._records, key=lambda r: r[:2])
        # dict keys: the columns in the order the records name them.
        names = {} if records else dict.fromkeys(_EMPTY_COLUMNS)
        for _, _, record in records:
            names.update(dict.fromkeys(record))
        history = {
            "epoch": [r[0] for r in records],
            "batch": [r[1] for r in records],
        }
        for name in names:
            history[name] = [r[2].get(name) for r in records]
        return history
