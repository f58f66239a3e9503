"""The examples' data: TFDS when it can be had, else labelled synthetic."""

import socket
import time

import numpy as np
import pytest

from kmp.app import data

pytestmark = pytest.mark.backend_independent


def test_synthetic_images_are_deterministic_and_shaped_like_cifar():
    (x, y), (tx, ty) = data.synthetic_images(100, 20, seed=3)
    assert x.shape == (100, 32, 32, 3) and x.dtype == np.uint8
    assert tx.shape == (20, 32, 32, 3) and ty.shape == (20,)
    assert set(np.unique(y)) <= set(range(10))
    (x2, y2), _ = data.synthetic_images(100, 20, seed=3)
    np.testing.assert_array_equal(x, x2)
    np.testing.assert_array_equal(y, y2)
    (x3, _), _ = data.synthetic_images(100, 20, seed=4)
    assert not np.array_equal(x, x3)


def test_synthetic_images_are_learnable_with_headroom():
    # Nearest class mean on the training set classifies the test set about
    # as well as the redrawn labels (10%) allow: 1 - 0.9 * 0.1 = 91%.
    (x, y), (tx, ty) = data.synthetic_images(2000, 1000, seed=0)
    x, tx = x.reshape(len(x), -1) / 255.0, tx.reshape(len(tx), -1) / 255.0
    means = np.stack([x[y == c].mean(0) for c in range(10)])
    guess = np.argmin(((tx[:, None] - means[None]) ** 2).sum(-1), axis=1)
    assert 0.85 < (guess == ty).mean() < 0.95
    (_, clean), _ = data.synthetic_images(2000, 1000, seed=0, label_noise=0)
    assert 0.07 < (clean != y).mean() < 0.11  # 10% redrawn, 1 in 10 alike


def test_synthetic_source_skips_tfds():
    splits = data.load("cifar10", "synthetic", lambda: ("a", "b"))
    assert splits == ("a", "b", "synthetic", "--data synthetic")


def test_auto_falls_back_to_synthetic_when_offline(monkeypatch, caplog):
    monkeypatch.setattr(data, "_reachable", lambda: False)
    start = time.monotonic()
    splits = data.load(
        "cifar10", "auto", lambda: ("a", "b"), data_dir="/nonexistent"
    )
    assert time.monotonic() - start < 10
    assert splits.source == "synthetic"
    assert "network is unreachable" in splits.note
    assert "SYNTHETIC" in caplog.text


def test_tfds_source_fails_clearly_when_offline(monkeypatch):
    monkeypatch.setattr(data, "_reachable", lambda: False)
    with pytest.raises(data.DataUnavailable, match="--data synthetic"):
        data.load("cifar10", "tfds", lambda: 1 / 0, data_dir="/nonexistent")


def test_probe_tells_an_open_port_from_a_closed_one():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        address = server.getsockname()
        assert data._reachable(address, timeout=1.0)
    assert not data._reachable(address, timeout=1.0)


def test_tfds_path_with_mock_data(monkeypatch):
    tfds = pytest.importorskip("tensorflow_datasets")
    monkeypatch.setattr(data, "_reachable", lambda: True)
    with tfds.testing.mock_data(num_examples=6):
        splits = data.load("cifar10", "tfds", lambda: 1 / 0)
        image, label = next(iter(splits.train))
    assert splits.source == "tfds"
    assert tuple(image.shape) == (32, 32, 3)
    assert label.shape == ()


def test_unknown_source_is_a_value_error():
    with pytest.raises(ValueError, match="data must be one of auto, tfds"):
        data.load("cifar10", "web", lambda: None)


def test_as_arrays_reads_a_dataset_whole():
    import tensorflow as tf

    x, y = np.arange(12).reshape(6, 2), np.arange(6)
    assert data.as_arrays((x, y)) == (x, y)
    read = data.as_arrays(tf.data.Dataset.from_tensor_slices((x, y)))
    assert np.array_equal(read[0], x) and np.array_equal(read[1], y)
