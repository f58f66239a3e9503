"""Where the replicas are (`kmp.app.scale_out`): strategies on
TensorFlow, keras.distribution on JAX and its processes, each process's
share of the data."""

import math

import keras
import numpy as np
import pytest
from util import jax_only
from util import run_script
from util import tf_only
from util import torch_only

import kmp
from kmp import backend
from kmp.app import scale_out
from kmp_config import configs


@pytest.mark.backend_independent
def test_no_strategy_is_none():
    assert scale_out.make_strategy("none") is None
    with scale_out.scope(None):
        pass


@jax_only
def test_on_jax_a_strategy_is_refused_naming_the_distribution():
    for name in ("mirrored", "multiworker"):
        with pytest.raises(ValueError, match="--distribution=data"):
            scale_out.make_strategy(name)


@pytest.mark.parametrize("name", ["data", "model"])
def test_a_distribution_off_jax_is_refused_naming_the_strategy(name):
    config = configs.ImdbConfig(distribution=name)
    if keras.backend.backend() == "jax":
        pytest.skip("JAX runs it (tests/jax_distribution.py)")
    with pytest.raises(ValueError, match="keras.distribution, which runs on"):
        scale_out.make_distribution(config)
    if keras.backend.backend() == "tensorflow":
        with pytest.raises(ValueError, match="--strategy=mirrored"):
            scale_out.make_distribution(config)


def test_a_strategy_and_a_distribution_together_are_refused():
    config = configs.ImdbConfig(strategy="mirrored", distribution="data")
    assert "two engines" in config.problem()


@pytest.mark.slow
@jax_only
@pytest.mark.parametrize("name", ["data", "model"])
def test_the_examples_train_under_keras_distribution_on_4_devices(name):
    out = run_script("jax_distribution.py", name, backend="jax")
    imdb, cifar = out["imdb"], out["cifar10"]
    for run in (imdb, cifar):
        assert len(run["losses"]) == 2
        assert all(map(math.isfinite, run["losses"]))
    assert cifar["loss_scale"] == 2.0**15  # kmp's scaler, float16
    if name == "data":  # the batch over all 4, every kernel whole
        assert imdb["replicas"] == cifar["replicas"] == 4
        assert imdb["query_parts"] == imdb["ffn_up_parts"] == 1
        assert imdb["ffn_up_codes"] == []  # float32 state
    else:  # a 2 x 2 mesh: the batch over 2, the kernels in 2 parts
        assert imdb["replicas"] == cifar["replicas"] == 2
        assert imdb["query_parts"] == imdb["ffn_up_parts"] == 2
        assert imdb["ffn_down_parts"] == 2
        # 8-bit AdamW state: each slot's codes split as their kernel,
        # saved and loaded under the mesh.
        assert imdb["ffn_up_codes"] == [["int8", 2], ["int8", 2]]
    batch_axis = 4 if name == "data" else 2
    shape = "(4,)" if name == "data" else "(2, 2)"
    (seen,) = out["audit"]  # kmp.audit reports the mesh it sees
    assert f"mesh of shape {shape}" in seen
    assert f"split over {batch_axis} device(s)" in seen
    assert out["batch_7"] == (
        f"--batch_size=7 does not split over the {batch_axis} devices of "
        f"the mesh's batch axis: use a multiple of {batch_axis}."
    )
    if name == "data":
        return
    # kmp's parts under the 2 x 2 mesh, on a pinned kmp.float8 model with
    # a sharded hidden kernel.
    parts = out["parts"]
    assert parts["hidden_parts"] == 2
    histories = parts["float8_histories"]
    assert len(histories) == 6  # 2 float8 layers x 3 operands; head kept
    for history in histories.values():
        assert history["devices"] == 4 and history["identical"]
    # The global batch's largest input (100, in the last device's rows)
    # is in every device's history.
    assert histories["sequential_1/first/inputs_amax_history"]["largest"] == 100
    # kmp.float8's default on JAX, kmp's own matmul, trains on the mesh.
    own = parts["kmp_matmul"]
    assert own["class"] == "kmp.fp8.scaled_layers"
    assert all(np.isfinite(own["losses"])) and own["hidden_parts"] == 2
    assert parts["diagnosed_layers"] == 3
    # JAX's islands on a GPT-2 split over the mesh (its position
    # embedding, 2 GELUs, 6 projections, 2 decoders): the kernels keep
    # their split and the losses are the islands-free model's to bfloat16
    # rounding (6e-6 apart here; the projections' heads taken in reverse
    # order: 3e-3).
    # Exact values and gradients: tests/model_zoo_test.py, one device.
    gpt2 = parts["gpt2"]
    assert gpt2["islands"]["islands"] == gpt2["undone"]["islands"] == 11
    assert gpt2["islands"]["query_parts"] == gpt2["undone"]["query_parts"] == 2
    np.testing.assert_allclose(
        gpt2["islands"]["losses"], gpt2["undone"]["losses"], rtol=1e-4
    )
    assert parts["audit_sharded"] == []
    (uneven, where), (placed, problem) = parts["audit_early"]
    assert uneven == "sequential/odd/kernel"
    assert "dimension 1 (3) does not split over the 2 devices" in where
    assert placed == "environment"
    assert "built before keras.distribution.set_distribution" in problem


@torch_only
def test_torch_has_no_strategy_and_says_so():
    for name in ("mirrored", "multiworker"):
        with pytest.raises(ValueError, match="no multi-device fit"):
            scale_out.make_strategy(name)


def as_process(monkeypatch, process, count):
    """Makes kmp see this process as `process` of `count`."""
    monkeypatch.setattr(backend, "processes", lambda: (process, count))


@pytest.mark.backend_independent
def test_one_process_feeds_all_of_its_data():
    x, y = np.arange(10.0), np.arange(10)
    assert scale_out.process_share((x, y), 4) == (x, y)
    assert scale_out.local_batch_size(4) == 4


@pytest.mark.backend_independent
def test_each_process_feeds_its_part_of_every_global_batch(monkeypatch):
    x = {"tokens": np.arange(20).reshape(10, 2)}
    y, weights = np.arange(10), np.ones(10)
    shares = []
    for process in (0, 1):
        as_process(monkeypatch, process, 2)
        assert scale_out.local_batch_size(4) == 2
        shares.append(scale_out.process_share((x, y, weights), 4))
    # Global batches [0..3] and [4..7]; rows 8 and 9 make no whole batch.
    assert shares[0][1].tolist() == [0, 1, 4, 5]
    assert shares[1][1].tolist() == [2, 3, 6, 7]
    assert shares[1][0]["tokens"].tolist() == [
        [4, 5],
        [6, 7],
        [12, 13],
        [14, 15],
    ]
    assert len(shares[1][2]) == 4


@tf_only
def test_a_dataset_is_rebatched_and_sharded_alike(monkeypatch):
    import tensorflow as tf

    dataset = tf.data.Dataset.range(8).batch(4)
    seen = []
    for process in (0, 1):
        as_process(monkeypatch, process, 2)
        share = scale_out.process_share(dataset, 4)
        seen.append([batch.tolist() for batch in share.as_numpy_iterator()])
    assert seen == [[[0, 1], [4, 5]], [[2, 3], [6, 7]]]


@pytest.mark.backend_independent
def test_fit_arguments_give_each_process_its_rows_and_batch(monkeypatch):
    as_process(monkeypatch, 1, 2)
    data = (np.arange(8.0), np.arange(8))
    (x, y), kwargs = scale_out.fit_arguments(data, 4)
    assert y.tolist() == [2, 3, 6, 7]
    assert kwargs == {"batch_size": 2}


@pytest.mark.backend_independent
def test_fit_arguments_pass_datasets_as_is_and_batch_arrays():
    x, y = np.zeros((4, 2)), np.zeros(4)
    args, kwargs = scale_out.fit_arguments((x, y), 2)
    assert args == (x, y) and kwargs == {"batch_size": 2}
    # A dataset shuffles in its pipeline: fit must not try (and warn).
    assert scale_out.fit_arguments("dataset", 2) == (
        ("dataset",),
        {"shuffle": False},
    )


@pytest.mark.backend_independent
def test_the_layout_is_the_config_s_and_must_split(monkeypatch):
    mesh = type(
        "Mesh", (), {"shape": (2, 2), "axis_names": ("batch", "model")}
    )()
    made = {}
    monkeypatch.setattr(keras.distribution, "LayoutMap", lambda m: made)
    layout = scale_out.layout_map(configs.ImdbConfig(heads=4, d_model=64), mesh)
    assert layout[r"ffn_up_\d+/kernel"] == (None, "model")
    assert len(layout) == 4
    with pytest.raises(ValueError, match="--heads=3 and --d_model=63 must"):
        scale_out.layout_map(configs.ImdbConfig(heads=3, d_model=63), mesh)
    with pytest.raises(ValueError, match="use --distribution=data"):
        scale_out.layout_map(configs.LmConfig(), mesh)


@pytest.mark.backend_independent
def test_one_process_joins_nothing(monkeypatch):
    monkeypatch.delenv("KERAS_DISTRIBUTION_JOB_ADDRESSES", raising=False)
    assert scale_out.start_processes(configs.ImdbConfig()) == (0, 1)


@pytest.mark.backend_independent
def test_keras_environment_without_a_distribution_is_refused(monkeypatch):
    monkeypatch.setenv("KERAS_DISTRIBUTION_JOB_ADDRESSES", "h:1,h2:1")
    with pytest.raises(kmp.InputError, match="needs --distribution=data"):
        scale_out.start_processes(configs.ImdbConfig())


@pytest.mark.backend_independent
@pytest.mark.parametrize(
    "flags, phrase",
    [
        ({"coordinator": "h:1"}, "need --distribution=data or model"),
        ({"num_processes": 2}, "need --distribution=data or model"),
        (
            {"distribution": "data", "num_processes": 2, "process_id": 2},
            "the ids are 0..num_processes-1",
        ),
        (
            {"distribution": "data", "process_timeout": 0.0},
            "process_timeout must be > 0",
        ),
    ],
)
def test_process_flags_are_checked_before_keras_loads(flags, phrase):
    assert phrase in configs.ImdbConfig(**flags).problem()
