"""`kmp.distribute` and `kmp.multi_worker_strategy` with 2 worker
processes on 127.0.0.1 (MultiWorkerMirroredStrategy).

Each job runs tests/distributed/workers.py (or the CIFAR-10 example) as
two subprocesses, since TF_CONFIG must be set before TensorFlow starts;
every subprocess has a time limit. The `fit`, `overflow` and `shard`
scenarios share one 2-worker job (the `cluster` fixture).
"""

import json
import os
import re
import subprocess
import sys

import pytest
from util import free_ports
from util import once_per_session
from util import run_processes
from util import script_result
from util import tf_only

pytestmark = [pytest.mark.slow, tf_only]

HERE = os.path.dirname(os.path.abspath(__file__))


def _workers(scenario, workdir, count=2, timeout=300):
    """Runs tests/distributed/workers.py as `count` workers on
    127.0.0.1; returns each one's result."""
    ports = free_ports(2)
    script = os.path.join(HERE, "workers.py")
    outputs = run_processes(
        [
            [script, scenario, str(i), *map(str, ports), str(workdir)]
            for i in range(count)
        ],
        [{}] * count,
        timeout,
    )
    return [script_result(out) for out in outputs]


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    """Both workers' results of the `fit`, `overflow` and `shard`
    scenarios, from one 2-worker job for the pytest run (both pytest
    processes read them)."""
    return once_per_session(
        tmp_path_factory,
        "multi_worker",
        lambda: _workers("all", tmp_path_factory.mktemp("workers")),
    )


def test_multi_worker_fit_trains_identically_on_both_workers(cluster):
    workers = [worker["fit"] for worker in cluster]
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


@pytest.mark.parametrize(
    "optimizer, initial_scale",
    [("kmp", 512.0), ("keras", 512.0), ("plain", 2.0**15), ("name", 2.0**15)],
)
def test_multi_worker_overflow_on_one_worker_makes_both_skip(
    cluster, optimizer, initial_scale
):
    # Whatever `compile` was given: kmp's scaler, Keras's given explicitly,
    # or a plain optimizer (object or name) that Keras wrapped in its own.
    # With Keras's scaler, both workers waited here forever.
    first, second = (worker["overflow"][optimizer] for worker in cluster)
    for out in (first, second):
        assert out["optimizer"] == "kmp.scaling.loss_scale_optimizer"
        assert out["skipped"] == 1
        assert out["scale"] == initial_scale / 2
        assert out["digest"] == out["initial"]  # no weight moved
    assert first["digest"] == second["digest"]


def test_multi_worker_sharding_shows_each_example_once_per_epoch(cluster):
    first, second = (worker["shard"] for worker in cluster)
    # Datasets are sharded by TensorFlow; arrays by kmp's agreed shuffle
    # (stock Keras gave 29 of 96 examples to both workers).
    for source in ("dataset", "arrays"):
        for mine, theirs in zip(first[source], second[source]):
            assert not set(mine) & set(theirs)
            assert sorted(mine + theirs) == list(range(96))
        assert first[source][0] != first[source][1]  # reshuffled


@pytest.mark.parametrize("how", ["kill", "stop"])
def test_a_lost_worker_ends_the_job_with_an_error_not_a_hang(how):
    # TensorFlow's coordination service (which MultiWorkerMirroredStrategy
    # turns on) aborts the collectives: a killed peer's connection fails
    # at once, a frozen peer misses its heartbeats (10 s). Measured on
    # 127.0.0.1: 0.1 s and 10.1 s after the last step.
    ports = free_ports(2)
    script = os.path.join(HERE, "workers.py")
    procs = [
        subprocess.Popen(
            [sys.executable, script, "lost", str(i), *map(str, ports), how],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=dict(os.environ, KERAS_BACKEND="tensorflow"),
        )
        for i in range(2)
    ]
    try:
        out, _ = procs[0].communicate(timeout=180)
    finally:
        for p in procs:
            p.kill()  # worker 1 is dead or frozen: SIGKILL either way
    result = script_result(out)
    assert result["error"] == "UnavailableError", result
    assert result["seconds"] < 30


def test_cifar10_example_trains_on_two_workers(tmp_path):
    ports = free_ports(2)
    workers = [f"127.0.0.1:{port}" for port in ports]
    example = os.path.join(HERE, os.pardir, os.pardir, "examples", "cifar10.py")
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
    outputs = run_processes([[example, *flags]] * 2, envs, timeout=240)
    # The same summary on both workers, timings aside; the chief alone
    # writes the files, and says so last.
    summaries = [
        re.sub(r"\d+ examples/s", "", line)
        for out in outputs
        for line in out.splitlines()
        if "replica(s)" in line
    ]
    assert len(summaries) == 2 and summaries[0] == summaries[1]
    assert "2 replica(s)" in summaries[0]
    wrote = [
        [line for line in out.splitlines() if line.startswith("wrote ")]
        for out in outputs
    ]
    assert len(wrote[0]) == 3 and wrote[1] == []
    assert sorted(os.listdir(tmp_path)) == [
        "cifar10.keras",
        "results.json",
        "results.png",
    ]
