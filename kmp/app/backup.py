"""The backup an interrupted run resumes from, and what it belongs to.

`keras.callbacks.BackupAndRestore` saves the weights and the optimizer's
state at the end of every epoch, and a rerun restores them and goes on
from the next epoch. Alone, it knows neither the configuration it was
made with (a rerun with another `--width` ends in a ValueError listing
every weight that "could not be loaded") nor the epochs before the
interruption (the rerun's History starts at the resumed epoch).
`Backup` keeps a record beside Keras's files (`run.json`): the
configuration fields a rerun must keep (`RunConfig.resume_key`, and the
policy the run resolved) and every finished epoch's logs. A rerun

- with the same key resumes, and `history` joins the epochs before the
  interruption to its own;
- with another key is refused in one line (`kmp.InputError`) that says
  how to resume (the flags that differ) or start over (`--restart`, or
  another `--output_dir`);
- with `--restart` deletes the backup first.

The record is written before Keras's backup at the end of an epoch, so
a run killed between the two has logged an epoch more than it backed
up, never fewer; `history` keeps the epochs before the one the rerun
resumes at. A backup made without a record (an older kmp) resumes as
Keras does. Keras deletes the directory, record included, when `fit`
ends.
"""

import json
import os
import shutil

import keras

import kmp

RECORD = "run.json"


class Backup:
    """Keras's backup of one run, with the record that says whose it is.

    Args:
        config: The run's config (`kmp_cli.configs.RunConfig`).
        policy: The dtype policy the run resolved (`"auto"` picks by
            hardware, so the name the policy got).
        backup_dir: Where the backup is, e.g. `OUTPUT_DIR/backup`.
        per_step: A function returning the per-step series of the
            current `fit` so far (name -> list, e.g. the step log's
            losses), kept with the epochs they belong to.

    Raises:
        kmp.InputError: The directory holds the backup of a run whose key
            differs from this one's.

    Example:

    ```python
    backup = Backup(config, "mixed_float16", "runs/cifar10/backup")
    history = model.fit(..., callbacks=backup.callbacks)
    logs = backup.history(history)  # every epoch, resumed or not
    ```
    """

    def __init__(self, config, policy, backup_dir, per_step=dict):
        self.backup_dir = backup_dir
        self.key = {**config.resume_key(), "policy": policy}
        if config.restart and kmp.is_chief():
            shutil.rmtree(backup_dir, ignore_errors=True)
        self.previous = self._read()
        self.callbacks = [
            # Before Keras's backup: see the module's docstring.
            _EpochRecord(self, per_step),
            keras.callbacks.BackupAndRestore(backup_dir),
        ]

    def _read(self) -> dict:
        """The record's epochs and steps, once its key is checked; none
        without a record."""
        path = os.path.join(self.backup_dir, RECORD)
        if not os.path.exists(path):
            return {"epochs": {}, "steps": []}
        with open(path) as f:
            record = json.load(f)
        saved = record["key"]
        differ = sorted(
            name
            for name in {**saved, **self.key}
            if saved.get(name) != self.key.get(name)
        )
        if differ:
            theirs = " ".join(f"--{n}={saved.get(n)}" for n in differ)
            ours = ", ".join(f"{n}={self.key.get(n)}" for n in differ)
            raise kmp.InputError(
                f"{self.backup_dir} holds the backup of an interrupted run "
                f"with {theirs} (this run: {ours}). To resume it, rerun "
                f"with {theirs}; to start over, pass --restart (deletes the "
                "backup) or another --output_dir."
            )
        return record

    def _first_epoch(self, history) -> int:
        """The epoch `fit` began at: after the ones the backup held."""
        if history.epoch:
            return history.epoch[0]
        return len(self.previous["steps"])  # all done before; none now

    def history(self, history) -> dict:
        """The whole run's per-epoch logs: the record's epochs before the
        one `fit` resumed at, then `history`'s (a Keras `History`)."""
        first, before = self._first_epoch(history), self.previous["epochs"]
        logs = {k: [float(v) for v in vs] for k, vs in history.history.items()}
        return {
            name: before.get(name, [])[:first] + logs.get(name, [])
            for name in {**before, **logs}
        }

    def steps(self, history, name) -> list:
        """The whole run's per-step series `name` (see `per_step`): the
        record's steps before the epoch `fit` resumed at, then this
        `fit`'s."""
        earlier = self.previous["steps"][: self._first_epoch(history)]
        now = self.callbacks[0].per_step().get(name, [])
        return [x for epoch in earlier for x in epoch.get(name, [])] + [
            float(x) for x in now
        ]

    def _write(self, epochs: dict, steps: list) -> None:
        os.makedirs(self.backup_dir, exist_ok=True)
        path = os.path.join(self.backup_dir, RECORD)
        record = {"key": self.key, "epochs": epochs, "steps": steps}
        # Whole or not at all: a run killed while writing leaves the
        # previous record.
        with open(path + ".tmp", "w") as f:
            json.dump(record, f)
        os.replace(path + ".tmp", path)


class _EpochRecord(keras.callbacks.Callback):
    """Writes the backup's record at the end of every epoch (chief): the
    epochs before this `fit`'s first, then each of its epochs' logs and
    per-step series."""

    def __init__(self, backup, per_step):
        super().__init__()
        self.backup, self.per_step = backup, per_step
        self.epochs = self.steps = None

    def on_epoch_end(self, epoch, logs=None):
        if self.epochs is None:  # the first epoch of this fit
            previous = self.backup.previous
            self.epochs = {n: v[:epoch] for n, v in previous["epochs"].items()}
            self.steps = previous["steps"][:epoch]
            self._recorded = {}  # of this fit's steps, per series
        for name, value in (logs or {}).items():
            self.epochs.setdefault(name, []).append(float(value))
        series = self.per_step()
        self.steps.append(
            {
                name: [float(x) for x in values[self._recorded.get(name, 0) :]]
                for name, values in series.items()
            }
        )
        self._recorded = {name: len(v) for name, v in series.items()}
        if kmp.is_chief():
            self.backup._write(self.epochs, self.steps)
