"""What a part of a held model's call result carries
(`kmp.auditing.held_outputs`): one output by a constant key, every
output otherwise."""

import ast

import keras
import pytest

from kmp.auditing import held_outputs
from kmp.auditing.held_outputs import Outputs

pytestmark = pytest.mark.backend_independent


def _models():
    z = keras.Input((4,))
    score = keras.layers.Dense(1, name="score")(z)
    images = keras.layers.Dense(4, name="images")(z)
    return {
        "pair": keras.Model(z, [score, images], name="pair"),
        "named": keras.Model(z, {"score": score, "images": images}),
        "one": keras.Model(z, [score], name="one"),
    }


def _slice(source):
    return ast.parse(f"out[{source}]", mode="eval").body.slice


@pytest.mark.parametrize(
    "source, key",
    [("0", 0), ("-1", -1), ("'score'", "score"), ("i", None)]
    + [("1:", None), ("True", None), ("-'a'", None), ("0.5", None)],
)
def test_a_constant_key(source, key):
    assert held_outputs.constant(_slice(source)) == key


def test_a_constant_key_names_one_output():
    models = _models()
    whole = frozenset([Outputs("pair", None)])
    part = held_outputs.part
    assert part(whole, 0, models) == {Outputs("pair", 0)}
    assert part(whole, -1, models) == {Outputs("pair", 1)}
    # Unpacked into as many names as it has outputs, or not.
    assert part(whole, 1, models, count=2) == {Outputs("pair", 1)}
    assert part(whole, 1, models, count=3) == {"pair"}
    # A key it lacks, or a starred name (key None): every output.
    assert part(whole, 2, models) == {"pair"}
    assert part(whole, "score", models) == {"pair"}
    assert part(whole, None, models, count=2) == {"pair"}
    # A dict's key; unpacked, a dict gives its keys.
    named = frozenset([Outputs("named", None)])
    assert part(named, "score", models) == {Outputs("named", "score")}
    assert part(named, 0, models) == {"named"}
    assert part(named, 0, models, count=2) == {"named"}
    # One output: `[0]` is a row of it.
    assert part(frozenset([Outputs("one", None)]), 0, models) == {"one"}
    # One output's part, or every output's, stays what it was.
    rows = frozenset([Outputs("pair", 0), "pair", "*"])
    assert part(rows, 1, models) == rows


def test_a_value_made_of_the_result_carries_every_output():
    carried = frozenset([Outputs("pair", None), Outputs("pair", 1), "*"])
    assert held_outputs.widened(carried) == {"pair", Outputs("pair", 1), "*"}


def test_keys_and_the_losses_of_one_output_layer():
    models = _models()
    keys = held_outputs.result_keys
    assert keys(Outputs("pair", 1), models) == ["pair/images"]
    assert keys(Outputs("pair", None), models) == ["pair"]
    assert keys("pair", models) == ["pair"]
    losses = {"pair": ["a"], "pair/images": ["b", "a"]}
    images = models["pair"].get_layer("images")
    score = models["pair"].get_layer("score")
    assert held_outputs.output_losses(losses, "pair", images) == ["a", "b"]
    assert held_outputs.output_losses(losses, "pair", score) == ["a"]
    assert held_outputs.output_losses({}, "pair", score) == []


def test_a_nested_model_s_output_and_an_op_s():
    # keras-io's combined GAN: the discriminator's score of the
    # generator's images, beside the images. A nested model's output is
    # its output layers'; an op's output has no layer, so every output.
    z = keras.Input((4,))
    generator = keras.Sequential([keras.layers.Dense(4, name="image")])
    disc_in = keras.Input((4,))
    scorer = keras.layers.Dense(1, name="scorer")
    discriminator = keras.Model(disc_in, scorer(disc_in))
    images = generator(z)
    outputs = [discriminator(images), keras.ops.abs(images)]
    models = {"gan": keras.Model(z, outputs)}
    keys = held_outputs.result_keys
    assert keys(Outputs("gan", 0), models) == ["gan/scorer"]
    assert keys(Outputs("gan", 1), models) == ["gan"]
