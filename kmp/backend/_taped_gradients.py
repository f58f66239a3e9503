"""Gradients by intermediate tensors, one implementation per framework.

The doctor needs d(loss)/d(x) for every layer output x, which no Keras
API gives. Each framework gets there its own way:

- TensorFlow: a `GradientTape` watches each tapped tensor;
- JAX differentiates by inputs only, so each tapped tensor gets a zero
  added that is an input of the function: the gradient by that zero is
  the gradient by the tensor;
- PyTorch: `torch.autograd.grad` takes the tapped tensors themselves as
  inputs (autograd records every tensor of the graph).

`kmp.backend.taped_gradients` picks one by the Keras backend; this module
branches on nothing. Every `make_*` returns the same `run` (see there).
"""

import keras
import numpy as np
from keras import ops

from kmp.errors import InputError


def make_tensorflow(loss_fn, jit_compile):
    import tensorflow as tf

    keys = []

    def step(values, args):
        keys.clear()
        taps = []
        with tf.GradientTape() as tape:
            tape.watch(values)

            def tap(key, x):
                tape.watch(x)
                keys.append(key)
                taps.append(x)
                return x

            loss = loss_fn(values, args, tap)
        value_grads, tap_grads = tape.gradient(loss, (values, taps))
        return loss, taps, value_grads, tap_grads

    if jit_compile:
        step = tf.function(step, jit_compile=True)

    def run(values, *args):
        values = [tf.convert_to_tensor(v) for v in values]
        loss, taps, value_grads, tap_grads = step(values, args)
        return loss, list(keys), taps, value_grads, tap_grads

    return run


def make_jax(loss_fn, jit_compile):
    import jax
    import jax.numpy as jnp

    keys = []

    def traced(values, zeros, args):
        keys.clear()
        taps = []
        supply = None if zeros is None else iter(zeros)

        def tap(key, x):
            keys.append(key)
            if supply is not None:
                # d(loss)/d(zero) is d(loss)/d(x): JAX differentiates
                # by inputs only, so each tapped tensor gets one.
                x = x + next(supply)
            taps.append(x)
            return x

        return loss_fn(values, args, tap), taps

    grad = jax.value_and_grad(traced, argnums=(0, 1), has_aux=True)
    if jit_compile:
        grad = jax.jit(grad)

    shapes_by_input = {}

    def run(values, *args):
        signature = tuple(
            (tuple(jnp.shape(a)), str(jnp.result_type(a)))
            for a in jax.tree_util.tree_leaves(args)
        )
        if signature not in shapes_by_input:  # trace once per shape
            _, shapes_by_input[signature] = jax.eval_shape(
                lambda v, a: traced(v, None, a), values, args
            )
        zeros = [
            jnp.zeros(s.shape, s.dtype) for s in shapes_by_input[signature]
        ]
        (loss, taps), (value_grads, tap_grads) = grad(values, zeros, args)
        return loss, list(keys), taps, value_grads, tap_grads

    return run


def make_torch(loss_fn, jit_compile):
    # `jit_compile` is not used: torch.compile would split the pass at
    # `torch.autograd.grad` (a graph break) and compile each half, for no
    # change in what is measured. The passes run eagerly, as Keras's own
    # torch `fit` does by default (`jit_compile="auto"` is eager there).
    del jit_compile
    import torch

    def run(values, *args):
        keys, taps = [], []
        # NumPy batches to tensors on Keras's device, as Keras's own
        # torch trainer does with each batch.
        args = keras.tree.map_structure(
            lambda a: (
                ops.convert_to_tensor(a)
                if isinstance(a, (np.ndarray, np.generic))
                else a
            ),
            args,
        )
        # Leaves of a graph of the doctor's own: the model's variables
        # are neither read nor given gradients.
        leaves = [
            torch.as_tensor(v).detach().requires_grad_(True) for v in values
        ]

        def tap(key, x):
            keys.append(key)
            if not x.requires_grad:
                # An output no trainable value flows into (a cast of the
                # input, say): as a leaf of its own it gets a gradient.
                x = x.detach().requires_grad_(True)
            taps.append(x)
            return x

        with torch.enable_grad():
            loss = loss_fn(leaves, args, tap)
        grads = torch.autograd.grad(
            loss, leaves + taps, allow_unused=True, materialize_grads=False
        )
        return (
            loss.detach(),
            keys,
            [t.detach() for t in taps],
            list(grads[: len(leaves)]),
            list(grads[len(leaves) :]),
        )

    return run


MAKERS = {
    "tensorflow": make_tensorflow,
    "jax": make_jax,
    "torch": make_torch,
}


def maker(backend_name):
    """The `make_*` function for a Keras backend."""
    if backend_name not in MAKERS:
        raise InputError(
            "Gradients by intermediate tensors need the TensorFlow, JAX or "
            f"PyTorch backend; KERAS_BACKEND is {backend_name!r}."
        )
    return MAKERS[backend_name]
