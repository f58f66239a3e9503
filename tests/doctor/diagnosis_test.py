"""The doctor's report, `kmp.Diagnosis`: summary, the pin call, JSON
(hand-made counts; the tables and PNG are in view_test.py)."""

import json

import numpy as np
import pytest
from handmade import diagnose_rows
from handmade import noisy

pytestmark = pytest.mark.backend_independent


def test_summary_pin_call_and_json():
    ref = np.linspace(1, 2, 64)
    report = diagnose_rows(
        [
            ("block/a.b", "float16", *noisy(ref, 1e-3)),
            ("block/c_1", "float16", *noisy(ref, 0.5)),
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
    escaped = diagnose_rows([("a.b", "float16", np.full(4, 1e5), np.ones(4))])
    assert escaped.pin_call() == r'kmp.pin_float32(model, also=[r"a\.b"])'
