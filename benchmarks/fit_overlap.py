"""Whether `fit` overlaps the host's work with the device's: a run's
callbacks that wait for each step's logs against kmp's, which do not.

    KERAS_BACKEND=jax python benchmarks/fit_overlap.py
    KERAS_BACKEND=jax python benchmarks/fit_overlap.py --host_ms=0  # a GPU

A callback with a batch-end method of its own (Keras's progress bar, the
step log kmp's runs kept until 2026-11-28) makes Keras wait for every
step's logs before it starts the next step: the host's work between
steps (the next batch, the call) and the device's step then add up. With
every callback `async_safe` (kmp's `StepLog`, `kmp.callbacks.ProgressBar`
and `LossScaleMonitor`) Keras on JAX and torch reads the logs on its thread
pool and the two overlap. (Keras on TensorFlow always waits.)

Times one epoch of `fit` of an MLP (`--width`, 3 layers) on a
`PyDataset` that spends `--host_ms` of host time on each batch (a
sleep: the share of a data pipeline's or Python's time that leaves the
device idle), interleaved round by round:

    waits    StepLog, ProgressBar and a callback that reads each
             step's loss on the main thread (as Keras's own bar does)
    kmp      StepLog, ProgressBar and LossScaleMonitor, as `kmp train`
             passes them

both at `verbose=1`, with each variant's median step time from its
`StepLog`. Writes benchmarks/results/fit_overlap_<backend>.json.
"""

import argparse
import contextlib
import io
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import common  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402

import kmp  # noqa: E402
from kmp import backend  # noqa: E402
from kmp.app import report  # noqa: E402


class Batches(keras.utils.PyDataset):
    """`steps` batches of one array, each after `host_ms` of sleep."""

    def __init__(self, x, y, steps, host_ms):
        super().__init__()
        self.x, self.y, self.steps, self.host_s = x, y, steps, host_ms / 1e3

    def __len__(self):
        return self.steps

    def __getitem__(self, index):
        time.sleep(self.host_s)
        return self.x, self.y


class ReadsEachLoss(keras.callbacks.Callback):
    """A batch-end method of its own, not async-safe: Keras waits."""

    def on_train_batch_end(self, batch, logs=None):
        float(logs["loss"])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--host_ms", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--output", default=None)
    args = parser.parse_args()

    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((args.width,))]
        + [keras.layers.Dense(args.width, activation="relu") for _ in range(3)]
        + [keras.layers.Dense(1)]
    )
    model.compile(optimizer=kmp.wrap("sgd"), loss="mse")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(args.batch_size, args.width)).astype("float32")
    y = rng.normal(size=(args.batch_size, 1)).astype("float32")
    data = Batches(x, y, args.steps, args.host_ms)
    model.fit(Batches(x, y, 3, 0.0), verbose=0)  # compiled before timing

    logs = {}

    def epoch(name, extra):
        def run():
            log = report.StepLog()
            # The bar draws into a buffer: the benchmark's own lines stay.
            with contextlib.redirect_stdout(io.StringIO()):
                model.fit(
                    data,
                    verbose=1,
                    callbacks=[log, kmp.callbacks.ProgressBar(), extra()],
                )
            logs.setdefault(name, []).append(log.median_step_time())

        return run

    runs = {
        "waits": epoch("waits", ReadsEachLoss),
        "kmp": epoch("kmp", kmp.callbacks.LossScaleMonitor),
    }
    seconds = common.time_interleaved(runs, args.rounds)
    variants = {
        name: {
            "epoch_s": statistics.median(seconds[name]),
            "step_ms": 1e3 * statistics.median(logs[name]),
        }
        for name in runs
    }
    ratio = common.ratio_stats(seconds, "waits", "kmp")
    print(f"{backend.name()}, host {args.host_ms} ms a batch:")
    print("| variant | epoch (s) | step (ms, StepLog) |\n|---|---|---|")
    for name, v in variants.items():
        print(f"| {name} | {v['epoch_s']:.3f} | {v['step_ms']:.2f} |")
    print(common.ratio_table({"waits/kmp": ratio}))
    common.write_result(
        {
            "flags": vars(args),
            "variants": variants,
            "waits_over_kmp": ratio,
        },
        f"fit_overlap_{backend.name()}.json",
        args.output,
    )


if __name__ == "__main__":
    main()
