"""kmp's loss scaler with several replicas: tf.distribute.MirroredStrategy
on 2 logical CPUs, and keras.distribution.DataParallel on 2 JAX host CPUs.

Each scenario runs in a subprocess (tests/replicas.py,
tests/jax_data_parallel.py), since devices must be configured before the
framework initialises.
"""

import json
import math
import os
import subprocess
import sys

import pytest
from util import jax_only
from util import tf_only

HERE = os.path.dirname(__file__)


def _run(*args, script="replicas.py", backend="tensorflow"):
    result = subprocess.run(
        [sys.executable, os.path.join(HERE, script), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, KERAS_BACKEND=backend),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    line = [x for x in result.stdout.splitlines() if x.startswith("RESULT ")]
    return json.loads(line[-1][len("RESULT ") :])


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
