"""Datasets for the examples: TFDS when it can be had, else a synthetic
twin of the same shapes that says so.

`--data auto` (the default) uses the TFDS copy on disk, or downloads it;
when neither is possible it says so within seconds and trains on a
deterministic, learnable synthetic dataset, and every result it prints is
labelled "synthetic". `--data tfds` fails instead; `--data synthetic`
skips TFDS.

TensorFlow and TFDS are imported only on the TFDS path, so the synthetic
path runs with `KERAS_BACKEND=jax` on a machine without TensorFlow.
"""

import logging
import socket
from typing import NamedTuple

import numpy as np

import kmp
from kmp_config.configs import SOURCES

logger = logging.getLogger("kmp")

# Where TFDS downloads from first; a machine that cannot open a connection
# here within seconds is treated as offline.
_PROBE = ("storage.googleapis.com", 443)
_PROBE_TIMEOUT = 3.0


class Splits(NamedTuple):
    """A dataset's train and test splits and where they came from.

    Attributes:
        train: `(x, y)` NumPy arrays, or a `tf.data.Dataset` of unbatched
            `(x, y)` pairs.
        test: The same, for evaluation.
        source: `"tfds"` or `"synthetic"`.
        note: Why this source was used (shown to the user).
    """

    train: object
    test: object
    source: str
    note: str


class DataUnavailable(kmp.InputError):
    """TFDS data is neither on disk nor downloadable here (the message
    says how to provide it, or to use --data=synthetic)."""


def _reachable(address=_PROBE, timeout=_PROBE_TIMEOUT) -> bool:
    try:
        socket.create_connection(address, timeout=timeout).close()
        return True
    except OSError:
        return False


def has_tensorflow() -> bool:
    """Whether TensorFlow can be imported (for `tf.data` pipelines)."""
    try:
        import tensorflow  # noqa: F401
    except ImportError:
        return False
    return True


def as_arrays(split):
    """An `(x, y)` pair of NumPy arrays: arrays as they are, a `tf.data`
    split of `(x, y)` pairs read whole (CIFAR-10: 150 MB of uint8)."""
    if isinstance(split, tuple):
        return split
    parts = [(x, y) for x, y in split.batch(10_000).as_numpy_iterator()]
    return tuple(np.concatenate(column) for column in zip(*parts))


def check_source(source: str) -> str:
    if source not in SOURCES:
        raise kmp.InputError(
            f"data must be one of {', '.join(SOURCES)}; got {source!r}."
        )
    return source


def load_tfds(name: str, data_dir: str | None = None):
    """Returns `(train, test)` unbatched `(x, y)` datasets from TFDS.

    Raises:
        DataUnavailable: within seconds, when TFDS is not installed, or
            the dataset is not prepared in `data_dir` and the network is
            unreachable.
    """
    try:
        import tensorflow_datasets as tfds
    except ImportError as error:  # e.g. a JAX-only machine
        raise DataUnavailable(
            f"TFDS cannot be imported here ({error}); install "
            "tensorflow-datasets, or use --data synthetic."
        ) from None
    builder = tfds.builder(name, data_dir=data_dir)
    if not builder.is_prepared() and not _reachable():
        raise DataUnavailable(
            f"TFDS dataset {name!r} is not in {builder.data_dir} and the "
            f"network is unreachable ({_PROBE[0]}:{_PROBE[1]} did not "
            f"answer in {_PROBE_TIMEOUT:g} s). Prepare it where there is a "
            f"network (`tfds build {name}`), copy the directory here and "
            "pass --data_dir, or use --data synthetic."
        )
    builder.download_and_prepare()
    train, test = builder.as_dataset(
        split=["train", "test"], as_supervised=True, shuffle_files=False
    )
    return train, test


def load(
    name: str, source: str, synthetic, data_dir: str | None = None
) -> Splits:
    """Loads `name` from TFDS or makes its synthetic twin.

    Args:
        name: The TFDS name, e.g. `"cifar10"`.
        source: `"auto"`, `"tfds"` or `"synthetic"`.
        synthetic: A function returning `(train, test)` synthetic arrays.
        data_dir: TFDS's data directory.
    """
    check_source(source)
    if source == "synthetic":
        train, test = synthetic()
        return Splits(train, test, "synthetic", "--data synthetic")
    try:
        train, test = load_tfds(name, data_dir)
        return Splits(train, test, "tfds", f"TFDS {name}")
    except DataUnavailable as error:
        if source == "tfds":
            raise
        logger.warning("kmp: %s Training on SYNTHETIC data instead.", error)
        train, test = synthetic()
        return Splits(train, test, "synthetic", f"offline: {error}")


def synthetic_images(
    train_size=50_000,
    test_size=10_000,
    shape=(32, 32, 3),
    classes=10,
    seed=0,
    label_noise=0.1,
):
    """A learnable stand-in for an image dataset, such as CIFAR-10.

    Each class has a smooth random colour pattern; an image is its class's
    pattern plus one of 1024 noise images, as `uint8` like the real thing.
    A `label_noise` share of the labels (both splits) is redrawn at random,
    so no model can pass about `1 - 0.9 * label_noise` test accuracy (91%
    by default): the accuracy column has headroom, and a precision problem
    can show in it (without it every policy reached 1.0000). The same
    `seed` gives the same arrays on every machine and worker; 60,000
    images take about 0.1 s (this is why the noise comes from a bank and
    the sum is taken in `uint8`, one add per pixel).

    Returns:
        `((x_train, y_train), (x_test, y_test))`.
    """
    rng = np.random.default_rng(seed)
    height, width, channels = shape
    coarse = rng.normal(size=(classes, 4, 4, channels)).astype("float32")
    smooth = coarse.repeat(height // 4, axis=1).repeat(width // 4, axis=2)
    # Pattern in [0, 127] plus noise in [0, 128]: the uint8 sum never wraps.
    patterns = np.clip(64 + 40 * smooth, 0, 127).astype("uint8")
    noise = rng.standard_normal((1024, *shape), dtype="float32")
    bank = np.clip(64 + 50 * noise, 0, 128).astype("uint8")

    def split(size):
        labels = rng.integers(0, classes, size=size)
        picks = rng.integers(0, len(bank), size=size)
        images = np.empty((size, *shape), dtype="uint8")
        for start in range(0, size, 1024):  # bounded temporary memory
            part = slice(start, start + 1024)
            np.add(patterns[labels[part]], bank[picks[part]], out=images[part])
        redrawn = rng.random(size) < label_noise
        labels[redrawn] = rng.integers(0, classes, size=int(redrawn.sum()))
        return images, labels.astype("int64")

    return split(train_size), split(test_size)


def synthetic_text(
    train_size=25_000,
    test_size=25_000,
    sequence_length=256,
    vocabulary_size=20_000,
    seed=0,
    label_noise=0.1,
):
    """A learnable stand-in for a binary text-classification dataset, such
    as IMDB reviews, already tokenized.

    Reviews are token ids (0 is padding, 1 out-of-vocabulary) of random
    length, drawn from a Zipf-like word distribution; each positive review
    also uses words from a small "positive" set, each negative one from a
    "negative" set, as sentiment words do. A `label_noise` share of the
    labels (both splits) is redrawn at random, so no model can pass about
    `1 - 0.5 * label_noise` test accuracy (95% by default; without it every
    policy reached 99-100% and a precision problem could not show).
    Deterministic in `seed`.

    Returns:
        `((tokens_train, y_train), (tokens_test, y_test))`, tokens as
        `int32` of shape `(n, sequence_length)`, labels 0 or 1.
    """
    rng = np.random.default_rng(seed)
    ids = np.arange(2, vocabulary_size)
    weights = 1.0 / np.arange(1, len(ids) + 1)
    weights /= weights.sum()
    # Sentiment words: rarer words, 40 per class (fewer for tiny
    # vocabularies in tests).
    pool = ids[len(ids) // 2 :]
    per_class = max(1, min(40, len(pool) // 2))
    sentiment = rng.choice(pool, size=(2, per_class), replace=False)

    def split(size):
        labels = rng.integers(0, 2, size=size).astype("int64")
        tokens = np.zeros((size, sequence_length), dtype="int32")
        for i, label in enumerate(labels):
            length = int(rng.integers(sequence_length // 4, sequence_length))
            words = rng.choice(ids, size=length, p=weights)
            marked = rng.random(length) < 0.08
            words[marked] = rng.choice(sentiment[label], size=marked.sum())
            tokens[i, :length] = words
        redrawn = rng.random(size) < label_noise
        labels[redrawn] = rng.integers(0, 2, size=int(redrawn.sum()))
        return tokens, labels

    return split(train_size), split(test_size)
