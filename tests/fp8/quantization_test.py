"""kmp.fp8.quantization: per-tensor scales, rounding to E4M3 and E5M2,
and the gradient quantized at its own scale."""

import hypothesis.extra.numpy as hnp
import numpy as np
from hypothesis import assume
from hypothesis import given
from hypothesis import strategies as st
from keras import ops

from kmp import backend
from kmp.fp8 import quantization as f8


def numpy(x):
    return ops.convert_to_numpy(ops.cast(x, "float32"))


def test_quantize_rounds_to_e4m3_and_saturates():
    x = ops.convert_to_tensor([1.0, 3.3, -0.3, 500.0, -500.0], "bfloat16")
    scale = f8.scale_for(448.0, f8.E4M3, "bfloat16")
    assert numpy(scale) == 1.0
    # E4M3 between 2 and 4 steps by 0.25; bfloat16's 0.30078 lies between
    # 0.28125 and 0.3125 (steps of 1/32); beyond 448 it saturates.
    np.testing.assert_array_equal(
        numpy(f8.quantize(x, scale, f8.E4M3)),
        [1.0, 3.25, -0.3125, 448.0, -448.0],
    )
    # At half the scale the grid is twice as fine and saturates at 224.
    half = f8.scale_for(224.0, f8.E4M3, "bfloat16")
    np.testing.assert_array_equal(
        numpy(f8.quantize(x, half, f8.E4M3)),
        [1.0, 3.25, -0.3125, 224.0, -224.0],
    )


def test_scale_for_zero_non_finite_and_float16():
    assert numpy(f8.scale_for(0.0, f8.E5M2, "bfloat16")) == 1.0
    assert numpy(f8.scale_for(57344.0 * 4, f8.E5M2, "bfloat16")) == 4.0
    # A non-finite amax makes the quantized tensor NaN (an overflow the
    # loss-scale optimizer must still see), not a saturated finite one.
    scale = f8.scale_for(np.inf, f8.E5M2, "float16")
    x = ops.convert_to_tensor([1.0, np.inf], "float16")
    assert np.isnan(numpy(f8.quantize(x, scale, f8.E5M2))).all()
    # float16 cannot hold a scale below its smallest normal number.
    tiny = float(np.finfo("float16").tiny)
    assert numpy(f8.scale_for(1e-9, f8.E5M2, "float16")) == tiny


@given(
    hnp.arrays(
        "float32",
        (4, 8),
        elements=st.floats(-1e3, 1e3, width=32, allow_subnormal=False),
    ),
    st.integers(-8, 15),
)
def test_current_scaling_commutes_with_a_power_of_two(values, exponent):
    # What makes the gradients' float8 independent of the loss scale,
    # where the scale (amax / 57344) is a normal float32: above an amax
    # of about 7e-34 (hypothesis found 2e-35 on torch, whose scale is
    # subnormal). A loss scale leaves no gradient that small.
    factor = 2.0**exponent
    amax = float(np.max(np.abs(values)))
    assume(amax == 0 or amax * min(factor, 1.0) > 1e-30)

    def current(x):
        return f8.quantize(
            x, f8.scale_for(f8.amax(x), f8.E5M2, "bfloat16"), f8.E5M2
        )

    g = ops.convert_to_tensor(values, "bfloat16")
    np.testing.assert_array_equal(
        numpy(current(g * factor)), numpy(current(g)) * factor
    )


def _gradients(function, *args):
    """Gradients of a scalar function of tensors, on this backend."""
    run = backend.taped_gradients(lambda values, _, tap: function(*values))
    return run(list(args))[3]


def test_gradient_is_quantized_to_e5m2_at_its_own_scale():
    y = ops.convert_to_tensor(np.linspace(-1, 1, 12), "bfloat16")
    weights = ops.convert_to_tensor(np.linspace(-3, 5, 12) ** 3, "bfloat16")

    def loss(y):
        return ops.sum(ops.cast(f8.quantize_gradient(y) * weights, "float32"))

    (gradient,) = _gradients(loss, y)
    scale = f8.scale_for(f8.amax(weights), f8.E5M2, "bfloat16")
    np.testing.assert_array_equal(
        numpy(gradient), numpy(f8.quantize(weights, scale, f8.E5M2))
    )
    # Rounded to 2 mantissa bits, not the upstream gradient as it was.
    assert (numpy(gradient) != numpy(weights)).sum() >= 6
