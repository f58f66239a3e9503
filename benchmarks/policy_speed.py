"""Training throughput of one convnet under each dtype policy.

    python benchmarks/policy_speed.py                  # TensorFlow
    KERAS_BACKEND=jax python benchmarks/policy_speed.py

This is the measurement behind `kmp.recommend_policy()`'s CPU rule: a CPU
has no float16 or bfloat16 matmul units, so mixed precision is not faster
there. A 4-conv net on 32x32x3 images is trained under float32,
mixed_bfloat16 and mixed_float16 (with kmp's scaler), epochs interleaved
after a warm-up, and the median images/s and the median per-round speed
ratio to float32 are reported. `--jit_compile false` measures without
XLA. Writes a JSON file with the hardware and versions.
"""

import argparse
import os
import statistics

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import common  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402

import kmp  # noqa: E402
from kmp import backend  # noqa: E402

POLICIES = ("float32", "mixed_bfloat16", "mixed_float16")


def build(policy, jit_compile):
    with kmp.policy_scope(policy):
        keras.utils.set_random_seed(0)
        model = keras.Sequential(
            [
                keras.Input((32, 32, 3)),
                keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
                keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
                keras.layers.MaxPooling2D(),
                keras.layers.Conv2D(64, 3, padding="same", activation="relu"),
                keras.layers.Conv2D(64, 3, padding="same", activation="relu"),
                keras.layers.GlobalAveragePooling2D(),
                keras.layers.Dense(10),
                keras.layers.Activation("softmax", dtype="float32"),
            ]
        )
        model.compile(
            optimizer=kmp.wrap("adam"),
            loss="sparse_categorical_crossentropy",
            jit_compile=jit_compile,
        )
    return model


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=8, help="per epoch")
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument(
        "--jit_compile", choices=("true", "false"), default="true"
    )
    parser.add_argument("--out", default=None, help="JSON path")
    args = parser.parse_args()
    jit = args.jit_compile == "true"

    rng = np.random.default_rng(0)
    n = args.steps * args.batch_size
    x = rng.uniform(size=(n, 32, 32, 3)).astype("float32")
    y = rng.integers(0, 10, size=n).astype("int32")

    runs = {}
    for policy in POLICIES:
        model = build(policy, jit)
        runs[policy] = lambda m=model: m.fit(
            x, y, batch_size=args.batch_size, verbose=0, shuffle=False
        )
        runs[policy]()  # warm-up: compile
    seconds = common.time_interleaved(runs, args.rounds, unit=(n, "img/s"))

    images_per_second = {
        p: n / statistics.median(s) for p, s in seconds.items()
    }
    # Speed vs float32 = float32's time / the policy's time, per round.
    speed = {
        p: 1 / common.ratio_stats(seconds, p, "float32")["median"]
        for p in POLICIES
    }
    print()
    print("| policy | images/s | speed vs float32 |")
    print("|---|---|---|")
    for p in POLICIES:
        print(f"| {p} | {images_per_second[p]:.0f} | {speed[p]:.2f}x |")
    recommendation = kmp.recommend_policy()
    print(f"\nkmp.recommend_policy() here: {recommendation.policy}")
    common.write_result(
        {
            "benchmark": "policy_speed",
            "model": "4-conv net, 32x32x3 input, 10 classes",
            "batch_size": args.batch_size,
            "jit_compile": jit,
            "epoch_seconds": seconds,
            "images_per_second": images_per_second,
            "speed_vs_float32": speed,
            "recommended_policy": recommendation.policy,
        },
        f"policy_speed_{backend.name()}_jit_{args.jit_compile}.json",
        args.out,
    )


if __name__ == "__main__":
    main()
