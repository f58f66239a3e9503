"""The doctor's verdict rules, on hand-made counts (no model run)."""

import json
import math
import types

import numpy as np
import pytest

from kmp.diagnosis import build_diagnosis
from kmp.numerics import FORMATS
from kmp.numerics import RangeCounter

F16 = FORMATS["float16"]
KINDS = ("activations", "activation_gradients", "weight_gradients")


def _layer(path):
    return types.SimpleNamespace(path=path, name=path)


def _diagnose(rows, scale=2.0**15, policy="mixed_float16", grads=None):
    """rows: (path, dtype, reference activations, mixed activations)."""
    fmt = FORMATS["float16" if policy == "mixed_float16" else "bfloat16"]
    layers = [_layer(path) for path, *_ in rows]
    counters = {
        kind: [
            RangeCounter(fmt, 1.0 if kind == "activations" else scale)
            for _ in range(len(rows) + 1)
        ]
        for kind in KINDS
    }
    for i, (_, _, reference, mixed) in enumerate(rows):
        counters["activations"][i].add(reference, mixed)
        g = np.full(4, 2.0**-10) if grads is None else grads
        counters["activation_gradients"][i].add(g, g * scale)
    return build_diagnosis(
        model=types.SimpleNamespace(name="m"),
        layers=layers,
        order=list(range(len(rows))),
        counters=counters,
        dtypes={i: dtype for i, (_, dtype, *_) in enumerate(rows)},
        policy=policy,
        scale=scale,
        batches=1,
        examples=4,
        float32_inside=[False] * len(rows),
        notes=[],
    )


def _noisy(values, error):
    values = np.asarray(values, np.float32)
    return values, values * (1 + error)


def test_error_jump_is_pinned_and_inherited_error_is_not():
    ref = np.linspace(1, 2, 64)
    report = _diagnose(
        [
            ("a", "float16", *_noisy(ref, 1e-3)),
            ("b", "float16", *_noisy(ref, 2e-3)),
            ("jump", "float16", *_noisy(ref, 0.1)),  # 50x the layers before
            ("after", "float16", *_noisy(ref, 0.11)),  # inherits it
        ]
    )
    verdicts = {row.path: row.verdict for row in report.layers}
    assert verdicts == {
        "a": "ok",
        "b": "ok",
        "jump": "pin to float32",
        "after": "ok",
    }
    (reason,) = report.layers[2].reasons
    assert reason.startswith("relative error 1.0e-01 vs float32, 50x")
    assert report.pin == ["jump"]


def test_small_absolute_error_is_never_a_jump():
    ref = np.linspace(1, 2, 64)
    # 10x the first layer, but 2e-3 < 20 eps (9.8e-3): float16 rounding.
    report = _diagnose(
        [
            ("a", "float16", *_noisy(ref, 1e-4)),
            ("b", "float16", *_noisy(ref, 2e-3)),
        ]
    )
    assert report.pin == []


def test_overflow_and_first_inf_are_pinned_float32_layers_are_not():
    finite = np.ones(8, np.float32)
    inf = np.full(8, np.inf, np.float32)
    report = _diagnose(
        [
            ("pinned", "float32", finite * 1e5, finite * 1e5),
            ("inner", "float16", finite, inf),  # finite in float32, inf here
            ("downstream", "float16", finite, inf),
        ]
    )
    rows = {row.path: row for row in report.layers}
    assert rows["pinned"].verdict == "float32"
    assert rows["inner"].verdict == "pin to float32"
    assert "a value overflows inside it" in rows["inner"].reasons[0]
    assert rows["downstream"].verdict == "ok"
    assert rows["inner"].activations.relative_error == math.inf


@pytest.mark.parametrize(
    "scale, start",
    [
        (1.0, "loss scale too low: at 2^0, 100% of the gradient values"),
        (2.0**10, "loss scale ok: at 2^10"),
        (2.0**50, "loss scale too high: at 2^50, 100% of the gradient"),
    ],
)
def test_scale_verdicts(scale, start):
    ref = np.ones(8, np.float32)
    grads = np.full(4, 2.0**-30)  # fits 2^6 .. 2^45
    report = _diagnose([("a", "float16", ref, ref)], scale=scale, grads=grads)
    assert report.scale_range == (6, 45)
    assert report.verdicts[0].startswith(start), report.verdicts[0]
    assert report.recommended_policy == "mixed_float16"


def test_too_wide_a_span_recommends_bfloat16():
    ref = np.ones(8, np.float32)
    grads = np.array([2.0**-50, 2.0**-50, 2.0**10, 2.0**10])
    report = _diagnose([("a", "float16", ref, ref)], grads=grads)
    assert report.scale_range is None
    assert report.recommended_policy == "mixed_bfloat16"
    assert report.verdicts[0].startswith("prefer mixed_bfloat16")
    assert "recommended policy: mixed_bfloat16" in report.summary()


def test_summary_pin_call_and_json():
    ref = np.linspace(1, 2, 64)
    report = _diagnose(
        [
            ("block/a.b", "float16", *_noisy(ref, 1e-3)),
            ("block/c_1", "float16", *_noisy(ref, 0.5)),
            ("x", "float16", np.full(4, 1e5), np.full(4, np.inf)),
        ]
    )
    assert report.pin == ["block/c_1", "x"]
    call = report.pin_call()
    assert call == r'kmp.pin_float32(model, also=[r"block/c_1", r"x"])'
    assert call in report.summary()
    assert "loss scale: 2^" in report.summary()
    loaded = json.loads(report.to_json())
    assert loaded["layers"][2]["activations"]["relative_error"] == "inf"
    assert loaded["layers"][0]["activations"]["histogram"]["start"] == 0
    escaped = _diagnose([("a.b", "float16", np.full(4, 1e5), np.ones(4))])
    assert escaped.pin_call() == r'kmp.pin_float32(model, also=[r"a\.b"])'


def test_bfloat16_needs_no_scale():
    ref = np.ones(8, np.float32)
    report = _diagnose(
        [("a", "bfloat16", ref, ref)], scale=1.0, policy="mixed_bfloat16"
    )
    assert report.scale_range is None
    assert report.verdicts == [
        "bfloat16 has float32's range: no loss scale is needed"
    ]
    assert "loss scale" not in report.summary().splitlines()[1]
