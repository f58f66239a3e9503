"""The examples' shared plumbing (`kmp.app.recipes`): CPU sizes, data
arguments, evaluation batches."""

import numpy as np
import pytest
from util import tf_only

import kmp_cli
from kmp.app import data
from kmp.app import recipes
from kmp_config import configs


class Seen(Exception):
    """Carries the config a stand-in `train` was called with."""


def _seen_train(config):
    raise Seen(config)


@pytest.mark.backend_independent
@pytest.mark.parametrize("gpu", [False, True])
def test_without_a_gpu_the_sizes_not_given_are_cpu_sizes(
    gpu, monkeypatch, capsys
):
    monkeypatch.setattr(recipes, "has_accelerator", lambda: gpu)
    config = configs.Cifar10Config(batch_size=64)
    with pytest.raises(Seen) as seen:
        recipes.run_and_report(
            "cifar10", "t", config, {"batch_size"}, _seen_train
        )
    trained = seen.value.args[0]
    out = capsys.readouterr().out
    assert trained.batch_size == 64  # given: it wins
    if gpu:
        assert trained == config and out == ""
    else:
        assert trained.width == 16
        assert out == (
            "kmp: no GPU found: width=16 (CPU sizes); pass them to override.\n"
        )


@pytest.mark.backend_independent
def test_devices_are_not_asked_when_every_size_is_given_or_multiworker(
    monkeypatch,
):
    def asked():
        raise AssertionError("listed the devices")

    monkeypatch.setattr(recipes, "has_accelerator", asked)
    config = configs.Cifar10Config(batch_size=64, width=8)
    assert recipes.device_sized(config, {"batch_size", "width"}) == (
        config,
        None,
    )
    # Listing devices would start TensorFlow before the cluster's
    # collective ops are configured.
    multiworker = configs.Cifar10Config(strategy="multiworker")
    assert recipes.device_sized(multiworker) == (multiworker, None)


@pytest.mark.backend_independent
def test_kmp_train_runs_the_example_on_its_cpu_sized_config(
    monkeypatch, capsys
):
    from kmp.examples import imdb

    monkeypatch.setattr(recipes, "has_accelerator", lambda: False)
    monkeypatch.setattr(imdb, "train", _seen_train)
    with pytest.raises(Seen) as seen:
        kmp_cli.main(["train", "imdb", "--d_model=32", "--steps=1"])
    trained = seen.value.args[0]
    assert (trained.d_model, trained.steps) == (32, 1)
    assert (trained.batch_size, trained.sequence_length) == (32, 128)
    assert "no GPU found: batch_size=32, sequence_length=128" in (
        capsys.readouterr().out
    )


@pytest.mark.backend_independent
def test_has_accelerator_is_the_backend_s_first_device():
    from kmp import backend

    expected = backend.list_devices()[0].platform in ("gpu", "tpu")
    assert recipes.has_accelerator() == expected


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
    config = configs.RunConfig(steps=steps, eval_steps=eval_steps, batch_size=8)
    splits = data.Splits(
        train=(np.zeros((100, 2)), np.zeros(100)),  # 12 full batches of 8
        test=(np.zeros((20, 2)), np.zeros(20)),  # 3 batches, the last short
        source="synthetic",
        note="",
    )
    assert recipes.evaluation_steps(config, splits) == expected


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


@pytest.mark.backend_independent
def test_the_summary_says_why_the_monitor_stopped_a_run():
    results = {
        "data": "synthetic",
        "policy": "mixed_float16",
        "replicas": 1,
        "epochs": 1,
        "accuracy": 0.1,
        "final_loss": float("nan"),
        "examples_per_s": 10.0,
        "loss_scale": 1.0,
        "skipped_steps": 100.0,
        "stopped": "kmp: 100 steps in a row had non-finite gradients",
    }
    lines = recipes.summary("cifar10", results).splitlines()
    assert lines[0].endswith("skipped steps 100")
    assert lines[1] == results["stopped"]
    results["stopped"] = None
    assert len(recipes.summary("cifar10", results).splitlines()) == 1
