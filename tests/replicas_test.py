"""kmp's scaler with several replicas in one process: every replica
skips a step that overflows on any replica, and clipping acts on the
summed gradients.

tf.distribute.MirroredStrategy on 2 logical CPUs (tests/replicas.py),
keras.distribution.DataParallel on 2 JAX host CPUs
(tests/jax_data_parallel.py), each in a subprocess, since devices must be
set before the framework starts, and on torch, whose Keras backend has no
multi-device fit, the recipe kmp gives instead: DistributedDataParallel
in two gloo processes (tests/torch_ddp.py). The MirroredStrategy
scenarios share one process (the `replicas` fixture). Multi-worker
training is tests/distributed/multi_worker_test.py.
"""

import math
import os

import pytest
from util import HERE
from util import free_ports
from util import jax_only
from util import once_per_session
from util import run_processes
from util import run_script
from util import script_result
from util import tf_only
from util import torch_only

pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def replicas(tmp_path_factory):
    """Every scenario of tests/replicas.py, run once in one process for
    the whole pytest run (both pytest processes read its result)."""
    return once_per_session(
        tmp_path_factory, "replicas", lambda: run_script("replicas.py", "all")
    )


@tf_only
@pytest.mark.parametrize("bad_replica", [0, 1])
def test_one_replica_overflowing_makes_every_replica_skip(
    replicas, bad_replica
):
    out = replicas[f"one_inf kmp {bad_replica}"]
    assert out["weights"] == [[1.0, 1.0], [1.0, 1.0]]
    assert out["scale"] == [2.0, 2.0]
    assert out["skipped"] == [1, 1]


@tf_only
def test_stock_keras_applies_a_step_only_replica_one_overflowed(replicas):
    # The defect kmp fixes: Keras takes `finite` from replica 0's local
    # gradients, so replica 1's inf reaches the weights.
    out = replicas["one_inf stock 1"]
    assert math.isinf(out["weights"][0][0])
    assert out["scale"] == [4.0, 4.0]


@tf_only
def test_tf_keras_loop_unscales_once_on_every_replica(replicas):
    # d(sum v)/dv = 1 on each replica; unscaled once, summed over 2
    # replicas, SGD(1.0) moves v from 1 to -1. Unscaling twice on either
    # replica would leave it above -1.
    out = replicas["tf_keras_loop"]
    assert out["weights"] == [[-1.0, -1.0], [-1.0, -1.0]]


@tf_only
def test_inner_clipping_acts_on_the_aggregated_gradient(replicas):
    # Replica gradients [3, 0] and [0, 4] sum to [3, 4], norm 5; clipped to
    # norm 1 that is [0.6, 0.8]. Stock Keras clips each replica first:
    # [1, 0] + [0, 1] = [1, 1].
    out = replicas["clip kmp"]
    for weights in out["weights"]:
        assert weights == pytest.approx([-0.6, -0.8], abs=1e-6)
    stock = replicas["clip stock"]
    assert stock["weights"][0] == pytest.approx([-1.0, -1.0], abs=1e-6)


@tf_only
def test_distribute_gives_keras_s_own_scaler_replica_agreement(replicas):
    # compile(optimizer="sgd") under mixed_float16 makes Keras's scaler;
    # after kmp.distribute, replica 1's overflow is skipped on both.
    out = replicas["distribute_stock"]
    assert out["optimizer"] == "kmp.scaling.loss_scale_optimizer"
    assert out["unchanged"]
    assert out["scale"] == [2.0**14, 2.0**14]
    assert out["skipped"] == [1, 1]


@tf_only
def test_fit_keeps_replicas_identical_and_learns(replicas):
    out = replicas["fit"]
    loss = out["history"]["loss"]
    assert loss[-1] < loss[0]
    skipped = out["skipped"]
    assert skipped[0] == skipped[1] > 0
    assert out["history"]["skipped_steps"][-1] == skipped[0]
    assert out["scale"][0] == out["scale"][1]
    for replicas_weights in out["weights"]:
        assert replicas_weights[0] == replicas_weights[1]


@tf_only
def test_bfloat16_masters_round_alike_on_every_replica(replicas):
    # Stochastic rounding hashes (seed, step, variable, element): each
    # replica draws the same bits, so the replicas stay one model.
    out = replicas["bfloat16_masters"]
    assert out["optimizer"] == "LowPrecisionAdamW"
    assert out["dtypes"] == ["bfloat16"]
    loss = out["history"]["loss"]
    assert loss[-1] < 0.8 * loss[0]
    for replicas_weights in out["weights"]:
        assert replicas_weights[0] == replicas_weights[1]


@tf_only
def test_int8_state_quantizes_alike_on_every_replica(replicas):
    # Each replica's update of an 8-bit slot draws the same rounding
    # (seed, step, variable, element): codes, scales and the bfloat16
    # weights stay one model's.
    out = replicas["int8_state"]
    assert len(out["codes"]) == 2  # m and v of the 8 x 64 kernel
    loss = out["history"]["loss"]
    assert loss[-1] < 0.8 * loss[0]
    for replicas_values in out["variables"]:
        assert replicas_values[0] == replicas_values[1]


@tf_only
def test_float8_layers_train_alike_on_every_replica(replicas):
    out = replicas["float8_fit"]
    assert out["modes"][0] == "float8"  # Keras's float8, by kmp.float8
    loss = out["history"]["loss"]
    assert loss[-1] < loss[0]
    assert "loss_scale" in out["history"]  # LossScaleMonitor
    # Weights and amax histories agree on both replicas.
    for replicas_weights in out["weights"]:
        assert replicas_weights[0] == replicas_weights[1]
    histories = [
        w[0]
        for w in out["weights"]
        if isinstance(w[0], list) and len(w[0]) == 1024
    ]
    assert histories and any(any(h) for h in histories)


@tf_only
def test_keras_float8_statistics_agree_on_every_replica_with_kmp_s_scaler(
    replicas,
):
    # Each replica computes Keras's float8 scales and amax histories from
    # its own half of the batch; the stock scaler writes those as they
    # are, so a mirrored variable holds different values on the two
    # replicas. kmp's writes their maximum, the global batch's.
    stock = replicas["keras_float8 stock"]["agree"]
    ours = replicas["keras_float8 kmp"]["agree"]
    assert sorted(stock) == sorted(ours) and len(ours) == 12  # 2 layers
    assert not stock["layer 0/inputs_amax_history"]
    assert all(ours.values())


@jax_only
def test_jax_data_parallel_skips_when_one_device_overflows():
    out = run_script("jax_data_parallel.py", backend="jax")
    assert out["devices"] == 2
    assert out["after_bad"] == {
        "weights_unchanged": True,
        "scale": 512.0,
        "skipped": 1,
    }
    assert out["loss"][-1] < out["loss"][0]
    assert out["skipped"] == 1
    assert out["replicas_agree"]


@torch_only
def test_one_rank_overflowing_makes_every_ddp_rank_skip():
    (port,) = free_ports(1)
    script = os.path.join(HERE, "torch_ddp.py")
    outputs = run_processes(
        [[script, str(rank), str(port)] for rank in (0, 1)],
        [{}, {}],
        timeout=240,
        backend="torch",
    )
    ranks = [script_result(out) for out in outputs]
    assert [r["skipped"] for r in ranks] == [1, 1]
    assert [r["iterations"] for r in ranks] == [4, 4]
    assert [r["scale"] for r in ranks] == [512.0, 512.0]
    assert ranks[0]["weights"] == ranks[1]["weights"]
