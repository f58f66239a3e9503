"""Reading a model's own methods (`kmp.auditing.source_reading`): found
through the MRO, followed through `self` and `super()` in the user's
classes to a fixed depth, a library's read but not followed, and what
has no source said so."""

import ast

import keras
import pytest
from keras.ops import mean

from kmp.auditing import source_reading

pytestmark = pytest.mark.backend_independent


def _helper(loss):
    return loss


class Base(keras.Model):
    def train_step(self, data):
        return self._first(data)

    def _first(self, data):
        return self.compute_loss(y=data, y_pred=data)


class Child(Base):
    def train_step(self, data):
        step = jax_like_grad(self._second)  # passed, not called
        return super().train_step(step(data))

    def _second(self, data):
        return _helper(mean(data)) + len(data)


def jax_like_grad(function):
    return function


def _names(methods):
    return [method.where for method in methods]


def test_methods_are_found_through_the_mro_and_super():
    method = source_reading.find_method(Child, "_first")
    assert method.where == "Base._first" and method.tree is not None
    after = source_reading.find_method(Child, "train_step", after=Child)
    assert after.where == "Base.train_step"
    assert source_reading.find_method(Child, "metrics") is None  # property
    assert source_reading.find_method(Child, "nothing") is None


def _keras_owner(name):
    """The Keras class that defines `keras.Model`'s method `name`
    (`compute_loss`: Trainer on Keras 3.15, BaseTrainer on 3.16)."""
    return next(k.__name__ for k in keras.Model.__mro__ if name in vars(k))


def test_reachable_follows_the_user_s_methods_and_reads_keras_s():
    methods, deeper = source_reading.reachable(Child, "train_step")
    assert _names(methods) == [
        "Child.train_step",
        "Child._second",
        "Base.train_step",
        "Base._first",
        f"{_keras_owner('compute_loss')}.compute_loss",
    ]
    assert not deeper
    # Keras's compute_loss is read (a leaf), its own calls not followed.
    assert methods[-1].tree is not None
    short, deeper = source_reading.reachable(Child, "train_step", depth=1)
    assert _names(short) == [
        "Child.train_step",
        "Child._second",
        "Base.train_step",
    ]
    assert deeper  # Base._first, two calls deep, was left unread


def test_what_has_no_source_is_said_so():
    namespace = {}
    exec("def train_step(self, data):\n    return data", namespace)
    typed = type(
        "Typed", (keras.Model,), {"train_step": namespace["train_step"]}
    )
    (method,), _ = source_reading.reachable(typed, "train_step")
    assert method.tree is None
    assert source_reading.called_functions(method) == []


def test_called_functions_are_the_user_s_called_by_name():
    method = source_reading.find_method(Child, "_second")
    # `_helper` is the user's; `mean` is Keras's and `len` a builtin.
    assert source_reading.called_functions(method) == [_helper]

    def make():
        def scale(loss):
            return loss

        class Closure(keras.Model):
            def train_step(self, data):
                return scale(data)

        return Closure, scale

    closure, scale = make()
    method = source_reading.find_method(closure, "train_step")
    assert source_reading.called_functions(method) == [scale]


def test_dotted_names():
    call = ast.parse("tf.random.normal(shape)").body[0].value
    assert source_reading.dotted(call.func) == "tf.random.normal"
    assert source_reading.dotted(ast.parse("f()[0].x").body[0].value) == ""


class _Draws(keras.layers.Layer):
    def call(self, x):
        noise = keras.random.normal(keras.ops.shape(x), dtype="float16")
        return keras.ops.softmax(x + noise) + self.factor.value


def test_module_calls_resolve_each_call_s_package():
    method = source_reading.find_method(_Draws, "call")
    found = [
        (name, package, function)
        for _, name, package, function in source_reading.module_calls(method)
    ]
    # `self.factor.value` is no call; `self` names no module.
    assert sorted(found) == [
        ("keras.ops.shape", "keras", "shape"),
        ("keras.ops.softmax", "keras", "softmax"),
        ("keras.random.normal", "keras", "normal"),
    ]


class _Scaled(keras.layers.Layer):
    def call(self, x):
        return self._scale(x)

    def _scale(self, x):
        return x * 1e9


def test_first_in_calls_reads_each_user_class_once_and_no_library_s():
    def numbers(method):
        return [
            node.value
            for node in ast.walk(method.tree)
            if isinstance(node, ast.Constant) and node.value == 1e9
        ]

    layers = [_Scaled(), _Scaled(), keras.layers.Dense(2)]
    found = list(source_reading.first_in_calls(layers, numbers))
    assert [(layer, method.where, value) for layer, method, value in found] == [
        (layers[0], "_Scaled._scale", 1e9)
    ]
