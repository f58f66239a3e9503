"""What the example trainers share: flags, strategy, callbacks, results.

`examples/cifar10.py` and `examples/imdb.py` each show their data, model
and `fit` call; the plumbing around them lives here once: a config
dataclass whose fields are the command-line flags, the strategy choice,
the callbacks every run gets (loss-scale monitor, step log, backup), and
the results record that `kmp train`, `kmp bench` and the tests read.
"""

import contextlib
import dataclasses
import json
import math
import os

import keras
import numpy as np

import kmp
from kmp.app import data as kmp_data
from kmp.app import device_data
from kmp.app import report

POLICIES = ("auto", "float32", "mixed_float16", "mixed_bfloat16")
STRATEGIES = ("none", "mirrored", "multiworker")


def flag(default, help, choices=None, lower_bound=None):
    """A config field that is also a command-line flag."""
    metadata = {"help": help, "choices": choices, "lower_bound": lower_bound}
    return dataclasses.field(default=default, metadata=metadata)


@dataclasses.dataclass
class RunConfig:
    """The flags every example takes; examples subclass it."""

    policy: str = flag(
        "auto", "Dtype policy; auto picks by hardware.", POLICIES
    )
    epochs: int = flag(10, "Epochs.", lower_bound=1)
    batch_size: int = flag(64, "Global batch (all replicas).", lower_bound=1)
    steps: int = flag(
        0,
        "Steps per epoch; 0 means all. Also bounds validation (the same "
        "share of the test split) unless --eval_steps is set.",
        lower_bound=0,
    )
    eval_steps: int = flag(
        0,
        "Validation steps; 0 means all, or with --steps the same share "
        "of the test split as --steps is of the training split.",
        lower_bound=0,
    )
    data: str = flag("auto", "Data source.", kmp_data.SOURCES)
    data_dir: str = flag("", "TFDS data directory (default: TFDS's).")
    output_dir: str = flag("runs", "Where results and checkpoints go.")
    seed: int = flag(0, "Random seed.")
    strategy: str = flag("none", "Where the replicas are.", STRATEGIES)
    learning_rate: float = flag(1e-3, "Peak learning rate.")
    synthetic_size: int = flag(
        25_000,
        "Training examples of synthetic data; its test split is a fifth "
        "of that.",
        lower_bound=1,
    )
    verbose: int = flag(1, "fit's verbosity (0, 1, 2).", lower_bound=0)
    compile_cache: str = flag(
        "auto",
        "Persistent XLA compilation cache: a directory, 'auto' (~/.cache/"
        "kmp/xla, on backends that have one) or 'off'.",
    )

    def check(self):
        """Raises `ValueError` naming the first bad field."""
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            choices = field.metadata.get("choices")
            low = field.metadata.get("lower_bound")
            if choices and value not in choices:
                raise kmp.InputError(
                    f"{field.name} must be one of {', '.join(choices)}; "
                    f"got {value!r}."
                )
            if low is not None and value < low:
                raise kmp.InputError(
                    f"{field.name} must be >= {low}, got {value}."
                )
        if not self.learning_rate > 0:
            raise kmp.InputError(
                f"learning_rate must be > 0, got {self.learning_rate}."
            )
        if self.strategy == "multiworker" and kmp.parse_tf_config() is None:
            raise kmp.InputError(
                "strategy=multiworker needs TF_CONFIG, the cluster (every "
                "worker's host:port) and this worker's index, e.g. "
                'TF_CONFIG=\'{"cluster": {"worker": ["host1:12345", '
                '"host2:12345"]}, "task": {"type": "worker", "index": 0}}\' '
                "(README, Multi-GPU and multi-node). On one machine use "
                "strategy=mirrored or none."
            )
        return self


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


def define_flags(config_class, flag_values=None):
    """Defines one absl flag per field of `config_class`."""
    from absl import flags

    where = flags.FLAGS if flag_values is None else flag_values
    for field in dataclasses.fields(config_class):
        meta, name = field.metadata, field.name
        help_text = meta.get("help", name)
        if meta.get("choices"):
            flags.DEFINE_enum(
                name,
                field.default,
                list(meta["choices"]),
                help_text,
                flag_values=where,
            )
        elif field.type in (int, "int"):
            flags.DEFINE_integer(
                name,
                field.default,
                help_text,
                lower_bound=meta.get("lower_bound"),
                flag_values=where,
            )
        elif field.type in (bool, "bool"):
            flags.DEFINE_boolean(
                name, field.default, help_text, flag_values=where
            )
        elif field.type in (float, "float"):
            flags.DEFINE_float(
                name, field.default, help_text, flag_values=where
            )
        else:
            flags.DEFINE_string(
                name, field.default, help_text, flag_values=where
            )


def config_from_flags(config_class, flag_values):
    names = [field.name for field in dataclasses.fields(config_class)]
    return config_class(**{name: flag_values[name].value for name in names})


def make_strategy(name: str):
    """A `tf.distribute` strategy for `name`, or `None`.

    On JAX, `"mirrored"` sets `keras.distribution.DataParallel` over the
    local devices instead (and returns `None`). Keras's torch backend has
    neither.
    """
    if name == "none":
        return None
    backend = keras.backend.backend()
    if backend == "jax" and name == "mirrored":
        keras.distribution.set_distribution(keras.distribution.DataParallel())
        return None
    if backend != "tensorflow":
        where = "KERAS_BACKEND=tensorflow"
        if name == "mirrored":
            where += " or jax"
        raise kmp.InputError(
            f"strategy={name} needs {where} (it is {backend!r})"
            + (
                ": Keras's torch backend has no multi-device fit "
                "(README, Multi-GPU and multi-node)."
                if backend == "torch"
                else "."
            )
        )
    import tensorflow as tf

    if name == "mirrored":
        strategy = tf.distribute.MirroredStrategy()
    else:
        strategy = kmp.multi_worker_strategy()
    # A batch that does not split over the replicas is refused by
    # kmp.distribute when fit starts (see `prepare`).
    return strategy


def build_optimizer(model):
    """Creates the optimizer's variables now, after `compile`.

    Keras on TensorFlow without a strategy builds the optimizer inside
    the first trace of the train step; a `tf.function` whose first trace
    creates variables is traced a second time. Built here, the train
    step is traced once (JAX builds it before tracing anyway).
    """
    model.optimizer.build(model.trainable_variables)
    return model


def scope(strategy):
    """The strategy's scope, or nothing."""
    return strategy.scope() if strategy else contextlib.nullcontext()


def prepare(model, strategy):
    """After `compile`: `kmp.distribute` under a strategy."""
    if strategy is not None:
        kmp.distribute(model)
    return model


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
    there (`kmp.app.device_data`): on JAX, without a distribution (a
    `DataParallel` run shards host batches itself)."""
    return keras.backend.backend() == "jax" and config.strategy == "none"


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
    with `batch_size`."""
    if isinstance(data, tuple):
        return data, {"batch_size": batch_size}
    return (data,), {"shuffle": False}


class Run:
    """The callbacks of one training run, and its results afterwards.

    Args:
        config: The run's `RunConfig`. Its `output_dir` holds the backup
            (so an interrupted run resumes when rerun), and afterwards the
            model, `results.json` and `results.png` (chief only).
        splits: The `kmp.app.data.Splits` trained on.
        strategy: The `tf.distribute` strategy, or `None`.
    """

    def __init__(self, config, splits, strategy):
        self.config, self.splits, self.strategy = config, splits, strategy
        output_dir = self.output_dir = config.output_dir
        os.makedirs(output_dir, exist_ok=True)
        self.steps = report.StepLog()
        self.monitor = kmp.callbacks.LossScaleMonitor()
        # --steps (or --eval_steps) bounds validation too.
        self.eval_steps = evaluation_steps(config, splits)
        shown = self.eval_steps or batches(splits.test, config.batch_size)
        self.callbacks = [
            self.monitor,
            self.steps,
            report.ValidationProgress(shown, config.verbose),
            keras.callbacks.BackupAndRestore(
                os.path.join(output_dir, "backup")
            ),
        ]

    def results(self, model_name, policy, history, model, test_loss, accuracy):
        """The run's record: figures, History, per-step losses, config."""
        config, splits, strategy = self.config, self.splits, self.strategy
        step_time = self.steps.median_step_time()  # without compiling
        memory, memory_note = report.peak_memory_mib()
        logs = {k: [float(v) for v in vs] for k, vs in history.history.items()}
        replicas = strategy.num_replicas_in_sync if strategy else 1
        return {
            "model": model_name,
            "policy": policy,
            "data": splits.source,
            "data_note": splits.note,
            "strategy": config.strategy,
            "replicas": replicas,
            "epochs": len(logs.get("loss", [])),
            "batch_size": config.batch_size,
            "step_time_s": step_time,
            "examples_per_s": config.batch_size / step_time,
            "peak_memory_mib": memory,
            "peak_memory_note": memory_note,
            "final_loss": logs["loss"][-1] if logs.get("loss") else math.nan,
            "test_loss": float(test_loss),
            "accuracy": float(accuracy),
            "loss_scale": logs.get("loss_scale", [None])[-1],
            "skipped_steps": logs.get("skipped_steps", [0])[-1],
            "parameters": model.count_params(),
            "history": logs,
            "step_losses": self.steps.losses,
            "config": dataclasses.asdict(config),
        }

    def save(self, model, results, name):
        """Writes the model, `results.json` and `results.png` (chief)."""
        if not kmp.is_chief():
            return
        out = self.output_dir
        model.save(os.path.join(out, f"{name}.keras"))
        with open(os.path.join(out, "results.json"), "w") as f:
            json.dump(results, f, indent=2)
        report.plot(
            results,
            os.path.join(out, "results.png"),
            self.monitor.history["loss_scale"],
        )


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
    )


def main(name, title, config_class, train):
    """An example's `main`: flags -> train -> table and summary."""
    from absl import flags

    results = train(config_from_flags(config_class, flags.FLAGS))
    note = "memory: " + results["peak_memory_note"]
    report.show([results], title, note=note)
    print(summary(name, results))
    return results
