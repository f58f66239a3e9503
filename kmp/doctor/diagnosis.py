"""The doctor's report: `kmp.Diagnosis`.

What `kmp.diagnose` found, as data (`TensorReport` per tensor family,
`LayerReport` per layer, verdicts and the recommended policy), with a
summary, JSON, and the tables and PNG drawn by `kmp.doctor._view`. The
verdicts themselves are made in `kmp.doctor._verdicts`.
"""

import dataclasses
import json
import math

import keras
import numpy as np

from kmp.doctor import _float8
from kmp.doctor import _view
from kmp.doctor.numerics import FORMATS
from kmp.doctor.numerics import LOG2_MIN
from kmp.doctor.numerics import RangeCounter
from kmp.doctor.numerics import as_power_of_two


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
            overflowing, and the scaler can reach them (its `min_scale`
            and `max_scale`); None when none does, or for bfloat16.
        gradients: The pooled half-precision gradients (`TensorReport`).
        recommended_policy: `"mixed_float16"` or `"mixed_bfloat16"`.
        pin: Paths of the layers to pin to float32.
        verdicts: Model-level verdicts, one sentence each.
        notes: What the diagnosis could not see, and other remarks.
        environment: When, and on which versions and hardware, it ran
            (`kmp.backend.environment()`).
        machine_policy, machine_reason: What `kmp.recommend_policy()`
            (`kmp.enable("auto")`) picks on that hardware, and why: speed,
            where `recommended_policy` is about this model's numerics.
        float8: One dict per operand of each `kmp.float8` layer: amax,
            history amax, headroom, saturated and flushed shares
            (`kmp.doctor._float8`).
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
    machine_policy: str = ""
    machine_reason: str = ""
    float8: list = dataclasses.field(default_factory=list)

    @property
    def format(self):
        """The half-precision `kmp.doctor.numerics.Format` tested."""
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
                    f"{as_power_of_two(self.loss_scale)}: "
                    f"{self._scale_state()})"
                )
        names = ", ".join(self.pin) if self.pin else "none beyond the default"
        lines.append(f"pin to float32: {names}")
        lines.append(f"    {self.pin_call()}")
        if self.machine_policy and self.machine_policy != (
            self.recommended_policy
        ):
            lines.append(
                f"on this machine, kmp.enable('auto') picks "
                f"{self.machine_policy} instead, for speed: "
                f"{self.machine_reason}"
            )
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
        title = (
            f"kmp doctor: {self.model} under {self.policy}, loss scale "
            f"{self.loss_scale:g}, {self.batches} batch(es), "
            f"{self.examples} examples ({self.backend})"
        )
        lines = [f"- {verdict}" for verdict in self.verdicts]
        lines += [
            f"- {layer.path}: {reason}"
            for layer in self.layers
            for reason in layer.reasons
            if reason.startswith("note:")
        ]
        lines += [f"- note: {note}" for note in self.notes]
        lines += [f"- {_float8.describe(row)}" for row in self.float8]
        _view.show(
            title,
            self.layers,
            self.format,
            self.loss_scale,
            [*lines, self.summary()],
        )

    def plot(self, path: str, worst: int = 3) -> str:
        """Writes a PNG of gradient magnitudes against the format's range.

        Log2 histograms of the activation gradients and the weight
        gradients (all half-precision layers, and the `worst` layers with
        the most values lost at the loss scale), with the format's lost,
        subnormal, normal and overflow bands shaded and the loss scale's
        shift drawn: the picture of Micikevicius et al. (2018), Fig. 3,
        for this model. Returns `path`.
        """
        note = ""
        if self.scale_range is not None:
            lo, hi = self.scale_range
            note = f"; scales keeping 99% representable: 2^{lo} .. 2^{hi}"
        title = (
            f"{self.model} under {self.policy}: gradient magnitudes vs "
            f"{self.format.name}'s range (loss scale {self.loss_scale:g}"
            f"{note})"
        )
        _view.plot(
            path, title, self.layers, self.format, self.loss_scale, worst
        )
        return path


def _escape(path):
    # pin_float32 matches regular expressions; paths hold "/" and "_".
    return "".join("\\" + c if c in ".^$*+?{}[]()|\\" else c for c in path)
