"""kmp.doctor._float8: float8 layers' amax headroom and saturation."""

import json

import keras
import numpy as np
import pytest

import kmp
from kmp.doctor import _float8


def model_and_data():
    with kmp.policy_scope("mixed_bfloat16"):
        keras.utils.set_random_seed(0)
        inputs = keras.Input((32,))
        hidden = kmp.layers.Float8Dense(32, activation="relu", name="f8")(
            inputs
        )
        outputs = keras.layers.Dense(2, dtype="float32")(hidden)
        model = keras.Model(inputs, outputs)
    x = np.random.default_rng(0).standard_normal((64, 32)).astype("float32")
    return model, [(x[:32], None), (x[32:], None)], x


def test_untrained_layers_scale_by_the_batch_and_say_so():
    model, batches, _ = model_and_data()
    rows = _float8.measure(model, batches)
    assert [(r["path"], r["operand"]) for r in rows] == [
        ("f8", "inputs"),
        ("f8", "kernel"),
    ]
    for row in rows:
        assert row["headroom"] is None and row["saturated"] == 0
        assert "empty amax history" in _float8.describe(row)
    assert _float8.verdicts(rows) == []
    # The measurement leaves the layer as it was.
    assert model.get_layer("f8")._operand_observer is None


def test_a_lagging_history_shows_negative_headroom_and_saturation():
    model, batches, x = model_and_data()
    layer = model.get_layer("f8")
    amax = float(np.abs(x).max())
    # A history a quarter of the data's largest value: values above it
    # saturate, and the headroom is log2(1/4) = -2 bits.
    layer.inputs_amax_history.assign(np.full(16, amax / 4, "float32"))
    rows = {r["operand"]: r for r in _float8.measure(model, batches)}
    inputs = rows["inputs"]
    assert inputs["headroom"] == pytest.approx(-2.0, abs=0.01)
    expected = (np.abs(x) > np.float32(amax / 4)).mean()
    assert inputs["saturated"] == pytest.approx(expected, abs=1e-3)
    assert inputs["saturated"] > 0.01
    assert "headroom -2.0 bits" in _float8.describe(inputs)
    (verdict,) = _float8.verdicts(list(rows.values()))
    assert "f8 saturates" in verdict and 'skip=[r"f8"]' in verdict


def test_diagnose_reports_float8_layers(capsys):
    model, _, x = model_and_data()
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    y = (x[:, 0] > 0).astype("int32")
    report = kmp.diagnose(model, (x, y), batches=2, verbose=False)
    assert {(r["path"], r["operand"]) for r in report.float8} == {
        ("f8", "inputs"),
        ("f8", "kernel"),
    }
    assert json.loads(report.to_json())["float8"][0]["path"] == "f8"
    report.show()
    assert "float8 f8 inputs: empty amax history" in capsys.readouterr().out


def test_models_without_float8_layers_report_nothing():
    inputs = keras.Input((4,))
    model = keras.Model(inputs, keras.layers.Dense(2)(inputs))
    assert _float8.measure(model, [(np.ones((2, 4)), None)]) == []


def keras_float8_model():
    # What kmp.float8 puts in now: Keras's own float8 Dense.
    with kmp.policy_scope("mixed_bfloat16"):
        keras.utils.set_random_seed(0)
        inputs = keras.Input((32,))
        hidden = keras.layers.Dense(32, activation="relu", name="f8")(inputs)
        outputs = keras.layers.Dense(2, dtype="float32")(hidden)
        model = kmp.float8(keras.Model(inputs, outputs))
    assert model.get_layer("f8").quantization_mode == "float8"
    return model


def test_keras_float8_layers_are_read_by_their_scales():
    model = keras_float8_model()
    _, batches, x = model_and_data()
    layer = model.get_layer("f8")
    amax = float(np.abs(x).max())
    # Untrained, Keras's scale is 1: |x| up to 448 fits.
    rows = {r["operand"]: r for r in _float8.measure(model, batches)}
    assert rows["inputs"]["headroom"] == pytest.approx(
        np.log2(448 / amax), abs=0.01
    )
    assert rows["inputs"]["saturated"] == 0
    # A scale that covers a quarter of the data: -2 bits, saturating.
    layer.inputs_scale.assign(amax / 4 / 448)
    rows = {r["operand"]: r for r in _float8.measure(model, batches)}
    assert rows["inputs"]["headroom"] == pytest.approx(-2.0, abs=0.01)
    expected = (np.abs(x) > np.float32(amax / 4)).mean()
    assert rows["inputs"]["saturated"] == pytest.approx(expected, abs=1e-3)
    # The measurement leaves the layer's own call in place.
    assert "quantized_call" not in vars(layer)


def test_diagnose_observes_keras_float8_layers_in_both_passes():
    # A quantized layer runs `quantized_call`, not `call`: tapped on `call`
    # only, its outputs were missing from the mixed pass ("called its
    # layers in a different order").
    model = keras_float8_model()
    model.compile(
        optimizer=kmp.wrap(keras.optimizers.SGD(0.01)),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    _, _, x = model_and_data()
    y = (x[:, 0] > 0).astype("int32")
    report = kmp.diagnose(model, (x, y), batches=1, verbose=False)
    (f8,) = [row for row in report.layers if row.path == "f8"]
    assert f8.activations is not None  # paired with the float32 pass
    assert {(r["path"], r["operand"]) for r in report.float8} >= {
        ("f8", "inputs")
    }
    layer = model.get_layer("f8")
    assert "quantized_call" not in vars(layer) and "call" not in vars(layer)
