"""Keras's generated names, ranked (`kmp.saving.keras_names`): a run's
saved paths and a load's variables paired by order, not by count."""

from types import SimpleNamespace

import keras
from hypothesis import given
from hypothesis import strategies as st

from kmp.saving.keras_names import Names
from kmp.saving.keras_names import known_places
from kmp.saving.keras_names import names_made
from kmp.saving.keras_names import pair_weights
from kmp.saving.keras_names import ranked


def _variables(shapes):
    return [SimpleNamespace(path=p, shape=s) for p, s in shapes.items()]


def test_ranks_are_counts_in_order_within_a_scope_and_name():
    assert ranked(
        [
            "block/dense_1/kernel",
            "block/dense_2/kernel",
            "dense_7/kernel",
            "block/conv2d/kernel",
            "transformer_layer_10/bias",
            "transformer_layer_9/bias",
        ]
    ) == {
        "block/dense_1/kernel": "block#0/dense#0/kernel#0",
        "block/dense_2/kernel": "block#0/dense#1/kernel#0",
        "dense_7/kernel": "dense#0/kernel#0",
        "block/conv2d/kernel": "block#0/conv2d#0/kernel#0",
        # By number, not by string: 9 before 10.
        "transformer_layer_10/bias": "transformer_layer#1/bias#0",
        "transformer_layer_9/bias": "transformer_layer#0/bias#0",
    }


def test_kept_names_take_no_rank_from_their_siblings():
    # A config's dense_1 and dense_3 beside a made-up dense_2: only the
    # made-up one is ranked, among the made-up ones.
    paths = ["dense_1/kernel", "dense_2/kernel", "dense_3/kernel"]
    assert ranked(paths, lambda raw, scope, part: part != "dense_2") == {
        "dense_1/kernel": "dense_1/kernel",
        "dense_2/kernel": "dense#0/kernel",
        "dense_3/kernel": "dense_3/kernel",
    }


@given(
    counts=st.lists(
        st.integers(0, 50), min_size=1, max_size=6, unique=True
    ).map(sorted),
    shift=st.integers(1, 20),
)
def test_shifted_counts_rank_alike(counts, shift):
    # What another process makes before the model moves every count of a
    # name up; the order in which one piece of code makes them stays.
    def paths(offset):
        return [
            f"block/{'dense' if c + offset == 0 else f'dense_{c + offset}'}"
            "/kernel"
            for c in counts
        ]

    run, load = ranked(paths(shift)), ranked(paths(0))
    assert list(run.values()) == list(load.values())


def _pairs(saved, variables, made, scope="", given=()):
    names = Names(set(made), set(given), {})
    pairs = pair_weights(saved, _variables(variables), names, scope)
    return {s: v.path for s, v in pairs.items()}


def test_a_run_s_names_one_apart_pair_in_order():
    # A subclassed model built in `fit`, in its scope "net"; the load's
    # names made up from "dense".
    saved = {
        "net/dense_1/kernel": (4, 4),
        "net/dense_1/bias": (4,),
        "net/dense_2/kernel": (4, 4),
        "net/dense_2/bias": (4,),
    }
    variables = {
        "dense/kernel": (4, 4),
        "dense/bias": (4,),
        "dense_1/kernel": (4, 4),
        "dense_1/bias": (4,),
    }
    assert _pairs(saved, variables, {"dense", "dense_1"}, "net") == {
        "net/dense_1/kernel": "dense/kernel",
        "net/dense_1/bias": "dense/bias",
        "net/dense_2/kernel": "dense_1/kernel",
        "net/dense_2/bias": "dense_1/bias",
    }


def test_a_made_up_name_among_a_config_s_keeps_its_own_rank():
    # A reviewer's first case: a Functional model's dense_1 and dense_3
    # (its config's names) and a layer's own Dense, built in its
    # constructor, so at the root: the run's dense_2, the load's dense.
    # Ranked together, dense_2 came second in the run and dense first in
    # the load, and two layers of one shape traded values.
    shape = (6, 6)
    saved = {"dense_1/kernel": shape, "dense_2/kernel": shape}
    saved["dense_3/kernel"] = shape
    variables = dict.fromkeys(["dense_1/kernel", "dense/kernel"], shape)
    variables["dense_3/kernel"] = shape
    assert _pairs(saved, variables, {"dense"}) == {
        "dense_1/kernel": "dense_1/kernel",
        "dense_2/kernel": "dense/kernel",
        "dense_3/kernel": "dense_3/kernel",
    }


def test_a_name_given_in_code_keeps_its_place():
    # A reviewer's second case: a block's Dense named "dense_1" in its
    # code beside a Dense Keras names (the run's dense_2, the load's
    # dense).
    shape = (6, 6)
    saved = dict.fromkeys(
        ["block/dense_1/kernel", "block/dense_2/kernel"], shape
    )
    variables = dict.fromkeys(
        ["block/dense/kernel", "block/dense_1/kernel"], shape
    )
    assert _pairs(saved, variables, {"dense"}) == {
        "block/dense_1/kernel": "block/dense_1/kernel",
        "block/dense_2/kernel": "block/dense/kernel",
    }


def test_only_the_model_s_own_scope_is_read_off():
    # `fit` builds a subclassed model inside its name scope: the model's
    # name. Another outer scope pairs nothing (so kmp says what is lost).
    saved = {"net/dense/kernel": (2, 2), "net/block/dense/kernel": (2, 2)}
    variables = {"dense/kernel": (2, 2), "block/dense/kernel": (2, 2)}
    assert _pairs(saved, variables, {"dense"}, "net") == {
        "net/dense/kernel": "dense/kernel",
        "net/block/dense/kernel": "block/dense/kernel",
    }
    assert _pairs(saved, variables, {"dense"}, "other") == {}


def test_all_or_none():
    made = {"dense", "dense_1", "dense_2"}
    saved = {"dense/kernel": (2, 2), "dense_1/kernel": (2, 2)}
    # One more layer than the run had: which is which is a guess.
    three = {
        "dense/kernel": (2, 2),
        "dense_1/kernel": (2, 2),
        "dense_2/kernel": (2, 2),
    }
    assert _pairs(saved, three, made) == {}
    # A shape that differs.
    other = {"dense/kernel": (2, 2), "dense_1/kernel": (2, 3)}
    assert _pairs(saved, other, made) == {}
    # One saved value fewer.
    assert _pairs({"dense/kernel": (2, 2)}, other, made) == {}
    # A path saved both in the model's scope and outside it.
    both = {"net/dense/kernel": (2, 2), "dense/kernel": (2, 2)}
    assert _pairs(both, {"dense/kernel": (2, 2)}, made, "net") == {}


def test_a_random_state_need_not_pair():
    saved = {
        "dense/kernel": (2, 2),
        "seed_generator_3/seed_generator_state": (2,),
    }
    assert _pairs(saved, {"dense_4/kernel": (2, 2)}, {"dense_4"}) == {
        "dense/kernel": "dense_4/kernel"
    }


def test_a_name_made_up_and_given_beside_a_made_up_sibling_pairs_nothing():
    # The block's Dense named "dense_1" in its code, a Dense Keras named
    # "dense" beside it, and "dense_1" made up elsewhere in the same load:
    # which block/dense_1 is the made-up one, no path tells.
    shape = (6, 6)
    saved = dict.fromkeys(
        ["block/dense_1/kernel", "block/dense_4/kernel"], shape
    )
    saved["other/dense_3/kernel"] = shape
    variables = dict.fromkeys(
        ["block/dense/kernel", "block/dense_1/kernel"], shape
    )
    variables["other/dense_1/kernel"] = shape
    made = {"dense", "dense_1"}
    assert _pairs(saved, variables, made, given={"dense_1"}) == {}
    # Alone in its scope, its rank is its own.
    alone = {"block/dense_1/kernel": shape, "other/dense_3/kernel": shape}
    ours = {"block/dense_1/kernel": shape, "other/dense_1/kernel": shape}
    assert _pairs(alone, ours, made, given={"dense_1"}) == {
        "block/dense_1/kernel": "block/dense_1/kernel",
        "other/dense_3/kernel": "other/dense_1/kernel",
    }


def test_names_made_are_the_names_keras_gave_meanwhile():
    keras.layers.Dense(1)  # "dense" at least, before
    names = Names(set(), set(), {})
    with names_made(names):
        first = keras.layers.Dense(1)
        named = keras.layers.Dense(1, name="head")
        second = keras.layers.Dense(1)
    assert {first.name, second.name} <= names.made
    assert named.name not in names.made and "dense" not in names.made
    assert "head" in names.given and first.name not in names.given
    # Keras's own constructor again after the block.
    assert keras.layers.Dense(1, name="later").name == "later"
    assert "later" not in names.given


def test_known_places_tell_a_layer_s_name_by_the_layer_that_holds_it():
    # The root's "dense_1" is given; the block's "dense_1", made up, is
    # the same string: each place is told by the layer there.
    @keras.saving.register_keras_serializable(package="kmp_tests")
    class Block(keras.layers.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.first = keras.layers.Dense(2)
            self.second = keras.layers.Dense(2)

        def call(self, x):
            return self.second(self.first(x))

    keras.utils.clear_session()
    names = Names(set(), set(), {})
    with names_made(names):
        inputs = keras.Input((2,))
        hidden = keras.layers.Dense(2, name="dense_1")(inputs)
        model = keras.Model(inputs, Block(name="block")(hidden))
    assert [v.path for v in model.weights if "kernel" in v.path] == [
        "dense_1/kernel",
        "block/dense/kernel",
        "block/dense_1/kernel",
    ]
    assert "dense_1" in names.made and "dense_1" in names.given
    known = known_places(model, names)
    assert known[("", "dense_1")] is False
    assert known[("block", "dense_1")] is True
    assert known[("", "block")] is False
    keras.utils.clear_session()
