"""Training throughput of one convnet under each dtype policy.

    python benchmarks/policy_speed.py                  # TensorFlow
    KERAS_BACKEND=jax python benchmarks/policy_speed.py

This is the measurement behind `kmp.recommend_policy()`'s CPU rule: on a
CPU, float16 and bfloat16 compute is emulated and slower than float32. A
4-conv net on 32x32x3 images is trained under float32, mixed_bfloat16 and
mixed_float16 (with kmp's scaler), epochs interleaved after a warm-up, and
the median images/s and the median per-round ratio to float32 are
reported. `--jit_compile false` measures without XLA. Writes a JSON file
with the hardware and versions.
"""

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import kmp  # noqa: E402
from kmp import backend  # noqa: E402

POLICIES = ("float32", "mixed_bfloat16", "mixed_float16")


def build(policy, jit_compile):
    with kmp.policy_scope(policy):
        keras.utils.set_random_seed(0)
        layers = [
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
        model = keras.Sequential(layers)
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
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    jit = args.jit_compile == "true"

    rng = np.random.default_rng(0)
    n = args.steps * args.batch_size
    x = rng.uniform(size=(n, 32, 32, 3)).astype("float32")
    y = rng.integers(0, 10, size=n).astype("int32")

    models = {p: build(p, jit) for p in POLICIES}
    for model in models.values():  # warm-up: compile
        model.fit(x, y, batch_size=args.batch_size, verbose=0)

    seconds = {p: [] for p in POLICIES}
    for r in range(args.rounds):
        for policy in POLICIES[r % 3 :] + POLICIES[: r % 3]:
            start = time.perf_counter()
            models[policy].fit(
                x, y, batch_size=args.batch_size, verbose=0, shuffle=False
            )
            seconds[policy].append(time.perf_counter() - start)
        print(
            f"round {r + 1}/{args.rounds}: "
            + ", ".join(
                f"{p} {n / seconds[p][-1]:.0f} img/s" for p in POLICIES
            ),
            flush=True,
        )

    images_per_second = {
        p: n / statistics.median(s) for p, s in seconds.items()
    }
    ratio_to_float32 = {
        p: statistics.median(
            f / s for f, s in zip(seconds["float32"], seconds[p])
        )
        for p in POLICIES
    }
    recommendation = kmp.recommend_policy()
    result = {
        "benchmark": "policy_speed",
        "command": "python benchmarks/policy_speed.py "
        + " ".join(f"--{k} {v}" for k, v in vars(args).items() if k != "out"),
        **backend.environment(),
        "model": "4-conv net, 32x32x3 input, 10 classes",
        "batch_size": args.batch_size,
        "jit_compile": jit,
        "images_per_second": images_per_second,
        "speed_vs_float32": ratio_to_float32,
        "recommended_policy": recommendation.policy,
    }
    out = args.out or os.path.join(
        os.path.dirname(__file__),
        "results",
        f"policy_speed_{backend.name()}_jit_{args.jit_compile}.json",
    )
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(result, f, indent=2)
    print()
    print("| policy | images/s | speed vs float32 |")
    print("|---|---|---|")
    for p in POLICIES:
        print(
            f"| {p} | {images_per_second[p]:.0f} | {ratio_to_float32[p]:.2f}x |"
        )
    print(f"\nkmp.recommend_policy() here: {recommendation.policy}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
