"""The doctor's vocabulary: where values fall in a half-precision format's
range.

float16 keeps magnitudes from 2^-24 (its smallest subnormal; anything
smaller becomes 0) to 65504 (anything larger becomes inf), with full
precision only from 2^-14 (its smallest normal) up. bfloat16 has
float32's range with 8 bits of mantissa. `kmp.diagnose` measures a
model's tensors against these bounds; this module does the counting, in
NumPy, one tensor at a time, so a whole model's activations never have to
sit in memory at once.

Magnitudes are binned by `floor(log2(|x|))`, read exactly from the
float32 exponent bits: for a power-of-two loss scale `2^k`, the count of
values that `2^k` pushes below a power-of-two bound is a sum over bins,
with no rounding.
"""

import dataclasses
import math
from typing import NamedTuple

import numpy as np

from kmp.errors import InputError

# floor(log2|x|) of nonzero finite float32 values lies in [-149, 127]
# (2^-149: float32's smallest subnormal); each value in its own bin.
LOG2_MIN = -149
LOG2_MAX = 127


class Format(NamedTuple):
    """A floating-point format's range.

    Attributes:
        name: `"float16"` or `"bfloat16"`.
        max: The largest finite value; larger magnitudes overflow.
        min_normal: The smallest normal value (full precision above it).
        min_subnormal: The smallest nonzero value; values below it are
            lost (become 0).
        epsilon: Unit roundoff, `2^-(mantissa bits + 1)`.
    """

    name: str
    max: float
    min_normal: float
    min_subnormal: float
    epsilon: float


FORMATS = {
    "float16": Format("float16", 65504.0, 2.0**-14, 2.0**-24, 2.0**-11),
    "bfloat16": Format(
        "bfloat16", 3.3895313892515355e38, 2.0**-126, 2.0**-133, 2.0**-8
    ),
}


def log2_bins(magnitudes: np.ndarray) -> np.ndarray:
    """`floor(log2(m))` of nonzero finite float32 magnitudes, exactly.

    The exponent field of a positive float32 is its bits shifted right by
    23, biased by 127. A subnormal's field is 0, and its value its
    mantissa times 2^-149: `floor(log2(mantissa)) - 149`, from -149 to
    -127 (gradients that small are what a loss scale is for).
    """
    bits = np.ascontiguousarray(magnitudes, np.float32).view(np.int32)
    exponents = (bits >> 23) - 127
    subnormal = exponents == -127
    if subnormal.any():
        mantissas = (bits[subnormal] & 0x7FFFFF).astype(np.float64)
        # frexp: mantissa = f * 2^e with f in [0.5, 1), so floor(log2) = e-1.
        exponents[subnormal] = np.frexp(mantissas)[1] - 1 + LOG2_MIN
    return exponents


@dataclasses.dataclass
class RangeCounter:
    """Counts of one tensor family's values against a format's range.

    Feed it with `add(reference, measured)` per tensor: `reference` are
    the float32 model's values (unscaled), `measured` the same tensor from
    the mixed-precision run at `scale`, already in the half format (for
    gradients: of the scaled loss). Fractions are of the nonzero finite
    reference values, since exact zeros (a ReLU's, say) are representable.

    Attributes:
        fmt: The half-precision `Format` measured against.
        scale: The loss scale of the measured values (1 for activations).
        values: Reference values seen.
        nonzero: Nonzero finite reference values.
        nonfinite: inf/NaN reference values (excluded from the rest).
        max_abs: Largest finite reference magnitude.
        histogram: Counts of nonzero finite reference values per
            `floor(log2|x|)`, indexed from `LOG2_MIN`.
        overflow, lost, subnormal: Reference values whose magnitude is
            above `fmt.max`, below `fmt.min_subnormal`, below
            `fmt.min_normal` (lost included), each at scale 1 and at
            `scale` (the `_scaled` fields).
        measured_nonfinite: inf/NaN among the measured values.
        measured_lost: Measured zeros where the reference is nonzero.
        sum_squares: Sum of squared reference values.
        error_squares: Sum of squared `measured / scale - reference`.
    """

    fmt: Format
    scale: float = 1.0
    values: int = 0
    nonzero: int = 0
    nonfinite: int = 0
    max_abs: float = 0.0
    histogram: np.ndarray = None
    overflow: int = 0
    lost: int = 0
    subnormal: int = 0
    overflow_scaled: int = 0
    lost_scaled: int = 0
    subnormal_scaled: int = 0
    measured: int = 0
    measured_nonfinite: int = 0
    measured_lost: int = 0
    sum_squares: float = 0.0
    error_squares: float = 0.0

    def __post_init__(self):
        if self.histogram is None:
            self.histogram = np.zeros(LOG2_MAX - LOG2_MIN + 1, np.int64)

    def add(self, reference, measured=None) -> None:
        """Counts one tensor (any shape); `measured` must match its shape."""
        reference = np.asarray(reference, np.float32).ravel()
        magnitude = np.abs(reference)
        finite = np.isfinite(magnitude)
        self.values += magnitude.size
        nonfinite = magnitude.size - int(np.count_nonzero(finite))
        if nonfinite:
            self.nonfinite += nonfinite
            magnitude = np.where(finite, magnitude, 0.0).astype(np.float32)
            reference = np.where(finite, reference, 0.0).astype(np.float32)
        nonzero = magnitude[magnitude > 0]
        self.nonzero += nonzero.size
        if nonzero.size:
            self.max_abs = max(self.max_abs, float(nonzero.max()))
            bins = np.bincount(
                log2_bins(nonzero) - LOG2_MIN, minlength=self.histogram.size
            )
            self.histogram += bins
        fmt, scale = self.fmt, self.scale
        self.overflow += int(np.count_nonzero(nonzero > fmt.max))
        self.lost += int(np.count_nonzero(nonzero < fmt.min_subnormal))
        self.subnormal += int(np.count_nonzero(nonzero < fmt.min_normal))
        self.overflow_scaled += int(np.count_nonzero(nonzero > fmt.max / scale))
        self.lost_scaled += int(
            np.count_nonzero(nonzero < fmt.min_subnormal / scale)
        )
        self.subnormal_scaled += int(
            np.count_nonzero(nonzero < fmt.min_normal / scale)
        )
        # float64: squares of gradients below ~1e-19 underflow float32.
        wide = reference.astype(np.float64)
        self.sum_squares += float(np.dot(wide, wide))
        if measured is None:
            return
        measured = np.asarray(measured, np.float32).ravel()
        if measured.shape != reference.shape:
            raise ValueError(
                f"measured values have {measured.size} elements, the "
                f"reference {reference.size}; they must be the same tensor."
            )
        self.measured += measured.size
        self.measured_nonfinite += measured.size - int(
            np.count_nonzero(np.isfinite(measured))
        )
        self.measured_lost += int(
            np.count_nonzero((measured == 0) & (magnitude > 0))
        )
        error = measured.astype(np.float64) / scale - wide
        self.error_squares += float(np.dot(error, error))

    def fraction(self, count: int) -> float:
        """`count` as a fraction of the nonzero reference values."""
        return count / self.nonzero if self.nonzero else 0.0

    def relative_error(self) -> float | None:
        """`||measured / scale - reference|| / ||reference||`; inf if the
        measured values hold inf/NaN; None without measurements or when
        the reference is all zeros."""
        if not self.measured or self.sum_squares == 0:
            return None
        if self.measured_nonfinite:
            return math.inf
        return math.sqrt(self.error_squares / self.sum_squares)

    def headroom(self) -> float:
        """Powers of two between the largest magnitude and `fmt.max`
        (negative: that many too many); inf for an all-zero tensor."""
        if self.max_abs == 0:
            return math.inf
        return math.log2(self.fmt.max / self.max_abs)

    def merge(self, other: "RangeCounter") -> "RangeCounter":
        """Adds another counter's counts (same format and scale)."""
        for field in dataclasses.fields(self):
            if field.name in ("fmt", "scale"):
                continue
            mine, theirs = getattr(self, field.name), getattr(other, field.name)
            if field.name == "max_abs":
                setattr(self, field.name, max(mine, theirs))
            else:
                setattr(self, field.name, mine + theirs)
        return self

    def lost_at(self, exponent: int) -> int:
        """Nonzero values that the scale `2^exponent` puts below
        `fmt.min_subnormal`, from the histogram (exact)."""
        # |x| 2^e < 2^b  <=>  floor(log2|x|) <= b - e - 1 (b integer).
        bound = round(math.log2(self.fmt.min_subnormal)) - exponent - 1
        return int(self.histogram[: max(bound - LOG2_MIN + 1, 0)].sum())


def scale_range(
    counter: RangeCounter, keep: float = 0.99
) -> tuple[int, int] | None:
    """The power-of-two loss scales `2^lo ... 2^hi` that keep at least
    `keep` of the nonzero gradient values at or above the format's
    smallest subnormal and none above its max.

    Args:
        counter: The gradients' counts, reference (unscaled) values.
        keep: The fraction that must stay representable.

    Returns:
        `(lo, hi)` exponents, or None when no single scale does both
        (the values span more binades than the format has).
    """
    if not 0 < keep <= 1:
        raise InputError(f"`keep` must be in (0, 1], got {keep}.")
    if counter.nonzero == 0:
        return None
    # No overflow: max_abs * 2^hi <= fmt.max.
    hi = math.floor(math.log2(counter.fmt.max / counter.max_abs))
    allowed = (1 - keep) * counter.nonzero
    lo = LOG2_MIN - math.floor(math.log2(counter.fmt.min_subnormal))
    # The smallest exponent whose lost count is within `allowed`: the
    # count falls as the exponent rises, so scan up from the bottom.
    while counter.lost_at(lo) > allowed:
        lo += 1
    while lo > -LOG2_MAX and counter.lost_at(lo - 1) <= allowed:
        lo -= 1
    if lo > hi:
        return None
    return lo, hi


def as_power_of_two(value: float) -> str:
    """`"2^15"` for an exact power of two, else the number (`"3e+04"`)."""
    exponent = math.log2(value)
    return f"2^{exponent:g}" if exponent == round(exponent) else f"{value:g}"
