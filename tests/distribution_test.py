"""kmp with several replicas: tf.distribute.MirroredStrategy on 2 logical
CPUs, MultiWorkerMirroredStrategy with 2 worker processes on 127.0.0.1,
and keras.distribution.DataParallel on 2 JAX host CPUs.

Each scenario runs in subprocesses (tests/replicas.py, tests/workers.py,
tests/jax_data_parallel.py), since devices and TF_CONFIG must be set
before the framework initialises. Every subprocess has a time limit.
"""

import json
import math
import os
import re
import socket
import subprocess
import sys
import time

import pytest
from util import jax_only
from util import tf_only

HERE = os.path.dirname(__file__)


def _result(stdout):
    line = [x for x in stdout.splitlines() if x.startswith("RESULT ")]
    return json.loads(line[-1][len("RESULT ") :])


def _run(*args, script="replicas.py", backend="tensorflow"):
    result = subprocess.run(
        [sys.executable, os.path.join(HERE, script), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, KERAS_BACKEND=backend),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return _result(result.stdout)


def _free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def _workers(scenario, tmp_path, count=2, timeout=240):
    """Runs tests/workers.py as `count` MultiWorkerMirroredStrategy
    workers on 127.0.0.1; returns each one's result."""
    ports = _free_ports(2)
    script = os.path.join(HERE, "workers.py")
    outputs = _processes(
        [
            [script, scenario, str(i), *map(str, ports), str(tmp_path)]
            for i in range(count)
        ],
        [{}] * count,
        timeout,
    )
    return [_result(out) for out in outputs]


def _processes(argvs, envs, timeout):
    """Runs Python processes side by side; returns their stdouts."""
    procs = [
        subprocess.Popen(
            [sys.executable, *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=dict(os.environ, KERAS_BACKEND="tensorflow", **env),
        )
        for argv, env in zip(argvs, envs)
    ]
    try:
        outputs = [p.communicate(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            p.kill()
    for p, (_, err) in zip(procs, outputs):
        assert p.returncode == 0, err[-3000:]
    return [out for out, _ in outputs]


@tf_only
@pytest.mark.parametrize("bad_replica", [0, 1])
def test_one_replica_overflowing_makes_every_replica_skip(bad_replica):
    out = _run("one_inf", "kmp", bad_replica)
    assert out["weights"] == [[1.0, 1.0], [1.0, 1.0]]
    assert out["scale"] == [2.0, 2.0]
    assert out["skipped"] == [1, 1]


@tf_only
def test_stock_keras_applies_a_step_only_replica_one_overflowed():
    # The defect kmp fixes: Keras takes `finite` from replica 0's local
    # gradients, so replica 1's inf reaches the weights.
    out = _run("one_inf", "stock", 1)
    assert math.isinf(out["weights"][0][0])
    assert out["scale"] == [4.0, 4.0]


@tf_only
def test_tf_keras_loop_unscales_once_on_every_replica():
    # d(sum v)/dv = 1 on each replica; unscaled once, summed over 2
    # replicas, SGD(1.0) moves v from 1 to -1. Unscaling twice on either
    # replica would leave it above -1.
    out = _run("tf_keras_loop")
    assert out["weights"] == [[-1.0, -1.0], [-1.0, -1.0]]


@tf_only
def test_inner_clipping_acts_on_the_aggregated_gradient():
    # Replica gradients [3, 0] and [0, 4] sum to [3, 4], norm 5; clipped to
    # norm 1 that is [0.6, 0.8]. Stock Keras clips each replica first:
    # [1, 0] + [0, 1] = [1, 1].
    out = _run("clip", "kmp")
    for weights in out["weights"]:
        assert weights == pytest.approx([-0.6, -0.8], abs=1e-6)
    stock = _run("clip", "stock")
    assert stock["weights"][0] == pytest.approx([-1.0, -1.0], abs=1e-6)


@tf_only
def test_fit_keeps_replicas_identical_and_learns():
    out = _run("fit")
    loss = out["history"]["loss"]
    assert loss[-1] < loss[0]
    skipped = out["skipped"]
    assert skipped[0] == skipped[1] > 0
    assert out["history"]["skipped_steps"][-1] == skipped[0]
    assert out["scale"][0] == out["scale"][1]
    for replicas in out["weights"]:
        assert replicas[0] == replicas[1]


@jax_only
def test_jax_data_parallel_skips_when_one_device_overflows():
    out = _run(script="jax_data_parallel.py", backend="jax")
    assert out["devices"] == 2
    assert out["after_bad"] == {
        "weights_unchanged": True,
        "scale": 512.0,
        "skipped": 1,
    }
    assert out["loss"][-1] < out["loss"][0]
    assert out["skipped"] == 1
    assert out["replicas_agree"]


@tf_only
def test_multi_worker_fit_trains_identically_on_both_workers(tmp_path):
    workers = _workers("fit", tmp_path)
    # The Keras defect: stock fit fails at the first batch.
    for out in workers:
        assert "PerReplica" in out["stock_error"]
    first, second = workers
    # Bitwise-identical weights, scale and logs on both workers.
    for key in ("digest", "scale", "skipped", "history", "after"):
        assert first[key] == second[key], key
    history = first["history"]
    assert history["loss"][-1] < history["loss"][0]
    assert first["after"]["loss"] < first["before"]["loss"]
    assert history["loss_scale"] == [512.0] * 3
    assert {"val_loss", "val_accuracy", "skipped_steps"} <= set(history)
    # predict gathers both workers' shards: all 64 validation examples.
    assert first["predictions"] == [64, 4]
    # ModelCheckpoint and BackupAndRestore wrote on the chief only.
    assert first["files"] == ["backup", "private0", "worker0.keras"]
    assert first["backup"] == ["latest.weights.h5", "training_metadata.json"]
    # A restarted job resumed from the chief's backup at epoch 3 of 5.
    assert first["resumed_epochs"] == second["resumed_epochs"] == 2
    assert first["resumed_digest"] == second["resumed_digest"]
    # A backup only one worker can read, and a batch of 33 over 2 replicas.
    for out in workers:
        assert "holds a backup for 1 of 2 replicas" in out["private_backup"]
        assert "batch_size is 33" in out["odd_batch"]


@tf_only
def test_multi_worker_overflow_on_one_worker_makes_both_skip(tmp_path):
    first, second = _workers("overflow", tmp_path)
    for out in (first, second):
        assert out["skipped"] == 1
        assert out["scale"] == 256.0
        assert out["digest"] == out["initial"]  # no weight moved
    assert first["digest"] == second["digest"]


@tf_only
def test_multi_worker_sharding_shows_each_example_once_per_epoch(tmp_path):
    first, second = _workers("shard", tmp_path)
    # Datasets are sharded by TensorFlow; arrays by kmp's agreed shuffle
    # (stock Keras gave 29 of 96 examples to both workers).
    for source in ("dataset", "arrays"):
        for mine, theirs in zip(first[source], second[source]):
            assert not set(mine) & set(theirs)
            assert sorted(mine + theirs) == list(range(96))
        assert first[source][0] != first[source][1]  # reshuffled


@tf_only
def test_a_worker_that_never_comes_up_is_a_timeout_error(tmp_path):
    start = time.monotonic()
    (out,) = _workers("absent", tmp_path, count=1, timeout=120)
    assert "did not come up" in out["error"]
    assert "127.0.0.1" in out["error"]
    assert time.monotonic() - start < 60


@tf_only
def test_cifar10_example_trains_on_two_workers(tmp_path):
    ports = _free_ports(2)
    workers = [f"127.0.0.1:{port}" for port in ports]
    example = os.path.join(HERE, os.pardir, "examples", "cifar10.py")
    flags = [
        "--strategy=multiworker",
        "--data=synthetic",
        "--synthetic_size=256",
        "--width=8",
        "--epochs=1",
        "--steps=3",
        "--batch_size=32",
        "--verbose=0",
        f"--output_dir={tmp_path}",
    ]
    envs = [
        {
            "TF_CONFIG": json.dumps(
                {
                    "cluster": {"worker": workers},
                    "task": {"type": "worker", "index": index},
                }
            )
        }
        for index in range(2)
    ]
    outputs = _processes([[example, *flags]] * 2, envs, timeout=240)
    # The same logs on both workers, timings aside.
    summaries = [
        re.sub(r"\d+ examples/s", "", out.strip().splitlines()[-1])
        for out in outputs
    ]
    assert summaries[0] == summaries[1]
    assert "2 replica(s)" in summaries[0]
    assert sorted(os.listdir(tmp_path)) == [
        "cifar10.keras",
        "results.json",
        "results.png",
    ]
