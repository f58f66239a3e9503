"""The examples' shared plumbing: config flags, strategies, data args."""

import dataclasses

import keras
import numpy as np
import pytest
from absl import flags
from util import jax_only
from util import tf_only
from util import torch_only

from kmp.app import data
from kmp.app import recipes


@dataclasses.dataclass
class Config(recipes.RunConfig):
    width: int = recipes.flag(8, "Width.", lower_bound=8)
    rate: float = recipes.flag(0.5, "A rate.")


@pytest.mark.backend_independent
def test_flags_are_defined_from_the_fields():
    values = flags.FlagValues()
    recipes.define_flags(Config, values)
    values(["prog", "--width=16", "--rate=0.25", "--policy=float32"])
    config = recipes.config_from_flags(Config, values)
    assert (config.width, config.rate, config.policy) == (16, 0.25, "float32")
    assert config.epochs == 10 and config.data == "auto"
    with pytest.raises(flags.IllegalFlagValueError):
        values(["prog", "--width=4"])
    with pytest.raises(flags.IllegalFlagValueError):
        values(["prog", "--strategy=tpu"])


@pytest.mark.backend_independent
@pytest.mark.parametrize(
    "changes, message",
    [
        ({"width": 4}, "width must be >= 8, got 4"),
        ({"policy": "fp16"}, "policy must be one of auto, float32"),
        ({"learning_rate": -1.0}, "learning_rate must be > 0"),
        ({"verbose": -1}, "verbose must be >= 0"),
    ],
)
def test_check_names_the_bad_field(changes, message):
    with pytest.raises(ValueError, match=message):
        Config(**changes).check()
    assert Config().check() == Config()


@pytest.mark.backend_independent
def test_fit_data_passes_datasets_as_is_and_batches_arrays():
    x, y = np.zeros((4, 2)), np.zeros(4)
    args, kwargs = recipes.fit_data((x, y), 2)
    assert args == (x, y) and kwargs == {"batch_size": 2}
    # A dataset shuffles in its pipeline: fit must not try (and warn).
    assert recipes.fit_data("dataset", 2) == (("dataset",), {"shuffle": False})
    assert recipes.split_size((x, y)) == 4


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
    config = recipes.RunConfig(steps=steps, eval_steps=eval_steps, batch_size=8)
    splits = data.Splits(
        train=(np.zeros((100, 2)), np.zeros(100)),  # 12 full batches of 8
        test=(np.zeros((20, 2)), np.zeros(20)),  # 3 batches, the last short
        source="synthetic",
        note="",
    )
    assert recipes.evaluation_steps(config, splits) == expected


@pytest.mark.backend_independent
def test_no_strategy_is_none():
    assert recipes.make_strategy("none") is None
    with recipes.scope(None):
        pass


@jax_only
def test_jax_mirrored_is_data_parallel_and_multiworker_is_refused():
    assert recipes.make_strategy("mirrored") is None
    assert isinstance(
        keras.distribution.distribution(), keras.distribution.DataParallel
    )
    with pytest.raises(ValueError, match="needs KERAS_BACKEND=tensorflow"):
        recipes.make_strategy("multiworker")


@torch_only
def test_torch_has_no_strategy_and_says_so():
    for name in ("mirrored", "multiworker"):
        with pytest.raises(ValueError, match="no multi-device fit"):
            recipes.make_strategy(name)


@tf_only
def test_padded_evaluation_is_full_batches_and_exact():
    import tensorflow as tf
    from util import classification_data
    from util import mlp

    x, y = classification_data(n=50)
    split = tf.data.Dataset.from_tensor_slices((x, y))
    padded = recipes.padded_evaluation(split, 16)
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
    first = recipes.padded_evaluation(split, 16, steps=2)
    assert [batch[2].numpy().tolist() for batch in first] == [[1.0] * 16] * 2
    x_padded, _, weights = recipes.padded_arrays((x, y), 16)
    assert len(x_padded) == 64 and weights[-14:].tolist() == [0.0] * 14
