"""The loss-scale rule as one function of the scale's state, and the
checks of its arguments.

`kmp.LossScaleOptimizer`'s docstring states the rule as pseudo-code (the
one place it is written out); `next_scale_state` is that rule, on the
values of the optimizer's four state variables. The optimizer's stateful
path, its stateless path (JAX's `fit`) and the tests all run this one
function.
"""

import math
import numbers
from typing import NamedTuple

from keras import ops

from kmp.errors import InputError


class ScaleState(NamedTuple):
    """The values of a `kmp.LossScaleOptimizer`'s state variables.

    Attributes:
        scale: The loss scale (`dynamic_scale`).
        step_counter: Finite steps since the scale last changed.
        overflow_streak: Non-finite steps in a row.
        skipped_steps: Steps skipped for non-finite gradients, in all.
    """

    scale: object
    step_counter: object
    overflow_streak: object
    skipped_steps: object


class ScaleRule(NamedTuple):
    """The rule's constants (`kmp.LossScaleOptimizer`'s arguments)."""

    dynamic_growth_steps: int = 2000
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    min_scale: float = 1.0
    max_scale: float = 2.0**24
    hysteresis: int = 1
    dynamic: bool = True


class RuleConstant:
    """An attribute of the optimizer that is one constant of the
    `ScaleRule` it holds (`LossScaleOptimizer.rule`): the attributes
    users and Keras read under the constructor's names
    (`optimizer.min_scale`; Keras's own `dynamic_growth_steps`, which its
    constructor sets) are views of the one value the update runs on. An
    assignment replaces that constant of the rule, unchecked, as an
    assignment to a Keras attribute is."""

    def __set_name__(self, owner, name):
        self.name = name

    def __get__(self, optimizer, owner=None):
        if optimizer is None:
            return self
        return getattr(optimizer.rule, self.name)

    def __set__(self, optimizer, value):
        # Keras's constructor sets `dynamic_growth_steps` before kmp's
        # gives the whole rule: the defaults stand in until then.
        rule = getattr(optimizer, "_rule", None) or ScaleRule()
        optimizer._rule = rule._replace(**{self.name: value})


def next_scale_state(
    state: ScaleState, finite: bool, rule: ScaleRule
) -> ScaleState:
    """The scale's state after one step.

    Args:
        state: The state before the step (tensors or numbers).
        finite: Whether every gradient of the step was finite: a Python
            bool, since each branch of the optimizer's `cond` calls this
            with its own answer.
        rule: The constants.

    Returns:
        The new `ScaleState`. A field the step leaves alone is the very
        object passed in, so the caller can skip writing it back (the
        update runs in every train step).
    """
    scale, counter, streak, skipped = state
    counter = ops.convert_to_tensor(counter)  # for its dtype
    one = ops.ones((), dtype=counter.dtype)
    zero = ops.zeros((), dtype=counter.dtype)
    if finite:
        counter = ops.add(counter, one)
        if rule.dynamic:
            grow = ops.greater_equal(counter, rule.dynamic_growth_steps)
            grown = ops.minimum(
                ops.multiply(scale, rule.growth_factor), rule.max_scale
            )
            scale = ops.where(grow, grown, scale)
            counter = ops.where(grow, zero, counter)
        return ScaleState(scale, counter, zero, skipped)
    streak = ops.add(streak, one)
    if rule.dynamic:
        backoff = ops.greater_equal(streak, rule.hysteresis)
        lowered = ops.maximum(
            ops.multiply(scale, rule.backoff_factor), rule.min_scale
        )
        scale = ops.where(backoff, lowered, scale)
    return ScaleState(scale, zero, streak, ops.add(skipped, one))


def _is_number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _check_count(arg_name, value):
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
        raise InputError(
            f"`{arg_name}` must be a positive int, got {value!r} of type "
            f"{type(value).__name__}. Pass a whole number such as 2000."
        )
    if value < 1:
        raise InputError(
            f"`{arg_name}` must be a positive int (>= 1), got {value}."
        )


def check_rule(initial_scale, **rule) -> ScaleRule:
    """Checks the rule's arguments and the initial scale against them.

    Args:
        initial_scale: The starting scale.
        **rule: The fields of `ScaleRule`; missing ones take its defaults.

    Returns:
        The `ScaleRule`, with floats and ints normalised.

    Raises:
        ValueError: naming the argument, what was passed and what is
            allowed.
    """
    rule = ScaleRule(**rule)
    if not isinstance(rule.dynamic, bool):
        raise InputError(f"`dynamic` must be a bool, got {rule.dynamic!r}.")
    for arg_name, value in (
        ("initial_scale", initial_scale),
        ("growth_factor", rule.growth_factor),
        ("backoff_factor", rule.backoff_factor),
        ("min_scale", rule.min_scale),
        ("max_scale", rule.max_scale),
    ):
        if not _is_number(value) or not math.isfinite(value):
            raise InputError(
                f"`{arg_name}` must be a finite number, got {value!r}."
            )
    if rule.growth_factor <= 1:
        raise InputError(
            f"`growth_factor` must be > 1, got {rule.growth_factor}. The "
            "scale is multiplied by it after `dynamic_growth_steps` finite "
            "steps; 2.0 is the usual value."
        )
    if not 0 < rule.backoff_factor < 1:
        raise InputError(
            f"`backoff_factor` must be in the open interval (0, 1), got "
            f"{rule.backoff_factor}. The scale is multiplied by it on "
            "overflow; 0.5 is the usual value."
        )
    if rule.min_scale <= 0:
        raise InputError(
            f"`min_scale` must be > 0, got {rule.min_scale}. A zero scale "
            "zeroes every gradient and the unscaling then divides by zero."
        )
    if rule.min_scale > rule.max_scale:
        raise InputError(
            f"`min_scale` ({rule.min_scale}) must be <= `max_scale` "
            f"({rule.max_scale})."
        )
    if rule.max_scale > float(2**127):
        raise InputError(
            f"`max_scale` must be <= 2**127 so that the scale and its "
            f"growth stay finite in float32, got {rule.max_scale}."
        )
    if not rule.min_scale <= initial_scale <= rule.max_scale:
        raise InputError(
            f"`initial_scale` must lie in [min_scale, max_scale] = "
            f"[{rule.min_scale}, {rule.max_scale}], got {initial_scale}."
        )
    _check_count("dynamic_growth_steps", rule.dynamic_growth_steps)
    _check_count("hysteresis", rule.hysteresis)
    return ScaleRule(
        int(rule.dynamic_growth_steps),
        float(rule.growth_factor),
        float(rule.backoff_factor),
        float(rule.min_scale),
        float(rule.max_scale),
        int(rule.hysteresis),
        rule.dynamic,
    )
