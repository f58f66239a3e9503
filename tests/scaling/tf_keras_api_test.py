"""tf-keras's `get_scaled_loss` / `get_unscaled_gradients` on
kmp.LossScaleOptimizer (`kmp.scaling._tf_keras_api`). The same API in a custom
GradientTape loop: loss_scale_optimizer_test.py; on two replicas:
replicas_test.py."""

import keras
import numpy as np
from keras import ops

import kmp


def test_tf_keras_migration_api_does_not_unscale_twice():
    opt = kmp.LossScaleOptimizer(keras.optimizers.SGD(1.0), initial_scale=8)
    v = keras.Variable([0.0, 0.0])
    opt.build([v])
    loss = ops.convert_to_tensor(2.0)
    assert float(opt.get_scaled_loss(loss)) == 16.0
    assert float(opt.get_scaled_loss(lambda: loss)()) == 16.0
    scaled = [ops.convert_to_tensor([8.0, 16.0])]
    unscaled = opt.get_unscaled_gradients(scaled)
    np.testing.assert_array_equal(ops.convert_to_numpy(unscaled[0]), [1, 2])
    opt.apply_gradients(zip(unscaled, [v]))  # tf-keras loop
    np.testing.assert_array_equal(v.numpy(), [-1.0, -2.0])
    opt.scale_loss(loss)  # Keras 3 loop: scales, and apply unscales
    opt.apply_gradients(zip(scaled, [v]))
    np.testing.assert_array_equal(v.numpy(), [-2.0, -4.0])


def test_only_the_very_tensors_returned_skip_the_division():
    # Equal values computed anew are Keras 3 gradients: divided as usual.
    opt = kmp.LossScaleOptimizer(keras.optimizers.SGD(1.0), initial_scale=8)
    v = keras.Variable([0.0, 0.0])
    opt.build([v])
    unscaled = opt.get_unscaled_gradients([ops.convert_to_tensor([8.0, 8.0])])
    copy = [ops.convert_to_tensor(np.array([1.0, 1.0], "float32"))]
    opt.scale_loss(1.0)  # a Keras 3 loop's
    opt.apply_gradients(zip(copy, [v]))
    np.testing.assert_array_equal(v.numpy(), [-0.125, -0.125])
    # The pending tensors were forgotten by that apply: now they divide.
    opt.scale_loss(1.0)
    opt.apply_gradients(zip(unscaled, [v]))
    np.testing.assert_array_equal(v.numpy(), [-0.25, -0.25])
