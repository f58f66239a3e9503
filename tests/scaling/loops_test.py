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

import functools
import linecache
import logging

import keras
import keras_io_loops
import numpy as np
import pytest
from util import tf_only

import kmp
from kmp import backend
from kmp.scaling import scaled_losses

LOOPS = keras_io_loops.loops()
# Small enough that 8 steps on inputs in [0, 255] stay near the start,
# where the float32 and the float16 trajectories can be compared.
LEARNING_RATE = 1e-5


@functools.cache
def _float32_update(kind):
    """`_update` under float32, which three tests compare with (the same
    weights each time: computed once)."""
    return _update(kind, "float32")


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
    float32 = _float32_update(kind)
    with caplog.at_level(logging.WARNING, logger="kmp"):
        mixed = _update(kind, "mixed_float16")
    assert _off(mixed, float32) < 0.05
    # Once, though every eager step decided: one line, naming the line
    # of the guide's loop that applies (in a tf.function too, whose body
    # autograph rewrote into another file).
    (line,) = _told(caplog)
    where = line.split("kmp: the loop at ")[1].split(" applies ")[0]
    path, number = where.rsplit(":", 1)
    assert path.endswith("keras_io_loops.py")
    assert "optimizer." in linecache.getline(path, int(number))
    assert "applies 6 gradient(s)" in line  # 3 kernels, 3 biases
    # The form of this loop's backend (stateless_apply: the scale of the
    # state), the loss kept to log, not rebound.
    fix = {
        "jax": "Fix: in the function whose gradients you take, return "
        "optimizer.stateless_scale_loss(optimizer_variables, loss), with "
        "loss itself in its aux to log",
        "tensorflow": "Fix: scaled_loss = optimizer.scale_loss(loss) inside "
        "the GradientTape, and tape.gradient(scaled_loss, ...)",
        "torch": "Fix: optimizer.scale_loss(loss).backward() instead of "
        "loss.backward()",
    }[backend.name()]
    assert fix in line
    assert "can underflow" in line
    assert "\n" not in line
    assert where in scaled_losses.loops_told()


@pytest.mark.parametrize("kind", list(LOOPS))
def test_keras_s_own_scaler_shrinks_a_keras_io_loop_s_update(kind):
    # What the guide's loop gets from stock Keras's scaler: gradients
    # nobody multiplied, divided by 32768.
    float32 = _float32_update(kind)
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


def _gan_update(policy):
    """Both networks' updates by the TensorFlow guide's GAN loop (two
    optimizers in one tf.function), pinned: the guide concatenates the
    generator's output with float32 images, which float16 output fails."""
    with kmp.policy_scope(policy):
        keras.utils.set_random_seed(0)
        nets = [
            kmp.pin_float32(n) for n in keras_io_loops.gan_networks(width=16)
        ]
        before = [_flat(n.weights) for n in nets]
        keras_io_loops.tensorflow_gan_loop(
            *nets,
            kmp.wrap(keras.optimizers.SGD(0.01)),
            kmp.wrap(keras.optimizers.SGD(0.01)),
        )
    return [_flat(n.weights) - b for n, b in zip(nets, before)]


def _flat(weights):
    arrays = [keras.ops.convert_to_numpy(w) for w in weights]
    return np.concatenate([a.astype("float64").ravel() for a in arrays])


@tf_only
def test_keras_io_gan_loop_trains_like_float32_and_names_each_apply(caplog):
    float32 = _gan_update("float32")
    with caplog.at_level(logging.WARNING, logger="kmp"):
        mixed = _gan_update("mixed_float16")
    for net, reference in zip(mixed, float32):
        assert _off(net, reference) < 0.05
    # Two optimizers, two lines of the loop: one line each.
    told = _told(caplog)
    assert len(told) == 2
    applied = set()
    for line in told:
        where = line.split("kmp: the loop at ")[1].split(" applies ")[0]
        path, number = where.rsplit(":", 1)
        code = linecache.getline(path, int(number)).strip()
        applied.add(code.split(".apply(")[0])
    assert applied == {"d_optimizer", "g_optimizer"}
