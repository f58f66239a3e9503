"""kmp.fp8.scaled_matmul: kmp's float8 matmul on JAX and torch, its
numerics, its gradients, and on JAX the float8 `dot_general`s in the
lowered program (torch's `_scaled_mm` calls: torch_matmul_test.py)."""

import functools
import re

import hypothesis
import keras
import numpy as np
import pytest
from hypothesis import strategies as st

from kmp import backend
from kmp.fp8.scaled_matmul import float8_matmul

jax_only = pytest.mark.skipif(
    backend.name() != "jax", reason="reads JAX's lowered program"
)
kmp_matmul = pytest.mark.skipif(
    backend.name() not in ("jax", "torch"),
    reason="kmp's float8 matmul is JAX's and torch's",
)

# The bounds, as relative errors in the Frobenius norm on Gaussian data.
# Round-to-nearest with p mantissa bits has a relative error of RMS about
# 2**-(p+1) / sqrt(3) * E[1/mantissa], ~2.6 % for E4M3 (p = 3) and ~5.2 %
# for E5M2 (p = 2); a product's errors add in quadrature: ~3.7 % for the
# forward (E4M3 x E4M3), ~5.8 % for each gradient (E5M2 x E4M3). The
# bounds leave ~35 % above those.
FORWARD_BOUND = 0.05
GRADIENT_BOUND = 0.08


def data(seed=0, m=(2, 64), k=128, n=32):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((*m, k)).astype("float32")
    w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype("float32")
    c = rng.standard_normal((*m, n)).astype("float32")
    return x, w, c


def relative_error(got, want):
    got, want = np.asarray(got, "float32"), np.asarray(want, "float32")
    return np.linalg.norm(got - want) / np.linalg.norm(want)


def gradients(x, w, c, scale=1.0):
    """The gradients of `sum(float8_matmul(x, w) * c) * scale` by `x` and
    `w`, as NumPy arrays, in this backend's autodiff."""
    if backend.name() == "torch":
        import torch

        x = torch.tensor(np.asarray(x), requires_grad=True)
        w = torch.tensor(np.asarray(w), requires_grad=True)
        y = float8_matmul(x, w).float()
        (
            torch.sum(y * torch.tensor(np.asarray(c, "float32"))) * scale
        ).backward()
        return x.grad.numpy(), w.grad.numpy()
    import jax

    return jax.grad(losses(c)[0], argnums=(0, 1))(x, w, scale)


def as_float32(x):
    if backend.name() == "torch":
        return x.detach().float().numpy()
    return np.asarray(x, "float32")


def losses(c):
    import jax.numpy as jnp

    def float8(x, w, s=1.0):
        return jnp.sum(float8_matmul(x, w).astype("float32") * c) * s

    def float32(x, w):
        return jnp.sum((x.astype("float32") @ w.astype("float32")) * c)

    return float8, float32


@kmp_matmul
def test_the_product_is_float32_s_to_float8_precision():
    x, w, _ = data()
    y = float8_matmul(x, w)
    assert tuple(y.shape) == (2, 64, 32)
    assert keras.backend.standardize_dtype(y.dtype) == "float32"
    assert relative_error(as_float32(y), x @ w) < FORWARD_BOUND
    # Not float32's product: the operands were rounded to float8.
    assert relative_error(as_float32(y), x @ w) > 1e-3


@kmp_matmul
@pytest.mark.parametrize("rows", [64, 63])
def test_the_gradients_are_float32_s_to_float8_precision(rows):
    # 63 rows: torch pads the rows to 16's multiple for the kernel's
    # gradient (what CUDA's FP8 GEMM takes); the padding adds nothing.
    x, w, c = data(seed=1, m=(2, rows))
    got = gradients(x, w, c)
    want = (c @ w.T, x.reshape(-1, x.shape[-1]).T @ c.reshape(-1, c.shape[-1]))
    for g, r in zip(got, want):
        assert g.shape == r.shape
        assert relative_error(g, r) < GRADIENT_BOUND


@kmp_matmul
def test_bfloat16_operands_give_bfloat16_results_and_gradients():
    from keras import ops

    x, w, c = data(seed=2)
    x = ops.convert_to_tensor(x, "bfloat16")
    w = ops.convert_to_tensor(w, "bfloat16")
    dtype_of = keras.backend.standardize_dtype
    assert dtype_of(float8_matmul(x, w).dtype) == "bfloat16"
    assert dtype_of(float8_matmul(x, w, "float32").dtype) == "float32"
    assert dtype_of(float8_matmul(x, w, "float16").dtype) == "float16"
    if backend.name() == "torch":
        x, w = x.requires_grad_(), w.requires_grad_()
        float8_matmul(x, w).float().mul(
            ops.convert_to_tensor(c)
        ).sum().backward()
        dx, dw = x.grad, w.grad
    else:
        import jax

        dx, dw = jax.grad(losses(c)[0], argnums=(0, 1))(x, w)
    assert dtype_of(dx.dtype) == "bfloat16" and dtype_of(dw.dtype) == "bfloat16"


def _dot_generals(text):
    """`(lhs, rhs, result)` element types of every `dot_general`."""
    found = re.findall(
        r"stablehlo\.dot_general .*: \(tensor<([^>]*)>, tensor<([^>]*)>\)"
        r" -> tensor<([^>]*)>",
        text,
    )
    return [tuple(t.split("x")[-1] for t in types) for types in found]


@jax_only
@pytest.mark.parametrize(
    "dtype, written",
    # bfloat16 results are written by the GEMM itself; float16's range
    # cannot hold the unscaled product, so it gets float32, as float32.
    [("bfloat16", "bf16"), ("float16", "f32"), ("float32", "f32")],
)
def test_the_train_step_runs_all_three_matmuls_on_float8_operands(
    dtype, written
):
    import jax
    import jax.numpy as jnp

    x, w, c = data(seed=3)
    x, w = jnp.asarray(x, dtype), jnp.asarray(w, dtype)
    float8, _ = losses(c)
    step = jax.jit(jax.value_and_grad(float8, argnums=(0, 1)))
    dots = _dot_generals(step.lower(x, w).as_text())
    assert sorted(dots) == sorted(
        [
            ("f8E4M3FN", "f8E4M3FN", written),  # y = x @ w
            ("f8E5M2", "f8E4M3FN", written),  # dx = g @ w^T
            ("f8E4M3FN", "f8E5M2", written),  # dw = x^T @ g
        ]
    )
    # Each tensor is quantized once per step: x, w and the gradient.
    text = step.lower(x, w).as_text()
    casts = re.findall(r"stablehlo\.convert .* -> tensor<[^>]*x(f8\w*)>", text)
    assert sorted(casts) == ["f8E4M3FN", "f8E4M3FN", "f8E5M2"]
    # And the compiled program runs (XLA emulates float8 on a CPU).
    loss, _ = step(x, w)
    assert np.isfinite(loss)


@kmp_matmul
def test_zeros_multiply_to_zeros():
    x, w, c = data(seed=4)
    x = np.zeros_like(x)
    assert not np.any(as_float32(float8_matmul(x, w)))
    dx, dw = gradients(x, w, c)
    assert np.all(np.isfinite(dx)) and not np.any(dw)


@kmp_matmul
@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
def test_a_non_finite_operand_or_gradient_stays_non_finite(bad):
    # Under a dynamic loss scale an overflow must stay visible, for the
    # step to be skipped: saturating it to float8's max would hide it.
    x, w, c = data(seed=5)
    x[0, 3, 7] = bad
    assert not np.all(np.isfinite(as_float32(float8_matmul(x, w))))
    x, w, c = data(seed=5)
    c[1, 2, 3] = bad
    for gradient in gradients(x, w, c):
        assert not np.all(np.isfinite(gradient))


@functools.cache
def _scaled_grad():
    # One compiled program for every scale (hypothesis calls many times).
    x, w, c = data(seed=6)
    if backend.name() == "torch":
        return x, w, lambda x, w, scale: gradients(x, w, c, scale)
    import jax

    float8, _ = losses(c)
    return x, w, jax.jit(jax.grad(float8, argnums=(0, 1)))


@kmp_matmul
@hypothesis.settings(max_examples=12, deadline=None)
@hypothesis.given(st.integers(-30, 60))
@hypothesis.example(40)  # S * g ~ 1e12, far beyond E5M2's 57344
def test_a_power_of_two_loss_scale_scales_the_gradients_exactly(exponent):
    # The gradient's scale comes from its own amax, so `g * 2**e` rounds
    # to the same E5M2 values as `g`: the gradients of loss * S are
    # exactly S times those of loss, however far S * g is beyond E5M2.
    x, w, grad = _scaled_grad()
    scale = np.float32(2.0**exponent)
    for scaled, plain in zip(grad(x, w, scale), grad(x, w, np.float32(1))):
        np.testing.assert_array_equal(np.asarray(scaled), scale * plain)


@kmp_matmul
def test_mismatched_shapes_are_refused_with_the_shapes():
    x, w, _ = data()
    with pytest.raises(ValueError, match=r"got x of shape \(2, 64, 128\)"):
        float8_matmul(x, w.T)


@pytest.mark.skipif(
    backend.name() in ("jax", "torch"), reason="this backend runs it"
)
def test_tensorflow_is_told_where_it_runs():
    x, w, _ = data()
    with pytest.raises(ValueError, match="Set KERAS_BACKEND=jax"):
        float8_matmul(x, w)
