"""The active distribution and the reductions over replicas
(`kmp.backend.distribution`) outside a multi-replica run; under
`tf.distribute`: tf_replicas_test.py and replicas_test.py."""

import keras
from keras import ops

from kmp import backend


def test_no_distribution_is_none_and_a_keras_one_is_named():
    assert backend.distribution_name() is None
    if backend.name() != "jax":
        return  # keras.distribution runs on JAX only
    keras.distribution.set_distribution(keras.distribution.DataParallel())
    assert backend.distribution_name() == "DataParallel"


def test_one_replica_agrees_with_itself_and_sums_nothing():
    flag = ops.convert_to_tensor(False)
    assert not bool(backend.all_replicas_agree(flag))
    grads = [ops.convert_to_tensor([1.0, 3.0])]
    summed, replicas = backend.sum_over_replicas(grads)
    assert replicas == 1
    assert ops.convert_to_numpy(summed[0]).tolist() == [1.0, 3.0]


def test_outside_several_replicas_the_maximum_is_the_value_itself():
    values = [ops.convert_to_tensor([1.0, 5.0]), ops.convert_to_tensor(2.0)]
    out = backend.max_over_replicas(values)
    assert [ops.convert_to_numpy(v).tolist() for v in out] == [[1.0, 5.0], 2.0]
