"""# CIFAR-10 with kmp mixed precision

A ResNet-9 (the fast-CIFAR lineage of David Page's DAWNBench entry and
airbench) on TFDS `cifar10`, with float16 (or bfloat16) compute, float32
variables, kmp's dynamic loss scale and a float32 output softmax.

Run (from the repository root, after `pip install -e .`):

    python examples/cifar10.py --epochs=10              # policy "auto"
    python examples/cifar10.py --policy=float32 --steps=50 --epochs=2
    python examples/cifar10.py --data=synthetic         # no download
    python examples/cifar10.py --policy=mixed_bfloat16 \
        --master_weights=bfloat16 --optimizer_states=bfloat16 --remat
                                    # the memory modes (docs/memory.md)

Before a long run, `kmp doctor cifar10` (same flags) shows which layers
float16 hurts and the loss scales that keep the gradients in range
(README, "Numerics doctor").

Several GPUs on one machine: `--strategy=mirrored` (TensorFlow) or
`--distribution=data` (JAX: DataParallel; `--distribution=model` also
splits every convolution's output channels over pairs of devices).
Several machines: the same command on each host, with
`--strategy=multiworker` and a TF_CONFIG that lists every host and this
host's index (see README, "Beyond one machine"). The global batch
(`--batch_size`) is split over all replicas.

Measured (2-core AMD EPYC VM, no GPU; TF 2.21, Keras 3.15.1,
2026-11-23) with `python benchmarks/parity.py` (width 16, 2 epochs of 40
steps at batch 128, 10,000 synthetic images): test accuracy 0.9175 with
float32, mixed_float16 and mixed_bfloat16 alike, the ceiling that the
synthetic twin's 10% redrawn labels leave. On a CPU mixed precision is
slower (BENCHMARKS.md); speed claims belong to GPUs: on one H100
(2026-11-25) `kmp bench` trained this ResNet-9 at 90.5k images/s in
mixed_float16, 1.81x float32, and a whole run's figures are under
"Results" below. Multi-worker step times: BENCHMARKS.md.
"""

import os

if __name__ == "__main__":
    # Before TensorFlow loads: its C++ logs (on a CPU machine among them
    # "failed call to cuInit", which is not a failure) would bury the
    # run's own lines. Errors still reach Python as exceptions; a value you
    # set yourself (TF_CPP_MIN_LOG_LEVEL=0 shows everything) stands.
    # `kmp train` also filters the lines TensorFlow prints while loading.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import numpy as np

import kmp
from kmp import backend
from kmp.app import data as kmp_data
from kmp.app import device_data
from kmp.app.feeding import Feeding
from kmp.app.run import Run
from kmp_config import configs

MEAN = np.array([0.4914, 0.4822, 0.4465], "float32") * 255
STD = np.array([0.2470, 0.2435, 0.2616], "float32") * 255


# ## Configuration
#
# `Config` holds a run's settings, and each field is a flag
# (`--help` lists them): those every example takes (policy, epochs,
# batch_size, steps, data, seed, strategy, output_dir, restart, ...) and
# this model's `width`. Defaults are GPU sizes (batch 512, width 64); where
# no GPU is found, the sizes not given are batch 128, width 16, and the run
# says so. The class is in kmp_config/configs.py, which imports no Keras, so
# that `kmp train` refuses a bad flag before TensorFlow loads; it also holds
# what `kmp bench` times (`BENCH_SIZES`) and the kernels
# `--distribution=model` splits (`LAYOUT`).

Config = configs.Cifar10Config


# ## Data
#
# TFDS's cifar10 when it is on disk or downloadable; otherwise (with
# `--data=auto`) a synthetic twin of the same shapes, labelled as such.
# Training images are padded by 4, randomly cropped back to 32x32 and
# flipped; all are normalized with CIFAR-10's channel statistics.


def load_data(config):
    def synthetic():
        return kmp_data.synthetic_images(
            train_size=config.synthetic_size,
            test_size=max(config.synthetic_size // 5, 1),
            seed=config.seed,
        )

    return kmp_data.load(
        "cifar10", config.data, synthetic, config.data_dir or None
    )


def normalize(images):
    """float32 images with CIFAR-10's channel means and deviations."""
    return (images.astype("float32") - MEAN) / STD


def make_datasets(splits, config):
    """Full batches for `fit`: training drops its last partial batch and
    validation pads its own with zero-weight rows (`Feeding`), so each
    step compiles once.

    On JAX the uint8 images go to the device once and every batch is
    gathered, normalized and augmented there; on TensorFlow a `tf.data`
    pipeline prepares batches on the host while the step runs; with
    neither (PyTorch without TensorFlow), NumPy arrays without
    augmentation."""
    feeding = Feeding(config, splits)
    if feeding.kind == "device":
        crop_and_flip = device_data.crop_and_flip(padding=4)
        train = feeding.on_device(
            splits.train,
            training=True,
            transform=lambda images, key: crop_and_flip(normalize(images), key),
        )
        test = feeding.on_device(
            splits.test, transform=lambda images, key: normalize(images)
        )
        return train, test
    if feeding.kind == "arrays":
        x, y = feeding.full_batches(splits.train)
        x_test, y_test, weights = feeding.padded(splits.test)
        return (normalize(x), y), (normalize(x_test), y_test, weights)
    import tensorflow as tf

    def normalize_example(image, label):  # tf.data maps one (image, label)
        return (tf.cast(image, tf.float32) - MEAN) / STD, label

    def augment(image, label, seed):  # stateless: a rerun draws the same
        image, label = normalize_example(image, label)
        image = tf.pad(image, [[4, 4], [4, 4], [0, 0]], mode="REFLECT")
        crop, flip = tf.unstack(tf.random.split(seed))
        image = tf.image.stateless_random_crop(image, [32, 32, 3], seed=crop)
        image = tf.image.stateless_random_flip_left_right(image, seed=flip)
        return image, label

    def as_dataset(split):
        if isinstance(split, tf.data.Dataset):
            # Decoded uint8 images, kept after the first read: 4x smaller
            # than cached float32 ones.
            return split.cache()
        return tf.data.Dataset.from_tensor_slices(split)  # in memory

    # Epoch k's order and draws depend on (seed, k) alone (`Feeding`).
    train = feeding.batches(as_dataset(splits.train), augment, shuffle=10_000)
    test = feeding.padded(
        as_dataset(splits.test).map(
            normalize_example, num_parallel_calls=tf.data.AUTOTUNE
        )
    )
    return train, test.prefetch(tf.data.AUTOTUNE)


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


def compile_model(config, steps):
    """The ResNet-9 with its float32 islands, compiled with SGD under
    `kmp.wrap` (dynamic loss scale) and a warm-up + cosine schedule over
    `config.epochs * steps` steps, in the current dtype policy."""
    # On JAX every weight's first value comes from one compiled program,
    # not one per shape: a cold start compiles less (kmp.backend).
    with backend.initialized_together():
        model = build_model(config.width)
    model = kmp.pin_float32(model)
    if config.remat:
        # Each ReLU and pooling recomputed from its input in the backward
        # pass. Not BatchNormalization: recomputed on TensorFlow and torch,
        # it would update its moving statistics twice a step.
        kmp.rematerialize(model, (keras.layers.ReLU, keras.layers.MaxPooling2D))
    peak = config.learning_rate * config.batch_size / 512
    schedule = keras.optimizers.schedules.CosineDecay(
        peak / 10,
        decay_steps=max(config.epochs * steps, 1),
        warmup_target=peak,
        warmup_steps=max(config.epochs * steps // 5, 1),
    )
    # --optimizer_states / --master_weights: the memory modes (under
    # bfloat16 masters, wrap rounds each update stochastically, --seed's).
    optimizer = kmp.wrap(
        keras.optimizers.SGD(
            schedule, momentum=0.9, nesterov=True, weight_decay=5e-4
        ),
        state_dtype=config.optimizer_states,
        seed=config.seed,
    )
    model.compile(
        optimizer=optimizer,
        loss="sparse_categorical_crossentropy",
        # Weighted: validation pads its last batch with rows of weight 0.
        # An instance, not "accuracy": its variables exist now (Keras on
        # TensorFlow resolves a name inside the first trace of the train
        # step, and a trace that creates variables is traced again).
        weighted_metrics=[
            keras.metrics.SparseCategoricalAccuracy(name="accuracy")
        ],
    )
    # Built now, not in the first trace of the train step (Keras on
    # TensorFlow builds it there, and a first trace that creates variables
    # is traced again): the step is traced once; on JAX the slots' first
    # values come from one compiled program.
    with backend.initialized_together():
        model.optimizer.build(model.trainable_variables)
    return model


# ## Train
#
# `kmp.enable` sets Keras's dtype policy before the model is built: float16
# (or bfloat16) compute, float32 variables. A `Run` (kmp/app/run.py) does
# what every run does around the data, the model and `fit`: start-up and
# seed, the backup a rerun resumes from, the results; on leaving it, the
# policy is the caller's again. It also places the replicas: on TensorFlow
# the model is built and compiled in the strategy's scope and
# `kmp.distribute` makes `fit` work under it (Keras alone cannot run
# MultiWorkerMirroredStrategy); on JAX, `--distribution` sets
# keras.distribution instead (DataParallel, or ModelParallel splitting the
# config's `LAYOUT`).


def train(config: Config) -> dict:
    """Trains and evaluates; returns the results (also written as JSON)."""
    with Run(config) as run:
        kmp.enable(config.policy, master_weights=config.master_weights)
        splits = load_data(config)
        train_data, test_data = make_datasets(splits, config)
        steps = run.start(splits)  # a rerun resumes from the backup
        with run.scope():
            model = compile_model(config, steps)
        model = run.distribute(model)  # kmp.distribute under a strategy
        history = model.fit(
            **run.data(train_data, test_data),  # and validation steps
            epochs=config.epochs,
            steps_per_epoch=steps,  # the data is one stream (Feeding)
            callbacks=run.callbacks,  # kmp's LossScaleMonitor, the backup
            verbose=config.verbose,
        )
        # The History of every epoch (those before an interruption too);
        # the test figures are the last epoch's validation.
        return run.finish(model, history, "resnet9")


# ## Results
#
# Run as a script (below, flags parsed by absl like every Keras example)
# or as `kmp train cifar10`, a run prints a table and a one-line summary
# and says where it wrote them: --output_dir gets results.json (with the
# History), results.png (loss and loss scale over steps) and the trained
# model.
#
# What it measured on one H100 (Keras 3.15.1 on JAX, 2026-11-25;
# BENCHMARKS.md, "On an H100"): `kmp train cifar10 --data=synthetic
# --policy=mixed_float16 --epochs=6` ran in 32.9 s with a cold compile
# cache and 14.1 s with a warm one, at 75-77k images/s in `fit`, and
# reached the synthetic twin's ceiling (test accuracy 0.9106) with the
# loss scale at 32768 and no step skipped.


# ## For `kmp bench` and `kmp doctor`
#
# What the commands read besides `train` and `compile_model`
# (kmp.app.protocol): the inputs `kmp bench` feeds (its sizes and
# optimizer are the config's).


def bench_inputs(config, count):
    """For `kmp bench`: the ResNet-9 at `--width`, pinned, and `count`
    synthetic images, normalized as `make_datasets` does."""
    (x, y), _ = kmp_data.synthetic_images(count, 1)
    model = kmp.pin_float32(build_model(config.width))
    return model, normalize(x), y


if __name__ == "__main__":
    import sys

    from kmp.app.run import main

    main(sys.modules[__name__])  # the flags, train, the table, the files
