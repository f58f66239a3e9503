"""A training loop of the user's own, outside `fit`, that never scales its
loss (`kmp.scaling.scaled_losses`): the loops keras-io's guides "Writing a
training loop from scratch" write (`tests/keras_io_loops.py`), on each
backend (TensorFlow eagerly and in a `tf.function`, JAX under `jax.jit`,
PyTorch), under kmp's scaler and under Keras's.

"Trains like float32" is measured as in `scaled_losses_test.py`: the
weights' update after 8 SGD steps from the same initial weights, the
distance between the mixed and the float32 update over the float32
update's length, below 5 %.
"""

import linecache
import logging

import keras
import keras_io_loops
import numpy as np
import pytest

import kmp
from kmp.scaling import scaled_losses

LOOPS = keras_io_loops.loops()
# Small enough that 8 steps on inputs in [0, 255] stay near the start,
# where the float32 and the float16 trajectories can be compared.
LEARNING_RATE = 1e-5


def _update(kind, policy, scale=False, stock=False):
    """The weights' update of `LOOPS[kind]` under `policy`, from the same
    initial weights, with kmp's scaler (`kmp.wrap`: none under float32)
    or Keras's (`stock`)."""
    with kmp.policy_scope(policy):
        keras.utils.set_random_seed(0)
        model = keras_io_loops.get_model()
        before = [keras.ops.convert_to_numpy(v) for v in model.weights]
        sgd = keras.optimizers.SGD(LEARNING_RATE)
        if stock:
            optimizer = keras.optimizers.LossScaleOptimizer(sgd)
        else:
            optimizer = kmp.wrap(sgd)
        after = LOOPS[kind](model, optimizer, scale=scale)
    return np.concatenate(
        [(a - b).astype("float64").ravel() for a, b in zip(after, before)]
    )


def _off(update, reference):
    return np.linalg.norm(update - reference) / np.linalg.norm(reference)


def _told(caplog):
    return [r.message for r in caplog.records if "did not scale" in r.message]


@pytest.mark.parametrize("kind", list(LOOPS))
def test_keras_io_loop_that_never_scales_trains_like_float32(kind, caplog):
    float32 = _update(kind, "float32")
    with caplog.at_level(logging.WARNING, logger="kmp"):
        mixed = _update(kind, "mixed_float16")
    assert _off(mixed, float32) < 0.05
    # Once, though every eager step decided: one line, naming the line
    # of the guide's loop that applies (eagerly, under jax.jit) or that
    # calls the tf.function which does.
    (line,) = _told(caplog)
    where = line.split("kmp: the loop at ")[1].split(" applies ")[0]
    path, number = where.rsplit(":", 1)
    assert path.endswith("keras_io_loops.py")
    code = linecache.getline(path, int(number))
    assert ("apply(" in code) or ("= train_step(" in code), code
    assert "applies 6 gradient(s)" in line  # 3 kernels, 3 biases
    assert "Fix: loss = optimizer.scale_loss(loss)" in line
    assert "can underflow" in line
    assert "\n" not in line
    assert where in scaled_losses.loops_told()


@pytest.mark.parametrize("kind", list(LOOPS))
def test_keras_s_own_scaler_shrinks_a_keras_io_loop_s_update(kind):
    # What the guide's loop gets from stock Keras's scaler: gradients
    # nobody multiplied, divided by 32768.
    float32 = _update(kind, "float32")
    stock = _update(kind, "mixed_float16", stock=True)
    ratio = np.linalg.norm(stock) / np.linalg.norm(float32)
    assert ratio < 1e-3, ratio


@pytest.mark.parametrize("kind", list(LOOPS))
def test_keras_io_loop_that_scales_is_stock_keras_s_to_the_bit(kind, caplog):
    # With the fix's line the loop divides, as Keras's scaler (and kmp's
    # before issue 39) did: the same bits, and nothing said.
    with caplog.at_level(logging.WARNING, logger="kmp"):
        ours = _update(kind, "mixed_float16", scale=True)
    assert not _told(caplog)
    stock = _update(kind, "mixed_float16", scale=True, stock=True)
    np.testing.assert_array_equal(ours, stock)
    # (Not float32's update: on the guides' pixels in [0, 255] the scaled
    # loss's first gradients overflow float16, and the scale backs off
    # over the first steps, which are skipped.)
