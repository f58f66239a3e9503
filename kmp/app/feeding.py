"""How an example's splits reach `fit` on this backend: one data helper.

A training run feeds `fit` full batches, so that the train and test
steps compile once: training drops its last partial batch, validation
pads its own with rows of weight 0 (`device_data.padded_rows`). Where the
batches are made depends on the backend, and `Feeding.kind` names the
three ways, so that an example's `make_datasets` branches on one value:

    "device"    JAX without a keras.distribution: the arrays go to the
                device once and each batch is cut (and augmented) there
                (`kmp.app.device_data`)
    "tf.data"   TensorFlow is installed: `tf.data` pipelines prepare
                batches on the host while the step runs
    "arrays"    neither (PyTorch, or JAX under a distribution, without
                TensorFlow): NumPy arrays

Under a keras.distribution Keras shards host batches itself, so the
device feed is for one process's own devices without one.

Training batches are one stream, of which each epoch takes the next
`steps` (so `fit` gets `steps_per_epoch=steps`): pass `p` over the
data is shuffled and augmented by draws from (`--seed`, `p`) alone, not
from how many passes this process has made. A rerun resumed from the
backup at epoch `k` (`kmp.app.backup.resumed_epoch`) starts the stream
at batch `k * steps`, so it trains on the batches the uninterrupted run
trained on. NumPy arrays ("arrays") are shuffled by `fit` itself, which
a rerun does not resume; `Feeding.in_order` streams arrays in the order
they have, on every backend and without TensorFlow, resumed the same way.
"""

import keras

import kmp
from kmp import backend
from kmp.app import backup as kmp_backup
from kmp.app import batching
from kmp.app import data as kmp_data
from kmp.app import device_data


class Feeding:
    """The batches of one run's splits (see the module).

    Args:
        config: The run's config (`kmp_config.configs.RunConfig`): its
            `batch_size`, `steps`, `eval_steps`, `seed`, `distribution`.
        splits: The `kmp.app.data.Splits` trained on.

    Attributes:
        kind: "device", "tf.data" or "arrays".
        steps: Training batches per epoch: `--steps`, or the full
            batches of the training split.
        first_epoch: The epoch this run starts at (its backup's, if it
            resumes one).
        eval_steps: Validation batches: `--eval_steps`, the share
            `--steps` is of an epoch, or all (`None`).

    Example:

    ```python
    feeding = Feeding(config, splits)
    if feeding.kind == "device":
        train = feeding.on_device(splits.train, training=True)
        test = feeding.on_device(splits.test)
    ```
    """

    def __init__(self, config, splits):
        self.config = config
        self.steps = batching.steps_per_epoch(config, splits)
        self.first_epoch = kmp_backup.resumed_epoch(config)
        self.eval_steps = batching.evaluation_steps(config, splits)
        if batching.feeds_device(config):
            self.kind = "device"
        elif kmp_data.has_tensorflow():
            self.kind = "tf.data"
        else:
            self.kind = "arrays"

    def on_device(self, split, training=False, transform=None):
        """`split` (arrays, or a `tf.data` split read into arrays) held on
        the device, as `fit`'s batches: shuffled each pass and endless
        under `--steps` when `training`, else validation's padded
        batches. `transform(x, key)` runs on the device per batch
        (`kmp.app.device_data.DeviceBatches`)."""
        if self.kind != "device":
            raise ValueError(
                f"on_device() feeds JAX without a distribution; this run "
                f"feeds {self.kind!r} (backend {keras.backend.backend()}, "
                f"--distribution={self.config.distribution}). Branch on "
                "Feeding.kind."
            )
        x, y = kmp_data.as_arrays(split)
        config = self.config
        if training:
            return device_data.DeviceBatches(
                x,
                y,
                config.batch_size,
                shuffle=True,
                transform=transform,
                repeat=bool(config.steps),  # steps * epochs may exceed a pass
                seed=config.seed,
                start=self.first_epoch * self.steps,
            )
        return device_data.DeviceBatches(
            x, y, config.batch_size, transform=transform, steps=self.eval_steps
        )

    def padded(self, split):
        """Validation in full batches of `(x, y, sample_weight)`, the last
        padded with rows of weight 0 and cut at `eval_steps`: a `tf.data`
        split as a batched dataset, an `(x, y)` pair as three arrays."""
        if isinstance(split, tuple):
            return batching.padded_arrays(
                split, self.config.batch_size, self.eval_steps
            )
        return batching.padded_evaluation(
            split, self.config.batch_size, self.eval_steps
        )

    def batches(self, split, prepare=None, shuffle=10_000):
        """A `tf.data` split of `(x, y)` as the stream of training batches
        (see the module): the run's, from its first epoch on.

        Args:
            split: Unbatched `(x, y)` pairs (cache a TFDS split first).
            prepare: `prepare(x, y, seed) -> (x, y)` per example, after
                the shuffle; `seed` (int64, shape `(2,)`) is the
                example's own, for `tf.image.stateless_random_*`.
            shuffle: The shuffle buffer; 0 keeps the split's order.
        """
        import tensorflow as tf

        config, batch_size = self.config, self.config.batch_size
        per_pass, first, left = self._stream(batching.split_size(split))
        first_pass, skipped = divmod(first, per_pass)

        def one_pass(number):
            # The shuffle's graph-level seed fixed: the order is drawn from
            # the pass's seed alone, not from TensorFlow's global seed too
            # (which TensorFlow cannot combine with a tensor seed when it
            # is 0, the default --seed).
            tf.compat.v1.get_default_graph().seed = 1
            seed = tf.random.stateless_uniform(
                [], [config.seed, number], 0, 2**31 - 1, tf.int64
            )
            rows = split.shuffle(shuffle, seed, False) if shuffle else split
            # Numbered before the skip: the same rows get the same seeds.
            first_rows = tf.constant(skipped * batch_size, tf.int64)
            rows = rows.enumerate().skip(
                tf.where(number == first_pass, first_rows, 0)
            )
            if prepare is None:
                rows = rows.map(lambda i, pair: pair)
            else:
                rows = rows.map(
                    lambda i, pair: prepare(*pair, tf.stack([seed, i])),
                    num_parallel_calls=tf.data.AUTOTUNE,
                )
            return rows.batch(batch_size, drop_remainder=True)

        # The run's batches from this epoch on, and no more: `fit`
        # without `steps_per_epoch` would take them as one epoch, not
        # run forever.
        passes = tf.data.Dataset.range(first_pass, 2**62)
        stream = passes.flat_map(one_pass).take(left)
        return stream.prefetch(tf.data.AUTOTUNE)

    def in_order(self, split, training=True):
        """An `(x, y)` pair of arrays (`x` may be a dict) as batches in
        the arrays' own order, without TensorFlow: a grain `MapDataset`
        (KerasHub's own loader; Keras's `fit` takes it on every backend).

        Training: the run's stream from its first epoch on, as `batches`
        makes it with `shuffle=0` (shuffle the arrays once, beforehand):
        batch `b` is full batch `b % passes`, the last partial batch
        dropped. Validation (`training=False`): the split once, its last
        partial batch kept (dropped under many JAX processes, which must
        run the same steps). Under many processes
        `kmp.app.scale_out.process_share` cuts each its part of a batch.
        """
        try:
            import grain
        except ImportError:
            raise kmp.InputError(
                "Without TensorFlow, batches in order come from grain: "
                "pip install grain."
            ) from None
        x, y = split
        batch_size = self.config.batch_size
        if training:
            per_pass, first, left = self._stream(len(y))
            positions = grain.MapDataset.range(first, first + left)
            rows = positions.map(lambda b: (b % per_pass) * batch_size)
        else:
            whole = backend.processes()[1] > 1
            count = len(y) // batch_size if whole else -(-len(y) // batch_size)
            rows = grain.MapDataset.range(count).map(lambda b: b * batch_size)

        def cut(first):
            def part(array):
                return array[first : first + batch_size]

            if isinstance(x, dict):
                return {name: part(v) for name, v in x.items()}, part(y)
            return part(x), part(y)

        return rows.map(cut)

    def _stream(self, size):
        """`(per_pass, first, left)` of the training stream over `size`
        examples: its full batches a pass, this run's first batch in it,
        and the batches the run has left (the module doc)."""
        per_pass = size // self.config.batch_size
        if not per_pass:
            raise kmp.InputError(
                f"{size} training examples do not make one batch of "
                f"{self.config.batch_size}; pass a smaller --batch_size."
            )
        left = max(self.config.epochs - self.first_epoch, 0) * self.steps
        return per_pass, self.first_epoch * self.steps, left

    def full_batches(self, split):
        """An `(x, y)` pair of arrays cut to its full batches: an epoch of
        `steps` batches then ends where the arrays do."""
        x, y = split
        rows = len(y) // self.config.batch_size * self.config.batch_size
        return x[:rows], y[:rows]
