"""The doctor's verdict rules (`kmp.doctor._verdicts`), on hand-made counts
(no model run)."""

import math

import numpy as np
import pytest
from handmade import diagnose_rows
from handmade import noisy

pytestmark = pytest.mark.backend_independent


def test_error_jump_is_pinned_and_inherited_error_is_not():
    ref = np.linspace(1, 2, 64)
    report = diagnose_rows(
        [
            ("a", "float16", *noisy(ref, 1e-3)),
            ("b", "float16", *noisy(ref, 2e-3)),
            ("jump", "float16", *noisy(ref, 0.1)),  # 50x the layers before
            ("after", "float16", *noisy(ref, 0.11)),  # inherits it
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
    report = diagnose_rows(
        [
            ("a", "float16", *noisy(ref, 1e-4)),
            ("b", "float16", *noisy(ref, 2e-3)),
        ]
    )
    assert report.pin == []


def test_overflow_and_first_inf_are_pinned_float32_layers_are_not():
    finite = np.ones(8, np.float32)
    inf = np.full(8, np.inf, np.float32)
    report = diagnose_rows(
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
    report = diagnose_rows(
        [("a", "float16", ref, ref)], scale=scale, grads=grads
    )
    # ... and the scaler reaches 2^0 .. 2^24 (kmp's defaults).
    assert report.scale_range == (6, 24)
    assert report.verdicts[0].startswith(start), report.verdicts[0]
    assert report.recommended_policy == "mixed_float16"


def test_too_wide_a_span_recommends_bfloat16():
    ref = np.ones(8, np.float32)
    grads = np.array([2.0**-50, 2.0**-50, 2.0**10, 2.0**10])
    report = diagnose_rows([("a", "float16", ref, ref)], grads=grads)
    assert report.scale_range is None
    assert report.recommended_policy == "mixed_bfloat16"
    assert report.verdicts[0].startswith("prefer mixed_bfloat16")
    assert "recommended policy: mixed_bfloat16" in report.summary()


def test_bfloat16_needs_no_scale():
    ref = np.ones(8, np.float32)
    report = diagnose_rows(
        [("a", "bfloat16", ref, ref)], scale=1.0, policy="mixed_bfloat16"
    )
    assert report.scale_range is None
    assert report.verdicts == [
        "bfloat16 has float32's range: no loss scale is needed"
    ]
    assert "loss scale" not in report.summary().splitlines()[1]


def test_the_range_is_what_the_scaler_can_reach():
    ref = np.ones(8, np.float32)
    large = np.full(4, 2.0**-8)  # fits 2^-16 .. 2^23: below the floor too
    report = diagnose_rows([("a", "float16", ref, ref)], grads=large)
    assert report.scale_range == (0, 23)
    narrow = diagnose_rows(
        [("a", "float16", ref, ref)], grads=large, bounds=(4.0, 2.0**10)
    )
    assert narrow.scale_range == (2, 10)
    assert narrow.verdicts[0] == (
        "loss scale too high: at 2^15, above the scaler's max_scale; use a "
        "scale in 2^2 .. 2^10"
    )


def test_a_range_the_scaler_cannot_reach_recommends_bfloat16():
    ref = np.ones(8, np.float32)
    tiny = np.full(4, 2.0**-60)  # needs 2^36 at least; the cap is 2^24
    report = diagnose_rows([("a", "float16", ref, ref)], grads=tiny)
    assert report.scale_range is None
    assert report.recommended_policy == "mixed_bfloat16"
    assert "outside the scaler's range 2^0 .. 2^24" in report.verdicts[0]
