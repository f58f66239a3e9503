"""One training run of an example: what every run does around the data,
the model and `model.fit` that the example shows.

An example's `train` reads as a keras-io tutorial, with kmp's three
calls in it (`kmp.enable` before the model is built, `kmp.pin_float32`
and `kmp.wrap` where it is compiled), and hands the rest to a `Run`,
whose members are all it uses:

    with Run(config) as run       checks the config; starts the process
                                  (`kmp.app.startup.start`); seeds;
                                  makes the tf.distribute strategy or the
                                  keras.distribution; on exit, restores
                                  the dtype policy in force before
    run.start(splits)             the backup a rerun resumes from (one
                                  of other settings is refused here,
                                  before anything is built) and the
                                  callbacks; returns the steps of an
                                  epoch
    run.scope()                   where the model is built and compiled:
                                  the strategy's scope
    run.distribute(model)         `kmp.distribute` under a strategy
    run.data(train, test)         `fit`'s data arguments: this process's
                                  share, validation's steps
    run.callbacks                 loss-scale monitor, step log,
                                  validation progress, backup, progress
                                  bar: all async-safe but validation's
                                  (Keras need not wait for each step)
    run.finish(model, history, name)    the results record; writes it
                                  (`results.json`, its one writer), the
                                  model and `results.png` (chief only)

`train_example` is `kmp train`'s (and an example script's) engine: it
prepares the config (`kmp.app.startup.prepare`: start-up, CPU sizes,
`--batch_size=max`), calls the example's `train`, and prints the table,
the summary and the files written.

```python
def train(config):
    with Run(config) as run:
        kmp.enable(config.policy, master_weights=config.master_weights)
        splits = load_data(config)
        train_data, test_data = make_datasets(splits, config)
        steps = run.start(splits)
        with run.scope():
            model = compile_model(config, steps)
        history = run.distribute(model).fit(
            **run.data(train_data, test_data),
            epochs=config.epochs,
            steps_per_epoch=steps,  # always: the data is one stream
            callbacks=run.callbacks,
        )
        return run.finish(model, history, "resnet9")
```
"""

import contextvars
import dataclasses
import json
import math
import os

import keras

import kmp
from kmp import backend
from kmp.app import backup as kmp_backup
from kmp.app import batching
from kmp.app import report
from kmp.app import scale_out
from kmp.app import startup
from kmp_config import configs

# What `train_example` learned before the example's `train` ran (the
# batch search), for `Run.finish` to add to the record it writes.
_BEFORE_TRAINING = contextvars.ContextVar("before_training", default=None)


def example_name(config) -> str:
    """The name `config`'s class is registered under
    (`kmp_config.configs.EXAMPLES`), or of its nearest registered base."""
    for cls in type(config).__mro__:
        for name, registered in configs.EXAMPLES.items():
            if cls is registered:
                return name
    raise TypeError(
        f"{type(config).__name__} is no example's config "
        f"({list(configs.EXAMPLES)}); pass Run(config, name=...)."
    )


def outputs(config, name) -> dict:
    """The files a run writes in `--output_dir`: the model, the record
    and its plot."""
    out = config.output_dir
    return {
        "model": os.path.join(out, f"{name}.keras"),
        "results": os.path.join(out, "results.json"),
        "plot": os.path.join(out, "results.png"),
    }


class Run:
    """One training run of an example; a context manager (see the
    module).

    Args:
        config: The run's config (`kmp_config.configs.RunConfig`). Its
            `output_dir` holds the backup (a rerun resumes an interrupted
            run: `kmp.app.backup`), and afterwards the model,
            `results.json` and `results.png` (chief only).
        name: The example's name, the saved model's file
            (`{name}.keras`); by default the name its config class is
            registered under.

    Raises:
        kmp.InputError: a bad config, or (from `start`) an `output_dir`
            holding the backup of a run with other settings.
    """

    def __init__(self, config, name=None):
        self.config = config.check()
        self.name = name or example_name(config)
        self.strategy = None
        self.callbacks = None

    def __enter__(self):
        config = self.config
        startup.start(config)  # once: processes, compile cache
        keras.utils.set_random_seed(config.seed)
        self.strategy = scale_out.make_strategy(config.strategy)
        scale_out.make_distribution(config)  # JAX
        self._previous_policy = keras.config.dtype_policy()
        return self

    def __exit__(self, *exc_info):
        # The example's `kmp.enable` holds for this run only: a caller
        # (a test, a notebook) gets its own policy back, through
        # `kmp.enable`, so that kmp knows the run's policy is gone (else
        # the caller's next `kmp.wrap` would warn that it was reset).
        try:
            kmp.enable(self._previous_policy)
        except kmp.InputError:  # a policy of the caller's own making
            keras.config.set_dtype_policy(self._previous_policy)
            backend.note_dtype_errors()
        return False

    def start(self, splits) -> int:
        """The backup a rerun resumes from and the callbacks, under the
        dtype policy now in force; returns the steps of an epoch
        (`--steps`, or the training split's full batches)."""
        config = self.config
        self.splits = splits
        self.policy = keras.config.dtype_policy().name
        os.makedirs(config.output_dir, exist_ok=True)
        # Each JAX process backs up on its own directory; a rerun resumes
        # each from its own, checked to be at the same epoch.
        self.backup = kmp_backup.Backup(
            config,
            self.policy,
            kmp_backup.directory(config),
            self._per_step,
        )
        self.steps = report.StepLog()
        self.monitor = kmp.callbacks.LossScaleMonitor()
        # --steps (or --eval_steps) bounds validation too.
        self.eval_steps = batching.evaluation_steps(config, splits)
        shown = self.eval_steps or batching.batches(
            splits.test, config.batch_size
        )
        self.callbacks = [
            self.monitor,
            self.steps,
            report.ValidationProgress(shown, config.verbose),
            *self.backup.callbacks,
        ]
        if config.verbose:
            # Keras's own bar makes each step wait for the last one's logs.
            self.callbacks.append(kmp.callbacks.ProgressBar())
        return batching.steps_per_epoch(config, splits)

    def scope(self):
        """Where to build and compile the model: the strategy's scope."""
        return scale_out.scope(self.strategy)

    def distribute(self, model):
        """`kmp.distribute(model)` under a strategy; returns the model."""
        return scale_out.prepare(model, self.strategy)

    def data(self, train, test) -> dict:
        """`fit`'s data arguments: `train` (a batched dataset, or an
        `(x, y)` pair of arrays) and `test` as this process's share, with
        the batch size arrays need, and validation's steps."""
        self._started()
        batch_size = self.config.batch_size
        args, kwargs = scale_out.fit_arguments(train, batch_size)
        return {
            **dict(zip(("x", "y"), args)),
            **kwargs,
            "validation_data": scale_out.process_share(test, batch_size),
            "validation_steps": self.eval_steps,
        }

    def finish(self, model, history, model_name, more=None) -> dict:
        """The run's record, written with the model and its plot.

        The record: figures, the History of every epoch (those before an
        interruption too), per-step losses, config. The test figures are
        the last epoch's validation: the same weights on the same
        batches, so it is not run a second time.

        Args:
            model: The trained model.
            history: What `fit` returned.
            model_name: The record's `model` (e.g. `"resnet9"`).
            more: A function of the record returning figures to add to
                it (e.g. tokens per second) before it is written.

        Returns:
            The record, as `results.json` holds it.
        """
        self._started()
        results = self._results(model_name, history, model)
        if more is not None:
            results.update(more(results))
        results.update(_BEFORE_TRAINING.get() or {})
        self._save(model, results)
        return results

    def _started(self):
        if self.callbacks is None:
            raise RuntimeError(
                "Run.start(splits) comes before fit: it makes the "
                "callbacks and the backup."
            )

    def _per_step(self):
        """What the backup keeps per step: losses and loss scales."""
        return {
            "loss": getattr(self.steps, "losses", []),
            # A model with scalers of its own (a GAN's) has prefixed ones.
            "loss_scale": self.monitor.history.get("loss_scale", []),
        }

    def _results(self, model_name, history, model):
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
            # When, from which commit, on which versions and devices: as
            # every benchmark's record says (a results file read later,
            # on another machine, must say where it came from). The
            # chief's, which writes it: the others ask git nothing.
            **(backend.environment() if kmp.is_chief() else {}),
        }

    def _save(self, model, results):
        """Writes the model, `results.json` and `results.png` (chief),
        then deletes the backup (each process its own).

        In a multi-process JAX job every process saves, the others into a
        file they delete: Keras's save makes an optimizer variable, whose
        placement under a keras.distribution is a collective, so a save
        on process 0 alone waits for the others forever."""
        files = outputs(self.config, self.name)
        if backend.processes()[1] > 1 and not kmp.is_chief():
            import tempfile

            with tempfile.TemporaryDirectory() as scratch:
                model.save(os.path.join(scratch, f"{self.name}.keras"))
        elif kmp.is_chief():
            model.save(files["model"])
            with open(files["results"], "w") as f:
                json.dump(results, f, indent=2)
            report.plot(results, files["plot"], self.loss_scales)
        # Only now: a run killed before resumes from it and writes them.
        # Each JAX process deletes its own, once the chief has written
        # (a collective): one without a backup beside one with would
        # make a rerun refuse to resume. And none returns before every
        # one's is gone: the run's folder is then as it stays.
        backend.gather_over_processes(0)
        self.backup.delete()
        backend.gather_over_processes(0)


def summary(name, results) -> str:
    """One line for the end of a run: the test split's accuracy beside
    the training loss of the last epoch."""
    label = " (SYNTHETIC data)" if results["data"] == "synthetic" else ""
    return (
        f"{name}{label}: policy {results['policy']}, "
        f"{results['replicas']} replica(s), {results['epochs']} epoch(s), "
        f"test accuracy {results['accuracy']:.4f}, "
        f"final training loss {results['final_loss']:.4f}, "
        f"{results['examples_per_s']:.0f} examples/s, "
        f"loss scale {results['loss_scale'] or 'none'}, "
        f"skipped steps {results['skipped_steps']:g}"
        + (f"\n{results['stopped']}" if results.get("stopped") else "")
    )


def train_example(example, config, given=(), title=None) -> dict:
    """Trains `example` (its module) as `kmp train` does: its config
    prepared (`startup.prepare`: start-up, CPU sizes for the sizes not
    `given`, `--batch_size=max`), its `train(config)`, then the results
    table, the summary line and the files written. Returns the results.
    """
    name = example_name(config)
    config, search = startup.prepare(example, config, given)
    token = _BEFORE_TRAINING.set({"batch_search": search} if search else {})
    try:
        results = example.train(config)
    finally:
        _BEFORE_TRAINING.reset(token)
    note = "memory: " + results["peak_memory_note"]
    report.show([results], title or f"kmp train {name}", note=note)
    print(summary(name, results))
    if kmp.is_chief():
        for what, path in outputs(config, name).items():
            print(f"wrote {path} ({WRITTEN[what]})")
    return results


WRITTEN = {
    "model": "the trained model: kmp.load_model reads it",
    "results": "figures, History, per-step losses, config",
    "plot": "loss and loss scale over steps",
}


def main(example):
    """Runs `example` (its module) as a script: its flags (absl, parsed
    from `sys.argv`), then `train_example`."""
    from absl import app
    from absl import flags

    from kmp_config import flags as kmp_flags

    kmp_flags.define_flags(example.Config)

    def run(argv):
        del argv  # everything is in the flags
        config = kmp_flags.config_from_flags(example.Config, flags.FLAGS)
        given = kmp_flags.given(example.Config, flags.FLAGS)
        train_example(example, config, given)

    app.run(run)
