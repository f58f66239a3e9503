"""Keras's load of a checkpoint directory with the values of another shape
held back (`kmp.saving.held_values`)."""

import keras
import numpy as np
import pytest

import kmp
from kmp.saving.held_values import assigning_by_path


def _model():
    inputs = keras.Input((4,))
    model = keras.Model(inputs, keras.layers.Dense(3, name="a")(inputs))
    model.compile(optimizer="sgd", loss="mse")
    return model


def test_a_value_of_another_shape_is_held_back_and_named():
    model = _model()
    kernel = np.full((4, 3), 2.0, "float32")
    wrong = np.ones((3, 4), "float32")
    held = set()
    with assigning_by_path("ckpt", held):
        model.set_state_tree(
            {
                "trainable_variables": {
                    "a": {"kernel": wrong, "bias": [1.0] * 3}
                },
                "non_trainable_variables": {},
            }
        )
    assert held == {("trainable_variables", "a/kernel")}
    np.testing.assert_array_equal(model.get_layer("a").bias, [1.0] * 3)
    assert not np.array_equal(model.get_layer("a").kernel, kernel)
    # Outside the load, Keras's own assignment, and its error.
    with pytest.raises(ValueError, match="variable.assign"):
        model.set_state_tree({"trainable_variables": {"a": {"kernel": wrong}}})


def test_keras_s_assignment_is_back_after_an_error():
    stock = keras.Model.set_state_tree
    with pytest.raises(RuntimeError):
        with assigning_by_path("ckpt", set()):
            assert keras.Model.set_state_tree is not stock
            raise RuntimeError("the load failed")
    assert keras.Model.set_state_tree is stock


def test_an_assignment_of_another_shape_left_is_one_input_error():
    # A model class whose own set_state_tree assigns as it does.
    with pytest.raises(kmp.InputError, match="Keras said: Cannot") as error:
        with assigning_by_path("ckpt", set()):
            raise ValueError(
                "Cannot assign value of shape (3, 4) to variable.assign "
                "of shape (4, 3)"
            )
    assert "name those layers in their code" in str(error.value)
    with pytest.raises(ValueError, match="another error"):
        with assigning_by_path("ckpt", set()):
            raise ValueError("another error")
