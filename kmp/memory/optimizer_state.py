"""16-bit optimizer state: the slots in bfloat16, the update in float32.

Keras makes an optimizer's slots (Adam's moments, SGD's momentum) in the
dtype of the variable they follow (`add_variable_from_reference`), and
its `update_step` computes in that dtype: under a mixed policy, float32
slots, 8 bytes per parameter for Adam on top of the 4 of the float32
master. Stored in bfloat16 they take 4, and weights + state go from 12
bytes per parameter to 8 (0.67x).

`with_state_dtype(optimizer, "bfloat16")` changes the class of a Keras
optimizer not yet built to a subclass (`LowPrecisionAdam`, ...,
registered for saving) that:

- makes each slot in bfloat16 (an exponential moving average of the
  weights and a gradient accumulator stay float32: they stand for
  weights, not for statistics);
- runs the stock `update_step` with every variable read as float32 and
  writes each result back rounded once to the slot's dtype (Keras's
  `assign` rounds to nearest). Stock Keras would instead round after
  every operation (TensorFlow's `assign_add` casts its increment first;
  torch's fused `_foreach` kernels write in place in bfloat16);
- on torch, replaces the fused multi-tensor kernels with the per-variable
  loop (the opt-in mode's cost); on TensorFlow, keeps `tf.distribute`'s
  all-reduce and per-replica update.

The float32 arithmetic and one rounding per step are what keep the run
close to float32 state (`tests/memory/optimizer_state_test.py`).
"""

import keras
from keras import ops

from kmp import backend
from kmp.errors import InputError

STATE_DTYPES = ("float32", "bfloat16")
# Slots Keras makes from a weight that stand for weights themselves.
_KEPT_FLOAT32 = ("average", "gradient_accumulator")


class _LowPrecisionState:
    """The mixin placed before a Keras optimizer's class (module doc)."""

    _state_dtype = None
    _making_slot = False

    def add_variable_from_reference(
        self, reference_variable, name=None, initializer="zeros"
    ):
        slot = name not in _KEPT_FLOAT32 and "float" in str(
            reference_variable.dtype
        )
        # Keras's method computes the name and passes the reference's
        # dtype on to `add_variable`, which swaps it (below).
        object.__setattr__(self, "_making_slot", slot)
        try:
            return super().add_variable_from_reference(
                reference_variable, name=name, initializer=initializer
            )
        finally:
            object.__setattr__(self, "_making_slot", False)

    def add_variable(
        self,
        shape,
        initializer="zeros",
        dtype=None,
        aggregation="none",
        layout=None,
        name=None,
    ):
        if self._making_slot:
            dtype = self._state_dtype
        return super().add_variable(
            shape,
            initializer=initializer,
            dtype=dtype,
            aggregation=aggregation,
            layout=layout,
            name=name,
        )

    def _backend_update_step(self, grads, trainable_variables, learning_rate):
        if backend.updates_per_replica():
            # TensorFlow: all-reduce, then `_distributed_tf_update_step`.
            return super()._backend_update_step(
                grads, trainable_variables, learning_rate
            )
        with backend.outside_autograd(), backend.float32_reads():
            for grad, variable in zip(grads, trainable_variables):
                self.update_step(grad, variable, learning_rate)

    def _distributed_tf_update_step(
        self, distribution, grads_and_vars, learning_rate
    ):
        # TensorFlow hands the update the raw tf.Variable: the Keras one
        # (whose reads the float32 scope casts) is found by its index.
        def update(variable, grad, learning_rate):
            keras_variable = self._trainable_variables[
                self._get_variable_index(variable)
            ]
            with backend.float32_reads():
                self.update_step(grad, keras_variable, learning_rate)

        for grad, variable in grads_and_vars:
            distribution.extended.update(
                variable, update, args=(grad, learning_rate), group=False
            )

    def _var_key(self, variable):
        with backend.stored_reads():  # TensorFlow keys by the stored value
            return super()._var_key(variable)

    def assign(self, variable, value):
        with backend.stored_reads():  # the write reaches the variable
            variable.assign(value)  # rounded once to its dtype

    def assign_add(self, variable, value):
        self.assign(variable, ops.add(ops.cast(variable, "float32"), value))

    def assign_sub(self, variable, value):
        self.assign(
            variable, ops.subtract(ops.cast(variable, "float32"), value)
        )

    def get_config(self):
        return {**super().get_config(), "state_dtype": self._state_dtype}

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        state_dtype = config.pop("state_dtype", "bfloat16")
        optimizer = super().from_config(config, custom_objects=custom_objects)
        object.__setattr__(optimizer, "_state_dtype", state_dtype)
        return optimizer


_CLASSES = {}


def _stock_class(cls):
    """The public Keras optimizer class `cls` is or derives from (on
    torch, Keras's `Adam()` is an instance of its fused torch twin)."""
    for klass in cls.__mro__:
        if klass.__module__.startswith("keras.src.optimizers."):
            return klass
    return None


def _low_precision_class(stock):
    if stock not in _CLASSES:
        name = f"LowPrecision{stock.__name__}"
        klass = type(
            name, (_LowPrecisionState, stock), {"__module__": __name__}
        )
        _CLASSES[stock] = keras.saving.register_keras_serializable("kmp", name)(
            klass
        )
    return _CLASSES[stock]


# Registered when kmp is imported, so that a `.keras` file saved with one
# loads in a fresh process. Each makes its slots from its variables.
for _name in ("Adam", "AdamW", "SGD", "Lion", "RMSprop", "Adamax", "Nadam"):
    _low_precision_class(getattr(keras.optimizers, _name))


def state_dtype_of(optimizer) -> str | None:
    """The state dtype `with_state_dtype` set, or None (Keras's own)."""
    return getattr(optimizer, "_state_dtype", None)


def with_state_dtype(optimizer, state_dtype):
    """Stores `optimizer`'s slots in `state_dtype`; returns the optimizer.

    Args:
        optimizer: A Keras optimizer, not built yet (its slots are made
            when it is built).
        state_dtype: `"bfloat16"` (slots stored in bfloat16, the update
            in float32), or `"float32"` / None (the optimizer unchanged:
            Keras's slots, in the dtype of their variables).

    Raises:
        kmp.InputError: another dtype (float16's range cannot hold Adam's
            second moment of small gradients: it underflows to 0), a built
            optimizer, or one that is not a Keras optimizer.

    Example:

    ```python
    optimizer = with_state_dtype(keras.optimizers.AdamW(1e-3), "bfloat16")
    ```
    """
    if state_dtype in (None, "float32"):
        return optimizer
    if state_dtype not in STATE_DTYPES:
        raise InputError(
            f"state_dtype={state_dtype!r} is not supported; use one of "
            f"{STATE_DTYPES} (float16's range underflows Adam's second "
            "moment; bfloat16 has float32's range)."
        )
    stock = _stock_class(type(optimizer))
    if stock is None or not type(optimizer).__module__.startswith("keras."):
        # A subclass of the user's own would lose its methods to the
        # stock class's, and its file could not be loaded elsewhere.
        raise InputError(
            f"state_dtype needs one of Keras's own optimizers "
            f"(keras.optimizers.Adam, ...); got {type(optimizer).__name__}."
        )
    if optimizer.built:
        raise InputError(
            f"{type(optimizer).__name__} is built: its slots exist. Pass "
            "state_dtype before compile (kmp.wrap(optimizer, "
            "state_dtype=...)), or for a new optimizer."
        )
    optimizer.__class__ = _low_precision_class(stock)
    object.__setattr__(optimizer, "_state_dtype", state_dtype)
    return optimizer
