"""Which memory mode an optimizer is in, and when that is decided:
`low_precision`, what `kmp.wrap(..., state_dtype=, rounding=, seed=)`
asks of the (inner) optimizer.

A request Keras already meets leaves the optimizer as it is. Any other
makes it, in place, one of `kmp.memory.optimizer_state`'s classes: the
low-precision class now, or, where the rounding is the default and the
policy does not say yet that the weights will be bfloat16, a class that
decides when the optimizer is built, from the dtypes of its weights
(`kmp.wrap` may well run before `kmp.enable(..., master_weights=
"bfloat16")`, and a rounding read from the policy then would round
bfloat16 weights to nearest: the mode that stalls).
"""

import keras

from kmp.errors import InputError
from kmp.memory import optimizer_state
from kmp.memory import quantized_state
from kmp.memory.optimizer_state import ROUNDINGS
from kmp.memory.optimizer_state import STATE_DTYPES


def low_precision(optimizer, state_dtype=None, rounding=None, seed=0):
    """Stores `optimizer`'s slots in `state_dtype` and rounds its writes
    to bfloat16 weights as `rounding` says; returns the optimizer.

    The optimizer is changed in place, and only where a request differs
    from what Keras does: float32 weights and state with no stochastic
    rounding leave it as it was (the same class, the same bits).

    Args:
        optimizer: A Keras optimizer, not built yet (its slots are made
            when it is built).
        state_dtype: `"bfloat16"` (slots stored in bfloat16, the update
            in float32), `"int8"` (8-bit codes in blocks with a float32
            scale each, `kmp.memory.quantized_state`: Adam, AdamW, Lion
            and SGD), `"float32"` (float32 slots, also for bfloat16
            weights), or None: Keras's slots, in the dtype of their
            variables.
        rounding: How a new value of a bfloat16 weight is rounded:
            `"stochastic"` (unbiased: small updates still move it on
            average) or `"nearest"` (Keras's rounding: an update under
            half a bfloat16 step is lost). None: decided when the
            optimizer is built, from its weights: stochastic for those
            stored in bfloat16 (`kmp.enable(..., master_weights=
            "bfloat16")`, before or after this call).
        seed: An int: which stochastic roundings a run draws (the same
            seed rounds the same way on every backend).

    Raises:
        kmp.InputError: another dtype (float16's range cannot hold Adam's
            second moment of small gradients: it underflows to 0) or
            rounding, `"int8"` for an optimizer it is not offered for, a
            built optimizer, or one that is not a Keras optimizer.

    Example:

    ```python
    optimizer = low_precision(keras.optimizers.AdamW(1e-3), "bfloat16")
    ```
    """
    if state_dtype not in (None, *STATE_DTYPES):
        raise InputError(
            f"state_dtype={state_dtype!r} is not supported; use one of "
            f"{STATE_DTYPES} or None (float16's range underflows Adam's "
            "second moment; bfloat16 has float32's range)."
        )
    if rounding not in (None, *ROUNDINGS):
        raise InputError(
            f"rounding={rounding!r} is not supported; use one of "
            f"{ROUNDINGS} or None (stochastic for bfloat16 master weights)."
        )
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise InputError(f"seed must be an int, got {seed!r}.")
    masters = keras.config.dtype_policy().variable_dtype
    now = (
        state_dtype in ("bfloat16", "int8")
        or rounding == "stochastic"
        or (rounding is None and masters == "bfloat16")
        or (state_dtype is not None and masters != state_dtype)
    )
    # The default rounding under float32 weights (so far): Keras's own
    # class until the weights are known, in `build`.
    later = not now and rounding is None and not optimizer.built
    if not (now or later):
        return optimizer  # what Keras does already
    if optimizer_state.stock_class(optimizer) is None:
        if later:
            return optimizer  # Keras's rounding (the audit says so)
        # A subclass of the user's own would lose its methods to the
        # stock class's, and its file could not be loaded elsewhere.
        raise InputError(
            "16-bit state or stochastic rounding needs one of Keras's own "
            f"optimizers (keras.optimizers.Adam, ...); got "
            f"{type(optimizer).__name__}."
        )
    stock = optimizer_state.stock_class(optimizer)
    if stock.__name__ not in optimizer_state.offered():
        if later:
            return optimizer
        # ScheduleFreeAdamW (its "momentum" is an iterate of the weights),
        # LossScaleOptimizer (wrap its inner one), a class Keras adds later.
        raise InputError(
            f"16-bit state and stochastic rounding are not offered for "
            f"{stock.__name__}; use one of {optimizer_state.offered()}."
        )
    if state_dtype == "int8" and stock.__name__ not in (
        quantized_state.OPTIMIZERS
    ):
        raise InputError(
            f"8-bit state is not offered for {stock.__name__}: its slots "
            f"are quantized for {list(quantized_state.OPTIMIZERS)}. Use "
            "one of those, or state_dtype='bfloat16'."
        )
    if optimizer.built:
        raise InputError(
            f"{type(optimizer).__name__} is built: its slots exist. Pass "
            "state_dtype and rounding before compile (kmp.wrap(optimizer, "
            "state_dtype=...)), or for a new optimizer."
        )
    if later:
        optimizer_state.round_when_built(optimizer, state_dtype, seed)
    else:
        optimizer_state.become_low_precision(
            optimizer, state_dtype, rounding, seed
        )
    return optimizer
