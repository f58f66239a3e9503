"""Cost of kmp's replica agreement vs Keras's scaler under MirroredStrategy.

    python benchmarks/mirrored_agreement.py

kmp's scaler all-reduces the finiteness flag over replicas (so that one
replica's inf makes every replica skip) and sums gradients before inner
clipping; Keras's looks at replica 0's local gradients only. This times
the same model under mixed_float16 and
tf.distribute.MirroredStrategy on 2 logical CPU devices, in one process,
epochs interleaved after a warm-up:

    stock    keras.optimizers.LossScaleOptimizer(Adam)
    kmp      kmp.LossScaleOptimizer(Adam)

TensorFlow backend only. Writes a JSON file with hardware and versions.
"""

import argparse
import os

os.environ["KERAS_BACKEND"] = "tensorflow"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

CPU = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(
    CPU, [tf.config.LogicalDeviceConfiguration()] * 2
)

import common  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402

import kmp  # noqa: E402

VARIANTS = ("stock", "kmp")


def build(variant, strategy, features, units):
    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = keras.Sequential(
            [
                keras.Input((features,)),
                keras.layers.Dense(units, activation="relu"),
                keras.layers.Dense(units, activation="relu"),
                keras.layers.Dense(10),
                keras.layers.Activation("softmax", dtype="float32"),
            ]
        )
        adam = keras.optimizers.Adam(1e-3)
        optimizer = {
            "stock": keras.optimizers.LossScaleOptimizer(adam),
            "kmp": kmp.LossScaleOptimizer(adam),
        }[variant]
        model.compile(
            optimizer=optimizer,
            loss="sparse_categorical_crossentropy",
        )
    return model


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=40, help="per epoch")
    parser.add_argument("--batch_size", type=int, default=256)
    parser.add_argument("--features", type=int, default=256)
    parser.add_argument("--units", type=int, default=256)
    parser.add_argument("--out", default=None, help="JSON path")
    args = parser.parse_args()

    kmp.enable("mixed_float16")
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    rng = np.random.default_rng(0)
    n = args.steps * args.batch_size
    x = rng.normal(size=(n, args.features)).astype("float32")
    y = rng.integers(0, 10, size=n).astype("int32")
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(args.batch_size)
    data = data.cache()

    runs = {}
    for variant in VARIANTS:
        model = build(variant, strategy, args.features, args.units)
        runs[variant] = lambda model=model: model.fit(data, verbose=0)
        runs[variant]()  # warm-up: compile
    seconds = common.time_interleaved(runs, args.rounds)
    stats = {"kmp/stock": common.ratio_stats(seconds, "kmp", "stock")}
    print()
    print(common.ratio_table(stats))
    common.write_result(
        {
            "benchmark": "mirrored_agreement",
            "policy": "mixed_float16",
            "strategy": "MirroredStrategy, 2 logical CPU devices",
            "model": f"MLP {args.features}-{args.units}x2-10",
            "batch_size": args.batch_size,
            "steps_per_epoch": args.steps,
            "rounds": args.rounds,
            "epoch_seconds": seconds,
            "ratios": stats,
        },
        "mirrored_agreement_tensorflow.json",
        args.out,
    )


if __name__ == "__main__":
    main()
