"""Which loss scaler a model gets: `kmp.wrap`, and Keras's own scaler
made kmp's in place.

`kmp.wrap(optimizer)` gives a `kmp.LossScaleOptimizer` under float16 and
the optimizer itself otherwise, so training code is the same in every
mode. `upgrade_stock_scaler` turns the scaler Keras put in place (it wraps
plain optimizers in its own when it compiles a mixed_float16 model) into
kmp's without losing its state; `kmp.distribute` uses it, since Keras's
scaler can hang a multi-worker job.
"""

import inspect

import keras
from keras import ops

from kmp.errors import InputError
from kmp.errors import InputTypeError
from kmp.memory import low_precision
from kmp.policy import warn_if_reset
from kmp.scaling.loss_scale_optimizer import LossScaleOptimizer
from kmp.scaling.scale_rule import check_rule

_StockLossScaleOptimizer = keras.optimizers.LossScaleOptimizer


def upgrade_stock_scaler(optimizer) -> LossScaleOptimizer:
    """Makes a Keras `LossScaleOptimizer` a `kmp.LossScaleOptimizer`, in
    place.

    For the scaler Keras puts around a plain optimizer when it compiles a
    mixed_float16 model, or one a user passed. The object keeps its
    identity, inner optimizer (with its slots), `initial_scale`,
    `dynamic_growth_steps`, current scale and step counter, so a model
    compiled with it needs no new `compile`; it gains kmp's rule with
    default arguments (the bounds widened to hold `initial_scale`), a
    current scale clamped into those bounds, and `skipped_steps` and
    `overflow_streak` counting from 0. A built optimizer's two new
    variables are created in the current distribution scope: call this
    inside the scope the optimizer was made in.

    Args:
        optimizer: An instance of exactly
            `keras.optimizers.LossScaleOptimizer` (a user's subclass would
            lose its code).

    Returns:
        The same object, now a `kmp.LossScaleOptimizer`.
    """
    if type(optimizer) is not _StockLossScaleOptimizer:
        raise InputTypeError(
            "upgrade_stock_scaler takes a keras.optimizers."
            f"LossScaleOptimizer, got {type(optimizer).__name__}."
        )
    initial = float(optimizer.initial_scale)
    rule = check_rule(
        initial,
        dynamic_growth_steps=optimizer.dynamic_growth_steps,
        min_scale=min(1.0, initial),
        max_scale=max(2.0**24, initial),
    )
    optimizer.__class__ = LossScaleOptimizer
    # The stock class's plain attribute is now a view of the rule.
    vars(optimizer).pop("dynamic_growth_steps", None)
    optimizer._rule = rule
    if optimizer.built:
        optimizer._add_skip_accounting()
        # The stock scale may have fallen to 0 or grown to inf already.
        optimizer.dynamic_scale.assign(
            ops.clip(
                optimizer.dynamic_scale.value, rule.min_scale, rule.max_scale
            )
        )
        # Keras float8 statistics afresh, in units of kmp's scale.
        optimizer._follow_keras_float8(
            float(ops.convert_to_numpy(optimizer.dynamic_scale))
        )
    return optimizer


def _check_wrap_kwargs(kwargs):
    """Validates `kmp.wrap`'s kwargs even when no optimizer is made from
    them, so that a typo fails under bfloat16 as it would under float16."""
    bound = inspect.signature(LossScaleOptimizer.__init__).bind_partial(
        None, None, **kwargs
    )
    bound.apply_defaults()
    args = dict(bound.arguments)
    for name in ("self", "inner_optimizer", "name"):
        args.pop(name)
    extra = args.pop("kwargs")
    if extra:
        raise InputError(
            f"kmp.wrap got unexpected arguments {sorted(extra)}. It accepts "
            f"the arguments of kmp.LossScaleOptimizer: {sorted(args)}."
        )
    check_rule(**args)


def wrap(
    optimizer="adam", state_dtype=None, rounding=None, seed=0, **kwargs
) -> keras.optimizers.Optimizer:
    """Wraps an optimizer in `kmp.LossScaleOptimizer` when float16 needs it.

    Loss scaling is needed only when the global policy computes in float16.
    `wrap` returns a `kmp.LossScaleOptimizer` then, and the optimizer
    itself, scaling nothing, under bfloat16 or float32 (where it may
    round bfloat16-stored weights stochastically: `rounding`), so
    training code is the same in every mode. Call it after
    `kmp.enable(...)` and pass the result to `model.compile`: Keras keeps
    a loss-scaling optimizer it is given and would otherwise wrap a plain
    one in its own stock scaler.

    Args:
        optimizer: A `keras.optimizers.Optimizer` instance or a name Keras
            knows (`"adam"`, `"sgd"`, ...). A stock Keras
            `LossScaleOptimizer` is replaced by kmp's around the same inner
            optimizer, keeping its `initial_scale` and
            `dynamic_growth_steps`.
        state_dtype: `"bfloat16"` stores the (inner) optimizer's slots
            in bfloat16, its update computed in float32: Adam's state in
            4 bytes per parameter instead of 8 (`kmp.memory`).
            `"float32"`: float32 slots (also for bfloat16 weights). None:
            Keras's slots, in the dtype of their variables.
        rounding: How the new value of a bfloat16 weight is rounded:
            `"stochastic"` (small updates still move it on average),
            `"nearest"` (Keras's), or None: decided when the optimizer
            is built, from its weights: stochastic for those stored in
            bfloat16 (`kmp.enable("mixed_bfloat16",
            master_weights="bfloat16")`, before or after this call).
        seed: An int, which stochastic roundings the run draws.
        **kwargs: Passed to `kmp.LossScaleOptimizer` when one is made;
            ignored when no scaling is needed, so the same call works in
            every mode.

    Returns:
        A `keras.optimizers.Optimizer`.

    Example:

    ```python
    kmp.enable("auto")
    model.compile(optimizer=kmp.wrap("adam"), loss="mse")
    ```
    """
    if isinstance(optimizer, str):
        optimizer = keras.optimizers.get(optimizer)
    elif not isinstance(optimizer, keras.optimizers.Optimizer):
        raise InputError(
            "`optimizer` must be a keras.optimizers.Optimizer instance or an "
            f"optimizer name such as 'adam', got {optimizer!r}."
        )
    _check_wrap_kwargs(kwargs)
    if isinstance(optimizer, (LossScaleOptimizer, _StockLossScaleOptimizer)):
        low_precision(optimizer.inner_optimizer, state_dtype, rounding, seed)
    else:
        low_precision(optimizer, state_dtype, rounding, seed)
    if keras.config.dtype_policy().compute_dtype != "float16":
        warn_if_reset("wrap")  # no scale, when kmp.enable asked float16
        return optimizer
    if isinstance(optimizer, LossScaleOptimizer):
        return optimizer
    if isinstance(optimizer, _StockLossScaleOptimizer):
        if optimizer.built:
            raise InputError(
                "Cannot convert a stock keras LossScaleOptimizer that has "
                "already been built (its state would be lost). Pass its "
                "`inner_optimizer` to kmp.wrap before training."
            )
        kwargs.setdefault("initial_scale", optimizer.initial_scale)
        kwargs.setdefault(
            "dynamic_growth_steps", optimizer.dynamic_growth_steps
        )
        optimizer = optimizer.inner_optimizer
    return LossScaleOptimizer(optimizer, **kwargs)
