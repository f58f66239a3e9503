"""The audit's check of a train step of the model's own
(`kmp.auditing.train_step_checks`), through `kmp.audit`: whether it
scales its loss, read from its source and seen at its steps, and the
fix naming each optimizer's loss; keras-io's steps
(`tests/keras_io_steps.py`)."""

import re

import keras
import keras_io_steps
import numpy as np
import pytest
from audit_util import compiled_for_audit
from audit_util import has
from audit_util import quiet_audit
from audit_util import small_mlp
from util import tf_only

import kmp
from kmp import backend
from kmp.auditing import source_reading
from kmp.auditing import train_step_checks


class CycleGANStep(keras.Model):
    """keras-io's CycleGAN's step, cut down (read, never run): each
    optimizer applies the gradients of a total, of which `gen_G_loss` is
    one term."""

    def train_step(self, batch_data):
        with tf.GradientTape(persistent=True) as tape:  # noqa: F821
            gen_G_loss = self.generator_loss_fn(
                self.disc_Y(self.gen_G(batch_data))
            )
            total_loss_G = gen_G_loss + self.cycle_loss
            disc_X_loss = self.discriminator_loss_fn(self.disc_X(batch_data))
            total_loss_F = disc_X_loss + self.cycle_loss
        grads_G = tape.gradient(total_loss_G, self.gen_G.trainable_variables)
        disc_X_grads = tape.gradient(disc_X_loss, self.disc_X.variables)
        self.gen_G_optimizer.apply_gradients(
            zip(grads_G, self.gen_G.trainable_variables)
        )
        self.disc_X_optimizer.apply_gradients(zip(disc_X_grads, []))
        self.gen_F_optimizer.apply(tape.gradient(total_loss_F, []))  # inline
        return {"G_loss": total_loss_G, "D_X_loss": disc_X_loss}


class GuideGANStep(keras.Model):
    """keras-io's "Customizing what happens in fit()" GAN (TensorFlow):
    one name, `grads`, for both optimizers' gradients (read, never
    run)."""

    def train_step(self, real_images):
        with tf.GradientTape() as tape:  # noqa: F821
            d_loss = self.loss_fn(self.discriminator(real_images))
        grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
        self.d_optimizer.apply_gradients(zip(grads, []))
        with tf.GradientTape() as tape:  # noqa: F821
            g_loss = self.loss_fn(self.discriminator(real_images))
        grads = tape.gradient(g_loss, self.generator.trainable_weights)
        self.g_optimizer.apply_gradients(zip(grads, []))


class TorchGANStep(keras.Model):
    """keras-io's torch GAN step's shape (read, never run)."""

    def train_step(self, real_images):
        self.zero_grad()
        d_loss = self.loss_fn(self.discriminator(real_images))
        d_loss.backward()
        grads = [v.value.grad for v in self.discriminator.trainable_weights]
        self.d_optimizer.apply(grads, self.discriminator.trainable_weights)
        self.zero_grad()
        g_loss = self.loss_fn(self.discriminator(real_images))
        g_loss.backward()
        self.g_optimizer.apply(grads, self.generator.trainable_weights)


def test_the_loss_each_optimizer_applies_is_read_from_the_step():
    # keras-io's CycleGAN, helper 2026-11-30: the fix named
    # `gen_G_loss`, one term of `total_loss_G`; scaled alone, the cycle
    # and identity terms' gradients were 32768x too small (G moved 82
    # where float32 moved 2308), and nothing said so.
    def read(cls):
        return train_step_checks.applied_losses(
            source_reading.reachable(cls, "train_step")[0]
        )

    assert read(CycleGANStep) == {
        "gen_G_optimizer": "total_loss_G",
        "disc_X_optimizer": "disc_X_loss",
        "gen_F_optimizer": "total_loss_F",
    }
    gan = {"d_optimizer": "d_loss", "g_optimizer": "g_loss"}
    assert read(TorchGANStep) == gan
    # Each apply's latest gradients before it (a review: the step's last
    # assignment of `grads` named g_loss for both).
    assert read(GuideGANStep) == gan
    assert read(ScalesItsLoss) == {}  # no apply in it


def _keras_io_model(scale, wrap=True, cls=None):
    with kmp.policy_scope("mixed_float16"):
        model = keras_io_steps.custom_model(scale=scale, cls=cls)
        sgd = keras.optimizers.SGD()
        model.compile(optimizer=kmp.wrap(sgd) if wrap else sgd, loss="mse")
    return model


# The audit reads these steps' source; none of them runs.


class ScalesItsLoss(keras.Model):
    def train_step(self, data):
        loss = self.compute_loss(y=data[1], y_pred=self(data[0]))
        return self.optimizer.scale_loss(loss)


class NeverScales(keras.Model):
    def train_step(self, data):  # the guide's, short: no scaling anywhere
        x, y = data
        loss = self.compute_loss(y=y, y_pred=self(x, training=True))
        self.optimizer.apply(self._gradients(loss), self.trainable_weights)
        return {"loss": loss}

    def _gradients(self, loss):
        return [keras.ops.zeros_like(v) for v in self.trainable_weights]


class ScalesInAHelper(keras.Model):
    def _scaled(self, loss):
        return self.optimizer.scale_loss(loss)

    def _loss(self, data):
        loss = self.compute_loss(y=data[1], y_pred=self(data[0]))
        return self._scaled(loss)


class HelperInABase(ScalesInAHelper):
    def train_step(self, data):  # the scaling: two calls deep, in a base
        return {"loss": self._loss(data)}


class Deeper(keras.Model):
    def train_step(self, data):
        return self._a(data)

    def _a(self, data):
        return self._b(data)

    def _b(self, data):
        return self._c(data)

    def _c(self, data):
        return self._d(data)

    def _d(self, data):
        return self.optimizer.scale_loss(self.compute_loss(data))


def _unreadable():
    """A subclass whose helper has no source (made by `exec`, as in a
    console)."""
    namespace = {}
    exec(
        "def _scaled(self, loss):\n    return self.optimizer.scale_loss(loss)",
        namespace,
    )

    class Unreadable(NeverScales):
        def train_step(self, data):
            return {"loss": self._scaled(self.compute_loss(data))}

    Unreadable._scaled = namespace["_scaled"]
    return Unreadable


def test_a_train_step_of_one_s_own_is_reported_with_what_kmp_does():
    # A step that scales nowhere: "never scales", with what kmp does.
    report = quiet_audit(_keras_io_model(False, cls=NeverScales))
    assert has(report, "its source never scales the loss", "warning")
    assert has(report, "kmp applies the gradients unscaled")
    # A step whose source scales: noted, not warned about.
    report = quiet_audit(_keras_io_model(False, cls=ScalesItsLoss))
    assert has(report, "overrides train_step and scales", "info")
    (noted,) = [f for f in report if "train_step" in f.problem]
    assert noted.fix == "None needed."  # not the line it already has
    # Keras's own train_step: nothing to say.
    kmp.enable("mixed_float16")
    plain = compiled_for_audit(small_mlp(out="float32"))
    assert not has(quiet_audit(plain), "train_step")


def test_a_helper_method_that_scales_is_followed():
    # Issue 39: the scaling sat in a helper method, and the audit said
    # "never scales". It follows self's methods, base classes included.
    report = quiet_audit(_keras_io_model(False, cls=HelperInABase))
    assert has(report, "scales its loss (optimizer, in ScalesInAHelper.")
    assert not has(report, "never scales")
    # Past source_reading.DEPTH calls, or where a helper has no source,
    # it cannot tell, and says so.
    report = quiet_audit(_keras_io_model(False, cls=Deeper))
    assert has(report, "more than 3 calls deep", "warning")
    report = quiet_audit(_keras_io_model(False, cls=_unreadable()))
    assert has(report, "cannot read the source of Unreadable._scaled")
    assert not has(report, "never scales")


def test_a_step_that_calls_a_function_which_may_scale_cannot_be_told():
    # keras_io_steps's guides call `_scaling(...)`, a function outside
    # the class that scales or not by its argument: kmp does not follow
    # functions, and says it cannot tell, whichever the argument.
    for scale in (False, True):
        report = quiet_audit(_keras_io_model(scale))
        assert has(report, "cannot tell whether it scales", "warning")
        assert has(report, "calls _scaling, a function that names a loss")
        assert not has(report, "never scales")


def _backward(optimizer, loss):  # keras-io-like helpers of one's own
    return _scaled(optimizer, loss)


def _scaled(optimizer, loss):
    return optimizer.scale_loss(loss)


class ScalesTwoFunctionsDeep(keras.Model):
    def train_step(self, data):
        loss = self.compute_loss(y=data[1], y_pred=self(data[0]))
        return {"loss": _backward(self.optimizer, loss)}


def test_a_scaling_two_functions_deep_is_not_never_scales():
    # A helper's torch loop (2026-11-30): `backward(opt, loss)` calls
    # `scaled(opt, loss)`, which scales; the audit said "never scales".
    report = quiet_audit(_keras_io_model(False, cls=ScalesTwoFunctionsDeep))
    assert not has(report, "never scales")
    assert has(report, "_backward calls _scaled, a function that names a")


@pytest.mark.parametrize("scale", [False, True])
def test_a_step_that_ran_is_told_by_what_it_did(scale):
    # Its source calls `_scaling(optimizer, scale)`: kmp cannot tell
    # from it (above); once a step ran, kmp saw what it applied.
    model = _keras_io_model(scale)
    x, y = np.ones((4, 8), "float32"), np.ones((4, 1), "float32")
    model.fit(x, y, epochs=1, verbose=0)
    report = quiet_audit(model)
    assert not has(report, "cannot tell")
    if scale:
        assert has(report, "scales its loss (optimizer, seen at a step", "info")
    else:
        assert has(report, "did not scale (found at its first step)")


def test_a_train_step_that_never_scales_under_the_stock_scaler_is_an_error():
    model = _keras_io_model(False, wrap=False, cls=NeverScales)
    assert type(model.optimizer) is keras.optimizers.LossScaleOptimizer
    assert has(quiet_audit(model), "32768x too small", "error")
    # Where kmp cannot tell, a warning that says what the stock scaler
    # does to an unscaled loss, not an error.
    report = quiet_audit(_keras_io_model(False, wrap=False))
    assert has(report, "cannot tell", "warning")
    assert has(report, "32768x too small", "warning")
    assert not has(report, "32768x", "error")


def test_a_gan_s_two_optimizers_are_named():
    with kmp.policy_scope("mixed_float16"):
        gan = keras_io_steps.gan(scale=False)
        gan.compile(
            d_optimizer=kmp.wrap(keras.optimizers.SGD()),
            g_optimizer=kmp.wrap(keras.optimizers.SGD()),
            loss_fn=keras.losses.BinaryCrossentropy(from_logits=True),
        )
    (finding,) = [f for f in quiet_audit(gan) if "train_step" in f.problem]
    assert "d_optimizer, g_optimizer" in finding.problem
    # Each scales its own loss (the fix read "loss = ...(loss); loss =
    # ...(loss)", one loss scaled twice).
    assert finding.fix.startswith("scale each loss by the optimizer that")
    scaled = (
        "stateless_scale_loss(optimizer_variables, "
        if (backend.is_stateless())
        else "scale_loss("
    )
    assert f"self.d_optimizer.{scaled}d_loss)" in finding.fix
    assert f"self.g_optimizer.{scaled}g_loss)" in finding.fix
    # Names the step's source does not give (its `_step` helper takes
    # the optimizer), said to be each whole loss; none rebound, which
    # the guide's step would then log scaled (`return {"d_loss": ...}`).
    assert "(d_loss, g_loss: the whole loss whose gradients" in finding.fix
    assert not re.search(r"\b[dg]_loss = ", finding.fix)
    # Keras's compile made an RMSprop of its own, wrapped in its scaler,
    # that the step never applies: not reported.
    assert "Keras's own" not in finding.problem


def test_a_train_step_found_unscaled_at_run_time_is_said_so():
    model = _keras_io_model(False)
    x = np.zeros((8, 8), "float32")
    with kmp.policy_scope("mixed_float16"):
        model.fit(x, x[:, :1], verbose=0)
    assert has(quiet_audit(model), "found at its first step", "warning")


@pytest.mark.skipif(
    backend.is_stateless(), reason="the guide's GAN is TensorFlow's, torch's"
)
def test_a_gan_that_scales_one_loss_of_two_is_told_of_the_other_only():
    with kmp.policy_scope("mixed_float16"):
        base = keras_io_steps.gan(scale=False)

        class ScalesTheDiscriminatorS(type(base)):
            def _step(self, optimizer, loss_of, weights):
                if optimizer is self.d_optimizer:
                    unscaled = loss_of
                    loss_of = lambda: optimizer.scale_loss(unscaled())  # noqa: E731
                return super()._step(optimizer, loss_of, weights)

        gan = ScalesTheDiscriminatorS(
            base.discriminator, base.generator, base.latent_dim
        )
        gan.compile(
            d_optimizer=kmp.wrap(keras.optimizers.SGD()),
            g_optimizer=kmp.wrap(keras.optimizers.SGD()),
            loss_fn=keras.losses.BinaryCrossentropy(from_logits=True),
        )
        gan.fit(keras_io_steps.images(n=16), batch_size=8, verbose=0)
    report = quiet_audit(gan)
    (finding,) = [f for f in report if "train_step" in f.problem]
    assert "a loss that g_optimizer did not scale" in finding.problem
    scaled = (
        "stateless_scale_loss(optimizer_variables, "
        if (backend.is_stateless())
        else "scale_loss("
    )
    assert f"self.g_optimizer.{scaled}loss)" in finding.fix
    assert "d_optimizer" not in finding.fix
    # The RMSprop Keras made in its own scaler at `compile()`, which no
    # step applies: nothing is said of it.
    assert not has(report, "stock keras LossScaleOptimizer")
    assert not has(report, "Keras wrapped the compiled")


@pytest.mark.skipif(
    backend.is_stateless(), reason="the guide's GAN is TensorFlow's, torch's"
)
def test_a_gan_s_unscaling_optimizer_is_named_as_its_compile_takes_it():
    with kmp.policy_scope("mixed_float16"):
        gan = keras_io_steps.gan(scale=False)
        gan.compile(
            d_optimizer=kmp.wrap(keras.optimizers.SGD()),
            g_optimizer=keras.optimizers.SGD(),
            loss_fn=keras.losses.BinaryCrossentropy(from_logits=True),
        )
    (finding,) = [f for f in quiet_audit(gan) if f.severity == "error"]
    assert "but the g_optimizer (SGD) does not scale" in finding.problem
    assert finding.fix.startswith("compile with g_optimizer=kmp.wrap(")


@pytest.mark.skipif(
    backend.is_stateless(), reason="the guide's GAN is TensorFlow's, torch's"
)
def test_a_gan_s_plain_optimizers_leave_keras_s_compiled_scaler_unreported():
    # Under Keras's own mixed_float16 the GAN's compile() makes an
    # RMSprop in Keras's scaler that no step applies; its plain
    # d_optimizer and g_optimizer move the weights as in float32. The
    # audit said that scaler made "every update 32768x too small" (helper,
    # keras-io's conditional GAN shape).
    keras.config.set_dtype_policy("mixed_float16")
    gan = keras_io_steps.gan(scale=False)
    gan.compile(
        d_optimizer=keras.optimizers.SGD(),
        g_optimizer=keras.optimizers.SGD(),
        loss_fn=keras.losses.BinaryCrossentropy(from_logits=True),
    )
    assert isinstance(gan.optimizer, keras.optimizers.LossScaleOptimizer)
    report = quiet_audit(gan)
    assert not has(report, "32768x")
    assert not has(report, "Keras's own LossScaleOptimizer (optimizer)")
    # What the step applies is reported: its optimizers do not scale.
    assert has(report, "d_optimizer")


@tf_only
def test_a_train_step_in_a_tf_function_is_read():
    # `find_method` took a `tf.function` for no function: "never scales"
    # of a step that scales (a review, 2026-11-30).
    import tensorflow as tf

    class Decorated(keras.Model):
        @tf.function
        def train_step(self, data):
            return self.optimizer.scale_loss(self.compute_loss(data))

    report = quiet_audit(_keras_io_model(False, cls=Decorated))
    assert has(report, "overrides train_step and scales its loss", "info")
    assert not has(report, "never scales")
