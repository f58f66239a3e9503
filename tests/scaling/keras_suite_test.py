"""Keras's own `LossScaleOptimizer` test suite, run against kmp's class:
with default arguments kmp's scaler must pass what Keras asks of its own.

It lives in a file of its own so that a Keras without its tests can skip
this file only, never kmp's tests. With the Keras that the `test` extra
pins, a missing suite is an error (a broken install or a renamed module),
not a skip; with another Keras it is a skip that says so.
"""

from unittest import mock

import keras
from util import keras_own_tests

import kmp
from kmp.scaling import scaled_losses

stock_tests = keras_own_tests("keras.src.optimizers.loss_scale_optimizer_test")


class TestStockKerasBehaviour(stock_tests.LossScaleOptimizerTest):
    """Keras's own LossScaleOptimizer tests, run against kmp's class.

    Two stock tests assert what kmp changes on purpose and are replaced:
    the config has six more keys, and `dynamic=False` is supported.

    Keras's tests hand `apply` gradients they multiplied by the scale
    themselves, with no `scale_loss` call: Keras's contract for a bare
    apply. kmp applies such gradients unscaled, and says so, unless the
    loss was scaled since the last apply (`kmp.scaling.scaled_losses`,
    issue 39), so the suite runs with that decision taken as "scaled";
    `tests/scaling/scaled_losses_test.py` and `loops_test.py` test it.
    """

    def setUp(self):
        super().setUp()
        for patcher in (
            mock.patch.object(
                stock_tests, "LossScaleOptimizer", kmp.LossScaleOptimizer
            ),
            mock.patch.object(
                scaled_losses, "loss_was_unscaled", lambda *_, **__: False
            ),
        ):
            patcher.start()
            self.addCleanup(patcher.stop)

    def test_serialization(self):
        optimizer = kmp.LossScaleOptimizer(
            keras.optimizers.SGD(learning_rate=0.5),
            initial_scale=3.0,
            dynamic_growth_steps=2,
            name="test_opt",
        )
        config = optimizer.get_config()
        self.assertLen(config, 10)
        self.assertEqual(config["name"], "test_opt")
        self.assertEqual(config["initial_scale"], 3.0)
        self.assertEqual(config["dynamic_growth_steps"], 2)
        kmp.LossScaleOptimizer.from_config(config)

    def test_init_dynamic_arg(self):
        inner = keras.optimizers.SGD(learning_rate=0.5)
        self.assertFalse(kmp.LossScaleOptimizer(inner, dynamic=False).dynamic)
