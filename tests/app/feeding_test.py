"""`kmp.app.feeding.Feeding`: which of the three feeds a run gets, and
that each gives `fit` full batches, validation cut at `eval_steps` and
padded with rows of weight 0."""

import keras
import numpy as np
import pytest
from util import jax_only

import kmp
from kmp.app import data as kmp_data
from kmp.app import feeding as feeding_module
from kmp.app import scale_out
from kmp.app.feeding import Feeding
from kmp_config import configs


def _splits(train=40, test=10):
    rng = np.random.default_rng(0)

    def split(size):
        return rng.random((size, 3)).astype("float32"), np.arange(size) % 2

    return kmp_data.Splits(split(train), split(test), "synthetic", "test")


def _config(**fields):
    return configs.ImdbConfig(batch_size=4, **fields)


def test_the_kind_follows_the_backend_and_the_distribution():
    expected = {"jax": "device", "tensorflow": "tf.data", "torch": "tf.data"}
    backend = keras.backend.backend()
    assert Feeding(_config(), _splits()).kind == expected[backend]
    if backend == "jax":  # Keras shards host batches under a distribution
        config = _config(distribution="data")
        assert Feeding(config, _splits()).kind == "tf.data"


def test_without_tensorflow_the_feed_is_arrays(monkeypatch):
    monkeypatch.setattr(kmp_data, "has_tensorflow", lambda: False)
    monkeypatch.setattr(feeding_module.batching, "feeds_device", lambda c: 0)
    feeding = Feeding(_config(), _splits())
    assert feeding.kind == "arrays"
    x, y, weights = feeding.padded(_splits().test)
    # 10 rows in batches of 4: 12 rows, the last 2 weighing 0 and the
    # real ones 12/10, so that the loss is the mean over the real rows.
    assert len(x) == len(y) == len(weights) == 12
    assert weights.tolist() == pytest.approx([1.2] * 10 + [0, 0])
    with pytest.raises(ValueError, match="Branch on Feeding.kind"):
        feeding.on_device(_splits().train)


def test_steps_cut_validation_to_the_same_share():
    # --steps=5 of the 10 batches of training: half of validation's 3.
    feeding = Feeding(_config(steps=5), _splits())
    assert feeding.eval_steps == 2
    assert Feeding(_config(eval_steps=1), _splits()).eval_steps == 1
    assert Feeding(_config(), _splits()).eval_steps is None


@pytest.mark.skipif(
    not kmp_data.has_tensorflow(), reason="tf.data needs TensorFlow"
)
def test_a_tf_data_split_is_padded_to_full_weighted_batches():
    import tensorflow as tf

    feeding = Feeding(_config(eval_steps=2), _splits())
    batches = list(
        feeding.padded(tf.data.Dataset.from_tensor_slices(_splits().test))
    )
    assert [len(x) for x, _, _ in batches] == [4, 4]  # cut at eval_steps
    assert all(set(w.numpy()) == {1.0} for _, _, w in batches)


@jax_only
def test_on_device_training_is_full_shuffled_batches_and_validation_padded():
    feeding = Feeding(_config(seed=3), _splits(train=42))
    train = feeding.on_device(_splits(train=42).train, training=True)
    assert len(train) == 10  # 42 rows: the partial batch is dropped
    x, y = train[0]
    assert x.shape == (4, 3) and y.shape == (4,)
    test = feeding.on_device(
        _splits().test, transform=lambda rows, key: rows * 0 + 1
    )
    assert len(test) == 3
    x, y, weights = test[2]
    assert np.asarray(x).tolist() == [[1.0] * 3] * 4  # the transform ran
    assert weights.tolist() == pytest.approx([1.2, 1.2, 0, 0])


@pytest.mark.backend_independent
def test_a_resumed_tf_data_stream_is_the_uninterrupted_one_from_its_epoch(
    monkeypatch,
):
    import tensorflow as tf

    splits = _splits(train=20)  # 5 batches of 4 a pass
    config = _config(steps=3, epochs=4)  # 12 batches over 3 passes

    def noise(x, y, seed):  # a stateless draw per example, as augmentation
        return x + tf.random.stateless_uniform([], seed), y

    def stream(first_epoch):
        monkeypatch.setattr(
            feeding_module.kmp_backup, "resumed_epoch", lambda c: first_epoch
        )
        # TensorFlow's global seed plays no part (0, the default, too).
        tf.random.set_seed(first_epoch)
        feeding = Feeding(config, splits)
        data = tf.data.Dataset.from_tensor_slices(splits.train)
        return [x for x, _ in feeding.batches(data, noise).as_numpy_iterator()]

    whole = stream(0)
    assert len(whole) == 12  # the run's batches, then the stream ends
    first, second = np.concatenate(whole[:5]), np.concatenate(whole[5:10])
    assert not np.array_equal(np.sort(first, 0), np.sort(second, 0))
    # Epoch 2 starts at batch 6: inside pass 1, whose order and draws
    # are the uninterrupted run's.
    resumed = stream(2)
    assert len(resumed) == 6
    for got, expected in zip(resumed, whole[6:], strict=True):
        np.testing.assert_array_equal(got, expected)


@pytest.mark.backend_independent
def test_a_training_split_smaller_than_a_batch_is_refused_in_one_line():
    import tensorflow as tf

    splits = _splits(train=3)
    data = tf.data.Dataset.from_tensor_slices(splits.train)
    with pytest.raises(kmp.InputError, match="3 training examples do not"):
        Feeding(_config(), splits).batches(data)


def test_in_order_streams_the_run_s_batches_from_its_epoch(monkeypatch):
    # 10 rows in batches of 4: 2 a pass, the last 2 rows never trained on.
    x = {"ids": np.arange(10) * 10, "mask": np.arange(10) % 2 == 0}
    splits = kmp_data.Splits((x, np.arange(10)), (x, np.arange(10)), "", "")
    config = _config(steps=3, epochs=2)
    stream = Feeding(config, splits).in_order(splits.train)
    assert [y.tolist() for _, y in stream] == [[0, 1, 2, 3], [4, 5, 6, 7]] * 3
    x1, _ = stream[1]
    assert x1["ids"].tolist() == [40, 50, 60, 70]
    assert x1["mask"].tolist() == [True, False, True, False]
    # Validation: every row once, the last batch short.
    test = Feeding(config, splits).in_order(splits.test, training=False)
    assert [len(y) for _, y in test] == [4, 4, 2]
    # Resumed at epoch 1: the uninterrupted run's batches 3 to 5.
    monkeypatch.setattr(feeding_module.kmp_backup, "resumed_epoch", lambda c: 1)
    resumed = Feeding(config, splits).in_order(splits.train)
    assert [y.tolist() for _, y in resumed] == [
        y.tolist() for _, y in list(stream)[3:]
    ]
    with pytest.raises(kmp.InputError, match="3 training examples do not"):
        Feeding(config, _splits(train=3)).in_order(_splits(train=3).train)


def test_in_order_gives_each_process_its_part_of_every_batch(monkeypatch):
    rows = np.arange(18)
    splits = kmp_data.Splits((rows, rows), (rows, rows), "", "")
    config = _config(steps=2, epochs=1)
    parts = []
    for process in range(2):
        monkeypatch.setattr(
            scale_out.backend, "processes", lambda p=process: (p, 2)
        )
        monkeypatch.setattr(
            feeding_module.backend, "processes", lambda p=process: (p, 2)
        )
        feeding = Feeding(config, splits)
        train = scale_out.process_share(feeding.in_order(splits.train), 4)
        test = feeding.in_order(splits.test, training=False)
        test = scale_out.process_share(test, 4)
        parts.append(
            ([y.tolist() for _, y in train], [len(y) for _, y in test])
        )
    # The rows scale_out.process_share gives each process of arrays;
    # validation's short last batch is dropped: the same steps for both.
    assert parts[0] == ([[0, 1], [4, 5]], [2] * 4)
    assert parts[1] == ([[2, 3], [6, 7]], [2] * 4)


@pytest.mark.backend_independent
def test_in_order_is_the_unshuffled_tf_data_stream(monkeypatch):
    # The LM fed tf.data's stream (shuffle=0) before grain's: the same
    # batches, so the figures it measured stay reproducible.
    import tensorflow as tf

    splits = _splits(train=22)  # 5 batches of 4 a pass
    monkeypatch.setattr(feeding_module.kmp_backup, "resumed_epoch", lambda c: 1)
    feeding = Feeding(_config(steps=3, epochs=5), splits)
    data = tf.data.Dataset.from_tensor_slices(splits.train)
    expected = list(feeding.batches(data, shuffle=0).as_numpy_iterator())
    got = list(feeding.in_order(splits.train))
    assert len(got) == len(expected) == 12
    for (x, y), (tx, ty) in zip(got, expected, strict=True):
        np.testing.assert_array_equal(x, tx)
        np.testing.assert_array_equal(y, ty)
