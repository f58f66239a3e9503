"""Walking a model's layers (`kmp.model_layers`): every layer once,
output layers through nested models, patterns, and a class swapped in
place (recording their policies: layer_policies_test.py)."""

import re

import keras
import pytest
from util import nnx_only
from util import run_under_nnx

import kmp
from kmp import model_layers


def _nested():
    inner_in = keras.Input((4,))
    inner = keras.Model(
        inner_in, keras.layers.Dense(3, name="inner_out")(inner_in)
    )
    x = keras.Input((4,))
    side = keras.layers.Dense(2, name="side")(x)
    return keras.Model(x, [inner(x), side], name="outer"), inner


def test_all_layers_lists_the_model_and_every_nested_layer_once():
    model, inner = _nested()
    names = [layer.name for layer in model_layers.all_layers(model)]
    assert names[0] == "outer"
    assert {inner.name, "inner_out", "side"} <= set(names)
    # The nested model's own layers are there too, and nothing twice.
    assert {layer.name for layer in inner.layers} <= set(names)
    assert len(names) == len(set(names))


def test_output_layers_open_nested_models_and_skip_subclassed_ones():
    model, _ = _nested()
    outputs = model_layers.output_layers(model)
    assert [layer.name for layer in outputs] == ["inner_out", "side"]
    unbuilt = keras.Sequential([keras.layers.Dense(2, name="last")])
    assert [layer.name for layer in model_layers.output_layers(unbuilt)] == [
        "last"
    ]

    class Subclassed(keras.Model):
        def call(self, x):
            return x

    assert model_layers.output_layers(Subclassed()) is None


def test_fed_outputs_are_outputs_another_layer_takes_by_the_call():
    x = keras.Input((4,))
    tied = keras.layers.Dense(4, name="tied")
    hidden = tied(x)  # taken by `mid` below
    mid = keras.layers.Dense(4, name="mid")(hidden)
    last = tied(mid)  # the same layer's second call: taken by nothing

    assert _fed(x, last) == set()
    assert _fed(x, last, hidden) == {"tied"}  # by its first call
    assert _fed(x, mid, last) == {"mid"}
    # A nested model's outputs: one its own layers take (`tied`'s first
    # call), and one the outer model takes on or not (`mid`).
    inner = keras.Model(x, [hidden, mid], name="inner")
    y = keras.Input((4,))
    first, second = inner(y)
    assert _fed(y, first, second) == {"tied"}
    taken = keras.layers.Dense(2)(second)
    assert _fed(y, first, second, taken) == {"tied", "mid"}


def test_output_feeders_are_the_layers_an_output_layer_takes_from():
    x = keras.Input((4,))
    hidden = keras.layers.Dense(4, name="hidden")(x)
    probs = keras.layers.Dense(2, activation="softmax", name="probs")(hidden)
    out = keras.layers.Concatenate(name="out")([hidden, probs])
    model = keras.Model(x, [out, hidden])
    pairs = [("hidden", "out"), ("probs", "out")]
    assert _names(model_layers.output_feeders(model)) == pairs
    # An Input is no layer to pin; a nested model's output layer is
    # opened to the layers inside it that it takes.
    assert model_layers.output_feeders(keras.Model(x, hidden)) == []
    y = keras.Input((4,))
    outer = keras.Model(y, keras.Model(x, out, name="inner")(y))
    assert _names(model_layers.output_feeders(outer)) == pairs
    unbuilt = keras.Sequential(
        [keras.layers.Dense(2, name="d"), keras.layers.Softmax(name="s")]
    )
    assert _names(model_layers.output_feeders(unbuilt)) == [("d", "s")]


def _names(pairs):
    return [(layer.name, output.name) for layer, output in pairs]


def _fed(inputs, *outputs):
    """The names of the layers `fed_outputs` finds in a model of these
    outputs."""
    model = keras.Model(inputs, list(outputs))
    return {
        layer.name
        for layer in model_layers.all_layers(model)
        if id(layer) in model_layers.fed_outputs(model)
    }


def test_patterns_match_classes_paths_and_names():
    model, _ = _nested()
    side = model.get_layer("side")
    assert model_layers.matches(side, [keras.layers.Dense])
    assert model_layers.matches(side, ["si.e"])
    assert not model_layers.matches(side, ["si"])  # a full match only
    assert not model_layers.matches(side, [keras.layers.Conv2D])


@pytest.mark.parametrize(
    "pattern, phrase",
    [("(", "`skip` entry '(' is not a valid regular"), (3, "`skip` takes")],
)
def test_bad_patterns_are_refused_naming_the_argument(pattern, phrase):
    with pytest.raises(kmp.InputError, match=re.escape(phrase)):
        model_layers.check_patterns([pattern], "skip")


def test_swap_class_keeps_the_layer_and_refuses_a_non_subclass():
    layer = keras.layers.Softmax(name="s")
    same = layer
    model_layers.swap_class(layer, kmp.layers.Float32Softmax)
    assert layer is same and type(layer) is kmp.layers.Float32Softmax
    assert layer.name == "s"
    with pytest.raises(TypeError, match="not a subclass"):
        model_layers.swap_class(
            keras.layers.Dense(2), kmp.layers.Float32Softmax
        )


def test_held_models_are_a_trainer_s_and_has_own_call_tells_one():
    class Trainer(keras.Model):
        def __init__(self):
            super().__init__()
            inputs = keras.Input((2,))
            self.decoder = keras.Model(
                inputs, keras.layers.Dense(2)(inputs), name="decoder"
            )

    class Calls(Trainer):
        def call(self, x):
            return self.decoder(x)

    assert not model_layers.has_own_call(Trainer())
    assert [n for n, _ in model_layers.held_models(Trainer())] == ["decoder"]
    assert model_layers.has_own_call(Calls())
    assert model_layers.held_models(Calls()) == []
    assert not model_layers.has_own_call(keras.layers.Dense(2))


@nnx_only
def test_kmp_s_classes_swap_in_under_nnx(tmp_path_factory):
    # Under NNX a Keras layer's root class is Flax's Pytree, not
    # `object`: a plain mixin first among a kmp class's bases made
    # Python refuse the swap ("object layout differs").
    result = run_under_nnx("swap", tmp_path_factory)
    assert result["refused"] == {}
    assert result["classes"][2] == "Float32Softmax"
    assert result["attention_softmax"] == "Float32Softmax"
