"""`kmp.audit`'s report (`kmp.auditing.audit`): findings sorted by
severity, JSON, the printed table, bad input. The checks have files of
their own: model_checks_test.py, optimizer_checks_test.py,
environment_checks_test.py, float8_checks_test.py."""

import json

import keras
import numpy as np
import pytest

import kmp


def _compiled_mlp():
    with kmp.policy_scope("mixed_float16"):
        model = keras.Sequential(
            [
                keras.Input((16,)),
                keras.layers.Dense(16, activation="relu"),
                keras.layers.Dense(8),
                keras.layers.Activation("softmax"),
            ]
        )
    model.compile(
        optimizer=kmp.wrap("adam"),
        loss="categorical_crossentropy",
        jit_compile=True,
        auto_scale_loss=False,
    )
    return model


def test_report_is_json_serialisable_and_printable(capsys):
    kmp.enable("mixed_float16")
    report = kmp.audit(_compiled_mlp())
    printed = capsys.readouterr().out
    assert "severity" in printed and "fix:" in printed
    decoded = json.loads(report.to_json())
    assert decoded and set(decoded[0]) == {
        "severity",
        "where",
        "problem",
        "fix",
    }
    order = [f.severity for f in report]
    assert order == sorted(order, key=("error", "warning", "info").index)


def test_audit_rejects_non_models():
    with pytest.raises(ValueError, match="expects a Keras model"):
        kmp.audit(np.zeros(3))
