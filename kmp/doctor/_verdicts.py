"""Stage 4 of the doctor: judging the counts.

The verdicts, from the counts of `kmp.doctor.numerics.RangeCounter`
(`fmt` is the half format under test, `eps` its unit roundoff):

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
         and none above fmt.max (kmp.doctor.numerics.scale_range),
         within the scaler's [min_scale, max_scale]
if float16 and no such scale:  prefer mixed_bfloat16
elif scale < 2**lo:            loss scale too low
elif scale > 2**hi:            loss scale too high
```

`judge` applies them and returns the `kmp.Diagnosis`.
"""

import math

import keras
import numpy as np

from kmp import backend
from kmp import policy as policy_lib
from kmp.doctor import _float8
from kmp.doctor.diagnosis import Diagnosis
from kmp.doctor.diagnosis import LayerReport
from kmp.doctor.diagnosis import TensorReport
from kmp.doctor.numerics import FORMATS
from kmp.doctor.numerics import LOG2_MIN
from kmp.doctor.numerics import RangeCounter
from kmp.doctor.numerics import as_power_of_two
from kmp.doctor.numerics import scale_range
from kmp_config.names import HALF_DTYPES

_PRECEDING = 3  # layers whose error sets the baseline of the next
# Keras computes these in float32 under a mixed policy (their outputs are
# cast back), so their weight gradients are float32 ones.
_FLOAT32_INSIDE = (
    keras.layers.BatchNormalization,
    keras.layers.LayerNormalization,
    keras.layers.GroupNormalization,
)


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


def judge(
    model,
    layers,
    counts,
    policy,
    scale,
    batches,
    examples,
    notes,
    scale_bounds,
    float8=(),
) -> Diagnosis:
    """Applies the verdicts to the counts; returns the `Diagnosis`.

    Args:
        model: The model diagnosed.
        layers: The observed layers.
        counts: Their `LayerCounts` (`counters`, and `dtypes` in call
            order).
        policy: The mixed policy tested.
        scale: The loss scale tested.
        batches, examples: How much data was run.
        notes: What the diagnosis could not see, and other remarks.
        scale_bounds: `(min_scale, max_scale)` of the model's scaler: the
            scales a recommendation may name.
        float8: The float8 layers' rows (`kmp.doctor._float8.measure`).
    """
    fmt = FORMATS[keras.DTypePolicy(policy).compute_dtype]
    rows, pooled = _layer_rows(model, layers, counts, fmt, scale)
    verdicts, recommended, found_range = _scale_verdicts(
        pooled, policy, scale, fmt, scale_bounds
    )
    machine = policy_lib.recommend_policy()
    pin = [row.path for row in rows if row.verdict == "pin to float32"]
    for row in rows:
        if row.verdict == "pin to float32":
            verdicts.append(f"pin {row.path}: " + "; ".join(row.reasons))
    verdicts += _float8.verdicts(float8)
    return Diagnosis(
        model=model.name,
        policy=policy,
        loss_scale=scale,
        backend=keras.backend.backend(),
        batches=batches,
        examples=examples,
        layers=rows,
        scale_range=found_range,
        gradients=TensorReport.from_counter(pooled),
        recommended_policy=recommended,
        pin=pin,
        verdicts=verdicts,
        notes=notes,
        environment=backend.environment(),
        machine_policy=machine.policy,
        machine_reason=machine.reason,
        float8=list(float8),
    )


def _layer_rows(model, layers, counts, fmt, scale):
    """One `LayerReport` per layer with something measured, with its
    verdict; and the pooled half-precision gradients."""
    counters = counts.counters
    rows, previous_errors, nonfinite_before = [], [], False
    pooled = RangeCounter(fmt, scale)
    names = [
        (layer.path or layer.name, type(layer).__name__) for layer in layers
    ] + [("(model weights)", type(model).__name__)]
    # Call order first (the baseline of each layer is the ones run before
    # it), then layers that were never tapped, e.g. weights-only rows.
    order = list(dict.fromkeys([*counts.dtypes, *range(len(names))]))
    for index in order:
        path, class_name = names[index]
        reports = {
            kind: TensorReport.from_counter(counters[kind][index])
            for kind in counters
        }
        if not any(reports.values()):
            continue  # not called, no weights
        dtype = counts.dtypes.get(index)
        row = LayerReport(path, class_name, dtype, **reports)
        if dtype in HALF_DTYPES:
            row.reasons = _pin_reasons(
                row, fmt, previous_errors, nonfinite_before
            )
            row.verdict = "pin to float32" if row.reasons else "ok"
            pooled.merge(counters["activation_gradients"][index])
            if index < len(layers) and not isinstance(
                layers[index], _FLOAT32_INSIDE
            ):
                pooled.merge(counters["weight_gradients"][index])
        elif dtype is not None:
            row.verdict = "float32"
        act = row.activations
        if act is not None:
            if act.relative_error is not None:
                previous_errors.append(act.relative_error)
            nonfinite_before = nonfinite_before or act.measured_nonfinite > 0
            if dtype in HALF_DTYPES and act.lost > 0.01:
                row.reasons.append(
                    f"note: {_share(act.lost)} of its nonzero outputs are "
                    f"below {fmt.min_subnormal:g} and become 0 in {fmt.name}"
                )
        rows.append(row)
    return rows, pooled


def _scale_verdicts(pooled, policy, scale, fmt, bounds):
    """`(verdicts, recommended policy, scale range)` from the pooled
    half-precision gradients and the scaler's `(min_scale, max_scale)`."""
    if fmt.name == "bfloat16":
        return (
            [
                "bfloat16 has float32's range: no loss scale is needed"
                + (f" (tested at {scale:g})" if scale != 1 else "")
            ],
            policy,
            None,
        )
    if not pooled.nonzero:
        return (
            [
                "no nonzero half-precision gradients were measured: the "
                "loss scale cannot be judged (are the weights feeding the "
                "loss zero, or the half-precision layers frozen?)"
            ],
            policy,
            None,
        )
    found_range = scale_range(pooled)
    if found_range is not None:
        # Only scales the scaler can reach are advice.
        floor, cap = (
            math.ceil(math.log2(bounds[0])),
            math.floor(math.log2(bounds[1])),
        )
        lo, hi = max(found_range[0], floor), min(found_range[1], cap)
        if lo > hi:
            return (
                [
                    "prefer mixed_bfloat16: the loss scales that keep 99% "
                    "of the gradient values representable, "
                    f"2^{found_range[0]} .. 2^{found_range[1]}, are outside "
                    f"the scaler's range 2^{floor} .. 2^{cap} (min_scale "
                    "and max_scale)"
                ],
                "mixed_bfloat16",
                None,
            )
        found_range = (lo, hi)
    recommended = "mixed_bfloat16" if found_range is None else policy
    return (
        [_scale_verdict(found_range, pooled, scale, fmt)],
        recommended,
        found_range,
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
    at = as_power_of_two(scale)
    if scale < 2.0**lo:
        return (
            f"loss scale too low: at {at}, {_share(lost)} of the "
            f"gradient values fall below {fmt.min_subnormal:g} and become "
            f"0; {advice}"
        )
    if scale > 2.0**hi and not pooled.overflow_scaled:
        return (
            f"loss scale too high: at {at}, above the scaler's max_scale; "
            f"{advice}"
        )
    if scale > 2.0**hi:
        halvings = math.ceil(math.log2(scale) - hi)
        return (
            f"loss scale too high: at {at}, {_share(overflow)} "
            f"of the gradient values overflow (max |g| "
            f"{pooled.max_abs:.3g}) and a step with any overflow is "
            f"skipped; {advice} (a dynamic scale gets there by halving: "
            f"{halvings} skipped step(s))"
        )
    return (
        f"loss scale ok: at {at}, {_share(lost)} of the gradient "
        f"values are lost and none overflow ({advice})"
    )


def _bottom_percentile(counter, fraction=0.01):
    """The binade below which `fraction` of the nonzero values lie."""
    cumulative = np.cumsum(counter.histogram)
    index = int(np.searchsorted(cumulative, fraction * counter.nonzero))
    return index + LOG2_MIN
