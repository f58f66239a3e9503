"""# CIFAR-10 with kmp mixed precision

A ResNet-9 (the fast-CIFAR lineage of David Page's DAWNBench entry and
airbench) on TFDS `cifar10`, with float16 (or bfloat16) compute, float32
variables, kmp's dynamic loss scale and a float32 output softmax.

Run (from the repository root, after `pip install -e .`):

    python examples/cifar10.py --epochs=10              # policy "auto"
    python examples/cifar10.py --policy=float32 --steps=50 --epochs=2
    python examples/cifar10.py --data=synthetic         # no download

Several GPUs on one machine: `--strategy=mirrored`. Several machines: the
same command on each host, with `--strategy=multiworker` and a TF_CONFIG
that lists every host and this host's index (see README, "Multi-GPU and
multi-node"). The global batch (`--batch_size`) is split over all replicas.

Measured (2-core CPU VM, no GPU; TF 2.21, Keras 3.15.1):
`python examples/cifar10.py --data=synthetic --width=16 --epochs=2
--steps=20 --batch_size=128` trains to test accuracy 1.00 on synthetic data
(the same command with `--policy=float32` too); see BENCHMARKS.md for
multi-worker step times. Speed claims belong to GPUs.
"""

import dataclasses
import json
import math
import os
import time

import keras
import numpy as np

import kmp
from kmp import data as kmp_data

MEAN = np.array([0.4914, 0.4822, 0.4465], "float32") * 255
STD = np.array([0.2470, 0.2435, 0.2616], "float32") * 255
STRATEGIES = ("none", "mirrored", "multiworker")


@dataclasses.dataclass
class Config:
    """What `train` does. Every field is also a command-line flag."""

    policy: str = "auto"
    epochs: int = 10
    batch_size: int = 512
    steps: int = 0  # steps per epoch; 0 means a full pass over the data
    data: str = "auto"  # auto | tfds | synthetic
    data_dir: str | None = None
    output_dir: str = "runs/cifar10"
    seed: int = 0
    strategy: str = "none"  # none | mirrored | multiworker
    learning_rate: float = 0.2  # peak, at batch 512; scaled with the batch
    width: int = 64  # channels of the first block; 64 is ResNet-9
    synthetic_size: int = 50_000
    verbose: int = 1

    def check(self):
        for name in ("epochs", "batch_size", "width", "synthetic_size"):
            if getattr(self, name) < 1:
                raise ValueError(
                    f"{name} must be >= 1, got {getattr(self, name)}."
                )
        if self.steps < 0:
            raise ValueError(f"steps must be >= 0, got {self.steps}.")
        if not self.learning_rate > 0:
            raise ValueError(
                f"learning_rate must be > 0, got {self.learning_rate}."
            )
        if self.strategy not in STRATEGIES:
            raise ValueError(
                f"strategy must be one of {', '.join(STRATEGIES)}; got "
                f"{self.strategy!r}."
            )
        kmp_data.check_source(self.data)
        return self


# ## Data
#
# TFDS's cifar10 when it is on disk or downloadable; otherwise (with
# `--data=auto`) a synthetic twin of the same shapes, labelled as such.
# Training images are padded by 4, randomly cropped back to 32x32 and
# flipped; all are normalized with CIFAR-10's channel statistics.


def load_splits(config):
    def synthetic():
        return kmp_data.synthetic_images(
            train_size=config.synthetic_size,
            test_size=max(config.synthetic_size // 5, 1),
            seed=config.seed,
        )

    return kmp_data.load("cifar10", config.data, synthetic, config.data_dir)


def has_tensorflow():
    try:
        import tensorflow  # noqa: F401
    except ImportError:
        return False
    return True


def make_datasets(splits, config):
    """Batched train and test data for `fit`: `tf.data` pipelines when
    TensorFlow is installed, else NumPy arrays (synthetic data on a JAX
    machine without TensorFlow, without augmentation)."""
    if not has_tensorflow():
        return [
            ((x.astype("float32") - MEAN) / STD, y)
            for x, y in (splits.train, splits.test)
        ]
    import tensorflow as tf

    def normalize(image, label):
        return (tf.cast(image, tf.float32) - MEAN) / STD, label

    def augment(image, label):
        image = tf.pad(image, [[4, 4], [4, 4], [0, 0]], mode="REFLECT")
        image = tf.image.random_crop(image, [32, 32, 3], seed=config.seed)
        image = tf.image.random_flip_left_right(image, seed=config.seed)
        return image, label

    def as_dataset(split):
        if isinstance(split, tf.data.Dataset):
            return split
        return tf.data.Dataset.from_tensor_slices(split)

    train = (
        as_dataset(splits.train)
        .map(normalize, num_parallel_calls=tf.data.AUTOTUNE)
        .cache()
        .shuffle(10_000, seed=config.seed)
        .map(augment, num_parallel_calls=tf.data.AUTOTUNE)
        .batch(config.batch_size, drop_remainder=True)
        .prefetch(tf.data.AUTOTUNE)
    )
    if config.steps:
        train = train.repeat()  # steps * epochs may exceed one pass
    test = (
        as_dataset(splits.test)
        .map(normalize, num_parallel_calls=tf.data.AUTOTUNE)
        .batch(config.batch_size)
        .cache()
        .prefetch(tf.data.AUTOTUNE)
    )
    return train, test


# ## Model
#
# ResNet-9: conv-BN-ReLU blocks, three poolings, two residual blocks, a
# global max pool and a softmax. Widths are multiples of 8 (tensor cores);
# `kmp.pin_float32` makes the output softmax float32.


def conv_bn(x, filters):
    x = keras.layers.Conv2D(filters, 3, padding="same", use_bias=False)(x)
    x = keras.layers.BatchNormalization(momentum=0.9)(x)
    return keras.layers.ReLU()(x)


def residual(x, filters):
    return keras.layers.Add()([x, conv_bn(conv_bn(x, filters), filters)])


def build_model(width=64, classes=10):
    inputs = keras.Input((32, 32, 3))
    x = conv_bn(inputs, width)
    x = conv_bn(x, 2 * width)
    x = keras.layers.MaxPooling2D()(x)
    x = residual(x, 2 * width)
    x = conv_bn(x, 4 * width)
    x = keras.layers.MaxPooling2D()(x)
    x = conv_bn(x, 8 * width)
    x = keras.layers.MaxPooling2D()(x)
    x = residual(x, 8 * width)
    x = keras.layers.GlobalMaxPooling2D()(x)
    x = keras.layers.Dense(classes)(x)
    # Page's ResNet-9 scales the logits by 1/8: gentler early steps.
    x = keras.layers.Rescaling(0.125)(x)
    outputs = keras.layers.Softmax()(x)
    return keras.Model(inputs, outputs, name="resnet9")


# ## Train
#
# The strategy decides where the replicas are. On TensorFlow, the model is
# built and compiled in its scope and `kmp.distribute` makes `fit` work
# under it (Keras alone cannot run MultiWorkerMirroredStrategy). On JAX,
# `mirrored` means keras.distribution.DataParallel over the local devices.


def make_strategy(name):
    """Returns a `tf.distribute` strategy, or `None` (no TF strategy)."""
    if name == "none":
        return None
    if keras.backend.backend() != "tensorflow":
        if name == "mirrored":
            keras.distribution.set_distribution(
                keras.distribution.DataParallel()
            )
            return None
        raise ValueError(
            "strategy=multiworker needs KERAS_BACKEND=tensorflow (it is "
            f"{keras.backend.backend()!r})."
        )
    import tensorflow as tf

    if name == "mirrored":
        return tf.distribute.MirroredStrategy()
    return kmp.multi_worker_strategy()


class StepTimer(keras.callbacks.Callback):
    """Wall time of each training step (Keras returns logs per step, so a
    step has finished on the device when its end is seen)."""

    def on_train_begin(self, logs=None):
        self.times = []

    def on_train_batch_begin(self, batch, logs=None):
        self._start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        self.times.append(time.perf_counter() - self._start)


def train(config: Config) -> dict:
    """Trains and evaluates; returns the results (also written as JSON)."""
    config.check()
    keras.utils.set_random_seed(config.seed)
    splits = load_splits(config)
    strategy = make_strategy(config.strategy)
    replicas = strategy.num_replicas_in_sync if strategy else 1
    if config.batch_size % replicas:
        raise ValueError(
            f"batch_size {config.batch_size} does not split over {replicas} "
            f"replicas; use a multiple of {replicas}."
        )
    train_data, test_data = make_datasets(splits, config)
    steps = config.steps or _size(splits.train) // config.batch_size

    with kmp.policy_scope(config.policy) as policy:
        scope = strategy.scope() if strategy else _no_scope()
        with scope:
            model = kmp.pin_float32(build_model(config.width))
            peak = config.learning_rate * config.batch_size / 512
            schedule = keras.optimizers.schedules.CosineDecay(
                peak / 10,
                decay_steps=max(config.epochs * steps, 1),
                warmup_target=peak,
                warmup_steps=max(config.epochs * steps // 5, 1),
            )
            optimizer = kmp.wrap(
                keras.optimizers.SGD(
                    schedule, momentum=0.9, nesterov=True, weight_decay=5e-4
                )
            )
            model.compile(
                optimizer=optimizer,
                loss="sparse_categorical_crossentropy",
                metrics=["accuracy"],
            )
        if strategy is not None:
            kmp.distribute(model)
        timer = StepTimer()
        os.makedirs(config.output_dir, exist_ok=True)
        callbacks = [
            kmp.callbacks.LossScaleMonitor(),
            timer,
            # Nothing lost on interruption: rerun the same command.
            keras.callbacks.BackupAndRestore(
                os.path.join(config.output_dir, "backup")
            ),
        ]
        history = model.fit(
            *_xy(train_data),
            batch_size=_batch(train_data, config.batch_size),
            validation_data=_pair(test_data),
            epochs=config.epochs,
            steps_per_epoch=config.steps or None,
            callbacks=callbacks,
            verbose=config.verbose,
        )
        test_loss, test_accuracy = model.evaluate(
            *_xy(test_data),
            batch_size=_batch(test_data, config.batch_size),
            verbose=0,
        )
        results = _results(
            config, policy.name, splits, history, timer, model, replicas
        )
    results.update(test_loss=float(test_loss), accuracy=float(test_accuracy))
    if kmp.is_chief():
        model.save(os.path.join(config.output_dir, "cifar10.keras"))
        with open(os.path.join(config.output_dir, "results.json"), "w") as f:
            json.dump(results, f, indent=2)
    return results


class _no_scope:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def _size(split):
    if isinstance(split, tuple):
        return len(split[1])
    return int(split.cardinality())  # TFDS splits know their size


def _xy(data):
    """`fit`'s positional data arguments for a dataset or an array pair."""
    return tuple(data) if isinstance(data, tuple) else (data,)


def _batch(data, batch_size):
    # Datasets are batched already; arrays are batched by fit.
    return batch_size if isinstance(data, tuple) else None


def _pair(data):
    return tuple(data) if isinstance(data, tuple) else data


def _results(config, policy, splits, history, timer, model, replicas):
    step_times = timer.times[2:] or timer.times  # skip compilation
    step_time = float(np.median(step_times)) if step_times else math.nan
    logs = {k: [float(v) for v in vs] for k, vs in history.history.items()}
    return {
        "model": "resnet9",
        "policy": policy,
        "data": splits.source,
        "data_note": splits.note,
        "strategy": config.strategy,
        "replicas": replicas,
        "epochs": len(logs.get("loss", [])),
        "batch_size": config.batch_size,
        "step_time_s": step_time,
        "examples_per_s": config.batch_size / step_time,
        "final_loss": logs["loss"][-1] if logs.get("loss") else math.nan,
        "loss_scale": logs.get("loss_scale", [None])[-1],
        "skipped_steps": logs.get("skipped_steps", [0])[-1],
        "parameters": model.count_params(),
        "history": logs,
        "config": dataclasses.asdict(config),
    }


# ## Results
#
# `main` parses the flags (absl, like every Keras example), trains, and
# prints a one-screen summary; `results.json` in --output_dir has it all.


def define_flags(flag_values=None):
    """Defines the flags, one per `Config` field, on `flag_values`
    (absl's global `FLAGS` by default)."""
    from absl import flags

    defaults = Config()
    where = {"flag_values": flags.FLAGS if flag_values is None else flag_values}
    flags.DEFINE_enum(
        "policy",
        defaults.policy,
        ["auto", "float32", "mixed_float16", "mixed_bfloat16"],
        "Dtype policy; auto picks by hardware.",
        **where,
    )
    flags.DEFINE_integer(
        "epochs", defaults.epochs, "Epochs.", lower_bound=1, **where
    )
    flags.DEFINE_integer(
        "batch_size",
        defaults.batch_size,
        "Global batch.",
        lower_bound=1,
        **where,
    )
    flags.DEFINE_integer(
        "steps",
        defaults.steps,
        "Steps per epoch (0: all).",
        lower_bound=0,
        **where,
    )
    flags.DEFINE_enum(
        "data", defaults.data, list(kmp_data.SOURCES), "Data.", **where
    )
    flags.DEFINE_string("data_dir", None, "TFDS data directory.", **where)
    flags.DEFINE_string(
        "output_dir", defaults.output_dir, "Output dir.", **where
    )
    flags.DEFINE_integer("seed", defaults.seed, "Random seed.", **where)
    flags.DEFINE_enum(
        "strategy", defaults.strategy, list(STRATEGIES), "Replicas.", **where
    )
    flags.DEFINE_float(
        "learning_rate",
        defaults.learning_rate,
        "Peak learning rate at batch 512 (scaled linearly with the batch).",
        **where,
    )
    flags.DEFINE_integer(
        "width",
        defaults.width,
        "First block's channels.",
        lower_bound=1,
        **where,
    )
    flags.DEFINE_integer(
        "synthetic_size",
        defaults.synthetic_size,
        "Synthetic training examples.",
        lower_bound=1,
        **where,
    )
    flags.DEFINE_integer(
        "verbose", defaults.verbose, "fit's verbosity.", **where
    )


def config_from_flags(flag_values) -> Config:
    return Config(
        **{
            f.name: flag_values[f.name].value
            for f in dataclasses.fields(Config)
        }
    )


def summary(results) -> str:
    label = " (SYNTHETIC data)" if results["data"] == "synthetic" else ""
    return (
        f"cifar10{label}: policy {results['policy']}, "
        f"{results['replicas']} replica(s), {results['epochs']} epoch(s), "
        f"test accuracy {results['accuracy']:.4f}, "
        f"final loss {results['final_loss']:.4f}, "
        f"{results['examples_per_s']:.0f} examples/s, "
        f"loss scale {results['loss_scale']}, "
        f"skipped steps {results['skipped_steps']:g}"
    )


def main(argv):
    from absl import flags

    del argv  # everything is in the flags
    results = train(config_from_flags(flags.FLAGS))
    print(summary(results))


if __name__ == "__main__":
    from absl import app

    define_flags()
    app.run(main)
