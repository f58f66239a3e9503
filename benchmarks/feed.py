"""Does the input pipeline starve the step? In-fit rate, fed two ways.

    python benchmarks/feed.py                          # TensorFlow: tf.data
    KERAS_BACKEND=jax python benchmarks/feed.py        # JAX: DeviceBatches

The CIFAR-10 example's ResNet-9 is trained by `model.fit` on its own
training feed (`examples/cifar10.make_datasets`: a `tf.data` pipeline
that shuffles, normalizes, pads, crops and flips on the host on
TensorFlow; `kmp.app.device_data.DeviceBatches` on JAX), and on one batch
of that feed held in memory and repeated, which costs the step nothing to
fetch. The two are timed in the same process, epochs interleaved; each
epoch's rate counts the steps after its first `--skip` (so a pipeline's
start-up, its shuffle buffer filling, is not charged to the steady
state). `feed / resident` near 1 means the feed keeps up with the step;
the issue's target on a GPU is >= 0.90.

On a CPU the pipeline's threads and the step share the same cores, so
this is the harsher case for `tf.data`; on a GPU the step leaves the host
cores to the pipeline. Writes a JSON file with hardware and versions.
"""

import argparse
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import common  # noqa: E402
import keras  # noqa: E402

import kmp  # noqa: E402
from kmp import backend  # noqa: E402
from kmp.examples import cifar10  # noqa: E402

TARGET = 0.90


class StepClock(keras.callbacks.Callback):
    """The time at the end of every training batch of the last `fit`."""

    def on_train_begin(self, logs=None):
        self.ends = []

    def on_train_batch_end(self, batch, logs=None):
        self.ends.append(time.perf_counter())


def resident(feed):
    """One batch of `feed`, held and repeated: a feed that costs nothing."""
    if isinstance(feed, keras.utils.PyDataset):
        batch = feed[0]  # already on the device (DeviceBatches)

        class Repeated(keras.utils.PyDataset):
            def __len__(self):
                return len(feed)

            def __getitem__(self, index):
                return batch

        return Repeated()
    import tensorflow as tf

    batch = next(iter(feed))
    return tf.data.Dataset.from_tensors(batch).repeat()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--policy", default="float32")
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--batch_size", type=int, default=128)
    parser.add_argument("--steps", type=int, default=24, help="per epoch")
    parser.add_argument("--skip", type=int, default=4, help="steps not timed")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default=None, help="JSON path")
    args = parser.parse_args()
    if args.steps <= args.skip + 1:
        parser.error(
            f"--steps ({args.steps}) must exceed --skip ({args.skip}) + 1."
        )

    config = cifar10.Config(
        data="synthetic",
        policy=args.policy,
        width=args.width,
        batch_size=args.batch_size,
        steps=args.steps,
        synthetic_size=max(10_000, args.batch_size * args.steps),
    )
    splits = cifar10.load_data(config)
    feed, _ = cifar10.make_datasets(splits, config)
    feeds = {"feed": feed, "resident": resident(feed)}
    clock = StepClock()
    with kmp.policy_scope(args.policy):
        keras.utils.set_random_seed(0)
        model = cifar10.compile_model(config, args.steps)

    rates = {name: [] for name in feeds}

    def epoch(name):
        model.fit(
            feeds[name],
            steps_per_epoch=args.steps,
            epochs=1,
            verbose=0,
            callbacks=[clock],
            shuffle=False,  # the feed shuffles itself
        )
        timed = clock.ends[args.skip :]
        rates[name].append(
            (len(timed) - 1) * args.batch_size / (timed[-1] - timed[0])
        )

    for name in feeds:
        epoch(name)  # warm-up: compile, fill the pipeline once
    rates = {name: [] for name in feeds}
    runs = {name: (lambda n=name: epoch(n)) for name in feeds}
    common.time_interleaved(runs, args.rounds)  # whole epochs, for the log
    per_round = [f / r for f, r in zip(rates["feed"], rates["resident"])]
    median = {name: statistics.median(v) for name, v in rates.items()}
    ratio = statistics.median(per_round)
    what = "DeviceBatches" if backend.name() == "jax" else "tf.data"
    print(
        f"| backend | feed | policy | feed img/s | resident img/s | "
        f"feed / resident (median of rounds) | >= {TARGET} |\n"
        "|---|---|---|---|---|---|---|\n"
        f"| {backend.name()} | {what} | {args.policy} | {median['feed']:.0f} "
        f"| {median['resident']:.0f} | {ratio:.3f} "
        f"({min(per_round):.3f}-{max(per_round):.3f}) "
        f"| {'yes' if ratio >= TARGET else 'NO'} |"
    )
    common.write_result(
        {
            "benchmark": "feed",
            "feed": what,
            "settings": vars(args),
            "images_per_s": rates,
            "feed_over_resident_per_round": per_round,
            "median_ratio": ratio,
            "target": TARGET,
        },
        f"feed_{backend.name()}.json",
        args.out,
    )


if __name__ == "__main__":
    main()
