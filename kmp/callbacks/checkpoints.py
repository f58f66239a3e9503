"""Keras's checkpoint callbacks, whose files a kill cannot break.

Keras's `BackupAndRestore` and `ModelCheckpoint` write their files in
place. A run killed while one writes (a Ctrl-C as an epoch ends, a
scheduler's or a preemptible VM's kill, the out-of-memory killer)
leaves a file that does not load: the backup a rerun needs, or, with
`save_best_only`, the best model so far. And the backup is two files,
the weights (with the optimizer's state) and then the record of the
epochs done (`training_metadata.json`): killed between them, a rerun
resumes at the last epoch's record with the next epoch's weights, and
trains that epoch again, silently (BUILD_NOTES.md, defect 33).

Here every file is written whole under a name of its own beside its
place (`.next-` 8 hex digits `-NAME`), then renamed onto it: a rename within a
directory is atomic, so each name holds the old file or the new one,
never a part. The backup's record, which names its staged weights, is
renamed first (the commit) and the weights after; the next `fit`
renames weights a committed record names if a kill came between the two
renames, and deletes what uncommitted saves left. The record is the
backup: when `fit` ends, it is deleted first, so that a kill while the
rest goes leaves no backup rather than half of one. Each file is flushed
to the disk before its rename (`fsync`), and the directory after it, so
that a machine that loses its power keeps a whole backup too.

Everything else, arguments, files, formats and messages, is Keras's:
Keras's backup restores with this class, and this class's with Keras's
once settled (a kill between the two renames leaves a committed save
that only this class finishes). A remote path (`gs://...`) is written as
Keras writes it: an object store makes each object appear whole.

    BackupAndRestore  Keras's backup, committed by renames
    ModelCheckpoint   Keras's checkpoints, each file renamed into place
"""

import contextlib
import glob
import json
import os
import re
import secrets
import shutil

import keras

# The key of Keras's backup record that names the weights a save staged;
# Keras reads only the record's "epoch".
_STAGED = "kmp_staged_weights"
# What a save writes before its rename: `_staged`'s names.
_STAGED_GLOB = ".next-????????-*"


class BackupAndRestore(keras.callbacks.BackupAndRestore):
    """Keras's `BackupAndRestore`, whose backup a kill cannot break.

    A run killed at any moment of a save leaves the backup of before the
    save or of after it (the module says how), where Keras's leaves a
    weights file the rerun cannot load (`OSError: truncated file`) or
    weights an epoch ahead of the record the rerun resumes by.
    Everything else is Keras's, `keras.callbacks.BackupAndRestore`'s
    arguments and files included. With the default `save_freq="epoch"`
    the callback is `async_safe` (see `kmp.callbacks.ProgressBar`): its
    batch-end method saves nothing.

    Args:
        backup_dir: Where the backup lives (one run's, nothing else's).
        save_freq: `"epoch"`, or an integer: save every that many batches.
        double_checkpoint: Also keep the backup before the last one.
        delete_checkpoint: Delete the backup when `fit` ends.

    Example:

    ```python
    model.fit(x, y, epochs=100,
              callbacks=[kmp.callbacks.BackupAndRestore("/shared/backup")])
    # killed at any moment: the same call again resumes after the last
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

    def on_train_end(self, logs=None):
        if self.delete_checkpoint and not _is_remote(self.backup_dir):
            self.delete()
        else:
            super().on_train_end(logs)

    def delete(self):
        """Deletes the backup (a local one): its record first, so that a
        kill while the rest goes leaves no backup rather than half of
        one. `fit`'s end calls it unless `delete_checkpoint=False`."""
        with contextlib.suppress(FileNotFoundError):
            os.remove(self._training_metadata_path)  # the backup, gone
        shutil.rmtree(self.backup_dir, ignore_errors=True)

    def _save_model(self):
        if _is_remote(self.backup_dir):
            return super()._save_model()
        os.makedirs(self.backup_dir, exist_ok=True)
        staged = _staged(self._weights_path)
        self.model.save_weights(staged)
        _flush(staged)
        if self.double_checkpoint:
            _copy_whole(self._weights_path, self._prev_weights_path)
            _copy_whole(
                self._training_metadata_path,
                self._prev_training_metadata_path,
            )
        record = {
            "epoch": self._current_epoch,
            "batch": self._last_batch_seen,
            _STAGED: os.path.basename(staged),
        }
        _write_whole(self._training_metadata_path, json.dumps(record))
        os.replace(staged, self._weights_path)
        _flush(self.backup_dir)

    def _settle(self):
        """Puts in place the weights the record names, if a kill came
        between the commit and their rename; deletes what saves that
        never committed left, and half a backup (a kill while `fit`'s
        end deleted it: weights without a record, or a record without
        weights), which would resume at the wrong epoch."""
        record = self._training_metadata_path
        try:
            with open(record) as f:
                staged = json.load(f).get(_STAGED)
        except (OSError, ValueError, AttributeError):
            staged = None  # no backup, or Keras's: nothing was staged
        # FileNotFoundError: another process sharing the directory did it.
        if staged:
            with contextlib.suppress(FileNotFoundError):
                path = os.path.join(self.backup_dir, staged)
                os.replace(path, self._weights_path)
        if os.path.exists(record) != os.path.exists(self._weights_path):
            for path in (
                record,
                self._weights_path,
                self._prev_training_metadata_path,
                self._prev_weights_path,
            ):
                with contextlib.suppress(FileNotFoundError):
                    os.remove(path)
        # The directory is the backup's alone (Keras's rule): what saves
        # staged there, and its `.part` files, are its own.
        _remove_staged(self.backup_dir, _STAGED_GLOB, "*.part")


class ModelCheckpoint(keras.callbacks.ModelCheckpoint):
    """Keras's `ModelCheckpoint`, whose files a kill cannot break.

    Each file is written whole under a name of its own beside its place,
    then renamed onto it: a run killed while it saves leaves the file
    that was there, where Keras's leaves part of the new one (with
    `save_best_only`, in place of the best model so far). Everything
    else is Keras's, `keras.callbacks.ModelCheckpoint`'s arguments,
    file names and messages included.

    Args:
        filepath: Where to save, with Keras's formatting options
            (`{epoch:02d}`, `{val_loss:.2f}`, ...).
        **kwargs: `keras.callbacks.ModelCheckpoint`'s other arguments:
            `monitor`, `save_best_only`, `save_weights_only`, `mode`,
            `save_freq`, `initial_value_threshold`, `verbose`.

    Example:

    ```python
    model.fit(x, y, epochs=100, validation_data=(vx, vy),
              callbacks=[kmp.callbacks.ModelCheckpoint(
                  "best.keras", save_best_only=True)])
    ```
    """

    def on_train_begin(self, logs=None):
        # The files killed saves of this path left (its fields any text),
        # not those of another run's path beside it.
        folder, name = os.path.split(str(self.filepath))
        if "{" not in folder and not _is_remote(folder):
            parts = re.split(r"\{[^}]*\}", name)
            names = "*".join(glob.escape(part) for part in parts)
            _remove_staged(folder or ".", _STAGED_GLOB[:-1] + names)
        super().on_train_begin(logs)

    def _save_model(self, epoch, batch, logs):
        if _is_remote(self.filepath):
            return super()._save_model(epoch, batch, logs)
        # Keras's save calls `self.model.save(...)` or `.save_weights`:
        # for its duration the callback's model is the model Keras shows
        # it (a torch DDP module unwrapped, JAX's state written back),
        # saving whole.
        kept = self._model
        self._model = _SavingWhole(self.model)
        try:
            super()._save_model(epoch, batch, logs)
        finally:
            self._model = kept


class _SavingWhole:
    """A model whose `save` and `save_weights` write each file whole: to
    a name of its own beside `filepath`, then renamed onto it. Anything
    else is the model's."""

    def __init__(self, model):
        self._wrapped = model

    def __getattr__(self, name):
        return getattr(self._wrapped, name)

    def save(self, filepath, *args, **kwargs):
        self._whole(self._wrapped.save, filepath, args, kwargs)

    def save_weights(self, filepath, *args, **kwargs):
        self._whole(self._wrapped.save_weights, filepath, args, kwargs)

    @staticmethod
    def _whole(save, filepath, args, kwargs):
        staged = _staged(filepath)
        save(staged, *args, **kwargs)
        _flush(staged)
        os.replace(staged, filepath)
        _flush(os.path.dirname(staged) or ".")


def _staged(path) -> str:
    """A name of its own beside `path`, with its extension (Keras's
    savers check it)."""
    folder, name = os.path.split(str(path))
    return os.path.join(folder, f".next-{secrets.token_hex(4)}-{name}")


def _remove_staged(folder, *patterns) -> None:
    """Deletes the files in `folder` that match `patterns`: what saves
    that never ended left."""
    leftovers = [
        path
        for pattern in patterns
        for path in glob.glob(os.path.join(folder, pattern))
    ]
    for path in leftovers:
        with contextlib.suppress(FileNotFoundError, IsADirectoryError):
            os.remove(path)


def _is_remote(path) -> bool:
    """`gs://...`, `s3://...`: an object store, where each object appears
    whole (and a rename is a copy)."""
    return re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*://", str(path)) is not None


def _write_whole(path, text) -> None:
    with open(path + ".part", "w") as f:
        f.write(text)
    _flush(path + ".part")
    os.replace(path + ".part", path)


def _copy_whole(source, destination) -> None:
    if os.path.exists(source):
        shutil.copyfile(source, destination + ".part")
        _flush(destination + ".part")
        os.replace(destination + ".part", destination)


def _flush(path) -> None:
    """Writes a file's (or a directory's names') data to the disk: a
    rename must not reach it before the data it names."""
    try:
        descriptor = os.open(path, os.O_RDONLY)
    except OSError:  # e.g. a directory, on Windows
        return
    try:
        os.fsync(descriptor)
    except OSError:  # a filesystem without fsync
        pass
    finally:
        os.close(descriptor)
