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


def test_the_summary_says_when_this_machine_would_pick_another_policy(
    monkeypatch,
):
    from kmp import policy as policy_lib
    from kmp.backend import Device

    monkeypatch.setattr(policy_lib, "_logged_reasons", set())
    ref = np.linspace(1, 2, 64)
    rows = [("a", "float16", *noisy(ref, 1e-3))]
    monkeypatch.setattr(
        "kmp.backend.list_devices", lambda: [Device("cpu", "x")]
    )
    on_cpu = diagnose_rows(rows)
    assert (on_cpu.recommended_policy, on_cpu.machine_policy) == (
        "mixed_float16",
        "float32",
    )
    last = on_cpu.summary().splitlines()[-1]
    assert last.startswith("on this machine, kmp.enable('auto') picks float32")
    assert "No GPU or TPU found" in last
    monkeypatch.setattr(
        "kmp.backend.list_devices", lambda: [Device("gpu", "T4", (7, 5))]
    )
    on_t4 = diagnose_rows(rows)
    assert on_t4.machine_policy == "mixed_float16"
    assert "on this machine" not in on_t4.summary()
