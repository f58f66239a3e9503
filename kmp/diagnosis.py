"""What `kmp.diagnose` found: per-layer figures, verdicts, table and plot.

The verdicts, from the counts of `kmp.numerics.RangeCounter` (`fmt` is the
half format under test, `eps` its unit roundoff):

```
for each layer computing in half precision, in call order:
    pin to float32 if
        any float32 output exceeds fmt.max            # overflows: inf
        or its half outputs hold inf/NaN, its float32 ones are finite,
           and no earlier layer's half outputs did    # overflows inside
        or rel_error > max(10 * baseline, 20 * eps)   # error jumps here
    where baseline = max(eps, rel_error of up to 3 layers before it)
gradients = activation and weight gradients computed in half precision
lo, hi = loss-scale exponents keeping >= 99 % of them >= fmt.min_subnormal
         and none above fmt.max (kmp.numerics.scale_range)
if float16 and no such scale:  prefer mixed_bfloat16
elif scale < 2**lo:            loss scale too low
elif scale > 2**hi:            loss scale too high
```
"""

import dataclasses
import json
import math

import keras
import numpy as np

from kmp import backend
from kmp.numerics import FORMATS
from kmp.numerics import LOG2_MIN
from kmp.numerics import RangeCounter
from kmp.numerics import scale_range

_HALF = ("float16", "bfloat16")
_PRECEDING = 3  # layers whose error sets the baseline of the next


@dataclasses.dataclass
class TensorReport:
    """One layer's activations, activation gradients or weight gradients.

    Fractions are of the nonzero float32 reference values; `_scaled`
    fields at the diagnosis's loss scale (activations are not scaled).

    Attributes:
        values: Values seen (all batches).
        max_abs: Largest float32 magnitude.
        headroom: `log2(fmt.max / max_abs)`: powers of two to spare.
        overflow, lost, subnormal: Fractions above `fmt.max`, below its
            smallest subnormal (they become 0), below its smallest normal.
        overflow_scaled, lost_scaled, subnormal_scaled: The same at the
            loss scale.
        measured_lost: Fraction that came out 0 in the mixed run.
        measured_nonfinite: Fraction of the mixed run's values that are
            inf/NaN (of all values).
        relative_error: `||mixed / scale - float32|| / ||float32||`.
        histogram: `{"start": k, "counts": [...]}`: nonzero values per
            binade, `counts[i]` in `[2^(k+i), 2^(k+i+1))`.
    """

    values: int
    max_abs: float
    headroom: float
    overflow: float
    lost: float
    subnormal: float
    overflow_scaled: float
    lost_scaled: float
    subnormal_scaled: float
    measured_lost: float
    measured_nonfinite: float
    relative_error: float | None
    histogram: dict

    @classmethod
    def from_counter(cls, counter: RangeCounter) -> "TensorReport | None":
        if counter.values == 0:
            return None
        f = counter.fraction
        return cls(
            values=counter.values,
            max_abs=counter.max_abs,
            headroom=counter.headroom(),
            overflow=f(counter.overflow),
            lost=f(counter.lost),
            subnormal=f(counter.subnormal),
            overflow_scaled=f(counter.overflow_scaled),
            lost_scaled=f(counter.lost_scaled),
            subnormal_scaled=f(counter.subnormal_scaled),
            measured_lost=f(counter.measured_lost),
            measured_nonfinite=(
                counter.measured_nonfinite / counter.measured
                if counter.measured
                else 0.0
            ),
            relative_error=counter.relative_error(),
            histogram=_trimmed(counter.histogram),
        )


def _trimmed(histogram):
    nonzero = np.flatnonzero(histogram)
    if not nonzero.size:
        return {"start": 0, "counts": []}
    first, last = int(nonzero[0]), int(nonzero[-1])
    return {
        "start": first + LOG2_MIN,
        "counts": [int(c) for c in histogram[first : last + 1]],
    }


@dataclasses.dataclass
class LayerReport:
    """One observed layer (or `"(model weights)"` for weights no observed
    layer owns).

    Attributes:
        path: The layer's path (its name if it has none).
        class_name: The layer's class.
        dtype: The dtype of its outputs in the mixed run.
        activations, activation_gradients, weight_gradients:
            `TensorReport`s, or None where there is nothing to measure
            (no weights; an output the loss does not depend on).
        verdict: `"pin to float32"`, `"ok"`, or `"float32"` (the layer
            already computes in float32).
        reasons: Why, for a pin; also notes such as activation underflow.
    """

    path: str
    class_name: str
    dtype: str | None
    activations: TensorReport | None
    activation_gradients: TensorReport | None
    weight_gradients: TensorReport | None
    verdict: str = "ok"
    reasons: list = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Diagnosis:
    """The report of `kmp.diagnose`.

    Attributes:
        model: The model's name.
        policy: The mixed policy tested.
        loss_scale: The loss scale tested.
        backend: The Keras backend.
        batches, examples: How much data was run.
        layers: One `LayerReport` per observed layer, in call order.
        scale_range: `(lo, hi)`: loss scales `2^lo ... 2^hi` keep >= 99 %
            of the half-precision gradient values representable and none
            overflowing; None when none does, or for bfloat16.
        gradients: The pooled half-precision gradients (`TensorReport`).
        recommended_policy: `"mixed_float16"` or `"mixed_bfloat16"`.
        pin: Paths of the layers to pin to float32.
        verdicts: Model-level verdicts, one sentence each.
        notes: What the diagnosis could not see, and other remarks.
        environment: Versions and hardware it ran on
            (`kmp.backend.environment()`).
    """

    model: str
    policy: str
    loss_scale: float
    backend: str
    batches: int
    examples: int
    layers: list
    scale_range: tuple | None
    gradients: TensorReport | None
    recommended_policy: str
    pin: list
    verdicts: list
    notes: list
    environment: dict = dataclasses.field(default_factory=dict)

    @property
    def format(self):
        """The half-precision `kmp.numerics.Format` tested."""
        return FORMATS[keras.DTypePolicy(self.policy).compute_dtype]

    def pin_call(self) -> str:
        """A `kmp.pin_float32` call that pins what the doctor found."""
        if not self.pin:
            return "kmp.pin_float32(model)"
        listed = ", ".join(f'r"{_escape(path)}"' for path in self.pin)
        return f"kmp.pin_float32(model, also=[{listed}])"

    def summary(self) -> str:
        """One paragraph: the recommended policy, scale range and pins."""
        lines = [f"recommended policy: {self.recommended_policy}"]
        if self.recommended_policy == "mixed_float16":
            if self.scale_range is None:
                lines.append("loss scale: no gradients measured")
            else:
                lo, hi = self.scale_range
                lines.append(
                    f"loss scale: 2^{lo} .. 2^{hi} (tested "
                    f"{_power(self.loss_scale)}: {self._scale_state()})"
                )
        names = ", ".join(self.pin) if self.pin else "none beyond the default"
        lines.append(f"pin to float32: {names}")
        lines.append(f"    {self.pin_call()}")
        return "\n".join(lines)

    def _scale_state(self):
        if self.scale_range is None:
            return "no scale fits"
        lo, hi = self.scale_range
        if self.loss_scale < 2.0**lo:
            return "too low"
        if self.loss_scale > 2.0**hi:
            return "too high"
        return "ok"

    def to_json(self) -> str:
        """The whole report as JSON (histograms included)."""

        def clean(value):
            if isinstance(value, float) and not math.isfinite(value):
                return str(value)  # JSON has no inf/NaN
            if isinstance(value, dict):
                return {k: clean(v) for k, v in value.items()}
            if isinstance(value, (list, tuple)):
                return [clean(v) for v in value]
            return value

        return json.dumps(clean(dataclasses.asdict(self)), indent=2)

    def show(self) -> None:
        """Prints the per-layer tables, the verdicts and the summary."""
        from kmp import doctor_view

        doctor_view.show(self)

    def plot(self, path: str, worst: int = 3) -> str:
        """Writes a PNG of gradient magnitudes against the format's range.

        Log2 histograms of the activation gradients and the weight
        gradients (all half-precision layers, and the `worst` layers with
        the most values lost at the loss scale), with the format's lost,
        subnormal, normal and overflow bands shaded and the loss scale's
        shift drawn: the picture of Micikevicius et al. (2018), Fig. 3,
        for this model. Returns `path`.
        """
        from kmp import doctor_view

        return doctor_view.plot(self, path, worst)


def _escape(path):
    # pin_float32 matches regular expressions; paths hold "/" and "_".
    return "".join("\\" + c if c in ".^$*+?{}[]()|\\" else c for c in path)


def _power(scale):
    exponent = math.log2(scale)
    return f"2^{exponent:g}" if exponent == round(exponent) else f"{scale:g}"


def _pin_reasons(report, fmt, previous_errors, nonfinite_before):
    reasons = []
    act = report.activations
    if act is None:
        return reasons
    if act.overflow > 0:
        reasons.append(
            f"{_share(act.overflow)} of its outputs exceed {fmt.max:g} "
            f"(max |x| {act.max_abs:.3g}): inf in {fmt.name}"
        )
    elif act.measured_nonfinite > 0 and not nonfinite_before:
        reasons.append(
            f"its {fmt.name} outputs hold inf/NaN while the float32 ones "
            f"are finite (max |x| {act.max_abs:.3g}): a value overflows "
            f"inside it, or where its inputs are cast to {fmt.name}"
        )
    error = act.relative_error
    if error is not None and math.isfinite(error):
        baseline = max([fmt.epsilon, *previous_errors[-_PRECEDING:]])
        if error > max(10 * baseline, 20 * fmt.epsilon):
            reasons.append(
                f"relative error {error:.1e} vs float32, "
                f"{error / baseline:.0f}x the layers before it "
                f"({baseline:.1e})"
            )
    return reasons


def build_diagnosis(
    model,
    layers,
    order,
    counters,
    dtypes,
    policy,
    scale,
    batches,
    examples,
    float32_inside,
    notes,
) -> Diagnosis:
    """Turns `kmp.doctor`'s counters into a `Diagnosis` with verdicts."""
    fmt = FORMATS[keras.DTypePolicy(policy).compute_dtype]
    rows, previous_errors, nonfinite_before = [], [], False
    pooled = RangeCounter(fmt, scale)
    names = [
        (layer.path or layer.name, type(layer).__name__) for layer in layers
    ] + [("(model weights)", type(model).__name__)]
    # Call order first (the baseline of each layer is the ones run before
    # it), then layers that were never tapped, e.g. weights-only rows.
    order = list(dict.fromkeys([*order, *range(len(names))]))
    for index in order:
        path, class_name = names[index]
        reports = {
            kind: TensorReport.from_counter(counters[kind][index])
            for kind in counters
        }
        if not any(reports.values()):
            continue  # not called, no weights
        dtype = dtypes.get(index)
        row = LayerReport(path, class_name, dtype, **reports)
        if dtype in _HALF:
            row.reasons = _pin_reasons(
                row, fmt, previous_errors, nonfinite_before
            )
            row.verdict = "pin to float32" if row.reasons else "ok"
            pooled.merge(counters["activation_gradients"][index])
            if index < len(layers) and not float32_inside[index]:
                pooled.merge(counters["weight_gradients"][index])
        elif dtype is not None:
            row.verdict = "float32"
        act = row.activations
        if act is not None:
            if act.relative_error is not None:
                previous_errors.append(act.relative_error)
            nonfinite_before = nonfinite_before or act.measured_nonfinite > 0
            if dtype in _HALF and act.lost > 0.01:
                row.reasons.append(
                    f"note: {_share(act.lost)} of its nonzero outputs are "
                    f"below {fmt.min_subnormal:g} and become 0 in {fmt.name}"
                )
        rows.append(row)

    gradients = TensorReport.from_counter(pooled)
    verdicts, recommended, found_range = [], policy, None
    if fmt.name == "float16" and not pooled.nonzero:
        verdicts.append(
            "no nonzero half-precision gradients were measured: the loss "
            "scale cannot be judged (are the weights feeding the loss "
            "zero, or the half-precision layers frozen?)"
        )
    elif fmt.name == "float16":
        found_range = scale_range(pooled)
        verdicts.append(_scale_verdict(found_range, pooled, scale, fmt))
        if found_range is None:
            recommended = "mixed_bfloat16"
    elif fmt.name == "bfloat16":
        verdicts.append(
            "bfloat16 has float32's range: no loss scale is needed"
            + (f" (tested at {scale:g})" if scale != 1 else "")
        )
    pin = [row.path for row in rows if row.verdict == "pin to float32"]
    for row in rows:
        if row.verdict == "pin to float32":
            verdicts.append(f"pin {row.path}: " + "; ".join(row.reasons))
    return Diagnosis(
        model=model.name,
        policy=policy,
        loss_scale=scale,
        backend=keras.backend.backend(),
        batches=batches,
        examples=examples,
        layers=rows,
        scale_range=found_range,
        gradients=gradients,
        recommended_policy=recommended,
        pin=pin,
        verdicts=verdicts,
        notes=notes,
        environment=backend.environment(),
    )


def _share(fraction):
    """A fraction as a percentage that keeps small ones visible."""
    if fraction == 0:
        return "0%"
    return f"{100 * fraction:.3g}%"


def _scale_verdict(found_range, pooled, scale, fmt):
    lost = pooled.fraction(pooled.lost_scaled)
    overflow = pooled.fraction(pooled.overflow_scaled)
    if found_range is None:
        top = math.log2(pooled.max_abs)
        return (
            "prefer mixed_bfloat16: no float16 loss scale keeps 99% of the "
            "gradient values representable without overflow (they span "
            f"2^{_bottom_percentile(pooled)} .. 2^{top:.0f}, float16 keeps "
            "2^-24 .. 2^16)"
        )
    lo, hi = found_range
    advice = f"use a scale in 2^{lo} .. 2^{hi}"
    if scale < 2.0**lo:
        return (
            f"loss scale too low: at {_power(scale)}, {_share(lost)} of the "
            f"gradient values fall below {fmt.min_subnormal:g} and become "
            f"0; {advice}"
        )
    if scale > 2.0**hi:
        halvings = math.ceil(math.log2(scale) - hi)
        return (
            f"loss scale too high: at {_power(scale)}, {_share(overflow)} "
            f"of the gradient values overflow (max |g| "
            f"{pooled.max_abs:.3g}) and a step with any overflow is "
            f"skipped; {advice} (a dynamic scale gets there by halving: "
            f"{halvings} skipped step(s))"
        )
    return (
        f"loss scale ok: at {_power(scale)}, {_share(lost)} of the gradient "
        f"values are lost and none overflow ({advice})"
    )


def _bottom_percentile(counter, fraction=0.01):
    """The binade below which `fraction` of the nonzero values lie."""
    cumulative = np.cumsum(counter.histogram)
    index = int(np.searchsorted(cumulative, fraction * counter.nonzero))
    return index + LOG2_MIN
