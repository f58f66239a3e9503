"""kmp.backend.broadcast_over_batch: the values of `ops.broadcast_to`, the
gradient of a sum over the batch, and on JAX that gradient written as a
contraction over the batch (no reduction for XLA to lay out)."""

import keras
import numpy as np
import pytest
from keras import ops

from kmp import backend


def table(shape=(5, 3), dtype="float32"):
    values = np.arange(np.prod(shape), dtype="float32").reshape(shape)
    return ops.cast(values - 4.5, dtype)


@pytest.mark.parametrize("shape", [(5, 3), (7,), (2, 3, 4)])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("batch", [4, 32])  # 32: JAX's product, 16-bit
def test_it_repeats_the_values_over_a_new_batch_axis(shape, dtype, batch):
    values = table(shape, dtype)
    out = backend.broadcast_over_batch(values, batch)
    assert tuple(out.shape) == (batch, *shape)
    assert keras.backend.standardize_dtype(out.dtype) == dtype
    want = ops.broadcast_to(values, (batch, *shape))
    np.testing.assert_array_equal(
        ops.convert_to_numpy(ops.cast(out, "float32")),
        ops.convert_to_numpy(ops.cast(want, "float32")),
    )


@pytest.mark.parametrize("jit_compile", [False, True])
@pytest.mark.parametrize("dtype, rtol", [("float32", 1e-6), ("bfloat16", 2e-2)])
@pytest.mark.parametrize("batch", [6, 32])
def test_the_values_gradient_is_the_sum_over_the_batch(
    jit_compile, dtype, rtol, batch
):
    rng = np.random.default_rng(0)
    weights = rng.standard_normal((batch, 5, 3)).astype("float32")

    def loss_fn(values, args, tap):
        (repeated,) = values
        out = backend.broadcast_over_batch(ops.cast(repeated, dtype), batch)
        return ops.sum(ops.cast(out, "float32") * args[0])

    run = backend.taped_gradients(loss_fn, jit_compile)
    _, _, _, (gradient,), _ = run([table()], ops.convert_to_tensor(weights))
    want = ops.convert_to_numpy(ops.cast(ops.cast(weights, dtype), "float32"))
    np.testing.assert_allclose(
        ops.convert_to_numpy(gradient), want.sum(0), rtol=rtol, atol=rtol
    )


@pytest.mark.skipif(backend.name() != "jax", reason="JAX's program")
@pytest.mark.parametrize(
    "form, dtype, batch, contracted",
    [
        ("kmp", "bfloat16", 32, True),
        ("kmp", "float16", 64, True),
        ("kmp", "float32", 32, False),  # summed exactly (module docstring)
        ("kmp", "bfloat16", 31, False),  # too few for XLA to relay out
        ("broadcast_to", "bfloat16", 32, False),
    ],
)
def test_on_jax_a_16_bit_gradient_contracts_a_batch_of_32(
    form, dtype, batch, contracted
):
    import jax

    def loss(values, activations):
        if form == "kmp":
            repeated = backend.broadcast_over_batch(values, batch)
        else:
            repeated = ops.broadcast_to(values, (batch, *values.shape))
        out = activations + repeated
        return (out * out).sum()

    values = jax.numpy.ones((16, 8), dtype)
    activations = jax.numpy.ones((batch, 16, 8), dtype)
    text = jax.jit(jax.grad(loss)).lower(values, activations).as_text()
    # A dot_general contracting the batch (dimension 0) of the
    # activation's gradient, or a reduction over it.
    element = {"bfloat16": "bf16", "float16": "f16", "float32": "f32"}[dtype]
    batch_sum = f"across dimensions = [0] : (tensor<{batch}x16x8x{element}>"
    assert (batch_sum in text) is not contracted
    assert ("contracting_dims = [0] x [0]" in text) is contracted
