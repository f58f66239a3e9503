"""A loss-scaling optimizer that cannot corrupt weights.

`kmp.LossScaleOptimizer` subclasses `keras.optimizers.LossScaleOptimizer`
and replaces its state transitions, and the branch of its apply (taken by
`kmp.backend`, which on torch fuses the check and unscale into one
kernel): the stock class's distribution logic, finiteness check, loss
scaling and serialization are reused as they are.
"""

import keras
from keras import ops

from kmp import backend
from kmp.errors import InputError
from kmp.scaling import keras_float8
from kmp.scaling._tf_keras_api import TfKerasLossScaleAPI
from kmp.scaling.scale_rule import RuleConstant
from kmp.scaling.scale_rule import ScaleRule
from kmp.scaling.scale_rule import ScaleState
from kmp.scaling.scale_rule import check_rule
from kmp.scaling.scale_rule import next_scale_state
from kmp.scaling.scaled_losses import ScaledLossTracking

_StockLossScaleOptimizer = keras.optimizers.LossScaleOptimizer


def _check_inner(inner_optimizer):
    if isinstance(inner_optimizer, _StockLossScaleOptimizer):
        raise InputError(
            "`inner_optimizer` is already a LossScaleOptimizer "
            f"({type(inner_optimizer).__name__}); wrapping it again would "
            "scale the loss twice. Pass its `inner_optimizer` instead."
        )
    if not isinstance(inner_optimizer, keras.optimizers.Optimizer):
        raise InputError(
            "`inner_optimizer` must be a keras.optimizers.Optimizer "
            f"instance, got {inner_optimizer!r}. For a name such as 'adam', "
            "use kmp.wrap('adam') or keras.optimizers.get('adam')."
        )


@keras.saving.register_keras_serializable(package="kmp")
class LossScaleOptimizer(
    ScaledLossTracking, TfKerasLossScaleAPI, _StockLossScaleOptimizer
):
    """A loss-scaling optimizer with a floor, a cap and skip accounting.

    Mixed float16 training multiplies the loss by a scale so that small
    gradients do not underflow float16, then divides the gradients by the
    same scale before the inner optimizer uses them. Keras's own
    `LossScaleOptimizer` does this, but its scale can fall to 0.0 (after
    which the next finite step writes NaN into every weight) or grow to
    inf (after which every step is skipped). This subclass keeps the scale
    finite and within `[min_scale, max_scale]`, makes growth, backoff and
    hysteresis configurable, supports a fixed scale, counts skipped steps,
    and restores tf-keras's `get_scaled_loss` / `get_unscaled_gradients`.
    With default arguments it updates the scale exactly as the stock class
    does while the scale stays within `[1, 2**24]`.

    Each `apply(grads)`, where `grads` are gradients of the scaled loss:

    ```
    if any(not isfinite(g) for g in grads):
        # Skip: no model variable, optimizer slot or iteration changes.
        skipped_steps += 1
        step_counter = 0
        overflow_streak += 1
        if dynamic and overflow_streak >= hysteresis:
            scale = max(scale * backoff_factor, min_scale)
    else:
        inner_optimizer.apply([g / scale for g in grads])
        overflow_streak = 0
        step_counter += 1
        if dynamic and step_counter == dynamic_growth_steps:
            scale = min(scale * growth_factor, max_scale)
            step_counter = 0
    ```

    `grads` are taken to be of the scaled loss where this optimizer
    scaled one (`scale_loss`, `stateless_scale_loss`) in the running
    `train_step` or, in a loop of one's own, since its last apply (or in
    the same trace). Gradients of a loss it never scaled (keras-io's
    guides write such steps and loops) are applied as they are, with one
    line that says how to scale it (`kmp.scaling.scaled_losses`).

    `scale`, `step_counter`, `overflow_streak` and `skipped_steps` are
    optimizer variables (`dynamic_scale`, `step_counter`,
    `overflow_streak`, `skipped_steps`), so they are saved with the model
    and restored by `keras.callbacks.BackupAndRestore`. `model.fit` shows
    them when `kmp.callbacks.LossScaleMonitor()` is passed as a callback.

    Keras's `compile` keeps a `LossScaleOptimizer` it is given and only
    wraps plain optimizers with the stock class, so pass this one (or
    `kmp.wrap(optimizer)`) to `compile`.

    Args:
        inner_optimizer: The `keras.optimizers.Optimizer` instance to wrap.
        initial_scale: Float. The starting scale, in `[min_scale,
            max_scale]`. Start high: a scale that is too high falls by
            `backoff_factor` per overflow, one that is too low rises only
            once per `dynamic_growth_steps`.
        dynamic_growth_steps: Int >= 1. Finite steps in a row after which
            the scale is multiplied by `growth_factor`.
        growth_factor: Float > 1. Growth multiplier.
        backoff_factor: Float in (0, 1). Multiplier applied on overflow.
        min_scale: Float > 0. The scale's floor.
        max_scale: Float >= `min_scale`. The scale's cap.
        hysteresis: Int >= 1. Non-finite steps in a row before the scale
            backs off; every further one in the same run backs off again.
            1 (every overflow backs off) is the stock behaviour.
        dynamic: Bool. If `False`, the scale stays at `initial_scale`;
            non-finite steps are still skipped and counted.
        name: String. The optimizer's name.
        **kwargs: As for `keras.optimizers.LossScaleOptimizer`; gradient
            clipping, weight decay etc. belong on `inner_optimizer`.

    Example:

    ```python
    kmp.enable("mixed_float16")
    model = build_model()
    optimizer = kmp.LossScaleOptimizer(keras.optimizers.Adam(1e-3))
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy")
    model.fit(x, y, callbacks=[kmp.callbacks.LossScaleMonitor()])
    print(float(optimizer.loss_scale), int(optimizer.skipped_steps))
    ```
    """

    # Positions of Keras float8 gradient state among the trainable
    # variables (`_follow_keras_float8`); none before `build`.
    _float8_state = ()
    # The constructor's arguments, read from `rule` (`RuleConstant`).
    dynamic_growth_steps = RuleConstant()
    growth_factor = RuleConstant()
    backoff_factor = RuleConstant()
    min_scale = RuleConstant()
    max_scale = RuleConstant()
    hysteresis = RuleConstant()
    dynamic = RuleConstant()

    def __init__(
        self,
        inner_optimizer,
        initial_scale=2.0**15,
        dynamic_growth_steps=2000,
        growth_factor=2.0,
        backoff_factor=0.5,
        min_scale=1.0,
        max_scale=2.0**24,
        hysteresis=1,
        dynamic=True,
        name=None,
        **kwargs,
    ):
        _check_inner(inner_optimizer)
        rule = check_rule(
            initial_scale,
            dynamic_growth_steps=dynamic_growth_steps,
            growth_factor=growth_factor,
            backoff_factor=backoff_factor,
            min_scale=min_scale,
            max_scale=max_scale,
            hysteresis=hysteresis,
            dynamic=dynamic,
        )
        super().__init__(
            inner_optimizer,
            initial_scale=float(initial_scale),
            dynamic_growth_steps=rule.dynamic_growth_steps,
            name=name,
            **kwargs,
        )
        self._rule = rule

    @property
    def rule(self) -> ScaleRule:
        """The rule's constants, one `ScaleRule` (checked when made); the
        attributes of the same names read it."""
        return self._rule

    def build(self, var_list):
        super().build(var_list)
        self._add_skip_accounting()
        self._follow_keras_float8(self.initial_scale)

    def apply(self, grads, trainable_variables=None):
        # Outside the stock apply's name scope: TF's slot paths then match
        # a load's, which OrbaxCheckpoint's restore needs (BUILD_NOTES).
        if not self.built and trainable_variables is not None:
            self.build(trainable_variables)
        return super().apply(grads, trainable_variables)

    def _follow_keras_float8(self, scale):
        """Keeps Keras's float8 layers' gradient scaling in units of the
        loss scale (`kmp.scaling.keras_float8`): reset now to the current
        `scale` (a number), multiplied with every change of the scale."""
        self._float8_state = keras_float8.gradient_state(
            self._trainable_variables
        )
        with backend.out_of_trace():  # once, though built in a trace
            keras_float8.reset(
                self._trainable_variables,
                self._float8_state,
                scale,
            )

    def _add_skip_accounting(self):
        """The two variables kmp adds to the stock class's state."""
        self.skipped_steps = self.add_variable(
            shape=(),
            dtype="int",
            initializer="zeros",
            aggregation="none",
            name="skipped_steps",
        )
        self.overflow_streak = self.add_variable(
            shape=(),
            dtype="int",
            initializer="zeros",
            aggregation="none",
            name="overflow_streak",
        )

    @property
    def loss_scale(self):
        """The current loss scale (a variable once built)."""
        return self.dynamic_scale if self.built else self.initial_scale

    def _update_scale_state(self, finite):
        """Assigns the state `next_scale_state` gives; `finite` is a
        Python bool. Both the stateful and the stateless path (inside a
        StatelessScope) come here.

        Returns:
            The scale's change, new / old, where Keras float8 state must
            follow it (`keras_float8`); `None` where there is none or the
            rule leaves the scale alone.
        """
        variables = ScaleState(
            self.dynamic_scale,
            self.step_counter,
            self.overflow_streak,
            self.skipped_steps,
        )
        # `.value` reads the variable, or its stand-in inside a
        # StatelessScope.
        state = ScaleState(*(v.value for v in variables))
        new_state = next_scale_state(state, finite, self.rule)
        factor = None
        if self._float8_state and new_state.scale is not state.scale:
            # Before the assignments: on torch `state.scale` is the
            # variable's own tensor, which `assign` changes in place.
            factor = ops.divide(new_state.scale, state.scale)
        for variable, old, new in zip(variables, state, new_state):
            if new is not old:  # e.g. skipped_steps on a finite step
                variable.assign(new)
        return factor

    def _rescale_keras_float8(self, factor):
        """Multiplies the Keras float8 state by the scale's change."""
        if factor is None:
            return
        for i in self._float8_state:
            variable = self._trainable_variables[i]
            variable.assign(keras_float8.rescale(variable.value, factor))

    def _overwrites(self, variable):
        # A variable whose "gradient" is its new value (Keras float8's).
        check = getattr(self, "_overwrite_variable_with_gradient", None)
        return bool(check and check(variable))

    def _unscale(self, grads, trainable_variables):
        if self._given_unscaled:  # see the attribute
            return list(grads)
        scale = self.dynamic_scale.value

        def unscaled(g, v):
            if g is None:
                return g
            if not self._overwrites(v):
                return ops.divide(g, scale)
            if v.name == "outputs_grad_scale":  # Keras float8's new scale
                return keras_float8.floored(g, scale)
            return g

        return [unscaled(g, v) for g, v in zip(grads, trainable_variables)]

    # --- Overrides of the stock class's four state handlers. ---

    def _stateful_handle_finite_grads(self, grads, trainable_variables):
        tvs = trainable_variables or self._trainable_variables
        # The scale the loss was scaled with: before this step's update.
        self._apply_unscaled(self._unscale(grads, tvs), trainable_variables)

    def _apply_unscaled(self, unscaled, trainable_variables):
        tvs = trainable_variables or self._trainable_variables
        agreed = self._agreed_overwrites(unscaled, tvs)
        grads = self._clip_aggregate(agreed, tvs)
        inner = self.inner_optimizer
        if grads and self._inner_applies_gradients():  # _tf_keras_api
            inner.apply_gradients(zip(grads, tvs))
        else:
            inner.apply(grads, trainable_variables=trainable_variables)
        # After the inner apply: it wrote this step's float8 statistics,
        # in the units of the scale the loss was scaled with.
        self._rescale_keras_float8(self._update_scale_state(finite=True))

    def _agreed_overwrites(self, grads, trainable_variables):
        """The values Keras writes into `overwrite_with_gradient` variables
        (its float8 layers' scales and amax histories), the same on every
        `tf.distribute` replica: their maximum, the statistic of the
        global batch. Each replica computed its own from its part of the
        batch, and writing those would leave a mirrored variable holding
        different values on different replicas (BUILD_NOTES, defect 24).
        """
        positions = [
            i
            for i, (g, v) in enumerate(zip(grads, trainable_variables))
            if g is not None and self._overwrites(v)
        ]
        if not positions:
            return grads
        agreed = backend.max_over_replicas([grads[i] for i in positions])
        grads = list(grads)
        for i, value in zip(positions, agreed):
            grads[i] = value
        return grads

    def _clip_aggregate(self, grads, trainable_variables):
        """Makes the inner optimizer's clipping act on the replicas' sum.

        Keras clips each replica's gradients before summing them (tf-keras
        clipped the sum). When the inner optimizer clips and there are
        several replicas, sum here, clip the sum with the inner
        optimizer's own rule, and hand each replica 1/N of it: the inner
        clip then leaves it unchanged (norms only shrink) and the inner
        all-reduce adds the N equal shares back to the clipped sum. This
        costs a second all-reduce, and only when clipping is set.
        """
        inner = self.inner_optimizer
        clips = inner.clipnorm or inner.global_clipnorm or inner.clipvalue
        if (
            not clips
            or inner.gradient_accumulation_steps
            or any(self._overwrites(v) for v in trainable_variables)
        ):
            return grads
        summed, replicas = backend.sum_over_replicas(grads)
        if replicas == 1:
            return grads
        return [
            None if g is None else ops.divide(g, replicas)
            for g in inner._clip_gradients(summed)
        ]

    def _stateful_handle_non_finite_grads(self):
        self._rescale_keras_float8(self._update_scale_state(finite=False))

    def _stateless_handle_finite_grads(
        self, optimizer_variables, grads, trainable_variables
    ):
        mapping = list(zip(self.variables, optimizer_variables))
        with keras.StatelessScope(state_mapping=mapping) as scope:
            unscaled = self._unscale(grads, self._trainable_variables)
            new_trainable, new_inner = self.inner_optimizer.stateless_apply(
                self.inner_optimizer.variables, unscaled, trainable_variables
            )
            factor = self._update_scale_state(finite=True)
        own = [scope.get_current_value(v) for v in self._variables]
        return self._rescaled(new_trainable, factor), own + list(new_inner)

    def _stateless_handle_non_finite_grads(
        self, optimizer_variables, trainable_variables
    ):
        mapping = list(zip(self.variables, optimizer_variables))
        with keras.StatelessScope(state_mapping=mapping) as scope:
            factor = self._update_scale_state(finite=False)
        return self._rescaled(trainable_variables, factor), [
            scope.get_current_value(v) for v in self.variables
        ]

    def _rescaled(self, trainable_values, factor):
        """The stateless path's `_rescale_keras_float8`: new values."""
        if factor is None:
            return trainable_values
        return keras_float8.rescaled(
            trainable_values, self._float8_state, factor
        )

    def _stateless_apply(self, optimizer_variables, grads, trainable_variables):
        # The stock one (`super()`'s decides again). On torch it updates
        # the values given in place (the model's): `own_values` copies.
        return _StockLossScaleOptimizer.stateless_apply(
            self,
            backend.own_values(optimizer_variables),
            grads,
            backend.own_values(trainable_variables),
        )

    def check_finite(self, grads):
        # Keras checks each replica's local gradients and, on the merge_call
        # path, uses replica 0's answer: a step that overflows on another
        # replica alone would be applied. Agree across all replicas.
        return backend.all_replicas_agree(super().check_finite(grads))

    def _common_apply(self, grads, trainable_variables=None):
        if not backend.is_stateless():
            self._stateful_apply(grads, trainable_variables)
            return
        # Keras's JAX `cond` is `lax.cond`, which traces both branches and
        # so cannot hold the stock handlers' variable assignments (the
        # stock class raises UnexpectedTracerError here). Compute the step
        # statelessly and assign its results instead.
        tvs = list(trainable_variables or self._trainable_variables)
        new_tvs, new_values = self._stateless_apply(
            [v.value for v in self.variables],
            list(grads),
            [v.value for v in tvs],
        )
        for variable, value in zip(tvs + self.variables, new_tvs + new_values):
            variable.assign(value)

    def _stateful_apply(self, grads, trainable_variables):
        """The stock class's check-then-branch, with the branch taken by
        `backend.cond` (on torch, no operation built per step) and, where
        the backend has one, the check and unscale fused in one pass."""
        tvs = list(trainable_variables or self._trainable_variables)
        fused = None
        if not self._given_unscaled and not any(map(self._overwrites, tvs)):
            fused = backend.fused_unscale(grads, self.dynamic_scale.value)
        if fused is None:
            backend.cond(
                self.check_finite(grads),
                lambda: self._stateful_handle_finite_grads(
                    grads, trainable_variables
                ),
                self._stateful_handle_non_finite_grads,
            )
            return
        unscaled, finite = fused
        backend.cond(
            finite,
            lambda: self._apply_unscaled(unscaled, trainable_variables),
            self._stateful_handle_non_finite_grads,
        )

    def get_config(self):
        config = super().get_config()
        config.update(self.rule._asdict())
        return config
