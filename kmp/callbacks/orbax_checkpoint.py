"""Keras's `OrbaxCheckpoint`, numbering a resumed run's saves past the
ones on disk.

Keras's `OrbaxCheckpoint` numbers a save every `save_freq` batches by the
batches seen, and a resumed run's count starts at its optimizer's
`iterations`. A loss scaler does not count a skipped step there (the
inner optimizer's learning-rate schedule must not advance on it), so
after skipped steps a resumed run numbers its saves below the steps on
disk: a helper's run of 10 batches with 7 skipped (`iterations` 3) saved
steps 6, 8 and 10; resumed from step 10, its saves 5, 7 and 9 never
appeared on JAX, silently, and a second resume went back to step 10's
state; on TensorFlow and torch the resumed run failed at its first save
("Step 6 already exists"). Stock Keras's scaler the same, 2026-12-01.

kmp's `LossScaleOptimizer` counts the steps it skipped
(`skipped_steps`), saved with the rest of its state, so here the count
starts at `iterations + skipped_steps`: every batch the run's optimizers
saw, applied or skipped, as a run that was never interrupted counts
them. A save at each epoch's end (`save_freq="epoch"`, the default)
is numbered by the epoch, and a `fit` resumed without `initial_epoch`
counts from 0 again: Keras's failed at its first save ("Step 0 already
exists"); here such a `fit`'s epochs are numbered after the latest step
on disk. Two crashes of Keras's callback are mended on the way (a
reviewer, 2026-12-01): under TensorFlow's `MirroredStrategy` its
`set_model` took `int()` of a `MirroredVariable` and `fit` failed
before its first step; with `save_best_only` and a `save_freq` in
batches its first save compared with a monitor it sets only at an
epoch's end. Everything else is Keras's: arguments and files. Restore
with `kmp.load_model(directory)`: Keras's load, then the float32 islands
made in code that no checkpoint keeps, and the weights and optimizer
state Keras's load drops by path (every weight of a Sequential or
subclassed model; `kmp.saving.checkpoint_dirs`).

Other notes from the same runs, which hold for Keras's callback too:
restore into a model whose optimizer is built (a load builds it;
compiled by hand, call `model.optimizer.build(model.trainable_variables)`
before `load_weights`), with optimizers named as they were saved
(`Adam(name="adam")`): Keras's `set_state_tree` matches variables by
path and skips, without a word, what it cannot match.
"""

import keras

from kmp.scaling import LossScaleOptimizer


class OrbaxCheckpoint(keras.callbacks.OrbaxCheckpoint):
    """Keras's `OrbaxCheckpoint`, whose step numbers count the steps a
    loss scaler skipped, so that a resumed run's saves follow the ones
    on disk (the module says why).

    Takes Keras's arguments and writes Keras's checkpoints: restore with
    `kmp.load_model(directory)`, which puts back what Keras's load of a
    directory leaves out (the module says what). With a model whose
    optimizer is not kmp's `LossScaleOptimizer`, it numbers as Keras's
    does.

    Args:
        directory: Where the checkpoints go.
        **kwargs: Keras's `OrbaxCheckpoint` arguments (`save_freq`,
            `max_to_keep`, `monitor`, `save_best_only`, ...).

    Example:

    ```python
    model.compile(optimizer=kmp.wrap("adam"), loss=...)
    model.fit(data, epochs=100, callbacks=[
        kmp.callbacks.OrbaxCheckpoint("/shared/ckpt", save_freq=1000)])
    # interrupted: load the latest, and go on numbering after it
    model = kmp.load_model("/shared/ckpt")
    model.fit(data, epochs=100, callbacks=[
        kmp.callbacks.OrbaxCheckpoint("/shared/ckpt", save_freq=1000)])
    ```
    """

    def set_model(self, model):
        # Not Keras's own: it reads `int(optimizer.iterations)`, which a
        # `MirroredVariable` refuses ("int() argument must be ... not
        # 'MirroredVariable'": TensorFlow's `MirroredStrategy`, a
        # reviewer), so `fit` failed before its first step.
        keras.callbacks.Callback.set_model(self, model)
        self._total_batches_seen = batches_seen(model)

    def on_train_begin(self, logs=None):
        # Keras's sets its monitor's comparison at an epoch's end, and
        # with `save_best_only` and a `save_freq` in batches the first
        # save compared with it unset ("'NoneType' object is not
        # callable", a reviewer).
        if self.monitor_op is None:
            self._set_monitor_op()
        self._epochs_after = None  # set at this `fit`'s first epoch
        super().on_train_begin(logs)

    def on_epoch_begin(self, epoch, logs=None):
        if self._epochs_after is None:
            # An epoch's save is numbered by the epoch, and a resumed
            # `fit` without `initial_epoch` counts from 0 again: its first
            # save failed ("Step 0 already exists"). Number this `fit`'s
            # epochs after the latest step on disk where they would fall
            # on it; with `initial_epoch` set past it, as Keras does.
            latest = self.checkpointer.latest
            self._epochs_after = 0 if latest is None else latest.step + 1
            self._epochs_after = max(0, self._epochs_after - epoch)
        super().on_epoch_begin(epoch, logs)

    def _save_checkpoint(self, step, logs=None):
        if self.save_freq == "epoch":
            step += getattr(self, "_epochs_after", None) or 0
        super()._save_checkpoint(step, logs)


def batches_seen(model) -> int:
    """The batches a compiled model's optimizer has seen: its applied
    steps (`iterations`) and those kmp's scaler skipped; 0 for a model
    not compiled."""
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None:
        return 0
    applied = keras.ops.convert_to_numpy(optimizer.iterations.value)
    return int(applied) + skipped_steps(model)


def skipped_steps(model) -> int:
    """The steps kmp's scaler, a compiled model's optimizer, skipped in
    all (0 where its optimizer is another, or not built). `kmp.wrap`
    puts the scaler outermost, memory modes included."""
    optimizer = getattr(model, "optimizer", None)
    if not isinstance(optimizer, LossScaleOptimizer) or not optimizer.built:
        return 0
    return int(keras.ops.convert_to_numpy(optimizer.skipped_steps.value))
