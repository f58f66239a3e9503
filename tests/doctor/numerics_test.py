"""Range counting against float16/bfloat16: exact small cases and
properties checked against direct NumPy counts."""

import math

import numpy as np
import pytest
from hypothesis import example
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from kmp.doctor.numerics import FORMATS
from kmp.doctor.numerics import RangeCounter
from kmp.doctor.numerics import log2_bins
from kmp.doctor.numerics import scale_range

pytestmark = pytest.mark.backend_independent

F16 = FORMATS["float16"]
magnitudes = hnp.arrays(
    np.float32,
    st.integers(1, 200),
    elements=st.floats(
        -1e6, 1e6, width=32, allow_nan=False, allow_infinity=False
    ).map(lambda v: v * 1e-9 if abs(v) < 1 else v),
)


def test_format_bounds_are_numpy_float16s():
    info = np.finfo(np.float16)
    assert F16.max == float(info.max)
    assert F16.min_normal == float(info.smallest_normal)
    assert F16.min_subnormal == float(info.smallest_subnormal)
    assert F16.epsilon == float(info.eps) / 2


def test_log2_bins_are_exact_at_powers_of_two():
    values = np.array([1.0, 2.0**-24, 2.0**-24 * 0.99999, 65504.0, 3.0])
    assert log2_bins(values).tolist() == [0, -24, -25, 15, 1]
    # Float32 subnormals, each in its own binade (they were all put in
    # -127's: a loss scale 22 binades short passed for enough).
    subnormals = np.array([1e-45, 8.45939e-40, 2.0**-127], np.float32)
    assert log2_bins(subnormals).tolist() == [-149, -130, -127]


@given(magnitudes)
def test_log2_bins_bracket_each_value(values):
    nonzero = np.abs(values[values != 0]).astype(np.float64)
    bins = log2_bins(nonzero.astype(np.float32))
    assert np.all(2.0 ** bins.astype(np.float64) <= nonzero)
    assert np.all(nonzero < 2.0 ** (bins.astype(np.float64) + 1))


@given(magnitudes, st.sampled_from([1.0, 8.0, 1000.0, 2.0**15]))
def test_counts_match_numpy(values, scale):
    counter = RangeCounter(F16, scale)
    half = len(values) // 2
    counter.add(values[:half])
    counter.add(values[half:])
    nonzero = np.abs(values[values != 0]).astype(np.float64)
    assert counter.values == values.size
    assert counter.nonzero == nonzero.size
    assert counter.lost == np.count_nonzero(nonzero < 2.0**-24)
    assert counter.subnormal == np.count_nonzero(nonzero < 2.0**-14)
    assert counter.overflow == np.count_nonzero(nonzero > 65504)
    assert counter.lost_scaled == np.count_nonzero(
        nonzero < np.float32(2.0**-24 / scale)
    )
    assert counter.overflow_scaled == np.count_nonzero(
        nonzero > np.float32(65504 / scale)
    )
    assert counter.max_abs == (nonzero.max() if nonzero.size else 0.0)
    assert counter.histogram.sum() == nonzero.size
    for exponent in (-10, 0, 7, 30):
        assert counter.lost_at(exponent) == np.count_nonzero(
            nonzero * 2.0**exponent < 2.0**-24
        )


def test_measured_values_and_relative_error():
    counter = RangeCounter(F16, 4.0)
    reference = np.array([1.0, 2.0, 1e-9, 0.0], np.float32)
    measured = np.array([4.0, 8.0, 0.0, 0.0], np.float32)
    counter.add(reference, measured)
    assert counter.measured_lost == 1  # 1e-9 came out 0; 0 stays 0
    assert counter.relative_error() == pytest.approx(1e-9 / math.sqrt(5))
    counter.add(reference, np.array([np.inf, 0, 0, 0], np.float32))
    assert counter.measured_nonfinite == 1
    assert counter.relative_error() == math.inf
    with pytest.raises(ValueError, match="same tensor"):
        counter.add(reference, measured[:2])


def test_nonfinite_reference_values_are_counted_apart():
    counter = RangeCounter(F16)
    counter.add(np.array([np.inf, np.nan, 2.0], np.float32))
    assert (counter.nonfinite, counter.nonzero, counter.max_abs) == (2, 1, 2)


def test_headroom_and_merge():
    a, b = RangeCounter(F16), RangeCounter(F16)
    a.add(np.array([1.0, 2.0**-30]))
    b.add(np.array([1024.0]))
    assert b.headroom() == pytest.approx(math.log2(65504 / 1024))
    merged = a.merge(b)
    assert (merged.nonzero, merged.max_abs, merged.lost) == (3, 1024.0, 1)
    assert RangeCounter(F16).headroom() == math.inf


def test_scale_range_exact():
    counter = RangeCounter(F16)
    # 99 values at 2^-30, one at 2^-10: 2^6 lifts the 99 to 2^-24; the
    # largest, 2^-10, may grow to 2^25 * 2^-10 = 32768 <= 65504.
    counter.add(np.array([2.0**-30] * 99 + [2.0**-10]))
    assert scale_range(counter) == (6, 25)
    assert scale_range(counter, keep=0.5) == (6, 25)
    # Keeping 1% (one value) needs only the 2^-10 one: no lower bound
    # beyond putting it at or above 2^-24.
    assert scale_range(counter, keep=0.01)[0] == -14


def test_scale_range_none_when_span_exceeds_float16():
    counter = RangeCounter(F16)
    counter.add(np.array([2.0**-40] * 50 + [1024.0] * 50))
    assert scale_range(counter) is None
    assert scale_range(RangeCounter(F16)) is None  # nothing measured
    with pytest.raises(ValueError, match="keep"):
        scale_range(counter, keep=0)


@given(magnitudes)
# Found by CI on 2026-11-30: a float32 subnormal, counted as 2^-127.
@example(np.array([8.45939e-40], np.float32))
def test_every_scale_in_range_keeps_99_percent(values):
    counter = RangeCounter(F16)
    counter.add(values)
    found = scale_range(counter)
    nonzero = np.abs(values[values != 0]).astype(np.float64)
    if found is None:
        return
    lo, hi = found
    for k in {lo, hi, (lo + hi) // 2}:
        scaled = nonzero * 2.0**k
        assert np.mean(scaled < 2.0**-24) <= 0.01
        assert scaled.max() <= 65504
    assert np.mean(nonzero * 2.0 ** (lo - 1) < 2.0**-24) > 0.01 or (lo == -103)
