"""kmp.callbacks.checkpoints: Keras's `BackupAndRestore` and `ModelCheckpoint`,
whose files a kill cannot break. Each test kills a fit inside a save, at
a given point, leaving the files as a kill there would (an exception
raised there; a file cut to half its length for a kill while it is
written), then checks what the next `fit` or load finds; the same kill
on Keras's classes shows the defect (BUILD_NOTES.md, defect 33).

The callbacks are the same on every backend (their files are h5, zip and
JSON): the tests run under torch, the fastest Keras to start."""

import os
import shutil
from unittest import mock

import keras
import numpy as np
import pytest
from util import classification_data
from util import mlp

import kmp

pytestmark = pytest.mark.backend_independent("torch")


class Killed(Exception):
    """A kill, as the backup's files see one: nothing runs after it."""


# Where in the save of the second epoch's backup the run is killed.
WHILE_WRITING_WEIGHTS = "while the weights are written"
AFTER_THE_WEIGHTS = "once the weights are written"
AT_THE_COMMIT = "as the record is put in place"  # kmp's first rename
AFTER_THE_COMMIT = "as the weights are put in place"  # its second


class _Kill(keras.callbacks.Callback):
    """Before the backup in `fit`'s callbacks: at the end of epoch 2 it
    arms `point`, which raises `Killed` inside the backup's save that
    follows, leaving its files as a kill there would."""

    def __init__(self, point):
        super().__init__()
        self.point, self.patchers = point, []

    def on_epoch_end(self, epoch, logs=None):
        if epoch != 1:
            return
        if self.point in (WHILE_WRITING_WEIGHTS, AFTER_THE_WEIGHTS):
            save = self.model.save_weights

            def killed_saving(filepath, *args, **kwargs):
                save(filepath, *args, **kwargs)
                if self.point == WHILE_WRITING_WEIGHTS:
                    os.truncate(filepath, os.path.getsize(filepath) // 2)
                raise Killed

            self.model.save_weights = killed_saving
        else:
            renames, replace = [], os.replace
            killed_at = 1 if self.point == AT_THE_COMMIT else 2

            def killed_renaming(source, destination):
                renames.append(destination)
                if len(renames) == killed_at:
                    raise Killed
                replace(source, destination)

            patcher = mock.patch.object(os, "replace", killed_renaming)
            patcher.start()
            self.patchers.append(patcher)

    def stop(self):
        for patcher in self.patchers:
            patcher.stop()


def _state(model):
    return [
        keras.ops.convert_to_numpy(v)
        for v in model.weights + model.optimizer.variables
    ]


class _States(keras.callbacks.Callback):
    """The weights and the optimizer's state at each epoch's end, and,
    when `fit` begins, its first epoch and the state then (after a
    restore)."""

    def __init__(self, folder=None):
        super().__init__()
        self.ended, self.first, self.folder = {}, None, folder

    def on_epoch_begin(self, epoch, logs=None):
        if self.first is None:
            self.first = (epoch, _state(self.model))
            if self.folder:
                self.files = sorted(os.listdir(self.folder))

    def on_epoch_end(self, epoch, logs=None):
        self.ended[epoch] = _state(self.model)


def _fit_with_backup(backup, seed, *callbacks):
    model = mlp(seed=seed)
    model.compile(
        optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
        loss="sparse_categorical_crossentropy",
    )
    x, y = classification_data(n=64)
    model.fit(
        x, y, batch_size=16, epochs=3, verbose=0, callbacks=[*callbacks, backup]
    )


def _killed_in_the_second_save(backup_class, folder, point):
    states, kill = _States(), _Kill(point)
    try:
        with pytest.raises(Killed):
            _fit_with_backup(backup_class(folder), 0, states, kill)
    finally:
        kill.stop()
    return states.ended


@pytest.mark.parametrize(
    "point, resumed",
    [
        (WHILE_WRITING_WEIGHTS, 1),
        (AFTER_THE_WEIGHTS, 1),
        (AT_THE_COMMIT, 1),
        (AFTER_THE_COMMIT, 2),
    ],
)
def test_a_kill_anywhere_in_a_save_leaves_a_backup_that_resumes(
    tmp_path, point, resumed
):
    folder = str(tmp_path / "backup")
    ended = _killed_in_the_second_save(
        kmp.callbacks.BackupAndRestore, folder, point
    )
    rerun = _States(folder)
    _fit_with_backup(kmp.callbacks.BackupAndRestore(folder), 1, rerun)
    # What the killed save left staged is gone once Keras restored.
    assert rerun.files == ["latest.weights.h5", "training_metadata.json"]
    # Before the save (1 epoch done) or after it (2), never between: the
    # weights and the optimizer's state are those of the epoch resumed
    # after, exactly.
    epoch, state = rerun.first
    assert epoch == resumed
    for now, then in zip(state, ended[resumed - 1], strict=True):
        np.testing.assert_array_equal(now, then)
    assert not os.path.exists(folder)  # fit ended: deleted, as Keras does


@pytest.mark.parametrize(
    "left", ["training_metadata.json", "latest.weights.h5"]
)
def test_half_a_backup_left_by_fit_s_end_is_none(tmp_path, left):
    # A kill while `fit`'s end deletes the backup: kmp's class deletes the
    # record first, so "training_metadata.json" alone comes from Keras's
    # order (or a hand), "latest.weights.h5" alone from kmp's. Either
    # would resume wrong: with fresh weights after every epoch, or with
    # the trained weights from epoch 1.
    folder = tmp_path / "backup"
    if left == "latest.weights.h5":
        with (
            mock.patch.object(shutil, "rmtree", side_effect=Killed),
            pytest.raises(Killed),
        ):
            _fit_with_backup(kmp.callbacks.BackupAndRestore(str(folder)), 0)
    else:
        backup = kmp.callbacks.BackupAndRestore(str(folder))
        _fit_with_backup(backup, 0)
        folder.mkdir()
        (folder / left).write_text('{"epoch": 3, "batch": 0}')
    assert sorted(os.listdir(folder)) == [left]
    rerun = _States()
    _fit_with_backup(kmp.callbacks.BackupAndRestore(str(folder)), 1, rerun)
    epoch, state = rerun.first
    assert epoch == 0  # started over, from the rerun's own weights
    for now, then in zip(state, mlp(seed=1).weights, strict=False):
        np.testing.assert_array_equal(now, keras.ops.convert_to_numpy(then))


def test_stock_backup_killed_while_writing_fails_or_resumes_wrong(tmp_path):
    folder = str(tmp_path / "half")
    _killed_in_the_second_save(
        keras.callbacks.BackupAndRestore, folder, WHILE_WRITING_WEIGHTS
    )
    with pytest.raises(OSError, match="truncated file"):
        _fit_with_backup(keras.callbacks.BackupAndRestore(folder), 1)

    folder = str(tmp_path / "written")
    ended = _killed_in_the_second_save(
        keras.callbacks.BackupAndRestore, folder, AFTER_THE_WEIGHTS
    )
    rerun = _States()
    _fit_with_backup(keras.callbacks.BackupAndRestore(folder), 1, rerun)
    epoch, state = rerun.first
    # The record says one epoch done; the weights are the second's: epoch
    # 2 trains again from its own end, silently.
    assert epoch == 1
    for now, then in zip(state, ended[1], strict=True):
        np.testing.assert_array_equal(now, then)


def test_the_backup_is_async_safe_only_when_batches_save_nothing(tmp_path):
    assert kmp.callbacks.BackupAndRestore(str(tmp_path)).async_safe
    every_4 = kmp.callbacks.BackupAndRestore(str(tmp_path), save_freq=4)
    assert not every_4.async_safe


# --- ModelCheckpoint ---


class _KillTheSave(keras.callbacks.Callback):
    """Before the checkpoint in `fit`'s callbacks: at the end of epoch 2
    the model's next save writes half its file and raises `Killed`."""

    def __init__(self, method):
        super().__init__()
        self.method = method

    def on_epoch_end(self, epoch, logs=None):
        if epoch != 1:
            return
        save = getattr(self.model, self.method)

        def killed_saving(filepath, *args, **kwargs):
            save(filepath, *args, **kwargs)
            os.truncate(filepath, os.path.getsize(filepath) // 2)
            raise Killed

        setattr(self.model, self.method, killed_saving)


def _fit_with_checkpoint(checkpoint, *callbacks):
    model = mlp()
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    x, y = classification_data(n=64)
    model.fit(
        x,
        y,
        batch_size=16,
        epochs=3,
        verbose=0,
        callbacks=[*callbacks, checkpoint],
    )


def _best_so_far(checkpoint_class, path, weights_only):
    """The best model's file after a fit killed in its second save, and
    the weights of the first epoch's end (the best until then)."""
    states = _States()
    kill = _KillTheSave("save_weights" if weights_only else "save")
    checkpoint = checkpoint_class(
        path,
        monitor="loss",
        save_best_only=True,
        save_weights_only=weights_only,
    )
    with pytest.raises(Killed):
        _fit_with_checkpoint(checkpoint, states, kill)
    return states.ended[0]


def _load(path, weights_only):
    if not weights_only:
        return keras.saving.load_model(path)
    model = mlp()
    model.load_weights(path)
    return model


@pytest.mark.parametrize(
    "name, weights_only", [("best.keras", False), ("best.weights.h5", True)]
)
def test_a_kill_while_a_checkpoint_is_written_leaves_the_one_before(
    tmp_path, name, weights_only
):
    path = str(tmp_path / name)
    first = _best_so_far(kmp.callbacks.ModelCheckpoint, path, weights_only)
    model = _load(path, weights_only)  # the first epoch's, whole
    for now, then in zip(model.weights, first, strict=False):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(now), then)
    assert any(f.startswith(".next-") for f in os.listdir(tmp_path))
    # The next fit's checkpoint removes what the killed save left.
    _fit_with_checkpoint(kmp.callbacks.ModelCheckpoint(path))
    assert sorted(os.listdir(tmp_path)) == [name]


def test_a_checkpoint_removes_its_own_leftovers_only(tmp_path):
    # Another run's save, in progress beside this one's, is not touched.
    ours = tmp_path / ".next-0123abcd-m07.keras"
    theirs = tmp_path / ".next-0123abcd-other.keras"
    for path in (ours, theirs):
        path.write_text("half a file")
    path = str(tmp_path / "m{epoch:02d}.keras")
    _fit_with_checkpoint(kmp.callbacks.ModelCheckpoint(path))
    assert sorted(os.listdir(tmp_path)) == [
        theirs.name,
        "m01.keras",
        "m02.keras",
        "m03.keras",
    ]


def test_stock_checkpoint_killed_while_writing_leaves_a_broken_best(tmp_path):
    path = str(tmp_path / "best.keras")
    _best_so_far(keras.callbacks.ModelCheckpoint, path, weights_only=False)
    assert os.path.exists(path)  # half of it: Keras cannot open it
    with pytest.raises(ValueError, match="zip file"):
        keras.saving.load_model(path)  # the best model so far: gone
