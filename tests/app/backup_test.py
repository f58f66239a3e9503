"""The backup an interrupted run resumes from (`kmp.app.backup`): its key,
its record of the epochs before the interruption, `--restart`. Fits of a
small MLP, interrupted as a killed run is: by an exception after an
epoch's backup, before `fit` ends."""

import os

import keras
import pytest
from util import classification_data
from util import mlp

import kmp
from kmp.app import backup as kmp_backup
from kmp_config import configs


class Interrupted(Exception):
    pass


def interrupt(after):
    """A callback that ends `fit` after epoch `after` (from 1), once the
    backup of that epoch is written, as a kill would."""

    def stop(epoch, logs):
        if epoch + 1 == after:
            raise Interrupted

    return keras.callbacks.LambdaCallback(on_epoch_end=stop)


def _fit(backup, epochs, interrupt_after=None):
    model = mlp()
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    x, y = classification_data(n=64)
    callbacks = list(backup.callbacks)
    history = keras.callbacks.History()
    callbacks.append(history)  # after the backup, as Keras's own is
    if interrupt_after:
        callbacks.append(interrupt(interrupt_after))
    try:
        model.fit(
            x,
            y,
            batch_size=16,
            epochs=epochs,
            validation_data=(x, y),
            callbacks=callbacks,
            verbose=0,
        )
    except Interrupted:
        pass
    return history


def _config(tmp_path, **changes):
    return configs.Cifar10Config(output_dir=str(tmp_path), **changes)


def test_a_rerun_resumes_and_keeps_every_epoch_s_logs(tmp_path):
    folder = str(tmp_path / "backup")
    steps = []  # what the run's step log would hold, per fit
    first = kmp_backup.Backup(
        _config(tmp_path), "float32", folder, lambda: {"loss": steps}
    )
    steps += [1.0, 2.0, 3.0, 4.0]  # epoch 1's four steps
    interrupted = _fit(first, epochs=4, interrupt_after=2)
    assert interrupted.epoch == [0, 1]
    assert os.path.exists(os.path.join(folder, kmp_backup.RECORD))

    steps.clear()
    again = kmp_backup.Backup(
        _config(tmp_path, epochs=4), "float32", folder, lambda: {"loss": steps}
    )
    resumed = _fit(again, epochs=4)
    assert resumed.epoch == [2, 3]  # Keras restored two epochs
    logs = again.history(resumed)
    assert len(logs["loss"]) == len(logs["val_loss"]) == 4
    assert logs["loss"][:2] == interrupted.history["loss"]
    assert logs["loss"][2:] == resumed.history["loss"]
    # The first fit's steps of epoch 1, all of them in epoch 1's record.
    assert again.steps(resumed, "loss")[:4] == [1.0, 2.0, 3.0, 4.0]
    # Kept when fit ends, until the run's files are written.
    assert sorted(os.listdir(folder)) == sorted(
        [kmp_backup.RECORD, "latest.weights.h5", kmp_backup.KERAS_RECORD]
    )
    again.delete()
    assert not os.path.exists(folder)


def test_another_configuration_is_refused_with_how_to_resume(tmp_path):
    folder = str(tmp_path / "backup")
    first = kmp_backup.Backup(_config(tmp_path, width=16), "float32", folder)
    _fit(first, epochs=3, interrupt_after=1)
    with pytest.raises(kmp.InputError) as refused:
        kmp_backup.Backup(_config(tmp_path, width=32), "mixed_float16", folder)
    message = str(refused.value)
    assert "holds the backup of an interrupted run" in message
    assert "rerun with --policy=float32 --width=16" in message
    assert "(this run: policy=mixed_float16, width=32)" in message
    assert "pass --restart" in message and "another --output_dir" in message
    # What may change, changes: more epochs, another verbosity.
    kmp_backup.Backup(
        _config(tmp_path, width=16, epochs=30, verbose=0), "float32", folder
    )


def test_restart_deletes_the_backup_and_starts_over(tmp_path):
    folder = str(tmp_path / "backup")
    _fit(
        kmp_backup.Backup(_config(tmp_path), "float32", folder),
        epochs=3,
        interrupt_after=2,
    )
    fresh = kmp_backup.Backup(
        _config(tmp_path, width=16, restart=True), "float32", folder
    )
    assert fresh.previous == {
        "epochs": {},
        "steps": [],
        "seeds": [],
        "random": [],
    }
    history = _fit(fresh, epochs=2)
    assert history.epoch == [0, 1]
    assert len(fresh.history(history)["loss"]) == 2
