"""What kmp.diagnose runs on: policy, batches, loss, loss scale."""

import keras
import numpy as np
import pytest

import kmp
from kmp.doctor import _inputs


def _model(policy):
    with kmp.policy_scope(policy):
        inputs = keras.Input((4,))
        x = keras.layers.Dense(3, name="hidden")(inputs)
        outputs = keras.layers.Softmax(name="probabilities")(x)
        return keras.Model(inputs, outputs)


def test_policy_under_test():
    mixed = _model("mixed_float16")
    assert _inputs.policy_under_test(mixed, None) == (
        "mixed_float16",
        [],
    )
    name, switched = _inputs.policy_under_test(mixed, "mixed_bfloat16")
    assert name == "mixed_bfloat16"
    assert {layer.name for layer in switched} >= {"hidden", "probabilities"}
    plain = _model("float32")
    name, switched = _inputs.policy_under_test(plain, None)
    assert name == "mixed_float16"
    names = {layer.name for layer in switched}
    assert "hidden" in names and "probabilities" not in names  # output
    with pytest.raises(ValueError, match="tests a mixed policy"):
        _inputs.policy_under_test(plain, "float32")


def test_batches_of_arrays_dicts_and_iterables():
    x, y = np.arange(10.0).reshape(10, 1), np.arange(10)
    found = _inputs.batches_of((x, y), batches=2, batch_size=4)
    assert [len(b[1]) for b in found] == [4, 4]
    np.testing.assert_array_equal(found[1][1], [4, 5, 6, 7])
    found = _inputs.batches_of(({"a": x}, y), batches=5, batch_size=4)
    assert [len(b[1]) for b in found] == [4, 4, 2]
    assert set(found[0][0]) == {"a"}
    triples = [(x[:2], y[:2], np.ones(2))] * 3
    found = _inputs.batches_of(triples, batches=2, batch_size=1)
    assert len(found) == 2 and len(found[0]) == 2  # sample weights dropped


def test_current_scale():
    model = _model("mixed_float16")
    assert _inputs.current_scale(model, "mixed_float16") == 1.0
    with kmp.policy_scope("mixed_float16"):  # kmp.wrap reads the policy
        optimizer = kmp.wrap("sgd", initial_scale=64.0)
    model.compile(optimizer=optimizer, loss="mse")
    assert _inputs.current_scale(model, "mixed_float16") == 64.0
    assert _inputs.current_scale(model, "mixed_bfloat16") == 1.0


def test_loss_function_reduces_to_a_scalar_mean():
    loss = _inputs.loss_function(
        _model("float32"), keras.losses.MeanSquaredError(reduction=None)
    )
    value = loss(np.zeros((2, 3)), np.ones((2, 3), "float32"))
    assert keras.ops.convert_to_numpy(value).shape == ()
    assert float(value) == 1.0
    with pytest.raises(ValueError, match="Missing entries"):
        _inputs.loss_function(_model("float32"), {"other": "mse"})(
            np.zeros((2, 3)), np.ones((2, 3), "float32")
        )
