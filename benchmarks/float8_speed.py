"""Float8 training speed: kmp.float8 vs bfloat16 vs Keras's float8.

    KERAS_BACKEND=jax python benchmarks/float8_speed.py            # GPU sizes
    KERAS_BACKEND=jax python benchmarks/float8_speed.py --size small

Two models, each trained by `model.fit` on distinct batches in every
variant, epochs interleaved after a warm-up:

- `stack`: 4 Dense layers of width x width (8192 on a GPU) on `rows`
  rows, linear, MSE against a fixed linear map (issue 15's target:
  kmp.float8 >= 1.5x bfloat16 on an H100);
- `transformer`: the IMDB example's encoder (`examples/imdb.py`) at
  d_model 2048 (target >= 1.3x bfloat16).

A step time is an epoch's steady one (`kmp.app.bench.time_fit_rounds`),
the `fit` call's start and end left out; `call_step_time_s` keeps the
whole call's.

Variants (`--variants`, all by default): `bf16` (mixed_bfloat16),
`bf16+kmp.float8` (Keras's float8 layers, kmp's choice of them),
`bf16+kmp.float8(matmul=kmp)` (kmp's own float8 matmul, JAX only),
`bf16+keras.float8` (`model.quantize("float8")`), and the two kmp ones
under mixed_float16 with kmp's loss scale, whose final losses show
whether a run depends on its loss scale. TFLOP/s count each model's
matmuls (`kmp.app.flops`, training = 3x forward). Writes a JSON file
with the hardware and versions.

On a CPU float8 is emulated and slower than bfloat16: `--size small`
checks that the benchmark runs, not float8's speed.
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
from kmp.app import data as kmp_data  # noqa: E402
from kmp.app import flops  # noqa: E402
from kmp.app import report  # noqa: E402
from kmp.examples import imdb  # noqa: E402

VARIANTS = {
    "bf16": ("mixed_bfloat16", None),
    "bf16+kmp.float8": ("mixed_bfloat16", "kmp"),
    "bf16+kmp.float8(matmul=kmp)": ("mixed_bfloat16", "kmp matmul"),
    "bf16+keras.float8": ("mixed_bfloat16", "keras"),
    "fp16+kmp.float8": ("mixed_float16", "kmp"),
    "fp16+kmp.float8(matmul=kmp)": ("mixed_float16", "kmp matmul"),
}
SIZES = {
    "gpu": {
        "stack": {"width": 8192, "rows": 8192, "layers": 4},
        "transformer": {"d_model": 2048, "batch": 16, "sequence": 512},
    },
    "small": {
        "stack": {"width": 256, "rows": 256, "layers": 4},
        "transformer": {"d_model": 128, "batch": 8, "sequence": 64},
    },
}


def stack(size, batches):
    width, rows = size["width"], size["rows"]
    inputs = keras.Input((width,))
    x = inputs
    for _ in range(size["layers"]):
        x = keras.layers.Dense(width, use_bias=False)(x)
    # A float32 head keeps the loss in float32; kmp.float8 leaves it.
    outputs = keras.layers.Dense(16, dtype="float32")(x)
    rng = np.random.default_rng(0)
    data = rng.standard_normal((rows * batches, width), dtype="float32")
    target = data[:, :16] - data[:, 16:32]
    return keras.Model(inputs, outputs), data, target, rows, "mse"


def transformer(size, batches):
    config = imdb.Config(
        d_model=size["d_model"],
        heads=size["d_model"] // 128,
        layers=2,
        sequence_length=size["sequence"],
    )
    model = kmp.pin_float32(imdb.build_model(config))
    count = size["batch"] * batches
    (x, y), _ = kmp_data.synthetic_text(count, 1, size["sequence"])
    return model, x, y, size["batch"], "sparse_categorical_crossentropy"


def variant(name, kind, size, batches):
    policy, float8 = VARIANTS[kind]
    with kmp.policy_scope(policy):
        keras.utils.set_random_seed(0)
        model, x, y, batch, loss = {"stack": stack, "transformer": transformer}[
            name
        ](size, batches)
        # Every eligible layer (min_size=0), as measured since 2026-11-25;
        # kmp.float8's own default reads the device since 2026-11-28.
        if float8 == "kmp":
            kmp.float8(model, matmul="keras", min_size=0)
        elif float8 == "kmp matmul":
            kmp.float8(model, matmul="kmp", min_size=0)
        elif float8 == "keras":
            model.quantize("float8")
        model.compile(
            optimizer=kmp.wrap(keras.optimizers.Adam(1e-4)),
            loss=loss,
            jit_compile=True,
        )

    step_log = report.StepLog()

    def run():
        return model.fit(
            x,
            y,
            batch_size=batch,
            epochs=1,
            verbose=0,
            shuffle=False,
            callbacks=[step_log],
        )

    return model, run, batch, step_log


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", choices=tuple(SIZES), default="gpu")
    parser.add_argument("--models", nargs="+", default=["stack", "transformer"])
    parser.add_argument("--steps", type=int, default=10, help="per epoch")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--variants", default=",".join(VARIANTS), help="comma-separated"
    )
    parser.add_argument("--out", default=None, help="JSON path")
    args = parser.parse_args()
    rows, records = [], []
    kinds = args.variants.split(",")
    unknown = sorted(set(kinds) - set(VARIANTS))
    if unknown or "bf16" not in kinds:
        parser.error(
            f"--variants: {unknown} unknown or bf16 missing; "
            f"choose among {list(VARIANTS)}, bf16 included"
        )
    for name in args.models:
        size = SIZES[args.size][name]
        runs, before, models, step_logs = {}, {}, {}, {}
        for kind in kinds:
            models[kind], runs[kind], batch, step_logs[kind] = variant(
                name, kind, size, args.steps
            )
            before[kind] = runs[kind]().history["loss"][-1]  # compiles
        per_example = flops.training_flops(models["bf16"])
        seconds, steady = common.time_fit_rounds(
            runs, step_logs, args.rounds, args.steps
        )
        after = {kind: runs[kind]().history["loss"][-1] for kind in runs}
        for kind in kinds:
            ratios = [b / v for b, v in zip(steady["bf16"], steady[kind])]
            step = statistics.median(steady[kind])
            tflops = per_example * batch / step / 1e12
            record = {
                "model": name,
                "variant": kind,
                "sizes": size,
                "step_time_s": step,
                "speed_vs_bf16": statistics.median(ratios),
                "tflops": tflops,
                "loss_before": before[kind],
                "loss_after": after[kind],
                "epoch_seconds": seconds[kind],
                "steady_step_seconds": steady[kind],
                "call_step_time_s": statistics.median(seconds[kind])
                / args.steps,
            }
            records.append(record)
            rows.append(
                f"| {name} | {kind} | {1000 * step:.1f} | "
                f"{record['speed_vs_bf16']:.2f}x | {tflops:.3g} | "
                f"{before[kind]:.4f} | {after[kind]:.4f} |"
            )
    print(
        "| model | variant | step (ms) | speed vs bf16 | TFLOP/s | "
        "loss before | loss after |\n|---|---|---|---|---|---|---|\n"
        + "\n".join(rows)
    )
    common.write_result(
        {"benchmark": "float8_speed", "size": args.size, "runs": records},
        f"float8_speed_{args.size}_{backend.name()}.json",
        args.out,
    )


if __name__ == "__main__":
    main()
