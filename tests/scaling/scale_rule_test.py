"""The loss-scale rule as a pure function (`kmp.scaling.scale_rule`):
exact small numbers, a property test against the docstring's
pseudo-code, and the argument checks. The optimizer built on it:
loss_scale_optimizer_test.py.
"""

import pytest
from hypothesis import given
from hypothesis import strategies as st
from keras import ops
from util import SCALE_RULES
from util import reference_scale_rule

from kmp.scaling.scale_rule import ScaleRule
from kmp.scaling.scale_rule import ScaleState
from kmp.scaling.scale_rule import check_rule
from kmp.scaling.scale_rule import next_scale_state


def _start(scale):
    return ScaleState(
        ops.convert_to_tensor(scale, "float32"),
        ops.convert_to_tensor(0, "int32"),
        ops.convert_to_tensor(0, "int32"),
        ops.convert_to_tensor(0, "int32"),
    )


def _numbers(state):
    scale, counter, streak, skipped = (
        ops.convert_to_numpy(value) for value in state
    )
    return float(scale), int(counter), int(streak), int(skipped)


def _run(steps, scale, rule):
    state = _start(scale)
    for finite in steps:
        state = next_scale_state(state, finite, rule)
    return _numbers(state)


def test_four_overflows_take_400_to_25_and_count_four_skips():
    assert _run([False] * 4, 400.0, ScaleRule()) == (25.0, 0, 4, 4)


def test_growth_after_growth_steps_resets_the_counter():
    rule = ScaleRule(dynamic_growth_steps=3)
    assert _run([True, True], 8.0, rule) == (8.0, 2, 0, 0)
    assert _run([True] * 3, 8.0, rule) == (16.0, 0, 0, 0)
    assert _run([True] * 7, 8.0, rule) == (32.0, 1, 0, 0)


def test_an_overflow_resets_the_growth_count():
    rule = ScaleRule(dynamic_growth_steps=2)
    assert _run([True, False, True], 8.0, rule) == (4.0, 1, 0, 1)


def test_floor_and_cap_are_exact():
    rule = ScaleRule(dynamic_growth_steps=1, min_scale=3.0, max_scale=20.0)
    assert _run([False] * 3, 16.0, rule) == (3.0, 0, 3, 3)
    assert _run([True] * 3, 16.0, rule) == (20.0, 0, 0, 0)


def test_hysteresis_backs_off_at_the_nth_overflow_in_a_row_and_after():
    rule = ScaleRule(hysteresis=3)
    assert _run([False] * 2, 64.0, rule) == (64.0, 0, 2, 2)
    assert _run([False] * 3, 64.0, rule) == (32.0, 0, 3, 3)
    assert _run([False] * 4, 64.0, rule) == (16.0, 0, 4, 4)
    assert _run([False, False, True, False], 64.0, rule) == (64.0, 0, 1, 3)


def test_a_fixed_scale_still_counts_skips():
    rule = ScaleRule(dynamic=False, dynamic_growth_steps=1)
    assert _run([False, True, True], 64.0, rule) == (64.0, 2, 0, 1)


@given(
    finite=st.lists(st.booleans(), min_size=1, max_size=12),
    **SCALE_RULES,
)
def test_matches_the_docstring_pseudo_code(
    finite, growth_steps, hysteresis, growth, backoff, initial_exp
):
    rule = ScaleRule(
        dynamic_growth_steps=growth_steps,
        growth_factor=growth,
        backoff_factor=backoff,
        min_scale=1.0,
        max_scale=2.0**8,
        hysteresis=hysteresis,
    )
    expected = reference_scale_rule(
        ["finite" if f else "inf" for f in finite],
        2.0**initial_exp,
        growth_steps,
        growth,
        backoff,
        1.0,
        2.0**8,
        hysteresis,
    )
    assert _run(finite, 2.0**initial_exp, rule) == pytest.approx(
        expected, rel=1e-6
    )


@pytest.mark.backend_independent
def test_check_rule_normalises_numbers():
    rule = check_rule(4, dynamic_growth_steps=10, growth_factor=3, hysteresis=2)
    assert rule == ScaleRule(10, 3.0, 0.5, 1.0, 2.0**24, 2, True)
    assert isinstance(rule.growth_factor, float)


@pytest.mark.backend_independent
@pytest.mark.parametrize(
    "initial_scale, rule, phrase",
    [
        (1.0, {"growth_factor": 1.0}, "`growth_factor` must be > 1"),
        (1.0, {"backoff_factor": 1.5}, "`backoff_factor` must be in the open"),
        (1.0, {"min_scale": 0.0}, "`min_scale` must be > 0"),
        (5.0, {"max_scale": 4.0}, "`initial_scale` must lie in"),
        (1.0, {"max_scale": 2.0**128}, "`max_scale` must be <= 2\\*\\*127"),
        (1.0, {"hysteresis": 0}, "`hysteresis` must be a positive int"),
        (1.0, {"dynamic": 1}, "`dynamic` must be a bool"),
        ("8", {}, "`initial_scale` must be a finite number"),
    ],
)
def test_check_rule_says_what_is_wrong(initial_scale, rule, phrase):
    with pytest.raises(ValueError, match=phrase):
        check_rule(initial_scale, **rule)


def test_fields_a_step_leaves_alone_are_the_objects_passed_in():
    # The optimizer writes back only what changed: one op fewer per step.
    state = _start(8.0)
    finite = next_scale_state(state, True, ScaleRule())
    assert finite.skipped_steps is state.skipped_steps
    assert finite.scale is not state.scale  # a dynamic scale may grow
    fixed = next_scale_state(state, False, ScaleRule(dynamic=False))
    assert fixed.scale is state.scale


def test_the_optimizer_holds_one_rule_and_its_attributes_read_it():
    import keras

    import kmp

    optimizer = kmp.LossScaleOptimizer(
        keras.optimizers.SGD(),
        initial_scale=4.0,
        max_scale=8.0,
        dynamic_growth_steps=1,
    )
    assert optimizer.rule == check_rule(
        4.0, max_scale=8.0, dynamic_growth_steps=1
    )
    assert (optimizer.max_scale, optimizer.dynamic_growth_steps) == (8.0, 1)
    assert optimizer.get_config()["max_scale"] == 8.0
    # An assignment changes the rule the next step runs on: the cap.
    optimizer.max_scale = 4.0
    assert optimizer.rule.max_scale == 4.0
    variable = keras.Variable([1.0])
    optimizer.build([variable])
    optimizer.scale_loss(1.0)  # the gradient is of the scaled loss
    optimizer.apply([ops.ones((1,))], [variable])
    assert float(optimizer.loss_scale) == 4.0  # grown, then capped
    restored = kmp.LossScaleOptimizer.from_config(optimizer.get_config())
    assert restored.rule == optimizer.rule
