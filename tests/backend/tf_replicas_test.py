"""Replicas under tf.distribute (`kmp.backend._tf_replicas`, through
`kmp.backend`) with one replica or none: nothing to agree on or sum.
Two replicas are tests/replicas_test.py (devices must be set before
TensorFlow starts, so they run in a process of their own)."""

import numpy as np
from keras import ops
from util import tf_only

from kmp import backend


def _check_pass_through():
    flag = ops.convert_to_tensor(False)
    assert backend.all_replicas_agree(flag) is flag
    grads = [ops.ones((2,)), None]
    summed, replicas = backend.sum_over_replicas(grads)
    assert replicas == 1 and summed[1] is None
    np.testing.assert_array_equal(ops.convert_to_numpy(summed[0]), [1, 1])


def test_outside_a_strategy_there_is_one_replica():
    _check_pass_through()


@tf_only
def test_a_one_replica_strategy_passes_through():
    import tensorflow as tf

    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    strategy.run(_check_pass_through)
