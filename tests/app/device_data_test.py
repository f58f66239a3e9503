"""Data held on the device (`kmp.app.device_data`): a padded evaluation is
exact, every training pass is a new permutation without a remainder, the
augmentation moves pixels without changing them."""

import keras
import numpy as np
import pytest
from util import classification_data
from util import jax_only
from util import mlp

import kmp
from kmp.app import device_data


@pytest.mark.backend_independent
def test_padded_rows_make_the_loss_the_mean_over_the_real_rows():
    rows, weights = device_data.padded_rows(10, 4)
    assert rows.tolist() == [*range(10), 0, 1]
    assert weights.tolist() == pytest.approx([1.2] * 10 + [0, 0])
    # Keras: a batch's loss is sum(loss * w) / batch_size, and the epoch's
    # loss weighs batches by their size: sum(loss * w) / rows in all.
    losses = np.random.default_rng(0).random(10)
    assert (losses[rows] * weights).sum() / len(rows) == pytest.approx(
        losses.mean()
    )
    rows, weights = device_data.padded_rows(10, 4, steps=2)  # 8 rows
    assert rows.tolist() == list(range(8)) and set(weights) == {1.0}
    assert device_data.padded_rows(10, 4, steps=9)[0].tolist() == (
        device_data.padded_rows(10, 4)[0].tolist()
    )


@pytest.mark.backend_independent
def test_bad_input_is_one_clear_error():
    with pytest.raises(kmp.InputError, match="same number of rows"):
        device_data.DeviceBatches(np.zeros((3, 1)), np.zeros(4), 2)
    with pytest.raises(kmp.InputError, match="do not make one batch of 8"):
        device_data.DeviceBatches(
            np.zeros((4, 1)), np.zeros(4), 8, shuffle=True
        )


@jax_only
def test_evaluation_on_the_device_equals_keras_on_the_whole_split():
    x, y = classification_data(n=50)
    model = mlp()
    model.compile(
        "sgd", "sparse_categorical_crossentropy", weighted_metrics=["accuracy"]
    )
    expected = model.evaluate(x, y, batch_size=50, verbose=0, return_dict=True)
    padded = device_data.DeviceBatches(x, y, 16)  # 4 batches, 14 padding
    assert len(padded) == 4
    got = model.evaluate(padded, verbose=0, return_dict=True)
    assert got["loss"] == pytest.approx(expected["loss"], rel=1e-5)
    assert got["accuracy"] == pytest.approx(expected["accuracy"], rel=1e-6)


def _pass(data, first):
    return np.concatenate(
        [np.asarray(data[i][1]) for i in range(first, first + len(data))]
    )


@jax_only
def test_each_training_pass_is_a_new_permutation_without_remainder():
    x, y = np.arange(50, dtype="float32")[:, None], np.arange(50)
    data = device_data.DeviceBatches(x, y, 16, shuffle=True, seed=3)
    assert len(data) == data.num_batches == 3  # 48 of 50 rows
    first = _pass(data, 0)
    second = _pass(data, 0)  # Keras starts each epoch at 0: a new pass
    inputs, labels = data[1]
    assert np.array_equal(np.asarray(inputs)[:, 0], np.asarray(labels))
    for seen in (first, second):
        assert len(set(seen.tolist())) == 48
    assert not np.array_equal(first, second)
    same_seed = device_data.DeviceBatches(x, y, 16, shuffle=True, seed=3)
    assert np.array_equal(_pass(same_seed, 0), first)
    # Endless (for steps_per_epoch): batch 3 starts the second pass.
    endless = device_data.DeviceBatches(
        x, y, 16, shuffle=True, seed=3, repeat=True
    )
    assert endless.num_batches is None
    assert np.array_equal(_pass(endless, 0), first)
    assert np.array_equal(_pass(endless, 3), second)


@jax_only
def test_a_feed_started_at_batch_k_is_the_stream_from_batch_k():
    # A resumed run's feed (`start` = epochs done times an epoch's
    # batches) gives the batches the uninterrupted run trained on.
    x, y = np.arange(50, dtype="float32")[:, None], np.arange(50)

    def labels(data, indices):
        return [np.asarray(data[i][1]).tolist() for i in indices]

    def feed(**kwargs):
        return device_data.DeviceBatches(
            x, y, 16, shuffle=True, seed=3, **kwargs
        )

    stream = labels(feed(repeat=True), range(9))  # 3 passes of 3
    assert labels(feed(repeat=True, start=4), range(5)) == stream[4:]
    # Not repeating, Keras starts each epoch at 0: the next pass.
    assert labels(feed(start=3), [0, 1, 2, 0, 1, 2]) == stream[3:]


@jax_only
def test_crop_and_flip_moves_pixels_without_changing_them():
    import jax

    rng = np.random.default_rng(0)
    images = rng.integers(0, 255, (64, 6, 6, 3)).astype("float32")
    key = jax.random.key(0)
    flipped = np.asarray(jax.jit(device_data.crop_and_flip(0))(images, key))
    same = [np.array_equal(a, b) for a, b in zip(flipped, images)]
    mirrored = [np.array_equal(a, b[:, ::-1]) for a, b in zip(flipped, images)]
    assert all(s or m for s, m in zip(same, mirrored))
    assert 10 < sum(mirrored) < 54  # about half
    cropped = np.asarray(device_data.crop_and_flip(2)(images, key))
    assert cropped.shape == images.shape
    padded = np.pad(images, ((0, 0), (2, 2), (2, 2), (0, 0)), "reflect")
    for out, source in zip(cropped, padded):
        crops = [
            view
            for dy in range(5)
            for dx in range(5)
            for view in (source[dy : dy + 6, dx : dx + 6],)
        ]
        assert any(
            np.array_equal(out, c) or np.array_equal(out, c[:, ::-1])
            for c in crops
        )


@jax_only
def test_a_transformed_feed_trains_a_model():
    x, y = classification_data(n=64)
    data = device_data.DeviceBatches(
        x,
        y,
        16,
        shuffle=True,
        transform=lambda rows, key: rows.astype("float32") / 2,
    )
    inputs, _ = data[0]
    assert str(inputs.dtype) == "float32"
    model = mlp()
    model.compile("sgd", "sparse_categorical_crossentropy")
    history = model.fit(data, epochs=2, verbose=0)
    assert len(history.history["loss"]) == 2
    assert keras.config.dtype_policy().name == "float32"
