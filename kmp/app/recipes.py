"""What the example trainers share: devices, data, callbacks, results.

`examples/cifar10.py` and `examples/imdb.py` each show their data, model
and `fit` call; the plumbing around them lives here once: the sizes for
a machine without a GPU, the callbacks every run
gets (loss-scale monitor, step log, the backup it resumes from), and the
results record that `kmp train`, `kmp bench` and the tests read. Their
settings, whose fields are the command-line flags, are in
`kmp_config.configs` (no Keras there, so the command checks flags first).
Where the replicas are (strategies, meshes, processes) is
`kmp.app.scale_out`.
"""

import dataclasses
import json
import math
import os

import keras
import numpy as np

import kmp
from kmp import backend
from kmp.app import backup as kmp_backup
from kmp.app import batch_search
from kmp.app import device_data
from kmp.app import report
from kmp.app import scale_out
from kmp_config import flags as kmp_flags


def has_accelerator() -> bool:
    """Whether the backend computes on a GPU or TPU (its first device)."""
    return backend.list_devices()[0].platform != "cpu"


def device_sized(config, given=()):
    """`(config, note)`: where no GPU is found, `config` with the
    example's CPU sizes (`CPU_SIZES`) for the sizes not in `given` (the
    flags the user set), and the line that says so; else `config` and
    `None`. Asks the backend for its devices only when a size is left
    to choose: call it after the flags are checked.

    A multi-worker run keeps its sizes: listing devices starts
    TensorFlow's runtime, after which the cluster's collective ops can no
    longer be configured (and such a job is sized for its GPUs)."""
    sized, changes = config.cpu_sized(given)
    if not changes or config.strategy == "multiworker" or has_accelerator():
        return config, None
    shown = ", ".join(f"{name}={value}" for name, value in changes.items())
    return sized, (
        f"kmp: no GPU found: {shown} (CPU sizes); pass them to override."
    )


def use_compile_cache(config) -> str | None:
    """`--compile_cache`: `kmp.enable_compile_cache` unless it is `off`.
    With `auto`, a backend without a cache is no reason to warn."""
    if config.compile_cache == "off":
        return None
    if config.compile_cache == "auto":
        if keras.backend.backend() not in ("jax", "tensorflow"):
            return None
        return kmp.enable_compile_cache()
    return kmp.enable_compile_cache(config.compile_cache)


def split_size(split) -> int:
    """Examples in a split: an `(x, y)` pair or a sized `tf.data`."""
    if isinstance(split, tuple):
        return len(split[1])
    return int(split.cardinality())  # TFDS splits know their size


def batches(split, batch_size) -> int:
    """Batches of `split`, the last one short if need be."""
    return -(-split_size(split) // batch_size)


def evaluation_steps(config, splits) -> int | None:
    """Batches of validation and final evaluation; None for all.

    `--eval_steps` when set; else, when `--steps` is set, the same share
    of the test split as `--steps` is of the training split (at least
    one batch), so that a short run validates briefly too.
    """
    test_batches = batches(splits.test, config.batch_size)
    if config.eval_steps:
        return min(config.eval_steps, test_batches)
    if not config.steps:
        return None
    train_batches = max(split_size(splits.train) // config.batch_size, 1)
    share = min(config.steps / train_batches, 1.0)
    return max(math.ceil(share * test_batches), 1)


def feeds_device(config) -> bool:
    """Whether the examples hold their data on the device and cut batches
    there (`kmp.app.device_data`): on JAX, without a distribution (under
    one, Keras shards host batches itself)."""
    return keras.backend.backend() == "jax" and config.distribution == "none"


def padded_evaluation(split, batch_size, steps=None):
    """A `tf.data` split of `(x, y)` as full batches of `(x, y, weight)`:
    the first `steps` batches (all if None), the last padded with rows of
    weight 0 and the real rows weighted so that the loss and accuracy are
    exact means over them (`device_data.padded_rows`). Full batches: the
    test step compiles once under XLA."""
    import tensorflow as tf

    rows, weights = device_data.padded_rows(
        split_size(split), batch_size, steps
    )
    real = int(np.count_nonzero(weights))
    weight = tf.constant(weights[0])
    kept = split.take(real).map(lambda x, y: (x, y, weight))
    padding = (
        split.repeat()
        .take(len(rows) - real)
        .map(lambda x, y: (x, y, tf.zeros_like(weight)))
    )
    return kept.concatenate(padding).batch(batch_size, drop_remainder=True)


def padded_arrays(split, batch_size, steps=None):
    """`padded_evaluation` for an `(x, y)` pair of arrays: `(x, y, w)`."""
    x, y = split
    rows, weights = device_data.padded_rows(len(y), batch_size, steps)
    return x[rows], y[rows], weights


def fit_data(data, batch_size):
    """`(args, kwargs)` for `fit`: a batched dataset as is (its pipeline
    shuffles; `fit` would warn that it cannot), an `(x, y)` pair of arrays
    with `batch_size`; under many JAX processes, this process's share
    (`scale_out.process_share`)."""
    data = scale_out.process_share(data, batch_size)  # this process's rows
    if isinstance(data, tuple):
        return data, {"batch_size": scale_out.local_batch_size(batch_size)}
    return (data,), {"shuffle": False}


class Run:
    """The callbacks of one training run, and its results afterwards.

    Args:
        config: The run's config (`kmp_config.configs.RunConfig`). Its
            `output_dir` holds the backup (a rerun resumes an interrupted
            run: `kmp.app.backup`), and afterwards the model,
            `results.json` and `results.png` (chief only).
        splits: The `kmp.app.data.Splits` trained on.
        strategy: The `tf.distribute` strategy, or `None`.
        policy: The dtype policy's name, as `config.policy` resolved.

    Raises:
        kmp.InputError: `output_dir` holds the backup of a run with
            other settings (before anything is built: create it first).
    """

    def __init__(self, config, splits, strategy, policy):
        self.config, self.splits, self.strategy = config, splits, strategy
        self.policy = policy
        output_dir = self.output_dir = config.output_dir
        os.makedirs(output_dir, exist_ok=True)
        # Each JAX process backs up on its own (Keras's backup writes from
        # every process, which would race on one directory); a rerun
        # resumes each from its own, checked to be at the same epoch.
        process = backend.processes()[0]
        backup_dir = "backup" if process == 0 else f"backup_process_{process}"
        self.backup = kmp_backup.Backup(
            config, policy, os.path.join(output_dir, backup_dir), self._per_step
        )
        self.steps = report.StepLog()
        self.monitor = kmp.callbacks.LossScaleMonitor()
        # --steps (or --eval_steps) bounds validation too.
        self.eval_steps = evaluation_steps(config, splits)
        shown = self.eval_steps or batches(splits.test, config.batch_size)
        self.callbacks = [
            self.monitor,
            self.steps,
            report.ValidationProgress(shown, config.verbose),
            *self.backup.callbacks,
        ]
        self.loss_scales = []

    def _per_step(self):
        """What the backup keeps per step: losses and loss scales."""
        return {
            "loss": getattr(self.steps, "losses", []),
            "loss_scale": self.monitor.history["loss_scale"],
        }

    def results(self, model_name, history, model):
        """The run's record: figures, the History of every epoch (those
        before an interruption too), per-step losses, config. The test
        figures are the last epoch's validation: the same weights on the
        same batches, so it is not run a second time."""
        config, splits, strategy = self.config, self.splits, self.strategy
        step_time = self.steps.median_step_time()  # without compiling
        memory, memory_note = report.peak_memory_mib()
        logs = self.backup.history(history)
        self.loss_scales = self.backup.steps(history, "loss_scale")
        replicas = (
            strategy.num_replicas_in_sync
            if strategy
            else scale_out.batch_replicas()
        )
        return {
            "model": model_name,
            "policy": self.policy,
            "data": splits.source,
            "data_note": splits.note,
            "strategy": config.strategy,
            "replicas": replicas,
            "processes": backend.processes()[1],
            "epochs": len(logs.get("loss", [])),
            "batch_size": config.batch_size,
            "step_time_s": step_time,
            "examples_per_s": config.batch_size / step_time,
            "peak_memory_mib": memory,
            "peak_memory_note": memory_note,
            "final_loss": logs["loss"][-1] if logs.get("loss") else math.nan,
            "test_loss": logs["val_loss"][-1],
            "accuracy": logs["val_accuracy"][-1],
            "loss_scale": logs.get("loss_scale", [None])[-1],
            "skipped_steps": logs.get("skipped_steps", [0])[-1],
            # Why fit stopped early, if LossScaleMonitor stopped it: the
            # scale overflowed at its floor (None: the run went on).
            "stopped": self.monitor.stop_reason,
            "parameters": model.count_params(),
            # Exact, from the variables' shapes and dtypes: float32
            # masters and the optimizer's slots and scalars.
            "state_bytes": backend.state_bytes(model),
            "history": logs,
            "step_losses": self.backup.steps(history, "loss"),
            "config": dataclasses.asdict(config),
        }

    def save(self, model, results, name):
        """Writes the model, `results.json` and `results.png` (chief).

        In a multi-process JAX job every process saves, the others into a
        file they delete: Keras's save makes an optimizer variable, whose
        placement under a keras.distribution is a collective, so a save
        on process 0 alone waits for the others forever."""
        out = self.output_dir
        if backend.processes()[1] > 1 and not kmp.is_chief():
            import tempfile

            with tempfile.TemporaryDirectory() as scratch:
                model.save(os.path.join(scratch, f"{name}.keras"))
            return
        if not kmp.is_chief():
            return
        model.save(os.path.join(out, f"{name}.keras"))
        with open(os.path.join(out, "results.json"), "w") as f:
            json.dump(results, f, indent=2)
        report.plot(results, os.path.join(out, "results.png"), self.loss_scales)


def summary(name, results) -> str:
    """One line for the end of a run."""
    label = " (SYNTHETIC data)" if results["data"] == "synthetic" else ""
    return (
        f"{name}{label}: policy {results['policy']}, "
        f"{results['replicas']} replica(s), {results['epochs']} epoch(s), "
        f"test accuracy {results['accuracy']:.4f}, "
        f"final loss {results['final_loss']:.4f}, "
        f"{results['examples_per_s']:.0f} examples/s, "
        f"loss scale {results['loss_scale'] or 'none'}, "
        f"skipped steps {results['skipped_steps']:g}"
        + (f"\n{results['stopped']}" if results.get("stopped") else "")
    )


def run_and_report(name, title, config, given, train):
    """Trains an example from its flags: CPU sizes where no GPU is found
    for the sizes not `given` (said in one line), then `train(config)`,
    the results table and the summary line. Returns the results."""
    # Before the devices are listed, which starts TensorFlow: its cache
    # is set when it starts or not at all (`train` asks again: a no-op);
    # and JAX's processes join before JAX runs anything.
    use_compile_cache(config)
    scale_out.start_processes(config)
    config, note = device_sized(config, given)
    if note:
        print(note)
    config, search = batch_search.run_config(name, config)
    results = train(config)
    if search:
        results["batch_search"] = search
        _rewrite_results(config, results)
    note = "memory: " + results["peak_memory_note"]
    report.show([results], title, note=note)
    print(summary(name, results))
    return results


def _rewrite_results(config, results):
    """results.json again, with what the run learned before training."""
    if kmp.is_chief():
        with open(os.path.join(config.output_dir, "results.json"), "w") as f:
            json.dump(results, f, indent=2)


def main(name, title, config_class, train):
    """An example's `main` (run as a script, its flags in absl's
    `flags.FLAGS`)."""
    from absl import flags

    config = kmp_flags.config_from_flags(config_class, flags.FLAGS)
    given = kmp_flags.given(config_class, flags.FLAGS)
    return run_and_report(name, title, config, given, train)
