"""The audit's optimizer checks (`kmp.auditing.optimizer_checks`),
through `kmp.audit`: loss scaling where float16 needs it, kmp's scaler
rather than Keras's, a scaler a `.keras` file would not record, and a
train step of the model's own (keras-io's, `tests/keras_io_steps.py`)."""

import keras
import keras_io_steps
import numpy as np
import pytest
from audit_util import compiled_for_audit
from audit_util import has
from audit_util import quiet_audit
from audit_util import small_mlp

import kmp
from kmp import backend


def test_float16_without_loss_scaling_is_an_error():
    kmp.enable("mixed_float16")
    model = compiled_for_audit(small_mlp(out="float32"), optimizer="adam")
    assert has(quiet_audit(model), "does not scale the loss", "error")
    assert not has(
        quiet_audit(compiled_for_audit(small_mlp(out="float32"))),
        "scale the loss",
    )


def test_per_layer_float16_under_a_float32_policy_is_caught():
    kmp.enable("float32")
    model = keras.Sequential(
        [
            keras.Input((16,)),
            keras.layers.Dense(16, dtype="mixed_float16", name="half"),
            keras.layers.Dense(8),
        ]
    )
    model.compile(optimizer="adam", loss="mse")  # Keras wraps nothing
    assert not isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    assert has(quiet_audit(model), "half'", "error")


def test_stock_scaler_is_a_warning():
    kmp.enable("mixed_float16")
    stock = keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam())
    model = compiled_for_audit(small_mlp(out="float32"), optimizer=stock)
    assert has(quiet_audit(model), "stock keras LossScaleOptimizer", "warning")
    assert not has(
        quiet_audit(compiled_for_audit(small_mlp(out="float32"))), "stock keras"
    )


def test_needless_scaler_under_bfloat16_is_reported():
    kmp.enable("mixed_bfloat16")
    model = small_mlp(out="float32", policy="mixed_bfloat16")
    scaler = kmp.LossScaleOptimizer(keras.optimizers.Adam())
    assert has(
        quiet_audit(model, optimizer=scaler), "no layer computes in float16"
    )
    assert not has(
        quiet_audit(compiled_for_audit(model)), "no layer computes in float16"
    )


def test_kmp_s_scaler_over_a_model_with_no_float16_layer_is_not_told_wrap():
    # keras-io's torch guide's Dense(1) model, pinned under mixed_float16:
    # kmp.wrap gave the scaler; "use kmp.wrap" was no fix (a helper).
    kmp.enable("mixed_float16")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    kmp.pin_float32(model)
    model.compile(optimizer=kmp.wrap("adam"), loss="mse")
    (finding,) = [
        f for f in quiet_audit(model) if "no layer computes in" in f.problem
    ]
    assert "optimizer.inner_optimizer" in finding.fix
    assert "Use kmp.wrap" not in finding.fix


class HandRolled:
    """An optimizer of one's own: no Keras optimizer."""


def test_an_optimizer_that_is_no_keras_one_is_said_so():
    # keras-io's torch loop guide trains with torch.optim.Adam; the audit
    # read Keras's attributes of it and crashed (a helper, 2026-11-30).
    kmp.enable("mixed_float16")
    model = small_mlp(out="float32")
    foreign = HandRolled()
    if backend.name() == "torch":
        import torch

        foreign = torch.optim.Adam(model.parameters())
    report = quiet_audit(model, optimizer=foreign)
    kind = type(foreign).__qualname__
    assert has(report, "optimizer|The optimizer is a ", "warning")
    assert has(report, f"{kind}, not a Keras optimizer")
    assert not has(report, "No optimizer given")
    # Nothing in float16: no scaling needed, said as such.
    kmp.enable("mixed_bfloat16")
    model = small_mlp(out="float32", policy="mixed_bfloat16")
    report = quiet_audit(model, optimizer=HandRolled())
    assert has(report, "no scaling needed", "info")


def test_a_scaler_keras_added_at_compile_time_is_a_saving_hazard():
    kmp.enable("mixed_float16")

    def compiled(optimizer):
        model = kmp.pin_float32(small_mlp())
        model.compile(optimizer=optimizer, loss="categorical_crossentropy")
        return model

    model = compiled("sgd")  # Keras wraps it in its own scaler
    assert type(model.optimizer) is keras.optimizers.LossScaleOptimizer
    assert has(
        quiet_audit(model), "model|Keras wrapped the compiled SGD", "warning"
    )
    given = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD())
    assert not has(quiet_audit(compiled(given)), "Keras wrapped")
    assert not has(quiet_audit(compiled(kmp.wrap("sgd"))), "Keras wrapped")


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
    assert f"d_loss = self.d_optimizer.{scaled}d_loss)" in finding.fix
    assert f"g_loss = self.g_optimizer.{scaled}g_loss)" in finding.fix
    # Keras's compile made an RMSprop of its own, wrapped in its scaler,
    # that the step never applies: not reported.
    assert "Keras's own" not in finding.problem


def test_a_train_step_found_unscaled_at_run_time_is_said_so():
    model = _keras_io_model(False)
    x = np.zeros((8, 8), "float32")
    with kmp.policy_scope("mixed_float16"):
        model.fit(x, x[:, :1], verbose=0)
    assert has(quiet_audit(model), "found at its first step", "warning")


def test_the_8_bit_state_is_named_with_its_blocks():
    kmp.enable("mixed_float16")
    optimizer = kmp.wrap(keras.optimizers.Adam(), state_dtype="int8")
    model = compiled_for_audit(small_mlp(out="float32"), optimizer=optimizer)
    model.optimizer.build(model.trainable_variables)
    assert has(quiet_audit(model), "as 8-bit codes in blocks of 256", "info")


def test_the_memory_mode_is_named_and_float16_state_is_a_warning():
    kmp.enable("mixed_float16")
    optimizer = kmp.wrap(keras.optimizers.Adam(), state_dtype="bfloat16")
    model = compiled_for_audit(small_mlp(out="float32"), optimizer=optimizer)
    model.optimizer.build(model.trainable_variables)
    assert has(quiet_audit(model), "stores its slots in bfloat16", "info")
    assert not has(quiet_audit(model), "are float16")
    # A float16 policy makes float16 variables, and Keras's slots follow.
    keras.config.set_dtype_policy("float16")  # restored by conftest
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])
    model.compile(optimizer="adam", loss="mse", auto_scale_loss=False)
    model.optimizer.build(model.trainable_variables)
    assert has(quiet_audit(model), "are float16", "warning")
    assert not has(quiet_audit(model), "stores its slots")


def _bfloat16_masters_model(optimizer):
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(8)])
    return compiled_for_audit(model, optimizer=optimizer, loss="mse")


def test_bfloat16_masters_rounded_to_nearest_are_a_warning():
    kmp.enable("mixed_bfloat16", master_weights="bfloat16")
    stochastic = _bfloat16_masters_model(kmp.wrap("adam", seed=7))
    assert has(quiet_audit(stochastic), "stochastic rounding (seed 7)", "info")
    assert not has(quiet_audit(stochastic), "to nearest")
    for optimizer in (kmp.wrap("adam", rounding="nearest"), "adam"):
        nearest = _bfloat16_masters_model(optimizer)
        assert has(quiet_audit(nearest), "updates to nearest", "warning")
        assert not has(quiet_audit(nearest), "stochastic rounding")


def test_remat_is_named_and_keras_s_alone_is_a_warning():
    kmp.enable("mixed_float16")
    with keras.RematScope(mode="full"):
        stock = keras.Sequential([keras.Input((16,)), keras.layers.Dense(8)])
    stock = compiled_for_audit(stock, loss="mse")
    assert has(quiet_audit(stock), "recomputed by Keras alone", "warning")
    kmp.rematerialize(stock)
    assert has(quiet_audit(stock), "recomputed in the backward pass", "info")
    assert not has(quiet_audit(stock), "by Keras alone")


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
    assert finding.fix.startswith("loss = self.g_optimizer.scale_loss")
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
