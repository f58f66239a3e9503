"""Step-time cost of kmp's loss scaler vs Keras's own, and vs no scaling.

    python benchmarks/loss_scale_overhead.py                  # TensorFlow
    KERAS_BACKEND=jax python benchmarks/loss_scale_overhead.py
    KERAS_BACKEND=torch python benchmarks/loss_scale_overhead.py

In one process, the same model is trained under mixed_float16 with four
optimizers, interleaved epoch by epoch after a warm-up so that machine
noise hits them alike (compiled with XLA on TensorFlow and JAX; eager on
torch, Keras's default there; `--jit_compile` overrides):

    none     Adam, no loss scaling (float16 gradients may underflow)
    stock    keras.optimizers.LossScaleOptimizer(Adam)
    kmp      kmp.LossScaleOptimizer(Adam)
    kmp+mon  kmp.LossScaleOptimizer(Adam) with kmp.callbacks.LossScaleMonitor

Each round times one epoch of each; the ratio of two variants is taken
within a round, and the median over rounds is reported. Target:
kmp/stock <= 1.03. Writes a JSON file with the hardware and versions.
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import common  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402

import kmp  # noqa: E402
from kmp import backend  # noqa: E402

VARIANTS = ("none", "stock", "kmp", "kmp+mon")
TARGET = 1.03


def build(variant, features, units, jit_compile):
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((features,)),
            keras.layers.Dense(units, activation="relu"),
            keras.layers.Dense(units, activation="relu"),
            keras.layers.Dense(units, activation="relu"),
            keras.layers.Dense(10),
            keras.layers.Activation("softmax", dtype="float32"),
        ]
    )
    adam = keras.optimizers.Adam(1e-3)
    optimizer = {
        "none": adam,
        "stock": keras.optimizers.LossScaleOptimizer(adam),
        "kmp": kmp.LossScaleOptimizer(adam),
        "kmp+mon": kmp.LossScaleOptimizer(adam),
    }[variant]
    # auto_scale_loss=False keeps "none" unscaled; the others are already
    # loss-scaling optimizers, which compile keeps as given.
    model.compile(
        optimizer=optimizer,
        loss="sparse_categorical_crossentropy",
        jit_compile=jit_compile,
        auto_scale_loss=False,
    )
    monitor = variant == "kmp+mon"
    return model, [kmp.callbacks.LossScaleMonitor()] if monitor else []


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=25)
    parser.add_argument("--steps", type=int, default=60, help="per epoch")
    parser.add_argument("--batch_size", type=int, default=256)
    parser.add_argument("--features", type=int, default=512)
    parser.add_argument("--units", type=int, default=512)
    parser.add_argument("--out", default=None, help="JSON path")
    common.jit_compile_flag(parser)
    args = parser.parse_args()

    kmp.enable("mixed_float16")
    rng = np.random.default_rng(0)
    n = args.steps * args.batch_size
    x = rng.normal(size=(n, args.features)).astype("float32")
    y = rng.integers(0, 10, size=n).astype("int32")

    def epoch(model, callbacks):
        return lambda: model.fit(
            x,
            y,
            batch_size=args.batch_size,
            verbose=0,
            callbacks=callbacks,
            shuffle=False,
        )

    runs = {}
    for variant in VARIANTS:
        model, callbacks = build(
            variant, args.features, args.units, common.jit_compile(args)
        )
        runs[variant] = epoch(model, callbacks)
        runs[variant]()  # warm-up: compile
    seconds = common.time_interleaved(runs, args.rounds)

    stats = {
        "kmp/stock": common.ratio_stats(seconds, "kmp", "stock"),
        "stock/none": common.ratio_stats(seconds, "stock", "none"),
        "kmp/none": common.ratio_stats(seconds, "kmp", "none"),
        "kmp+mon/kmp": common.ratio_stats(seconds, "kmp+mon", "kmp"),
    }
    met = stats["kmp/stock"]["median"] <= TARGET
    print()
    print(common.ratio_table(stats))
    print(f"\nkmp/stock target <= {TARGET}: {'met' if met else 'MISSED'}")
    common.write_result(
        {
            "benchmark": "loss_scale_overhead",
            "policy": "mixed_float16",
            "model": f"MLP {args.features}-{args.units}x3-10",
            "batch_size": args.batch_size,
            "steps_per_epoch": args.steps,
            "rounds": args.rounds,
            "jit_compile": common.jit_compile(args),
            "epoch_seconds": seconds,
            "ratios": stats,
            "target_kmp_over_stock": TARGET,
            "target_met": met,
        },
        f"loss_scale_overhead_{backend.name()}.json",
        args.out,
    )


if __name__ == "__main__":
    main()
