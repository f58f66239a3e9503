"""Stochastic rounding to bfloat16 (`kmp.memory.rounding`): the hash is
the reference one bit for bit on this backend (so every backend draws
the same bits), the rounding is exact on bfloat16 values, unbiased, and
always one of the two neighbours."""

import hypothesis
import keras
import numpy as np
from hypothesis import strategies as st
from keras import ops

from kmp.memory import rounding


def _reference_hash(x):
    """lowbias32 in numpy's uint32 arithmetic."""
    x = np.asarray(x, dtype=np.int64).astype(np.uint32)
    x ^= x >> np.uint32(16)
    x = x * np.uint32(0x7FEB352D)
    x ^= x >> np.uint32(15)
    x = x * np.uint32(0x846CA68B)
    x ^= x >> np.uint32(16)
    return x.view(np.int32)


def _numpy(x):
    return ops.convert_to_numpy(ops.cast(x, "float32"))


def test_the_hash_is_lowbias32_bit_for_bit():
    values = np.array([0, 1, 2, 12345, 2**31 - 1, -1, -(2**31)], "int32")
    got = ops.convert_to_numpy(rounding.hash32(ops.convert_to_tensor(values)))
    np.testing.assert_array_equal(got, _reference_hash(values))
    # Known values of the published hash (uint32 1 -> 0x68896b40... as int).
    assert int(got[1]) == 1753845952


def test_noise_is_a_function_of_seed_step_and_index():
    one = ops.convert_to_numpy(rounding.noise_bits((3, 5), 7, 11, 2))
    again = ops.convert_to_numpy(rounding.noise_bits((3, 5), 7, 11, 2))
    np.testing.assert_array_equal(one, again)
    assert one.min() >= 0 and one.max() < 2**16 and len(set(one.flat)) > 12
    for other in ((8, 11, 2), (7, 12, 2), (7, 11, 3)):
        assert not np.array_equal(
            one, ops.convert_to_numpy(rounding.noise_bits((3, 5), *other))
        )


def test_the_noise_equals_the_reference_bits():
    # The whole construction in numpy: what each backend must draw.
    key = _reference_hash(5)
    key = _reference_hash(np.int64(key) + 3)
    key = _reference_hash(np.int64(key) + 9)
    counter = np.arange(6, dtype=np.int64)
    spread = (counter * 0x9E3779B9 + np.int64(key)) & 0xFFFFFFFF
    expected = _reference_hash(spread).view(np.uint32) >> 16
    got = ops.convert_to_numpy(rounding.noise_bits((2, 3), 5, 9, 3))
    np.testing.assert_array_equal(got.reshape(-1), expected.astype(np.int32))


def test_bfloat16_values_come_back_unchanged():
    values = np.array([0.0, 1.0, -2.5, 3.0e38, -1.0e-38, 0.0078125], "float32")
    values = (values.view(np.int32) & -65536).view(np.float32)  # bfloat16s
    for step in range(4):
        got = rounding.stochastic_round(values, 1, step, 0)
        assert keras.backend.standardize_dtype(got.dtype) == "bfloat16"
        np.testing.assert_array_equal(_numpy(got), values)


def test_a_small_part_survives_on_average_and_nearest_drops_it():
    # 1 + 2**-10 lies a quarter of the way from 1 to the next bfloat16
    # (1 + 2**-7, a 2**-7 step): nearest gives 1; stochastic gives the
    # upper neighbour a quarter of the time.
    x = np.full((256, 256), 1.0 + 2.0**-10, "float32")
    nearest = _numpy(ops.cast(x, "bfloat16"))
    assert set(nearest.flat) == {1.0}
    got = _numpy(rounding.stochastic_round(x, 0, 0, 0))
    assert set(got.flat) <= {1.0, 1.0 + 2.0**-7}
    # 65536 draws: the mean's standard deviation is 2**-7 * sqrt(3/16) /
    # 256 = 1.3e-5; five of them, against the 9.8e-4 nearest loses.
    assert abs(got.mean() - (1.0 + 2.0**-10)) < 7e-5
    negative = _numpy(rounding.stochastic_round(-x, 0, 0, 0))
    assert abs(negative.mean() + (1.0 + 2.0**-10)) < 7e-5


@hypothesis.settings(max_examples=40, deadline=None)
@hypothesis.given(
    st.floats(
        min_value=-(2.0**100),
        max_value=2.0**100,
        allow_nan=False,
        allow_subnormal=False,  # TF and XLA flush them to zero
        width=32,
    ),
    st.integers(0, 2**31 - 1),
)
def test_the_result_is_one_of_the_two_neighbours(value, seed):
    x = np.full((64,), value, "float32")
    got = _numpy(rounding.stochastic_round(x, seed, 0, 0))
    bits = x.view(np.int32)
    down = (bits & -65536).view(np.float32)
    up = ((bits & -65536) + 65536).view(np.float32)
    assert np.all((got == down) | (got == up))
    if down[0] == x[0]:
        assert np.all(got == x)  # already a bfloat16


def test_many_tensors_at_once_round_as_each_alone():
    rng = np.random.default_rng(0)
    tensors = [
        rng.normal(size=shape).astype("float32")
        for shape in ((3, 5), (7,), (), (2, 1, 4))
    ]
    indices = [4, 0, 9, 2]
    together = rounding.stochastic_round_many(tensors, 3, 17, indices)
    for x, index, got in zip(tensors, indices, together):
        alone = rounding.stochastic_round(x, 3, 17, index)
        assert keras.backend.standardize_dtype(got.dtype) == "bfloat16"
        assert tuple(got.shape) == x.shape
        np.testing.assert_array_equal(_numpy(got), _numpy(alone))
