"""16-bit optimizer state: the slots in bfloat16, the update in float32.

Keras makes an optimizer's slots (Adam's moments, SGD's momentum) in the
dtype of the variable they follow (`add_variable_from_reference`), and
its `update_step` computes in that dtype: under a mixed policy, float32
slots, 8 bytes per parameter for Adam on top of the 4 of the float32
master. Stored in bfloat16 they take 4, and weights + state go from 12
bytes per parameter to 8 (0.67x).

`low_precision(optimizer, "bfloat16")` changes the class of a Keras
optimizer not yet built to a subclass (`LowPrecisionAdam`, ...,
registered for saving) that:

- makes each slot in bfloat16 (an exponential moving average of the
  weights and a gradient accumulator stay float32: they stand for
  weights, not for statistics);
- runs the stock `update_step` with every variable read as float32 and
  writes each result back rounded once, stochastically, to bfloat16
  (`kmp.memory.rounding`). Stock Keras would instead round after every
  operation (TensorFlow's `assign_add` casts its increment first;
  torch's fused `_foreach` kernels write in place in bfloat16), and to
  nearest: Adam's second moment moves 0.1 % of its distance a step,
  under half a bfloat16 step, and rounded to nearest it freezes;
- on torch, runs Keras's multi-tensor update on float32 copies, a
  group of variables at a time (`kmp.memory.grouped_update`); on
  TensorFlow, keeps `tf.distribute`'s all-reduce and per-replica update;
  elsewhere (JAX, Nadam on torch) updates variable by variable.

The float32 arithmetic and one unbiased rounding per step are what keep
the run close to float32 state (`tests/memory/optimizer_state_test.py`).

With `"int8"` the same class stores Adam's, AdamW's, Lion's and SGD's
slots of a block or more (`kmp.memory.quantized_state`) as 8-bit codes
with a float32 scale a block, 2 bytes per parameter for Adam; the stock
`update_step` sees each as a float32 variable, filled for the update
and requantized, stochastically, when it ends. Smaller slots stay
float32.

The same class writes bfloat16 weights (`kmp.enable("mixed_bfloat16",
master_weights="bfloat16")`): with `rounding="stochastic"` each weight's
new value is rounded stochastically (`kmp.memory.rounding`), so updates
smaller than half a bfloat16 step still move it on average; weight decay
on those weights is computed in float32 and rounded the same way.
"""

import keras
from keras import ops

from kmp import backend
from kmp.memory import grouped_update
from kmp.memory import quantized_state
from kmp.memory.rounding import stochastic_round

STATE_DTYPES = ("float32", "bfloat16", "int8")
# The dtype a slot is made in, per state dtype: 8-bit state keeps a slot
# it does not quantize (under a block, or one it does not know) float32.
_SLOT_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "int8": "float32"}
ROUNDINGS = ("stochastic", "nearest")
# Slots Keras makes from a weight that stand for weights themselves.
_KEPT_FLOAT32 = ("average", "gradient_accumulator")
_MODES = {
    "state_dtype": "_state_dtype",
    "rounding": "_rounding",
    "rounding_seed": "_rounding_seed",
}


class _Modes:
    """What `low_precision` asked of an optimizer, saved in its config."""

    _state_dtype = None  # None: each slot in its variable's dtype
    # Of bfloat16 weights: "stochastic", "nearest", or None: decided in
    # `build`, stochastic where a weight is stored in bfloat16.
    _rounding = None
    _rounding_seed = 0
    # Read where a config has no key (files saved before the key was).
    _SAVED_BEFORE = {"state_dtype": "bfloat16", "rounding": "nearest"}

    def get_config(self):
        config = super().get_config()
        for key, attribute in _MODES.items():
            config[key] = getattr(self, attribute)
        return config

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        modes = {
            attribute: config.pop(key, cls._SAVED_BEFORE.get(key, 0))
            for key, attribute in _MODES.items()
        }
        optimizer = super().from_config(config, custom_objects=custom_objects)
        for attribute, value in modes.items():
            object.__setattr__(optimizer, attribute, value)
        return optimizer


def _stores_bfloat16(variables) -> bool:
    return any(backend.stored_dtype(v) == "bfloat16" for v in variables)


class _LowPrecisionState(_Modes):
    """The mixin placed before a Keras optimizer's class (module doc)."""

    _making_slot = False
    _quantizing = None  # the map of the 8-bit slot being made: signed?

    def add_variable_from_reference(
        self, reference_variable, name=None, initializer="zeros"
    ):
        slot = name not in _KEPT_FLOAT32 and "float" in str(
            reference_variable.dtype
        )
        if (
            slot
            and self._state_dtype == "int8"
            and quantized_state.quantizes(reference_variable.shape, name)
        ):
            object.__setattr__(
                self, "_quantizing", quantized_state.SIGNED[name]
            )
        # Keras's method computes the name and passes the reference's
        # dtype on to `add_variable`, which swaps it (below).
        object.__setattr__(self, "_making_slot", slot)
        try:
            made = super().add_variable_from_reference(
                reference_variable, name=name, initializer=initializer
            )
        finally:
            object.__setattr__(self, "_making_slot", False)
            object.__setattr__(self, "_quantizing", None)
        # What a group's update writes besides its weights (`build`).
        made_from = self.__dict__.setdefault("_made_from", {})
        made_from.setdefault(self._var_key(reference_variable), []).append(made)
        return made

    def add_variable(
        self,
        shape,
        initializer="zeros",
        dtype=None,
        aggregation="none",
        layout=None,
        name=None,
    ):
        if self._quantizing is not None:
            signed = self._quantizing
            object.__setattr__(self, "_quantizing", None)
            object.__setattr__(self, "_making_slot", False)
            return quantized_state.add_slot(
                self, shape, initializer, name, layout, signed
            )
        if self._making_slot and self._state_dtype:
            dtype = _SLOT_DTYPES[self._state_dtype]
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
        if backend.updates_in_groups() and (
            _stock_class(type(self)).__name__ in grouped_update.GROUPED
        ):
            # Eager torch: per variable, each operation of the update is
            # a kernel and a Python call of its own (0.57x float32's
            # tokens/s; BUILD_NOTES, "The 16-bit update on eager torch").
            return grouped_update.update_in_groups(
                self,
                grads,
                trainable_variables,
                learning_rate,
                stock_decay=super()._apply_weight_decay,
                stock_update=super()._backend_update_step,
            )
        with backend.outside_autograd(), backend.float32_reads():
            for grad, variable in zip(grads, trainable_variables):
                self._update_variable(grad, variable, learning_rate)

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
                self._update_variable(grad, keras_variable, learning_rate)

        for grad, variable in grads_and_vars:
            distribution.extended.update(
                variable, update, args=(grad, learning_rate), group=False
            )

    def _update_variable(self, grad, variable, learning_rate):
        """Weight decay (for weights rounded stochastically), then the
        stock update; every variable reads as float32 here (8-bit slots
        too, for the update)."""
        with quantized_state.dequantized(self, [variable], after=grad):
            self._decayed_and_updated(grad, variable, learning_rate)

    def _decayed_and_updated(self, grad, variable, learning_rate):
        if (
            self.weight_decay is not None
            and self._use_weight_decay(variable)
            and self._stochastic_index(variable) is not None
        ):
            value = ops.cast(variable, "float32")
            rate = ops.multiply(
                ops.cast(learning_rate, "float32"),
                ops.cast(self.weight_decay, "float32"),
            )
            self.assign(variable, ops.subtract(value, value * rate))
        self.update_step(grad, variable, learning_rate)

    def _apply_weight_decay(self, variables):
        # In bfloat16, `w - w * wd * lr` rounds back to `w` (the decay is
        # far below half a step): those weights decay in `_update_variable`.
        rest = [v for v in variables if self._stochastic_index(v) is None]
        if rest:  # torch's `_foreach_mul_` refuses an empty list
            super()._apply_weight_decay(rest)

    def build(self, variables):
        if self.built:  # as Keras's own: the slots exist, and the maps
            return
        if self._rounding is None:  # from the weights, not the policy
            rounding = "stochastic" if _stores_bfloat16(variables) else None
            object.__setattr__(self, "_rounding", rounding or "nearest")
        object.__setattr__(self, "_made_from", {})
        super().build(variables)
        # Keras's build kept each 8-bit slot's working variable in a list
        # attribute, which tracked it among the variables: it has no
        # state of its own (its codes and scales are the slot's).
        quantized_state.untrack_working(self)

        # Where each write is rounded stochastically, decided once (the
        # dtypes and the mode are fixed from here): a bfloat16 weight's
        # place is its index, when `rounding` is stochastic; a bfloat16
        # slot's comes after every weight's, always. A slot is a moving
        # average: Adam's second moment moves 0.1 % of its distance a
        # step, under half a bfloat16 step (0.2 %): rounded to nearest,
        # it freezes.
        def bfloat16(variable):
            return backend.stored_dtype(variable) == "bfloat16"

        weights = {
            self._var_key(v): i
            for i, v in enumerate(self._trainable_variables)
            if self._rounding == "stochastic" and bfloat16(v)
        }
        count = len(self._trainable_variables)
        slots = {
            self._var_key(v): count + i
            for i, v in enumerate(self.variables)
            if bfloat16(v)
        }
        object.__setattr__(self, "_weight_places", weights)
        object.__setattr__(self, "_rounding_places", {**slots, **weights})
        # What a group's update widens to float32 (torch): each weight's
        # bfloat16 variables, itself and its slots.
        widened = {
            self._var_key(w): [
                v
                for v in (w, *self._made_from.get(self._var_key(w), ()))
                if bfloat16(v)
            ]
            for w in self._trainable_variables
        }
        object.__setattr__(self, "_bfloat16_of", widened)

    def _stochastic_index(self, variable):
        """The index of a bfloat16 weight this optimizer rounds
        stochastically, or None (a slot, a float32 weight, or nearest)."""
        return self._weight_places.get(self._var_key(variable))

    def _rounding_place(self, variable):
        """Where a write to `variable` is rounded stochastically (`build`),
        or None: rounded to nearest by its own `assign`."""
        return self._rounding_places.get(self._var_key(variable))

    def _var_key(self, variable):
        with backend.stored_reads():  # TensorFlow keys by the stored value
            return super()._var_key(variable)

    def assign(self, variable, value):
        if quantized_state.is_working(self, variable):
            # An 8-bit slot, in float32 during the update: requantized
            # once, when `quantized_state.dequantized` ends.
            quantized_state.hold(variable, ops.cast(value, "float32"))
            return
        index = self._rounding_place(variable)
        if index is not None:
            value = stochastic_round(
                value, self._rounding_seed, self.iterations, index
            )
        with backend.stored_reads():  # the write reaches the variable
            variable.assign(value)  # rounded once to its dtype

    def assign_add(self, variable, value):
        self.assign(variable, ops.add(ops.cast(variable, "float32"), value))

    def assign_sub(self, variable, value):
        self.assign(
            variable, ops.subtract(ops.cast(variable, "float32"), value)
        )


class _ModesAtBuild(_Modes):
    """The mixin of an optimizer whose rounding waits for its weights.

    `low_precision` asked for the default rounding while the policy kept
    float32 weights (`kmp.wrap` called before `kmp.enable(...,
    master_weights="bfloat16")`), so nothing says yet whether the weights
    will be bfloat16. When built, the optimizer becomes in place the
    class its weights call for: the low-precision one, rounding
    stochastically, where any is stored in bfloat16; else the class it
    was (Keras's own: the same bits).
    """

    def build(self, variables):
        if self.built:
            return
        self.__class__ = type(self).__bases__[1]  # the class it was
        requested = [self.__dict__.pop(a, None) for a in _MODES.values()]
        if _stores_bfloat16(variables):
            state_dtype, _, seed = requested
            become_low_precision(self, state_dtype, "stochastic", seed or 0)
        self.build(variables)


_CLASSES = {}
_AT_BUILD = {}


def _stock_class(cls):
    """The public Keras optimizer class `cls` is or derives from (on
    torch, Keras's `Adam()` is an instance of its fused torch twin)."""
    for klass in cls.__mro__:
        if klass.__module__.startswith("keras.src.optimizers."):
            return klass
    return None


def _registered(classes, mixin, prefix, stock):
    if stock not in classes:
        name = f"{prefix}{stock.__name__}"
        # On torch, the twin with the multi-tensor update.
        made = backend.optimizer_class(stock)
        klass = type(name, (mixin, made), {"__module__": __name__})
        classes[stock] = keras.saving.register_keras_serializable("kmp", name)(
            klass
        )
    return classes[stock]


def _low_precision_class(stock):
    return _registered(_CLASSES, _LowPrecisionState, "LowPrecision", stock)


def _class_at_build(stock):
    return _registered(_AT_BUILD, _ModesAtBuild, "RoundingAtBuild", stock)


# Registered when kmp is imported, so that a `.keras` file saved with one
# loads in a fresh process. Each makes its slots from its variables
# (Adafactor its factored statistics with `add_variable`, in the weight's
# dtype). Not ScheduleFreeAdamW: its "momentum" is an iterate of the
# weights themselves, which bfloat16 state would round like a weight.
for _name in (
    "Adam",
    "AdamW",
    "SGD",
    "Lion",
    "RMSprop",
    "Adamax",
    "Nadam",
    "Adagrad",
    "Adadelta",
    "Adafactor",
    "Ftrl",
    "Lamb",
    "Muon",
):
    _low_precision_class(getattr(keras.optimizers, _name))
    _class_at_build(getattr(keras.optimizers, _name))


def stock_class(optimizer):
    """The Keras optimizer class `optimizer` can take kmp's modes from, or
    None (a class of the user's own, or one kmp does not offer them for).
    """
    stock = _stock_class(type(optimizer))
    if stock is None or not type(optimizer).__module__.startswith("keras."):
        return None
    return stock


def offered() -> list:
    """The names of the Keras optimizers kmp's modes are offered for."""
    return sorted(k.__name__ for k in _CLASSES)


def become_low_precision(optimizer, state_dtype, rounding, seed):
    """Makes `optimizer` (a stock Keras optimizer, not built) the
    low-precision class of its stock class, in place, with these modes."""
    optimizer.__class__ = _low_precision_class(stock_class(optimizer))
    object.__setattr__(optimizer, "_state_dtype", state_dtype)
    object.__setattr__(optimizer, "_rounding", rounding)
    object.__setattr__(optimizer, "_rounding_seed", seed)


def round_when_built(optimizer, state_dtype, seed):
    """Makes `optimizer` decide its rounding when it is built, from its
    weights (`_ModesAtBuild`), in place."""
    optimizer.__class__ = _class_at_build(stock_class(optimizer))
    object.__setattr__(optimizer, "_state_dtype", state_dtype)
    object.__setattr__(optimizer, "_rounding_seed", seed)


def state_dtype_of(optimizer) -> str | None:
    """The state dtype `low_precision` set, or None (Keras's own: each
    slot in the dtype of its variable)."""
    return getattr(optimizer, "_state_dtype", None)


def rounding_of(optimizer) -> str | None:
    """How `optimizer` rounds writes to bfloat16 weights: "stochastic",
    "nearest", or None for an optimizer `low_precision` did not change
    (Keras's own: to nearest, after each operation). One that decides
    when built rounds bfloat16 weights stochastically."""
    if not isinstance(optimizer, _Modes):
        return None
    return optimizer._rounding or "stochastic"
