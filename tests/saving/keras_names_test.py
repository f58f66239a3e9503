"""Keras's generated names, ranked (`kmp.saving.keras_names`): a run's
saved paths and a load's variables paired by order, not by count."""

from types import SimpleNamespace

from hypothesis import given
from hypothesis import strategies as st

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


def test_a_run_s_names_one_apart_pair_in_order():
    saved = {
        "net/dense_1/kernel": (4, 4),
        "net/dense_1/bias": (4,),
        "net/dense_2/kernel": (4, 4),
        "net/dense_2/bias": (4,),
    }
    variables = _variables(
        {
            "dense/kernel": (4, 4),
            "dense/bias": (4,),
            "dense_1/kernel": (4, 4),
            "dense_1/bias": (4,),
        }
    )
    pairs = {s: v.path for s, v in pair_weights(saved, variables).items()}
    assert pairs == {
        "net/dense_1/kernel": "dense/kernel",
        "net/dense_1/bias": "dense/bias",
        "net/dense_2/kernel": "dense_1/kernel",
        "net/dense_2/bias": "dense_1/bias",
    }


def test_the_nearest_outer_scope_wins():
    # `dense#0/kernel#0` ends both saved paths; the one with one outer
    # scope, not two, is the load's top-level dense.
    saved = {"net/dense/kernel": (2, 2), "net/block/dense/kernel": (2, 2)}
    variables = _variables(
        {"dense/kernel": (2, 2), "block/dense/kernel": (2, 2)}
    )
    pairs = {s: v.path for s, v in pair_weights(saved, variables).items()}
    assert pairs == {
        "net/dense/kernel": "dense/kernel",
        "net/block/dense/kernel": "block/dense/kernel",
    }


def test_all_or_none():
    saved = {"dense/kernel": (2, 2), "dense_1/kernel": (2, 2)}
    # One more layer than the run had: which is which is a guess.
    three = _variables(
        {
            "dense/kernel": (2, 2),
            "dense_1/kernel": (2, 2),
            "dense_2/kernel": (2, 2),
        }
    )
    assert pair_weights(saved, three) == {}
    # A shape that differs.
    other = _variables({"dense/kernel": (2, 2), "dense_1/kernel": (2, 3)})
    assert pair_weights(saved, other) == {}
    # One saved value fewer.
    assert pair_weights({"dense/kernel": (2, 2)}, other) == {}


def test_a_random_state_need_not_pair():
    saved = {
        "dense/kernel": (2, 2),
        "seed_generator_3/seed_generator_state": (2,),
    }
    variables = _variables({"dense_4/kernel": (2, 2)})
    pairs = pair_weights(saved, variables)
    assert {s: v.path for s, v in pairs.items()} == {
        "dense/kernel": "dense_4/kernel"
    }
