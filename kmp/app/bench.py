"""`kmp bench`: float32 vs mixed precision on the example models, in one
process, interleaved.

For the CIFAR-10 ResNet-9 and the IMDB Transformer encoder, four variants
are built from the same seed and trained on the same synthetic batches:

    float32        no scaling
    fp16+kmp       mixed_float16, kmp.LossScaleOptimizer
    fp16+stock     mixed_float16, keras.optimizers.LossScaleOptimizer
    bf16           mixed_bfloat16, no scaling

After a warm-up (compilation), each round trains every variant for
`steps` steps on `steps` distinct batches (one `fit` call), in an order
that rotates every round, so a shared machine's noise falls on all alike.
A round's step time is its steady one (`report.StepLog.steady_step_time`:
from the first step's end to the last's), so a `fit` call's start and
end, which a long epoch spreads thin, do not dilute the ratios. (On an
H200 a 10-step round's whole call came to 5.26 ms a step, against the
4.45 ms the same step took in `kmp train`'s long `fit`:
`benchmarks/results/h200_2026-11-29b/fit/`.)

Reported per variant: median step time, examples/s, speed vs float32
(the median of per-round ratios), achieved TFLOP/s (`kmp.app.flops`) and
MFU, their share of the device's peak for the variant's policy ("-"
where kmp knows no peak: a CPU, an unlisted GPU), the loss before and
after the timed rounds, and peak memory measured for each variant alone,
in a process of its own (`python -m kmp.app.bench`): one process-wide peak
would show the largest variant's memory for all of them.

A `warning` column flags what makes a row unbelievable: a loss that rose
or is not finite (training diverged), or the same loss to the last digit
for every variant (the harness is not training what it times).
"""

import contextlib
import copy
import dataclasses
import json
import math
import os
import statistics
import subprocess
import sys
import time

import keras

import kmp
from kmp import backend
from kmp.app import flops
from kmp.app import protocol
from kmp.app import report
from kmp.app import startup
from kmp_config import configs

VARIANTS = {
    "float32": ("float32", None),
    "fp16+kmp": ("mixed_float16", "kmp"),
    "fp16+stock": ("mixed_float16", "stock"),
    "bf16": ("mixed_bfloat16", None),
}
# `--float8`: the same policies with `kmp.float8(model)` (the Transformer's
# attention projections and feed-forward matmuls; a convnet has none).
FLOAT8_VARIANTS = {
    "bf16+fp8": ("mixed_bfloat16", None),
    "fp16+kmp+fp8": ("mixed_float16", "kmp"),
}
# Sizes: "small" for a CPU, "full" for a GPU, each example's own
# (its config's `BENCH_SIZES`, in its config's fields).


def sizes(size, models) -> dict:
    """`{example: its config's BENCH_SIZES[size]}` for each of
    `models`."""
    return {name: configs.EXAMPLES[name].BENCH_SIZES[size] for name in models}


COLUMNS = (
    ("variant", "variant", "{}"),
    ("step_time_s", "step time (ms)", "{:.1f}", 1000.0),
    ("examples_per_s", "examples/s", "{:.0f}"),
    ("speed_vs_float32", "speed vs float32", "{:.2f}x"),
    ("tflops_achieved", "TFLOP/s", "{:.3g}"),
    ("mfu", "MFU", "{:.1f} %", 100.0),
    ("peak_memory_mib", "peak memory (MiB)", "{:.0f}"),
    ("loss_before", "loss before", "{:.4f}"),
    ("loss", "loss after", "{:.4f}"),
    ("warning", "warning", "{}"),
)


def time_interleaved(runs, rounds, log=print, unit=None, after=None):
    """Times `runs[name]()` for each name, `rounds` times, interleaved.

    Args:
        runs: Dict of name -> zero-argument callable (one epoch, say).
        rounds: Number of rounds.
        log: Called with a progress line per round (`None`: silent).
        unit: Optional `(count, label)`; progress lines then show
            `count / seconds` in `label` instead of seconds.
        after: Optional callable of a name, called after each of its
            calls, outside the call's time (to read what it recorded).

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
            if after is not None:
                after(name)
        if log is None:
            continue
        if unit is None:
            shown = (f"{n} {seconds[n][-1]:.3f}s" for n in names)
        else:
            count, label = unit
            shown = (f"{n} {count / seconds[n][-1]:.0f} {label}" for n in names)
        log(f"round {r + 1}/{rounds}: " + ", ".join(shown))
    return seconds


@contextlib.contextmanager
def prompt_batch_ends(interval=1e-4):
    """Within it, Python switches threads every `interval` seconds.

    Keras's threads report batch ends; each waits for the interpreter
    lock while `fit`'s loop runs Python, up to the switch interval (5 ms
    by default, a whole step on a GPU). A shorter one keeps the first
    step's arrival, one end of `StepLog.steady_step_time`'s span, on
    time.
    """
    default = sys.getswitchinterval()
    sys.setswitchinterval(interval)
    try:
        yield
    finally:
        sys.setswitchinterval(default)


def time_fit_rounds(runs, step_logs, rounds, steps, log=print):
    """Times `fit` calls interleaved (`time_interleaved`), each round's
    step steady.

    Args:
        runs: Dict of name -> zero-argument callable that calls `fit`
            for one epoch of `steps` steps with `step_logs[name]` among
            its callbacks. They run within `prompt_batch_ends()`.
        step_logs: Dict of name -> `report.StepLog`.
        rounds: Number of rounds.
        steps: Steps per call.
        log: As for `time_interleaved`.

    Returns:
        `(call_seconds, steady_step_seconds)`: dicts of name -> one
        figure per round, each call's whole time and its steady step
        (`StepLog.steady_step_time`; a call of one step has no steady
        part, so its step is its call's time).
    """
    steady = {name: [] for name in runs}

    def read(name):  # before the next call resets the log
        seen = len(step_logs[name].times)
        if seen != steps:
            raise RuntimeError(
                f"{name!r}: its StepLog saw {seen} steps of a call of "
                f"{steps}; pass that StepLog to the call's `fit`."
            )
        steady[name].append(step_logs[name].steady_step_time())

    with prompt_batch_ends():
        seconds = time_interleaved(runs, rounds, log, after=read)
    step_seconds = {
        name: [
            call / steps if math.isnan(step) else step
            for call, step in zip(seconds[name], steady[name])
        ]
        for name in runs
    }
    return seconds, step_seconds


def _optimizer(module, kind):
    """The example's bench optimizer (its config's `BENCH_OPTIMIZER`),
    under kmp's scaler, Keras's, or none."""
    inner = keras.optimizers.get(copy.deepcopy(module.Config.BENCH_OPTIMIZER))
    if kind == "kmp":
        return kmp.LossScaleOptimizer(inner)
    if kind == "stock":
        return keras.optimizers.LossScaleOptimizer(inner)
    return inner


def _model(module, size, batches):
    """The example's model, pinned, and `batches` distinct synthetic
    batches for it (as one array each for x and y): its `bench_inputs`
    at the sizes of `size` (its config's fields)."""
    fields = {f.name for f in dataclasses.fields(module.Config)}
    config = module.Config(**{k: v for k, v in size.items() if k in fields})
    return module.bench_inputs(config, size["batch_size"] * batches)


def _variant(name, variant, sizes, steps):
    """The compiled model of one variant, a function that trains it for
    one epoch of `steps` distinct batches (returns the History), those
    batches' `(x, y)` and the `report.StepLog` of that function's last
    epoch."""
    policy, scaler = {**VARIANTS, **FLOAT8_VARIANTS}[variant]
    batch = sizes[name]["batch_size"]
    module = protocol.load_example(name)
    with kmp.policy_scope(policy):
        keras.utils.set_random_seed(0)
        model, x, y = _model(module, sizes[name], steps)
        if variant in FLOAT8_VARIANTS:
            kmp.float8(model)
        model.compile(
            optimizer=_optimizer(module, scaler),
            loss="sparse_categorical_crossentropy",
            jit_compile="auto",
            auto_scale_loss=False,  # bf16/float32: no scaler at all
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

    return model, run, (x, y), step_log


def variant_memory(name, variant, sizes, steps=2) -> tuple[float, str]:
    """`(MiB, what)`: the peak memory of training one variant, alone in a
    fresh process (`python -m kmp.app.bench`), on this Keras backend."""
    command = [
        sys.executable,
        "-m",
        "kmp.app.bench",
        json.dumps({"name": name, "variant": variant, "sizes": sizes}),
        str(steps),
    ]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    lines = [x for x in done.stdout.splitlines() if x.startswith("MEMORY ")]
    if done.returncode or not lines:
        return math.nan, "failed: " + done.stderr.strip()[-300:]
    measured = json.loads(lines[-1][len("MEMORY ") :])
    return measured["mib"], measured["what"] + ", this variant alone"


def _warnings(rows):
    """The `warning` text of each row of one model (see the docstring)."""
    losses = [repr(r["loss"]) for r in rows]
    same = len(rows) > 1 and len(set(losses)) == 1
    for r in rows:
        notes = []
        if not math.isfinite(r["loss"]):
            notes.append("loss not finite")
        elif r["loss"] > r["loss_before"]:
            notes.append("loss rose: diverging?")
        if same:
            notes.append("same loss in every variant: not training?")
        r["warning"] = "; ".join(notes)


def _tflops(row, device, tf32):
    """Adds a row's achieved TFLOP/s, the device's peak for its policy
    and MFU, their ratio (both `None` where kmp knows no peak)."""
    achieved = row["flops_per_example"] * row["examples_per_s"] / 1e12
    peak = flops.peak_tflops(device.name, row["policy"], tf32)
    row["tflops_achieved"], row["tflops_peak"] = achieved, peak
    row["mfu"] = achieved / peak if peak else None


def bench_model(
    name, sizes, steps, rounds, log=print, memory=False, float8=False
) -> list[dict]:
    """Benchmarks the four variants on one example model (six with
    `float8`, on a model with matmul layers); with `memory`, also each
    variant's peak memory on its own (`variant_memory`) and, on JAX, its
    compiled step's buffers from XLA (`kmp.backend.train_step_memory`).
    Every row has the bytes of its weights and optimizer state."""
    batch = sizes[name]["batch_size"]
    variants = dict(VARIANTS)
    if float8 and configs.EXAMPLES[name].BENCH_FLOAT8:
        variants.update(FLOAT8_VARIANTS)
    runs, before, models, inputs, step_logs = {}, {}, {}, {}, {}
    for variant in variants:
        model, runs[variant], inputs[variant], step_logs[variant] = _variant(
            name, variant, sizes, steps
        )
        models[variant] = model
        # Warm-up: compiles; its loss is the "before" figure.
        before[variant] = float(runs[variant]().history["loss"][-1])
    # Per layer; a KerasHub causal LM per token (PaLM's count).
    per_example = flops.training_flops(model)
    shared_memory, shared_what = report.peak_memory_mib()
    if log:
        log(
            f"{name}: {len(variants)} variants compiled; timing {rounds} "
            f"rounds of {steps} steps"
        )
    seconds, steady = time_fit_rounds(runs, step_logs, rounds, steps, log)
    last = {variant: runs[variant]() for variant in runs}
    device, tf32 = backend.list_devices()[0], backend.tf32_enabled()
    results = []
    for variant in variants:
        step_seconds = steady[variant]
        ratios = [f / v for f, v in zip(steady["float32"], step_seconds)]
        step_time = statistics.median(step_seconds)
        memory_mib, memory_what = (
            shared_memory,
            (shared_what + ", after compiling all variants (not per variant)"),
        )
        step_memory = None
        if memory:
            memory_mib, memory_what = variant_memory(name, variant, sizes)
            # JAX: the compiled step's buffers, from XLA (None elsewhere).
            step_memory = backend.train_step_memory(
                models[variant], *inputs[variant], batch
            )
        row = {
            "model": name,
            "variant": variant,
            "policy": variants[variant][0],
            "batch_size": batch,
            "step_time_s": step_time,
            "examples_per_s": batch / step_time,
            "speed_vs_float32": statistics.median(ratios),
            "flops_per_example": per_example,
            "peak_memory_mib": memory_mib,
            "peak_memory_note": memory_what,
            # Exact, from the variables: what a variant keeps between steps.
            "state_bytes": backend.state_bytes(models[variant]),
            "train_step_memory": step_memory,
            "loss_before": before[variant],
            "loss": float(last[variant].history["loss"][-1]),
            # Per round: the steady step, and the whole `fit` call.
            "steady_step_seconds": step_seconds,
            "epoch_seconds": seconds[variant],
            "call_step_time_s": statistics.median(seconds[variant]) / steps,
            "sizes": sizes[name],
        }
        _tflops(row, device, tf32)
        results.append(row)
    _warnings(results)
    return results


def run(
    models=configs.CLASSIFIERS,
    size="auto",
    steps=10,
    rounds=5,
    log=print,
    memory=True,
    float8=False,
) -> list[dict]:
    """Runs the benchmark; returns one result per model and variant
    (`memory=False` skips the per-variant memory processes; `float8` adds
    the `kmp.float8` variants where the model has matmul layers)."""
    if size == "auto":
        size = "full" if startup.has_accelerator() else "small"
    results = []
    for name in models:
        results += bench_model(
            name,
            sizes(size, models),
            steps,
            rounds,
            log,
            memory=memory,
            float8=float8,
        )
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


def _measure_one(spec, steps):
    """The `variant_memory` process: train one variant, print its peak."""
    _, run, _, _ = _variant(spec["name"], spec["variant"], spec["sizes"], steps)
    run()
    mib, what = report.peak_memory_mib()
    print("MEMORY " + json.dumps({"mib": mib, "what": what}))


if __name__ == "__main__":
    _measure_one(json.loads(sys.argv[1]), int(sys.argv[2]))
