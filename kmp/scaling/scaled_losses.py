"""Which losses a scaler scaled: gradients of a loss it never scaled are
applied as they are, not divided by the loss scale.

Keras's `LossScaleOptimizer.apply(grads)` takes gradients of the *scaled*
loss and divides them by the scale. Keras's own train steps scale the
loss first (`self.optimizer.scale_loss(loss)`); the code keras-io's
guides teach does not: the train steps of "Customizing what happens in
`fit()`" (TensorFlow, JAX and PyTorch, and their GANs with two
optimizers), and the loops of "Writing a training loop from scratch"
(`GradientTape` + `apply`, eager or in a `tf.function`; `jax.jit` over
`stateless_apply`; `loss.backward()` + `apply`). Under mixed_float16 such
code divides gradients that were never multiplied by 32768: the weights
move 1/32768 as far as they should, and nothing says so (stock Keras and
kmp alike, before this module).

The rule, per `apply` (or `stateless_apply`) of a `kmp.LossScaleOptimizer`:

```
frame = innermost keras.Model.train_step running now, if any
if frame is not None:                     # fit's step, or the user's
    scaled = optimizer scaled a loss in this very frame
else:                                     # a loop of the user's own
    scaled = optimizer scaled a loss since its last apply (eagerly), or
             in the trace being built (tf.function, jax.jit), or ever
             in a compiled function of a loop (applied outside it)
if scaled:
    divide by the scale                   # Keras's contract
else:
    apply the gradients as they are, and say so once (per model in a
    train step, per line of code in a loop): where, why, the fix
```

"Scaled a loss" is a call of `scale_loss`, `stateless_scale_loss` or
tf-keras's `get_scaled_loss` on this optimizer; gradients the user
divided with `get_unscaled_gradients` are never divided again. Either
way non-finite gradients are still skipped and counted.

kmp does not scale the loss for such code: the gradients reach the
optimizer already computed, and scaling after the fact cannot bring back
what float16 flushed to zero on the way. So the step keeps the user's
meaning, float16 gradients of an unscaled loss (what the same code does
in float32), and the line names the one-line fix.

Python decides, so on TensorFlow (in a `tf.function`) and JAX (under
`jax.jit`) the decision is taken once, when the step is traced; eagerly
and on torch at every step (a walk of the stack, microseconds). A
loop may compile the gradients' function alone and apply outside it
(keras-io's style transfer and DeepDream: a `tf.function`
`compute_loss_and_grads`, then an eager `apply_gradients`): that
function's `scale_loss` runs as Python at its trace only, so the
optimizer is marked for good then, and each later apply outside a
train step counts as scaled; one whose apply is in the same trace as
its `scale_loss` decides there, and is not marked.
"""

import contextlib
import logging
import sys
import sysconfig
import threading
import weakref

import keras

from kmp import backend
from kmp.errors import InputError

logger = logging.getLogger("kmp")

# The calls that scale a loss, by name (the audit looks for them in a
# train step's source).
SCALING_CALLS = ("scale_loss", "get_scaled_loss")

# Per thread (tf.distribute runs each replica's step in a thread of its
# own): optimizer -> where it last scaled a loss, not yet applied: the
# id of the train step frame, or `_IN_A_LOOP` outside any train step.
# Weakly keyed: a mark of an optimizer that is gone (a loss scaled, never
# applied) must not pass to a new one that Python gives the same id,
# whose first unscaled gradients would be divided by the scale.
_local = threading.local()
_IN_A_LOOP = "loop"
# Optimizers that scaled a loss in a compiled function of a loop of the
# user's own (a `tf.function`, `jax.jit`) that applies outside it: each
# later call of that function scales too, its Python not run again. An
# apply in the same trace takes the optimizer out (it decided there, for
# good). Not per thread: a trace is the function's, whichever thread
# calls it.
_scaled_when_traced = weakref.WeakSet()
# Models already told about (once per model, not per optimizer: a GAN's
# two optimizers make one line), each with the names it holds the
# optimizers under whose losses went unscaled (the audit names those),
# and lines of loops ("file:line").
_told = weakref.WeakKeyDictionary()
_told_loops = set()
# Optimizers seen applying, in a train step, the gradients of a loss
# they scaled there (the audit names them by the model's attributes).
_scaled_in_steps = weakref.WeakSet()
# Python's own frames are not the user's loop either (unittest,
# contextlib).
_STDLIB = sysconfig.get_paths()["stdlib"]


def _marks() -> weakref.WeakKeyDictionary:
    marks = getattr(_local, "marks", None)
    if marks is None:
        marks = _local.marks = weakref.WeakKeyDictionary()
    return marks


def train_step_frame():
    """The innermost frame of a `keras.Model`'s `train_step` on this
    thread's stack (a user's override, or Keras's own), or `None`."""
    frame = sys._getframe(1)
    while frame is not None:
        # Only a frame so named is looked into (reading f_locals costs).
        if frame.f_code.co_name.endswith("train_step") and isinstance(
            frame.f_locals.get("self"), keras.Model
        ):
            return frame
        frame = frame.f_back
    return None


def loop_line() -> str:
    """Where the user's own code on this thread's stack calls in: the
    innermost frame that is not kmp's, Keras's, a framework's
    (`backend.is_users`) or Python's, as "file:line" (a `tf.function`'s
    body by its source line, `backend.written_at`), or "?"."""
    frame = sys._getframe(1)
    while frame is not None:
        path = frame.f_code.co_filename
        if backend.is_users(frame.f_globals.get("__name__")) and not (
            path.startswith(_STDLIB) and "-packages" not in path
        ):
            written = backend.written_at(frame)
            if written is not None:
                return f"{written[0]}:{written[1]}"
        frame = frame.f_back
    return "?"


@backend.uncompiled
def note_scaled(optimizer, loss) -> None:
    """Records that `optimizer` scaled `loss` (`scale_loss`, tf-keras's
    `get_scaled_loss`, Keras's trainers): in the train step running now,
    or, outside any, in the user's loop, until its next apply, and for
    good where the loop's function is being traced."""
    frame = train_step_frame()
    _marks()[optimizer] = _IN_A_LOOP if frame is None else id(frame)
    if frame is None and backend.tracing(loss):
        _scaled_when_traced.add(optimizer)


@backend.uncompiled
def take_mark(optimizer):
    """Forgets, and returns, where `optimizer` last scaled a loss."""
    return _marks().pop(optimizer, None)


@backend.uncompiled
def loss_was_unscaled(optimizer, grads, stateless=False) -> bool:
    """Whether `optimizer` is being given gradients of a loss it did not
    scale (see the module docstring); takes the mark, and says so once
    (per model in a train step, per line in a loop) when it did not.

    Args:
        optimizer: The `kmp.LossScaleOptimizer` applying `grads`.
        grads: The gradients, to count them in the message.
        stateless: Whether they reach `stateless_apply` (the fix then
            takes the scale from the step's state).
    """
    mark = take_mark(optimizer)
    frame = train_step_frame()
    if frame is None:
        if mark is not None:
            traced = next((g for g in grads if g is not None), None)
            if backend.tracing(traced):  # scaled and applied in one trace
                _scaled_when_traced.discard(optimizer)
            return False
        if optimizer in _scaled_when_traced:
            return False
        _tell_loop(optimizer, grads, stateless)
        return True
    if mark == id(frame):
        # Seen scaling (at a compiled step's trace: its Python runs once);
        # by the optimizer, not the model: no second read of the frame's
        # locals at every eager apply.
        _scaled_in_steps.add(optimizer)
        return False
    model = frame.f_locals["self"]
    if model not in _told:
        _told[model] = set()
        logger.warning("kmp: %s", _message(model, frame, optimizer, grads))
    _told[model].add(attribute_of(model, optimizer))
    return True


def _tell_loop(optimizer, grads, stateless):
    where = loop_line()
    if where in _told_loops:
        return
    _told_loops.add(where)
    count = sum(g is not None for g in grads)
    logger.warning(
        "kmp: the loop at %s applies %d gradient(s) of a loss that the "
        "%s did not scale: kmp applies them unscaled, as under float32 "
        "(not divided by the loss scale, which would make every update that "
        "many times too small), but float16 gradients of an unscaled loss "
        "can underflow to zero. Fix: %s.",
        where,
        count,
        type(optimizer).__name__,
        fix("optimizer", stateless=stateless),
    )


def fix(who="self.optimizer", loss="loss", stateless=None) -> str:
    """How to take the gradients of `loss` scaled by the optimizer `who`
    (`self.d_optimizer` in a train step, `optimizer` in a loop), on this
    backend: `stateless` (JAX's `stateless_apply`; by default a train
    step's form on JAX) reads the scale from the step's state.

    It never rebinds `loss`: keras-io's steps log the name they take the
    gradients of (`return {"d_loss": d_loss}`), which would then report
    the loss times the scale (a helper's GANs, 2026-11-30)."""
    if stateless is None:
        stateless = backend.is_stateless()
    if stateless:
        return (
            "in the function whose gradients you take, return "
            f"{who}.stateless_scale_loss(optimizer_variables, {loss}), "
            f"with {loss} itself in its aux to log"
        )
    if backend.name() == "torch":
        return (
            f"{who}.scale_loss({loss}).backward() instead of "
            f"{loss}.backward(), {loss} kept to log"
        )
    if backend.name() == "jax":
        return (
            f"in the function whose gradients you take, return "
            f"{who}.scale_loss({loss}), with {loss} itself in its aux to log"
        )
    return (
        f"scaled_{loss} = {who}.scale_loss({loss}) inside the GradientTape, "
        f"and tape.gradient(scaled_{loss}, ...) instead of {loss}'s, "
        f"{loss} kept to log"
    )


def attribute_of(model, optimizer) -> str:
    """The name the model holds `optimizer` under (a GAN's
    `d_optimizer`), or "optimizer"."""
    for name, value in vars(model).items():
        if value is optimizer:
            return name.lstrip("_")
    return "optimizer"


def stem(attribute) -> str:
    """What an optimizer's attribute names less `optimizer` (`d_optimizer`
    -> `d`, `gen_opt` -> `gen_opt`, `optimizer` -> ""): the monitor's
    log prefix, the audit's name for the loss it scales."""
    return attribute.removesuffix("optimizer").rstrip("_")


def held_optimizers(model, kind, other_than=None) -> list:
    """`(name, optimizer)` for each optimizer of `kind` the model holds
    as an attribute (a GAN's `d_optimizer`, named as `attribute_of`
    names it), once each, other than `other_than`."""
    found = {}
    for name, value in vars(model).items():
        if value is not other_than and isinstance(value, kind):
            found.setdefault(id(value), (name.lstrip("_"), value))
    return list(found.values())


def _message(model, frame, optimizer, grads) -> str:
    where = f"{frame.f_code.co_filename}:{frame.f_lineno}"
    count = sum(g is not None for g in grads)
    attribute = attribute_of(model, optimizer)
    return (
        f"{type(model).__name__}.train_step ({where}) applies {count} "
        f"gradient(s) of a loss that self.{attribute} did not scale: kmp "
        "applies them unscaled, as under float32 (not divided by the loss "
        "scale, which would make every update that many times too small), "
        "but float16 gradients of an unscaled loss can underflow to zero. "
        f"Fix: {fix(f'self.{attribute}')}."
    )


def unscaled_in(model) -> set:
    """The names `model` holds the optimizers under (`attribute_of`)
    that its train step gave gradients of a loss they did not scale
    (`loss_was_unscaled` told of the model); empty if none did."""
    return set(_told.get(model, ()))


def scaled_in(model) -> set:
    """The names `model` holds the optimizers under (`attribute_of`) that
    its train step was seen to give gradients of a loss they scaled."""
    return {
        name.lstrip("_")
        for name, value in vars(model).items()
        if isinstance(value, keras.Optimizer) and value in _scaled_in_steps
    }


def loops_told() -> list:
    """The lines of loops ("file:line") `loss_was_unscaled` has warned
    about (for tests)."""
    return sorted(_told_loops)


class ScaledLossTracking:
    """Mixin for `kmp.LossScaleOptimizer`: the loss-scaling entry points
    that keep the marks (`scale_loss`, `stateless_scale_loss`) and read
    them (`apply`, `stateless_apply`).

    The subclass provides `_take_user_unscaled(grads)` (tf-keras's
    `get_unscaled_gradients`, `_tf_keras_api`) and `_stateless_apply`
    (its stateless update, which decides nothing), and asks
    `self._given_unscaled` before dividing by the scale.
    """

    # True during an apply whose gradients are not to be divided by the
    # scale: the user divided them (tf-keras's `get_unscaled_gradients`),
    # or they are of a loss this optimizer did not scale.
    _given_unscaled = False

    def scale_loss(self, loss):
        if self.built and backend.held_by_the_step(self.dynamic_scale):
            raise InputError(
                "scale_loss was called in a JAX train step of your own, "
                "where Keras's fit holds the loss scale in the step's state "
                "(the variable has no value there). Use loss = "
                "self.optimizer.stateless_scale_loss(optimizer_variables, "
                "loss), with the step's optimizer_variables."
            )
        note_scaled(self, loss)
        return super().scale_loss(loss)

    def stateless_scale_loss(self, optimizer_variables, loss):
        """`scale_loss` by the scale in `optimizer_variables`: the form
        for a stateless train step (JAX), whose state holds the scale.

        In a compiled JAX step, `scale_loss` reads the scale variable,
        not the step's state: under Keras's `fit` the variable has no
        value then (kmp raises, naming this method); in a loop of one's
        own it is a constant of the compiled program, which the scale's
        changes never reach. Keras's own JAX step scales under a
        `StatelessScope` for this reason; this is that, for a step of
        one's own.

        Args:
            optimizer_variables: The optimizer's values in the step's
                state, as `stateless_apply` takes them.
            loss: The loss tensor.

        Returns:
            `loss * scale`.

        Example:

        ```python
        def compute_loss_and_updates(self, trainable, non_trainable,
                                     optimizer_variables, x, y):
            y_pred, non_trainable = self.stateless_call(
                trainable, non_trainable, x, training=True)
            loss = self.compute_loss(x, y, y_pred)
            loss = self.optimizer.stateless_scale_loss(
                optimizer_variables, loss)
            return loss, (y_pred, non_trainable)
        ```
        """
        mapping = list(zip(self.variables, optimizer_variables))
        with keras.StatelessScope(state_mapping=mapping):
            return self.scale_loss(loss)

    def apply(self, grads, trainable_variables=None):
        grads = list(grads)
        if self._take_user_unscaled(grads):
            # Divided by the user (tf-keras's loop): not to be divided
            # again, nor told about.
            take_mark(self)
            divide = False
        else:
            divide = not loss_was_unscaled(self, grads)
        with self._dividing(divide):
            return super().apply(grads, trainable_variables)

    @contextlib.contextmanager
    def _dividing(self, divide):
        """Whether this apply divides the gradients by the scale."""
        self._given_unscaled = not divide
        try:
            yield
        finally:
            self._given_unscaled = False

    def stateless_apply(self, optimizer_variables, grads, trainable_variables):
        grads = list(grads)
        never_scaled = loss_was_unscaled(self, grads, stateless=True)
        with self._dividing(not never_scaled):
            return self._stateless_apply(
                optimizer_variables, grads, trainable_variables
            )
