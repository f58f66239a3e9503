"""kmp.backend.recompute_in_backward: an activation's values and gradients
unchanged, its name kept, and on JAX the input
the only tensor its backward pass keeps (what lets XLA fuse a GELU into
the matmul before it); elsewhere the activation itself."""

import functools

import keras
import numpy as np
import pytest
from keras import ops

from kmp import backend

ON_JAX = backend.name() == "jax"

ACTIVATIONS = {
    "gelu": keras.activations.gelu,
    "gelu approximate": functools.partial(
        keras.activations.gelu, approximate=True
    ),
    "relu": keras.activations.relu,
    "silu": keras.activations.silu,
}


def inputs(dtype="float32"):
    values = np.linspace(-4.0, 4.0, 24, dtype="float32").reshape(4, 6)
    return ops.cast(values, dtype)


def numpy(x):
    return ops.convert_to_numpy(ops.cast(x, "float32"))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_the_values_are_the_activation_s(name, dtype):
    activation = ACTIVATIONS[name]
    x = inputs(dtype)
    out = backend.recompute_in_backward(activation)(x)
    assert keras.backend.standardize_dtype(out.dtype) == dtype
    np.testing.assert_array_equal(numpy(out), numpy(activation(x)))


def test_arguments_after_the_input_are_passed_as_they_are():
    # `approximate` is a Python bool the GELU branches on: traced, it
    # would fail there.
    x = inputs()
    recomputed = backend.recompute_in_backward(keras.activations.gelu)
    np.testing.assert_array_equal(
        numpy(recomputed(x, approximate=True)),
        numpy(keras.activations.gelu(x, approximate=True)),
    )
    assert not np.array_equal(
        numpy(recomputed(x, approximate=True)), numpy(recomputed(x))
    )


@pytest.mark.parametrize("jit_compile", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_the_gradients_are_the_activation_s(name, dtype, jit_compile):
    activation = ACTIVATIONS[name]
    weights = np.cos(np.arange(24.0, dtype="float32")).reshape(4, 6)
    weights = ops.convert_to_tensor(weights)

    def gradient(function):
        def loss_fn(values, args, tap):
            out = function(ops.cast(values[0], dtype))
            return ops.sum(ops.cast(out, "float32") * args[0])

        run = backend.taped_gradients(loss_fn, jit_compile)
        _, _, _, (grad,), _ = run([inputs()], weights)
        return ops.convert_to_numpy(grad)

    # XLA may fuse the recomputation differently: float32 rounding.
    np.testing.assert_allclose(
        gradient(backend.recompute_in_backward(activation)),
        gradient(activation),
        rtol=1e-6,
        atol=1e-7,
    )


def test_it_takes_the_activation_s_name_and_gives_it_back():
    recomputed = backend.recompute_in_backward(keras.activations.gelu)
    assert recomputed.__name__ == "gelu"
    if ON_JAX:
        assert recomputed.__wrapped__ is keras.activations.gelu


@pytest.mark.skipif(ON_JAX, reason="TensorFlow's and torch's")
def test_off_jax_it_is_the_activation_itself():
    for activation in ACTIVATIONS.values():
        assert backend.recompute_in_backward(activation) is activation


@pytest.mark.skipif(not ON_JAX, reason="JAX's residuals")
@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_on_jax_the_backward_pass_keeps_the_input_only(name):
    import jax

    activation = ACTIVATIONS[name]
    x = inputs("bfloat16")
    # The residuals a VJP closes over: what the forward pass writes for
    # the backward pass.
    _, as_written = jax.vjp(activation, x)
    _, recomputed = jax.vjp(backend.recompute_in_backward(activation), x)
    (kept,) = jax.tree_util.tree_leaves(recomputed)
    np.testing.assert_array_equal(numpy(kept), numpy(x))
    if name.startswith("gelu"):
        # Its `tanh` or `erf` terms: tensors of the input's size besides it.
        residuals = jax.tree_util.tree_leaves(as_written)
        assert sum(r.shape == x.shape for r in residuals) >= 3
