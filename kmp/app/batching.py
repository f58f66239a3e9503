"""How many batches a split makes, and validation's full batches.

Every run feeds `fit` full batches, so that the train and test steps
compile once: training drops its last partial batch, and validation
pads its own with rows of weight 0, the real rows weighted so that the
loss and accuracy are exact means over them
(`device_data.padded_rows`). This module counts a split's batches, says
how many of them validation runs (`evaluation_steps`: a short run
validates briefly too), pads validation's batches on the host
(`padded_evaluation` for `tf.data`, `padded_arrays` for arrays), and
says whether the batches are cut on the device instead
(`feeds_device`). `kmp.app.feeding` builds an example's batches with
these, and `kmp.app.run` sizes an epoch and validation with them.
"""

import math

import keras
import numpy as np

from kmp.app import device_data


def split_size(split) -> int:
    """Examples in a split: an `(x, y)` pair or a sized `tf.data`."""
    if isinstance(split, tuple):
        return len(split[1])
    return int(split.cardinality())  # TFDS splits know their size


def batches(split, batch_size) -> int:
    """Batches of `split`, the last one short if need be."""
    return -(-split_size(split) // batch_size)


def full_batches(split, batch_size) -> int:
    """Full batches of `split` (at least one: a split smaller than a
    batch is refused where the feed is made)."""
    return max(split_size(split) // batch_size, 1)


def steps_per_epoch(config, splits) -> int:
    """An epoch's training steps: `--steps`, or the training split's
    full batches (the feed drops a partial last batch)."""
    return config.steps or full_batches(splits.train, config.batch_size)


def evaluation_steps(config, splits) -> int | None:
    """Batches of validation and final evaluation; None for all.

    `--eval_steps` when set; else, when `--steps` is set, the same share
    of the test split as `--steps` is of the training split (at least
    one batch), so that a short run validates briefly too.
    """
    test_batches = batches(splits.test, config.batch_size)
    if config.eval_steps:
        return min(config.eval_steps, test_batches)
    if not config.steps:
        return None
    train_batches = full_batches(splits.train, config.batch_size)
    share = min(config.steps / train_batches, 1.0)
    return max(math.ceil(share * test_batches), 1)


def feeds_device(config) -> bool:
    """Whether the examples hold their data on the device and cut batches
    there (`kmp.app.device_data`): on JAX, without a distribution (under
    one, Keras shards host batches itself)."""
    return keras.backend.backend() == "jax" and config.distribution == "none"


def padded_evaluation(split, batch_size, steps=None):
    """A `tf.data` split of `(x, y)` as full batches of `(x, y, weight)`:
    the first `steps` batches (all if None), the last padded with rows of
    weight 0 and the real rows weighted so that the loss and accuracy are
    exact means over them (`device_data.padded_rows`). Full batches: the
    test step compiles once under XLA."""
    import tensorflow as tf

    rows, weights = device_data.padded_rows(
        split_size(split), batch_size, steps
    )
    real = int(np.count_nonzero(weights))
    weight = tf.constant(weights[0])
    kept = split.take(real).map(lambda x, y: (x, y, weight))
    padding = (
        split.repeat()
        .take(len(rows) - real)
        .map(lambda x, y: (x, y, tf.zeros_like(weight)))
    )
    return kept.concatenate(padding).batch(batch_size, drop_remainder=True)


def padded_arrays(split, batch_size, steps=None):
    """`padded_evaluation` for an `(x, y)` pair of arrays: `(x, y, w)`."""
    x, y = split
    rows, weights = device_data.padded_rows(len(y), batch_size, steps)
    return x[rows], y[rows], weights
