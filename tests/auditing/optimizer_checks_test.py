"""The audit's optimizer checks (`kmp.auditing.optimizer_checks`),
through `kmp.audit`: loss scaling where float16 needs it, kmp's scaler
rather than Keras's, a scaler a `.keras` file would not record, and a
train step of the model's own (keras-io's, `tests/keras_io_steps.py`)."""

import keras
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


def test_an_unscaled_optimizer_is_told_of_the_layers_it_trains():
    # A GAN's disc_optimizer was told of 5 layers "e.g. 'gen'": every
    # layer of the trainer, its nested models counted (a helper's
    # CycleGAN: 210, e.g. 'generator_G').
    kmp.enable("mixed_float16")
    inner = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(4, name="a")], name="inner"
    )
    model = keras.Sequential(
        [keras.Input((4,)), inner, keras.layers.Dense(4, name="b")],
        name="sequential",
    )
    optimizer = keras.optimizers.Adam()
    report = quiet_audit(model, optimizer=optimizer)
    assert has(report, "2 layer(s), e.g. 'inner/a'", "error")  # unbuilt
    optimizer.build(model.get_layer("b").trainable_variables)
    report = quiet_audit(model, optimizer=optimizer)
    assert has(report, "1 layer(s), e.g. 'sequential/b'", "error")


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
    assert ("torch.amp" in report[0].fix) == (backend.name() == "torch")
    # A name, as `compile` takes one, is Keras's optimizer of that name.
    report = quiet_audit(model, optimizer="adam")
    assert not has(report, "not a Keras optimizer")
    assert has(report, "but the optimizer (Adam) does not scale", "error")
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
