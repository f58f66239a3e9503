"""The state a rematerialized call writes (dropout's seeds,
BatchNormalization's moving statistics), the same in its recomputation.

A layer Keras rematerializes runs twice: in the forward pass and again
in the backward pass. What it writes differs by backend:

    JAX         `jax.checkpoint` traces the call once, in its own trace: a
                write inside (a dropout layer's seed generator advancing)
                is a tracer of that trace, and leaks when Keras stores it
                in the step's `StatelessScope`. The writes are made
                outputs of the checkpointed function instead, and stored
                outside it.
    TensorFlow  `tf.recompute_grad` and torch's `checkpoint` call the
    torch       function again: it reads the seeds its first run advanced
                (another dropout mask than the forward pass's: wrong
                gradients, silently) and updates moving statistics twice.
                The recomputation starts from the state the first run
                started from instead: the same masks, one update.

`RecomputedState(layer)` is made at each call of the layer; its `run()`
wraps each run of the function, `pack` / `unpack` carry the writes
across the rematerialization (JAX).
"""

import contextlib

import keras
from keras import ops

from kmp.backend._current import name
from kmp.backend.keras_internals import private_import


def _step_scope():
    """The `StatelessScope` a JAX step runs in (Keras exports the class,
    not the function that finds the active one)."""
    get_stateless_scope = private_import(
        "keras.src.backend.common.stateless_scope",
        "get_stateless_scope",
        "kmp.rematerialize (JAX)",
    )
    return get_stateless_scope()


class RecomputedState:
    """The non-trainable state `layer` writes, kept equal between the
    forward run of its rematerialized call and the recomputation."""

    def __init__(self, layer):
        self._variables = [v for v in layer.variables if not v.trainable]
        self._outer = _step_scope() if name() == "jax" else None
        self._written = []  # JAX: ids of the variables the run wrote
        self._losses = False
        self._started = None  # TF, torch: the values before the first run

    @contextlib.contextmanager
    def run(self):
        """Wraps one run of the rematerialized function."""
        if self._outer is not None:
            inner = keras.StatelessScope(
                collect_losses=self._outer.collect_losses
            )
            inner.state_mapping = dict(self._outer.state_mapping)
            with inner:
                yield
            self._written = [
                (variable_id, value)
                for variable_id, value in inner.state_mapping.items()
                if self._outer.state_mapping.get(variable_id) is not value
            ]
            self._losses = inner.losses
            return
        if self._started is None:
            # A copy: torch writes its variables in place, and TensorFlow's
            # `value` is the variable itself, not a read of it.
            self._started = [ops.copy(v.value) for v in self._variables]
        else:  # the recomputation: from where the forward run started
            for variable, value in zip(self._variables, self._started):
                variable.assign(value)
        yield

    def pack(self, outputs):
        """The function's result: its outputs, and on JAX its writes."""
        if self._outer is None:
            return outputs
        return outputs, [value for _, value in self._written], self._losses

    def unpack(self, result):
        """The outputs; on JAX the writes stored in the step's scope."""
        if self._outer is None:
            return result
        outputs, values, losses = result
        for (variable_id, _), value in zip(self._written, values):
            self._outer.state_mapping[variable_id] = value
        for loss in losses or ():
            self._outer.add_loss(loss)
        return outputs
