"""`kmp bench`: float32 vs mixed precision on the example models, in one
process, interleaved.

For the CIFAR-10 ResNet-9 and the IMDB Transformer encoder, four variants
are built from the same seed and trained on the same synthetic batches:

    float32        no scaling
    fp16+kmp       mixed_float16, kmp.LossScaleOptimizer
    fp16+stock     mixed_float16, keras.optimizers.LossScaleOptimizer
    bf16           mixed_bfloat16, no scaling

After a warm-up (compilation), each round trains every variant for
`steps` steps, in an order that rotates every round, so a shared
machine's noise falls on all alike. Reported per variant: median step
time, examples/s, speed vs float32 (the median of per-round ratios),
peak memory, and the training loss after the last round.
"""

import statistics
import time

import keras
import numpy as np

import kmp
from kmp import backend
from kmp.app import data as kmp_data
from kmp.app import report

VARIANTS = {
    "float32": ("float32", None),
    "fp16+kmp": ("mixed_float16", "kmp"),
    "fp16+stock": ("mixed_float16", "stock"),
    "bf16": ("mixed_bfloat16", None),
}
# Sizes: "small" for a CPU, "full" for a GPU (the targets: batch
# >= 256 for the CIFAR net, d_model >= 512 for the IMDB transformer).
SIZES = {
    "small": {
        "cifar10": {"width": 16, "batch_size": 64},
        "imdb": {"d_model": 64, "batch_size": 32, "sequence_length": 128},
    },
    "full": {
        "cifar10": {"width": 64, "batch_size": 512},
        "imdb": {"d_model": 512, "batch_size": 64, "sequence_length": 256},
    },
}
COLUMNS = (
    ("variant", "variant", "{}"),
    ("step_time_s", "step time (ms)", "{:.1f}", 1000.0),
    ("examples_per_s", "examples/s", "{:.0f}"),
    ("speed_vs_float32", "speed vs float32", "{:.2f}x"),
    ("peak_memory_mib", "peak memory (MiB)", "{:.0f}"),
    ("loss", "loss after", "{:.4f}"),
)


def time_interleaved(runs, rounds, log=print, unit=None):
    """Times `runs[name]()` for each name, `rounds` times, interleaved.

    Args:
        runs: Dict of name -> zero-argument callable (one epoch, say).
        rounds: Number of rounds.
        log: Called with a progress line per round (`None`: silent).
        unit: Optional `(count, label)`; progress lines then show
            `count / seconds` in `label` instead of seconds.

    Returns:
        Dict of name -> list of seconds, one per round.
    """
    names = list(runs)
    seconds = {name: [] for name in names}
    for r in range(rounds):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            start = time.perf_counter()
            runs[name]()
            seconds[name].append(time.perf_counter() - start)
        if log is None:
            continue
        if unit is None:
            shown = (f"{n} {seconds[n][-1]:.3f}s" for n in names)
        else:
            count, label = unit
            shown = (f"{n} {count / seconds[n][-1]:.0f} {label}" for n in names)
        log(f"round {r + 1}/{rounds}: " + ", ".join(shown))
    return seconds


def _optimizer(kind):
    inner = keras.optimizers.SGD(0.01, momentum=0.9)
    if kind == "kmp":
        return kmp.LossScaleOptimizer(inner)
    if kind == "stock":
        return keras.optimizers.LossScaleOptimizer(inner)
    return inner


def _model(name, sizes):
    """The example's model, pinned, and a synthetic batch for it."""
    size = sizes[name]
    if name == "cifar10":
        from kmp.examples import cifar10

        model = cifar10.build_model(size["width"])
        (x, y), _ = kmp_data.synthetic_images(size["batch_size"], 1)
        x = (x.astype("float32") - cifar10.MEAN) / cifar10.STD
    else:
        from kmp.examples import imdb

        config = imdb.Config(
            d_model=size["d_model"],
            heads=max(size["d_model"] // 64, 1),
            sequence_length=size["sequence_length"],
        )
        model = imdb.build_model(config)
        (x, y), _ = kmp_data.synthetic_text(
            size["batch_size"], 1, size["sequence_length"]
        )
    return kmp.pin_float32(model), x, y


def bench_model(name, sizes, steps, rounds, log=print) -> list[dict]:
    """Benchmarks the four variants on one example model."""
    batch = sizes[name]["batch_size"]
    runs, models = {}, {}
    for variant, (policy, scaler) in VARIANTS.items():
        with kmp.policy_scope(policy):
            keras.utils.set_random_seed(0)
            model, x, y = _model(name, sizes)
            model.compile(
                optimizer=_optimizer(scaler),
                loss="sparse_categorical_crossentropy",
                jit_compile="auto",
                auto_scale_loss=False,  # bf16/float32: no scaler at all
            )
        xs = np.concatenate([x] * steps)
        ys = np.concatenate([y] * steps)

        def run(model=model, xs=xs, ys=ys):
            return model.fit(
                xs, ys, batch_size=batch, epochs=1, verbose=0, shuffle=False
            )

        run()  # warm-up: compile
        runs[variant], models[variant] = run, model
    memory, what = report.peak_memory_mib()
    if log:
        log(
            f"{name}: {len(VARIANTS)} variants compiled; timing {rounds} "
            f"rounds of {steps} steps"
        )
    seconds = time_interleaved(runs, rounds, log)
    last = {variant: runs[variant]() for variant in runs}
    results = []
    for variant in VARIANTS:
        ratios = [f / v for f, v in zip(seconds["float32"], seconds[variant])]
        step_time = statistics.median(seconds[variant]) / steps
        results.append(
            {
                "model": name,
                "variant": variant,
                "policy": VARIANTS[variant][0],
                "batch_size": batch,
                "step_time_s": step_time,
                "examples_per_s": batch / step_time,
                "speed_vs_float32": statistics.median(ratios),
                "peak_memory_mib": memory,
                "peak_memory_note": what,
                "loss": float(last[variant].history["loss"][-1]),
                "epoch_seconds": seconds[variant],
                "sizes": sizes[name],
            }
        )
    return results


def run(
    models=("cifar10", "imdb"), size="auto", steps=10, rounds=5, log=print
) -> list[dict]:
    """Runs the benchmark; returns one result per model and variant."""
    if size == "auto":
        accelerated = backend.list_devices()[0].platform != "cpu"
        size = "full" if accelerated else "small"
    results = []
    for name in models:
        results += bench_model(name, SIZES[size], steps, rounds, log)
    for r in results:
        r["size"] = size
    return results


def markdown(results) -> str:
    """One Markdown table per model."""
    parts = []
    for name in dict.fromkeys(r["model"] for r in results):
        rows = [r for r in results if r["model"] == name]
        sizes = ", ".join(f"{k} {v}" for k, v in rows[0]["sizes"].items())
        parts.append(
            f"**{name}** ({sizes})\n\n" + report.markdown(rows, COLUMNS)
        )
    return "\n\n".join(parts)
