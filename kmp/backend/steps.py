"""What a training step does differently on each backend: the logs it
returns (`add_train_step_logs`), gradients by intermediate tensors
(`taped_gradients`), what compiles it (`step_compiler`), and whether
Keras's crossentropy finds the logits behind probabilities.

TensorFlow's and torch's steps update variables in place; JAX's step is a
pure function of its state, so what it reads after an update comes out
of that state. Keras's compiled fit under NNX runs the class's
`train_step`, not the instance's: there the logs are added to what the
train function returns. The frameworks' gradient code is in
`_taped_gradients`.
"""

import contextlib
from typing import Callable

import keras
from keras import ops

from kmp.backend._current import is_nnx
from kmp.backend._current import is_stateless
from kmp.backend._current import name


def step_compiler() -> str:
    """What compiles a train step under `jit_compile=True`: `"XLA"`, or
    `"torch.compile"` on PyTorch (which Keras runs eagerly by default,
    and which makes no float8 GEMMs of kmp's float8 layers)."""
    return "torch.compile" if name() == "torch" else "XLA"


def crossentropy_reads_logits() -> bool:
    """Whether Keras's crossentropy on softmax or sigmoid probabilities
    recovers the logits they came from (`_keras_logits`): TensorFlow
    only. JAX and torch compute it from the probabilities, clipped to
    [1e-7, 1 - 1e-7], in float32 as in float16."""
    return name() == "tensorflow"


def add_train_step_logs(
    model: keras.Model,
    extra_logs: Callable[[Callable], dict],
) -> None:
    """Makes `model.train_step` return extra logs computed inside the step
    (they leave the device with the loss, in the transfer Keras makes).
    Under NNX, Keras's compiled fit runs the class's `train_step`: the
    logs are computed on the device after each call of the train
    function, from the state it returns (`_add_logs_to_train_function`).

    Args:
        model: A compiled Keras model. Its `train_step` (under NNX, its
            `make_train_function`) is wrapped on the instance; calling
            this again on the same model does nothing.
        extra_logs: `extra_logs(read)` returns a dict of tensors, where
            `read(variable)` gives an optimizer variable's value *after*
            this step's update.
    """
    if is_nnx():
        _add_logs_to_train_function(model, extra_logs)
        return
    if getattr(model.train_step, "_kmp_wrapped", False):
        return
    original = model.train_step

    if is_stateless():

        def train_step(state, data):
            logs, state = original(state, data)
            # state = (trainable, non_trainable, optimizer, metrics) values;
            # the optimizer's new values are only visible here, not through
            # its variables, which JAX updates when the epoch ends.
            if isinstance(logs, dict):
                read = _reader(model, state[2])
                logs = {**logs, **extra_logs(read)}
            return logs, state

    else:

        def train_step(data):
            logs = original(data)
            # Read after the update (TF: automatic control deps), as a
            # copy: torch assigns variables in place (an eager TF read is
            # the variable too), and Keras may read logs on a thread steps
            # later. A scalar copy on the device, no transfer.
            if isinstance(logs, dict):
                logs = {**logs, **extra_logs(ops.copy)}
            return logs

    train_step._kmp_wrapped = True
    model.train_step = train_step
    # A train function compiled before the wrap would not call it.
    model.train_function = None


def _reader(model, optimizer_values, copy=False):
    """`read(variable)`: the value of one of `model.optimizer`'s variables
    in `optimizer_values`, a JAX step's state (as a copy: the state is
    donated to the next step)."""
    index = {id(v): i for i, v in enumerate(model.optimizer.variables)}

    def read(variable):
        value = optimizer_values[index[id(variable)]]
        return ops.copy(value) if copy else value

    return read


def _add_logs_to_train_function(model, extra_logs):
    """`add_train_step_logs` under NNX: Keras's `fit` makes its train
    function by `model.make_train_function()`, whose compiled step calls
    `type(model).train_step`; the logs are added to what that function
    returns, `(logs, state)` after its steps (the last step's logs, with
    `steps_per_execution`), by a few scalar operations on the device."""
    if getattr(model.make_train_function, "_kmp_wrapped", False):
        return
    original = model.make_train_function

    def make_train_function(force=False):
        original(force)
        step = model.train_function
        if getattr(step, "_kmp_wrapped", False):
            return

        def train_function(state, iterator):
            logs, state = step(state, iterator)
            if isinstance(logs, dict):
                read = _reader(model, state[2], copy=True)
                logs = {**logs, **extra_logs(read)}
            return logs, state

        train_function._kmp_wrapped = True
        model.train_function = train_function

    make_train_function._kmp_wrapped = True
    model.make_train_function = make_train_function
    # A train function made before the wrap would not add them.
    model.train_function = None


def taped_gradients(loss_fn: Callable, jit_compile: bool = False):
    """Differentiates a loss by its inputs and by tensors marked inside it.

    `loss_fn(values, args, tap)` returns a scalar loss computed from the
    list `values` (e.g. trainable variable values) and `args`; inside it,
    `x = tap(key, x)` marks the floating tensor `x` and returns the tensor
    to compute on with. The marking leaves values unchanged. Each
    framework's way of doing it is in `kmp.backend._taped_gradients`.

    Args:
        loss_fn: The loss, as above. With `jit_compile`, it is traced once
            per input shape, so `tap` is called at trace time only.
        jit_compile: Compile with XLA (TensorFlow, JAX); PyTorch runs
            eagerly either way.

    Returns:
        `run(values, *args)` -> `(loss, keys, tapped, value_grads,
        tap_grads)`, `keys` in `tap`'s call order; a tapped tensor's
        gradient has its dtype (a float16 activation's is float16). One
        the loss does not depend on is None (TF, torch) or zeros (JAX).
    """
    from kmp.backend import _taped_gradients

    return _taped_gradients.maker(name())(loss_fn, jit_compile)


def tracing(value) -> bool:
    """Whether `value`, a tensor, belongs to a program being traced now,
    whose Python runs once, at its trace: a TensorFlow graph (a
    `tf.function`), a JAX staging transform (`jax.jit`; not `jax.grad`
    alone, which runs the Python at every call: an array made now is a
    tracer only while staging, and a concrete `value` answers first,
    with no array made, in an eager loop's every step). Never on torch:
    kmp's Python there runs at every call, compiled or not
    (`uncompiled`)."""
    if name() == "tensorflow":
        import tensorflow as tf

        return not tf.executing_eagerly()
    if name() == "jax":
        import jax

        tracer = jax.core.Tracer
        return isinstance(value, tracer) and isinstance(
            jax.numpy.zeros(()), tracer
        )
    return False


def out_of_trace():
    """A context in which code runs once, now, even inside a step being
    traced: TensorFlow's `tf.init_scope` (Keras builds an optimizer inside
    the first trace of the train step when there is no strategy, and an
    assignment there would become part of every step); nothing on JAX and
    torch, which build outside their traces."""
    if name() != "tensorflow":
        return contextlib.nullcontext()
    import tensorflow as tf

    return tf.init_scope()


def written_at(frame) -> tuple[str, int] | None:
    """Where the user wrote the code `frame` runs: its file and line, or,
    for a `tf.function`'s body, which TensorFlow's autograph rewrites
    into a generated file, the line of the original it came from (read
    from the source map autograph keeps on the converted function, which
    the caller's frame, autograph's `converted_call`, holds); None where
    that map cannot be read."""
    path = frame.f_code.co_filename
    if "__autograph_generated_file" not in path:
        return path, frame.f_lineno
    caller = frame.f_back
    converted = caller and caller.f_locals.get("converted_f")
    source_map = getattr(converted, "ag_source_map", None) or {}
    # Keys are LineLocation(filename, lineno) tuples.
    origin = source_map.get((path, frame.f_lineno))
    if origin is None:
        return None
    return origin.loc.filename, origin.loc.lineno


def uncompiled(function):
    """`function`, run as Python where a compiler traces the step around
    it: under torch.compile, `torch._dynamo.disable`, so dynamo guards on
    its result, not on the objects it reads (frames, ids: new each step,
    each a recompile). TensorFlow and JAX run Python once, when they
    trace: `function` itself."""
    if name() != "torch":
        return function
    import torch

    return torch._dynamo.disable(function)
