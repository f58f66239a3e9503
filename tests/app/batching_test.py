"""A split's batches (`kmp.app.batching`): how many, how many validation
runs, and validation's full, padded batches."""

import numpy as np
import pytest
from util import tf_only

from kmp.app import batching
from kmp.app import data
from kmp_config import configs


@pytest.mark.backend_independent
def test_a_split_counts_its_rows_and_batches():
    x, y = np.zeros((10, 2)), np.zeros(10)
    assert batching.split_size((x, y)) == 10
    assert batching.batches((x, y), 4) == 3  # the last one short


@pytest.mark.backend_independent
@pytest.mark.parametrize(
    "steps, eval_steps, expected",
    [
        (0, 0, None),  # whole epochs: the whole test split
        (3, 0, 1),  # 3 of 12 training batches: 1 of the 3 test batches
        (6, 0, 2),  # half: ceil(1.5)
        (12, 0, 3),
        (40, 0, 3),  # more steps than an epoch: all of it
        (3, 2, 2),  # --eval_steps wins
        (0, 5, 3),  # at most the split
    ],
)
def test_steps_bound_validation_in_proportion(steps, eval_steps, expected):
    config = configs.RunConfig(steps=steps, eval_steps=eval_steps, batch_size=8)
    splits = data.Splits(
        train=(np.zeros((100, 2)), np.zeros(100)),  # 12 full batches of 8
        test=(np.zeros((20, 2)), np.zeros(20)),  # 3 batches, the last short
        source="synthetic",
        note="",
    )
    assert batching.evaluation_steps(config, splits) == expected


@tf_only
def test_padded_evaluation_is_full_batches_and_exact():
    import tensorflow as tf
    from util import classification_data
    from util import mlp

    x, y = classification_data(n=50)
    split = tf.data.Dataset.from_tensor_slices((x, y))
    padded = batching.padded_evaluation(split, 16)
    shapes = [batch[0].shape[0] for batch in padded]
    assert shapes == [16, 16, 16, 16]  # 50 rows and 14 of padding
    model = mlp()
    model.compile(
        "sgd", "sparse_categorical_crossentropy", weighted_metrics=["accuracy"]
    )
    expected = model.evaluate(x, y, batch_size=50, verbose=0, return_dict=True)
    got = model.evaluate(padded, verbose=0, return_dict=True)
    assert got["loss"] == pytest.approx(expected["loss"], rel=1e-5)
    assert got["accuracy"] == pytest.approx(expected["accuracy"], rel=1e-6)
    # --steps: the first two batches, nothing padded.
    first = batching.padded_evaluation(split, 16, steps=2)
    assert [batch[2].numpy().tolist() for batch in first] == [[1.0] * 16] * 2
    x_padded, _, weights = batching.padded_arrays((x, y), 16)
    assert len(x_padded) == 64 and weights[-14:].tolist() == [0.0] * 14
