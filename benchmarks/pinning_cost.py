"""Step-time cost of `kmp.pin_float32` on a small transformer classifier.

    python benchmarks/pinning_cost.py                  # TensorFlow
    KERAS_BACKEND=jax python benchmarks/pinning_cost.py

Two copies of the same model (token + position embedding, two
Transformer encoder blocks, a softmax head) are trained under
mixed_float16 with kmp's scaler: one as built, one after
`kmp.pin_float32`. Their epochs are interleaved after a warm-up and the
median of per-round time ratios pinned/unpinned is reported. With
attention dropout > 0 (the default here) Keras runs its unfused attention,
whose softmax pinning moves to float32; with `--dropout 0` only the
output head changes. GPU target (not measurable on a CPU): <= 1.03.
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import common  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402

import kmp  # noqa: E402
from kmp import backend  # noqa: E402

TARGET = 1.03


def build(args):
    keras.utils.set_random_seed(0)
    tokens = keras.Input((args.seq_len,), dtype="int32")
    h = keras.layers.Embedding(args.vocab, args.d_model)(tokens)
    positions = keras.layers.Embedding(args.seq_len, args.d_model)(
        keras.ops.arange(args.seq_len)
    )
    h = h + positions
    for _ in range(args.blocks):
        attention = keras.layers.MultiHeadAttention(
            args.heads, args.d_model // args.heads, dropout=args.dropout
        )(h, h)
        h = keras.layers.LayerNormalization()(h + attention)
        ffn = keras.layers.Dense(4 * args.d_model, activation="relu")(h)
        h = keras.layers.LayerNormalization()(
            h + keras.layers.Dense(args.d_model)(ffn)
        )
    h = keras.layers.GlobalAveragePooling1D()(h)
    outputs = keras.layers.Dense(2, activation="softmax")(h)
    return keras.Model(tokens, outputs)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=20, help="per epoch")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--seq_len", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=2000)
    parser.add_argument("--d_model", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--blocks", type=int, default=2)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--out", default=None, help="JSON path")
    args = parser.parse_args()

    kmp.enable("mixed_float16")
    rng = np.random.default_rng(0)
    n = args.steps * args.batch_size
    x = rng.integers(0, args.vocab, size=(n, args.seq_len)).astype("int32")
    y = rng.integers(0, 2, size=n).astype("int32")

    runs = {}
    for variant in ("unpinned", "pinned"):
        model = build(args)
        if variant == "pinned":
            kmp.pin_float32(model)
        model.compile(
            optimizer=kmp.wrap("adam"),
            loss="sparse_categorical_crossentropy",
            jit_compile=True,
        )
        runs[variant] = lambda m=model: m.fit(
            x, y, batch_size=args.batch_size, verbose=0, shuffle=False
        )
        runs[variant]()  # warm-up: compile
    seconds = common.time_interleaved(runs, args.rounds)
    stats = {
        "pinned/unpinned": common.ratio_stats(seconds, "pinned", "unpinned")
    }
    print()
    print(common.ratio_table(stats))
    common.write_result(
        {
            "benchmark": "pinning_cost",
            "policy": "mixed_float16",
            "model": (
                f"transformer classifier: {args.blocks} blocks, d_model "
                f"{args.d_model}, {args.heads} heads, seq {args.seq_len}, "
                f"vocab {args.vocab}, attention dropout {args.dropout}"
            ),
            "batch_size": args.batch_size,
            "steps_per_epoch": args.steps,
            "rounds": args.rounds,
            "epoch_seconds": seconds,
            "ratios": stats,
            "gpu_target": TARGET,
        },
        f"pinning_cost_{backend.name()}.json",
        args.out,
    )


if __name__ == "__main__":
    main()
