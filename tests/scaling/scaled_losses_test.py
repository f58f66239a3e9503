"""A train step that never scales its loss (`kmp.scaling.scaled_losses`):
the train steps keras-io's guides teach (`tests/keras_io_steps.py`), on
each backend, under kmp's scaler and under stock Keras's.

"Trains like float32" is measured on the weights' update after 8 SGD
steps from the same initial weights: the distance between the mixed and
the float32 update, over the float32 update's length, below 5 %.
"""

import gc
import logging
import sys
import weakref

import keras
import keras_io_steps
import numpy as np
import pytest
from keras import ops
from util import jax_only
from util import tf_only

import kmp
from kmp import backend
from kmp.scaling import scaled_losses

STEPS, BATCH = 8, 8
no_gan_on_jax = pytest.mark.skipif(
    backend.name() == "jax", reason="keras-io's JAX guide has no GAN"
)


def _regression_data(n=STEPS * BATCH, features=8):
    x = np.random.default_rng(1).normal(size=(n, features)).astype("float32")
    # Targets of order 0.3: the loss times 2**15 stays inside float16, so
    # a step that scales skips nothing.
    return x, x.mean(axis=1, keepdims=True)


def _flat(variables):
    return np.concatenate(
        [ops.convert_to_numpy(v).astype("float64").ravel() for v in variables]
    )


def _fit_custom(policy, scale, wrap=True, model=None):
    """The guide's `CustomModel` fitted for 8 steps; returns the model and
    its weights' update."""
    with kmp.policy_scope(policy):
        model = model or keras_io_steps.custom_model(scale=scale)
        before = _flat(model.trainable_weights)
        sgd = keras.optimizers.SGD(0.05)
        # wrap=False: Keras wraps the SGD in its own scaler at compile.
        model.compile(
            optimizer=kmp.wrap(sgd) if wrap else sgd,
            loss="mse",
            metrics=["mae"],
        )
        x, y = _regression_data()
        model.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0)
    return model, _flat(model.trainable_weights) - before


def _fit_gan(policy, scale, wrap=True):
    """The guide's GAN fitted for 8 steps; its two networks' updates."""
    with kmp.policy_scope(policy):
        gan = keras_io_steps.gan(scale=scale)
        nets = (gan.discriminator, gan.generator)
        before = [_flat(n.trainable_weights) for n in nets]

        def optimizer():
            sgd = keras.optimizers.SGD(0.05)
            if wrap:
                return kmp.wrap(sgd)
            return keras.optimizers.LossScaleOptimizer(sgd)  # stock

        gan.compile(
            d_optimizer=optimizer(),
            g_optimizer=optimizer(),
            loss_fn=keras.losses.BinaryCrossentropy(from_logits=True),
        )
        gan.fit(keras_io_steps.images(), batch_size=BATCH, verbose=0)
    return gan, [_flat(n.trainable_weights) - b for n, b in zip(nets, before)]


def _off(update, reference):
    return np.linalg.norm(update - reference) / np.linalg.norm(reference)


def _told(caplog):
    return [r.message for r in caplog.records if "did not scale" in r.message]


def test_keras_io_step_that_never_scales_trains_like_float32(caplog):
    _, float32 = _fit_custom("float32", scale=False)
    with caplog.at_level(logging.WARNING, logger="kmp"):
        model, mixed = _fit_custom("mixed_float16", scale=False)
    assert _off(mixed, float32) < 0.05
    # Once for the model, though every step (torch) or trace decided.
    (line,) = _told(caplog)
    assert line.startswith("kmp: CustomModel.train_step (")
    assert "keras_io_steps.py:" in line
    assert scaled_losses.fix() in line
    assert "can underflow" in line
    assert "\n" not in line
    assert scaled_losses.unscaled_in(model) == {"optimizer"}


def test_stock_keras_shrinks_a_keras_io_step_s_update_32768x():
    # Keras wraps the SGD in its own scaler at compile, which divides the
    # gradients of a loss nobody multiplied.
    _, float32 = _fit_custom("float32", scale=False)
    model, stock = _fit_custom("mixed_float16", scale=False, wrap=False)
    assert type(model.optimizer) is keras.optimizers.LossScaleOptimizer
    ratio = np.linalg.norm(stock) / np.linalg.norm(float32)
    assert ratio < 1e-3, ratio  # 1 / 32768 = 3.1e-5, to float16's rounding


def test_keras_io_step_that_scales_is_fit_s_own_step_to_the_bit(caplog):
    with caplog.at_level(logging.WARNING, logger="kmp"):
        custom, scaled = _fit_custom("mixed_float16", scale=True)
    assert not _told(caplog)
    with kmp.policy_scope("mixed_float16"):
        own = keras_io_steps.custom_model(cls=keras.Model)
    _, fit_s_own = _fit_custom("mixed_float16", scale=False, model=own)
    np.testing.assert_array_equal(scaled, fit_s_own)
    assert int(custom.optimizer.skipped_steps) == 0


@pytest.mark.skipif(
    backend.name() == "jax", reason="stock Keras has no stateless_scale_loss"
)
def test_keras_io_step_that_scales_is_stock_keras_s_to_the_bit():
    _, ours = _fit_custom("mixed_float16", scale=True)
    _, stock = _fit_custom("mixed_float16", scale=True, wrap=False)
    np.testing.assert_array_equal(ours, stock)


@no_gan_on_jax
def test_gan_that_never_scales_trains_like_float32_and_is_told_once(caplog):
    _, float32 = _fit_gan("float32", scale=False)
    with caplog.at_level(logging.WARNING, logger="kmp"):
        _, mixed = _fit_gan("mixed_float16", scale=False)
    for net, reference in zip(mixed, float32):
        assert _off(net, reference) < 0.05
    # Two optimizers, one model: one line.
    (line,) = _told(caplog)
    assert line.startswith("kmp: GAN.train_step (")
    # The discriminator's half comes first: its optimizer is named.
    assert f"Fix: {scaled_losses.fix('self.d_optimizer')}." in line
    # The form of this backend, the loss kept to log (not rebound).
    assert {
        "tensorflow": "scaled_loss = self.d_optimizer.scale_loss(loss) "
        "inside the GradientTape, and tape.gradient(scaled_loss, ...)",
        "torch": "self.d_optimizer.scale_loss(loss).backward() instead of "
        "loss.backward(), loss kept to log",
    }[backend.name()] in line


@no_gan_on_jax
def test_stock_keras_shrinks_a_gan_s_updates_32768x():
    _, float32 = _fit_gan("float32", scale=False)
    _, stock = _fit_gan("mixed_float16", scale=False, wrap=False)
    for net, reference in zip(stock, float32):
        ratio = np.linalg.norm(net) / np.linalg.norm(reference)
        assert ratio < 1e-3, ratio


@no_gan_on_jax
def test_gan_that_scales_is_stock_keras_s_to_the_bit(caplog):
    with caplog.at_level(logging.WARNING, logger="kmp"):
        _, ours = _fit_gan("mixed_float16", scale=True)
    assert not _told(caplog)
    _, stock = _fit_gan("mixed_float16", scale=True, wrap=False)
    for a, b in zip(ours, stock):
        np.testing.assert_array_equal(a, b)


def test_a_scale_loss_outside_the_step_does_not_count_inside_it(caplog):
    # A mark is the train step's own: a scale_loss elsewhere (reading the
    # scale, say) cannot make the step's unscaled loss look scaled.
    _, float32 = _fit_custom("float32", scale=False)
    with kmp.policy_scope("mixed_float16"):
        model = keras_io_steps.custom_model(scale=False)
        optimizer = kmp.wrap(keras.optimizers.SGD(0.05))
        optimizer.scale_loss(1.0)
    with caplog.at_level(logging.WARNING, logger="kmp"):
        _, mixed = _fit_custom("mixed_float16", scale=False, model=model)
    assert _told(caplog)
    assert _off(mixed, float32) < 0.05


def test_outside_a_train_step_a_loss_scaled_since_the_last_apply_divides(
    caplog,
):
    # Keras's contract, kept for a loop that scales: gradients given
    # after a scale_loss are of the scaled loss, and divided by the scale.
    optimizer = kmp.LossScaleOptimizer(
        keras.optimizers.SGD(1.0), initial_scale=8
    )
    v = keras.Variable([0.0, 0.0])
    with caplog.at_level(logging.WARNING, logger="kmp"):
        optimizer.scale_loss(1.0)
        optimizer.apply([ops.convert_to_tensor([8.0, 16.0])], [v])
        np.testing.assert_array_equal(ops.convert_to_numpy(v), [-1.0, -2.0])
        # The mark was the step's: the next apply, with no scale_loss
        # since, applies its gradients as they are, and says where.
        optimizer.apply([ops.convert_to_tensor([8.0, 16.0])], [v])
        line = f"{__file__}:{sys._getframe().f_lineno - 1}"
    np.testing.assert_array_equal(ops.convert_to_numpy(v), [-9.0, -18.0])
    (told,) = _told(caplog)
    assert told.startswith(f"kmp: the loop at {line} applies 1 gradient(s)")
    assert line in scaled_losses.loops_told()


def test_a_loss_scaled_and_never_applied_goes_with_its_optimizer():
    # Keyed by id, the mark outlived it, and a new optimizer given the
    # same id (Python reuses them) divided its first unscaled gradients
    # by the scale: seen as a test failing only after others in the same
    # process (the keras-io loops of tests/scaling/loops_test.py).
    marks = scaled_losses._marks()
    before = len(marks)
    optimizer = kmp.LossScaleOptimizer(keras.optimizers.SGD(1.0))
    optimizer.scale_loss(1.0)  # a scaled loss, never applied
    assert len(marks) == before + 1
    gone = weakref.ref(optimizer)
    del optimizer
    gc.collect()
    assert gone() is None
    assert len(marks) == before


def test_an_unscaled_step_still_skips_non_finite_gradients():
    with kmp.policy_scope("mixed_float16"):
        model = keras_io_steps.custom_model(scale=False)
        before = _flat(model.trainable_weights)
        model.compile(
            optimizer=kmp.wrap(keras.optimizers.SGD(0.05)), loss="mse"
        )
        x, y = _regression_data(n=BATCH)
        x[0, 0] = np.inf
        model.fit(x, y, batch_size=BATCH, verbose=0)
    np.testing.assert_array_equal(_flat(model.trainable_weights), before)
    assert int(model.optimizer.skipped_steps) == 1


@tf_only
def test_tf_keras_methods_in_a_train_step_divide_once():
    import tensorflow as tf

    class TfKerasStyle(keras.Model):
        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                y_pred = self(x, training=True)
                loss = self.compute_loss(y=y, y_pred=y_pred)
                scaled = self.optimizer.get_scaled_loss(loss)
            grads = tape.gradient(scaled, self.trainable_variables)
            grads = self.optimizer.get_unscaled_gradients(grads)
            self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
            return self.compute_metrics(x, y, y_pred)

    with kmp.policy_scope("mixed_float16"):
        model = keras_io_steps.custom_model(cls=TfKerasStyle)
    _, tf_keras = _fit_custom("mixed_float16", scale=False, model=model)
    _, scaled = _fit_custom("mixed_float16", scale=True)
    np.testing.assert_array_equal(tf_keras, scaled)


@jax_only
def test_scale_loss_in_a_jax_step_of_one_s_own_names_the_stateless_form():
    class PlainScaleLoss(keras_io_steps.custom_model_class(False)):
        def compute_loss_and_updates(
            self,
            trainable,
            non_trainable,
            optimizer_variables,
            x,
            y,
            training=False,
        ):
            y_pred, non_trainable = self.stateless_call(
                trainable, non_trainable, x, training=training
            )
            loss = self.optimizer.scale_loss(self.compute_loss(x, y, y_pred))
            return loss, (y_pred, non_trainable)

    with kmp.policy_scope("mixed_float16"):
        keras.utils.set_random_seed(0)
        inputs = keras.Input(shape=(8,))
        model = PlainScaleLoss(inputs, keras.layers.Dense(1)(inputs))
    # Keras's own error: "'NoneType' object is not callable".
    with pytest.raises(kmp.InputError, match="stateless_scale_loss"):
        _fit_custom("mixed_float16", scale=False, model=model)


def _compiled_gradients(model, optimizer):
    """A loop's gradients function compiled alone, its apply left to the
    caller, as keras-io's style transfer and DeepDream write it: a
    `tf.function` (TensorFlow) or `jax.jit` (JAX) that scales the loss
    (the stateless form on JAX, whose compiled program would keep the
    scale as a constant otherwise)."""
    x, y = _regression_data(n=BATCH)
    if backend.name() == "tensorflow":
        import tensorflow as tf

        @tf.function
        def gradients():
            with tf.GradientTape() as tape:
                y_pred = ops.cast(model(x), "float32")
                loss = ops.mean(ops.square(y_pred - y))
                scaled = optimizer.scale_loss(loss)
            return tape.gradient(scaled, model.trainable_variables)

        return gradients
    import jax

    def scaled_loss(trainable, optimizer_variables):
        y_pred, _ = model.stateless_call(trainable, [], x)
        loss = ops.mean(ops.square(ops.cast(y_pred, "float32") - y))
        if not hasattr(optimizer, "stateless_scale_loss"):
            return loss  # float32: kmp.wrap's optimizer is Keras's own
        return optimizer.stateless_scale_loss(optimizer_variables, loss)

    compiled = jax.jit(jax.grad(scaled_loss))
    return lambda: compiled(
        [v.value for v in model.trainable_variables],
        [v.value for v in optimizer.variables],
    )


@pytest.mark.skipif(
    backend.name() == "torch",
    reason="torch runs kmp's Python at every call, compiled or not",
)
def test_a_loop_s_compiled_gradients_applied_outside_are_divided(caplog):
    # The compiled function's `scale_loss` runs as Python at its trace
    # only: the applies after the first had no mark, and kmp applied
    # their gradients undivided, 32768x too large (the loss 0.0016 to
    # 7.4e4 at the third step, every step skipped after).
    updates = {}
    for policy in ("float32", "mixed_float16"):
        with kmp.policy_scope(policy):
            keras.utils.set_random_seed(0)
            model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
            optimizer = kmp.wrap(keras.optimizers.SGD(0.05))
            optimizer.build(model.trainable_variables)
            before = _flat(model.trainable_weights)
            gradients = _compiled_gradients(model, optimizer)
            with caplog.at_level(logging.WARNING, logger="kmp"):
                for _ in range(4):
                    optimizer.apply(gradients(), model.trainable_variables)
            updates[policy] = _flat(model.trainable_weights) - before
    assert _off(updates["mixed_float16"], updates["float32"]) < 0.05
    assert int(optimizer.skipped_steps) == 0
    assert _told(caplog) == []


@tf_only
def test_a_step_that_scales_and_applies_in_one_trace_marks_nothing(caplog):
    # Its apply decided in the trace: an unscaled eager apply after it
    # is still told and applied as it is (the mark for good, first
    # written, divided it by the scale, silently: the review's case).
    import tensorflow as tf

    optimizer = kmp.LossScaleOptimizer(keras.optimizers.SGD(1.0))
    v = keras.Variable([0.0])
    optimizer.build([v])

    @tf.function
    def scaled_step():
        with tf.GradientTape() as tape:
            loss = optimizer.scale_loss(ops.sum(v * 2.0))
        optimizer.apply(tape.gradient(loss, [v]), [v])

    scaled_step()
    np.testing.assert_allclose(ops.convert_to_numpy(v), [-2.0])
    with caplog.at_level(logging.WARNING, logger="kmp"):
        optimizer.apply([ops.convert_to_tensor([2.0])], [v])
    np.testing.assert_allclose(ops.convert_to_numpy(v), [-4.0])
    (told,) = _told(caplog)
    assert told.startswith("kmp: the loop at ")


@jax_only
def test_jax_grad_without_jit_decides_at_every_step(caplog):
    # jax.grad alone runs the Python at every call: no mark for good.
    import jax

    optimizer = kmp.LossScaleOptimizer(
        keras.optimizers.SGD(1.0), initial_scale=8
    )
    v = keras.Variable([0.0])
    optimizer.build([v])

    def gradient(scale):
        def loss(value, optimizer_variables):
            loss = ops.sum(value * 2.0)
            if scale:
                loss = optimizer.stateless_scale_loss(optimizer_variables, loss)
            return loss

        return jax.grad(loss)(v.value, [w.value for w in optimizer.variables])

    optimizer.apply([gradient(scale=True)], [v])
    np.testing.assert_allclose(ops.convert_to_numpy(v), [-2.0])
    with caplog.at_level(logging.WARNING, logger="kmp"):
        optimizer.apply([gradient(scale=False)], [v])
    np.testing.assert_allclose(ops.convert_to_numpy(v), [-4.0])
    assert len(_told(caplog)) == 1
