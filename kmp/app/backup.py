"""The backup an interrupted run resumes from, and what it belongs to.

`kmp.callbacks.BackupAndRestore` (Keras's, whose files a kill while it
writes cannot break) saves the weights and the optimizer's state at the
end of every epoch, and a rerun restores them and goes on from the next
epoch. Alone, it knows neither the configuration it was
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
Keras does. The directory, record included, is deleted once the run's
model and results are written (`Backup.delete`), not when `fit` ends: a
run killed while they are written resumes with no epoch left to train,
and writes them.

Keras's backup holds the weights and the optimizer's state, not the
state of the layers' random draws (`keras.random.SeedGenerator`, e.g.
Dropout's, and on torch the global generator an unseeded Dropout draws
from: `kmp.backend.random_state`): the record keeps them per epoch, and
the rerun restores the resumed epoch's after Keras's restore. The data
of an epoch is a function of (seed, epoch) (`kmp.app.feeding`), which
starts at `resumed_epoch`: a resumed run trains as the uninterrupted one
did, to the bit.

In a multi-process JAX job every process keeps its own backup
(`directory` gives each its own) and its record; when `fit` starts, before
Keras's restore, the processes compare the epochs they resume at, and
different ones (a process stopped between the others' backup and its
own) are refused in one line before any step runs: a collective step
over processes at different epochs would train on nonsense or hang.
"""

import json
import os
import shutil

import keras

import kmp
from kmp import backend

RECORD = "run.json"
# Keras's own record of the epochs done (`BackupAndRestore`).
KERAS_RECORD = "training_metadata.json"


def directory(config) -> str:
    """This process's backup directory in `config.output_dir`: each JAX
    process backs up on its own (Keras's backup writes from every
    process, which would race on one directory)."""
    process = backend.processes()[0]
    name = "backup" if process == 0 else f"backup_process_{process}"
    return os.path.join(config.output_dir, name)


def resumed_epoch(config) -> int:
    """The epoch a run of `config` starts at: the epochs its backup
    holds (0 without one, or with `--restart`). The data pipelines start
    there (`kmp.app.feeding`); the backup checks, once Keras has
    restored, that it resumed there too."""
    return 0 if config.restart else _epochs_done(directory(config))


def _epochs_done(backup_dir) -> int:
    path = os.path.join(backup_dir, KERAS_RECORD)
    if not os.path.exists(path):
        return 0
    with open(path) as f:
        return int(json.load(f)["epoch"])


class Backup:
    """Keras's backup of one run, with the record that says whose it is.

    Args:
        config: The run's config (`kmp_config.configs.RunConfig`).
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
        # Whether this process writes the directory: the chief of a
        # tf.distribute job, or every process of a JAX job (each its own).
        self.owned = kmp.is_chief() or backend.processes()[1] > 1
        if config.restart and self.owned:
            shutil.rmtree(backup_dir, ignore_errors=True)
        self.previous = self._read()
        # Where the data starts (`resumed_epoch`), read before Keras's
        # restore.
        self.initial_epoch = _epochs_done(backup_dir)
        # A backup an epoch, which a kill while it writes cannot break;
        # `async_safe`, so Keras need not wait for each step's logs. Kept
        # when `fit` ends, until the run's files are written (`delete`).
        keras_backup = self.keras_backup = kmp.callbacks.BackupAndRestore(
            backup_dir, delete_checkpoint=False
        )
        self.record = _EpochRecord(self, per_step)
        self.callbacks = [
            # Before Keras's restore, whose weight loading is collective:
            # processes at different epochs would load differently and
            # their collectives would no longer match.
            _SameEpochEverywhere(keras_backup),
            # Before Keras's backup: see the module's docstring.
            self.record,
            keras_backup,
            _RandomState(self),  # after Keras's restore
        ]

    def delete(self) -> None:
        """Deletes the backup, once the run's files (model, record) are
        written: a run killed before, while `fit` ended or they were
        written, resumes with no epoch left to train and writes them;
        killed while this deletes, it starts over (the record goes first:
        `kmp.callbacks.BackupAndRestore.delete`)."""
        if self.owned:
            self.keras_backup.delete()

    def _read(self) -> dict:
        """The record's epochs and steps, once its key is checked; none
        without a record."""
        path = os.path.join(self.backup_dir, RECORD)
        if not os.path.exists(path):
            return {"epochs": {}, "steps": [], "seeds": [], "random": []}
        with open(path) as f:
            # Older records have no seeds or random state: none.
            record = {"seeds": [], "random": [], **json.load(f)}
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
        now = self.record.per_step().get(name, [])
        return [x for epoch in earlier for x in epoch.get(name, [])] + [
            float(x) for x in now
        ]

    def _write(
        self, epochs: dict, steps: list, seeds: list, random: list
    ) -> None:
        os.makedirs(self.backup_dir, exist_ok=True)
        path = os.path.join(self.backup_dir, RECORD)
        record = {
            "key": self.key,
            "epochs": epochs,
            "steps": steps,
            "seeds": seeds,
            "random": random,
        }
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
        self.epochs = self.steps = self.seeds = self.random = None

    def on_epoch_end(self, epoch, logs=None):
        if self.epochs is None:  # the first epoch of this fit
            previous = self.backup.previous
            self.epochs = {n: v[:epoch] for n, v in previous["epochs"].items()}
            self.steps = previous["steps"][:epoch]
            self.seeds = previous["seeds"][:epoch]
            self.random = previous["random"][:epoch]
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
        self.seeds.append(
            [keras.ops.convert_to_numpy(v).tolist() for v in _seeds(self.model)]
        )
        self.random.append(backend.random_state())  # torch's unseeded draws
        if self.backup.owned:
            self.backup._write(self.epochs, self.steps, self.seeds, self.random)


def _seeds(model) -> list:
    """The state of the model's random draws (`SeedGenerator`s, e.g.
    Dropout's): its variables that are not weights, which Keras's backup
    does not save."""
    weights = {id(v) for v in model.weights}
    return [v for v in model.variables if id(v) not in weights]


class _RandomState(keras.callbacks.Callback):
    """After Keras's restore: checks that it resumed where the data
    starts, and restores the random draws' state of the epoch it resumed
    at (a record made before this one had none: they start over)."""

    def __init__(self, backup):
        super().__init__()
        self.backup = backup

    def on_train_begin(self, logs=None):
        self._first = True

    def on_epoch_begin(self, epoch, logs=None):
        # The first epoch fit runs is the one Keras's restore resumed at
        # (read here, not from the model's private `_initial_epoch`), and
        # nothing has been drawn yet.
        if not getattr(self, "_first", True):
            return
        self._first = False
        if epoch != self.backup.initial_epoch:
            raise kmp.InputError(
                f"the backup in {self.backup.backup_dir} was unreadable "
                f"at epoch {self.backup.initial_epoch}; Keras restored its "
                f"copy of epoch {epoch} instead, after the data had "
                "started at the former. Rerun the same command: it "
                f"resumes from epoch {epoch}."
            )
        saved = self.backup.previous["seeds"]
        if 0 < epoch <= len(saved):
            for variable, value in zip(_seeds(self.model), saved[epoch - 1]):
                variable.assign(value)
        generators = self.backup.previous["random"]
        if 0 < epoch <= len(generators):
            self._generators = generators[epoch - 1]

    def on_train_batch_begin(self, batch, logs=None):
        # At the first step, not before: on torch, fit's first epoch
        # draws from the global generator before its first batch (an
        # uninterrupted run's later epochs do not).
        state, self._generators = getattr(self, "_generators", None), None
        backend.restore_random_state(state)


class _SameEpochEverywhere(keras.callbacks.Callback):
    """Before Keras's restore (the callback after it), checks that every
    JAX process resumes at the same epoch; a no-op in one process."""

    def __init__(self, keras_backup):
        super().__init__()
        self.keras_backup = keras_backup

    def on_train_begin(self, logs=None):
        if backend.processes()[1] == 1:
            return
        # Keras's own record of the epochs done, which its restore reads
        # next.
        path = self.keras_backup._training_metadata_path
        done = 0
        if os.path.exists(path):
            with open(path) as f:
                done = json.load(f)["epoch"]
        epochs = backend.gather_over_processes(done)
        if len(set(epochs)) > 1:
            each = ", ".join(
                f"process {i}: {e} epoch(s) done" for i, e in enumerate(epochs)
            )
            raise kmp.InputError(
                "the processes' backups resume at different epochs "
                f"({each}): one stopped between the others' backup and "
                "its own. Rerun every process with --restart (or resume "
                "each from a copy of one process's backup directory)."
            )
