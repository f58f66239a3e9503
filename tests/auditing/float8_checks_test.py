"""kmp.audit's float8 checks (`kmp.auditing.float8_checks`)."""

import keras
import pytest

import kmp
from kmp import backend
from kmp.backend import Device


def float8_model(units=32):
    with kmp.policy_scope("mixed_bfloat16"):
        inputs = keras.Input((32,))
        x = kmp.layers.Float8Dense(units)(inputs)
        outputs = keras.layers.Dense(2, dtype="float32")(x)
        return keras.Model(inputs, outputs)


def problems(report):
    return " | ".join(f.problem for f in report)


@pytest.mark.parametrize(
    "devices, warned",
    [
        ([Device("cpu", "AMD EPYC")], True),
        ([Device("gpu", "NVIDIA A100", (8, 0))], True),
        ([Device("gpu", "NVIDIA H100 80GB HBM3", (9, 0))], False),
        ([Device("gpu", "NVIDIA L4", (8, 9))], False),
    ],
)
def test_float8_without_float8_tensor_cores_is_flagged(
    devices, warned, monkeypatch
):
    monkeypatch.setattr(backend, "list_devices", lambda: devices)
    report = kmp.audit(float8_model(), verbose=False)
    assert ("without float8 tensor cores" in problems(report)) == warned
    if warned:
        assert devices[0].name in problems(report)


def test_float8_sizes_that_are_not_multiples_of_16_are_flagged():
    report = kmp.audit(float8_model(units=24), verbose=False)
    assert "size 32 -> 24" in problems(report)
    assert "size 32 -> 32" not in problems(
        kmp.audit(float8_model(), verbose=False)
    )


def test_float8_without_xla_is_flagged_and_plain_models_are_not():
    model = float8_model()
    model.compile(optimizer="sgd", loss="mse", jit_compile=False)
    found = problems(kmp.audit(model, verbose=False))
    if backend.name() == "torch":  # no XLA at all, compiled or not
        assert "only XLA turns" in found and "torch backend" in found
        (fix,) = [
            f.fix
            for f in kmp.audit(model, verbose=False)
            if "only XLA turns" in f.problem
        ]
        assert "matmul='kmp'" in fix
        # kmp.float8's default on torch: kmp's matmul, torch._scaled_mm
        # whether compiled or not.
        scaled = keras_float8_model()
        scaled.compile(optimizer="sgd", loss="mse", jit_compile=False)
        report = kmp.audit(scaled, verbose=False)
        assert "only XLA turns" not in problems(report)
    else:
        assert "without XLA" in found
        model.compile(optimizer="sgd", loss="mse", jit_compile=True)
        assert "without XLA" not in problems(kmp.audit(model, verbose=False))
    with kmp.policy_scope("mixed_bfloat16"):
        inputs = keras.Input((32,))
        plain = keras.Model(inputs, keras.layers.Dense(32)(inputs))
    assert "float8" not in problems(kmp.audit(plain, verbose=False)).lower()


def test_attention_projections_count_once():
    with kmp.policy_scope("mixed_bfloat16"):
        inputs = keras.Input((4, 32))
        x = kmp.layers.Float8MultiHeadAttention(2, 16)(inputs, inputs)
        model = keras.Model(inputs, keras.layers.Dense(2, dtype="float32")(x))
    report = kmp.audit(model, verbose=False)
    assert "4 float8 matmul layers" in problems(report)


def keras_float8_model():
    # What kmp.float8 puts in: Keras's own float8 Dense.
    with kmp.policy_scope("mixed_bfloat16"):
        inputs = keras.Input((32,))
        x = keras.layers.Dense(32)(inputs)
        outputs = keras.layers.Dense(2, dtype="float32")(x)
        return kmp.float8(keras.Model(inputs, outputs))


@pytest.mark.skipif(
    keras.backend.backend() != "tensorflow", reason="TensorFlow only"
)
def test_keras_float8_in_eager_tensorflow_cannot_train_and_is_an_error():
    import numpy as np

    model = keras_float8_model()
    model.compile("adam", "sparse_categorical_crossentropy", run_eagerly=True)
    with pytest.raises(ValueError, match="too many values to unpack"):
        model.fit(np.ones((4, 32)), np.zeros(4), verbose=0)
    report = kmp.audit(model, verbose=False)
    assert [f.severity for f in report if "run_eagerly" in f.problem] == [
        "error"
    ]
    model.compile("adam", "sparse_categorical_crossentropy")
    assert "run_eagerly" not in problems(kmp.audit(model, verbose=False))
    model.fit(np.ones((4, 32)), np.zeros(4), verbose=0)  # graph mode trains


def test_keras_float8_under_keras_s_scaler_is_an_error():
    model = keras_float8_model()
    model.compile(
        optimizer=keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam()),
        loss="mse",
    )
    report = kmp.audit(model, verbose=False)
    (finding,) = [
        f for f in report if "Keras's LossScaleOptimizer" in f.problem
    ]
    assert finding.severity == "error" and "kmp.wrap" in finding.fix
    model.compile(
        optimizer=kmp.LossScaleOptimizer(keras.optimizers.Adam()), loss="mse"
    )
    assert "Keras's LossScaleOptimizer" not in problems(
        kmp.audit(model, verbose=False)
    )
