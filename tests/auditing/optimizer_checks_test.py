"""The audit's optimizer checks (`kmp.auditing.optimizer_checks`),
through `kmp.audit`: loss scaling where float16 needs it, kmp's scaler
rather than Keras's, and a scaler a `.keras` file would not record."""

import keras
from audit_util import compiled_for_audit
from audit_util import has
from audit_util import quiet_audit
from audit_util import small_mlp

import kmp


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
