"""`kmp demo` (`kmp.app.demo`)."""

import pytest

import kmp_cli
from kmp.app import demo

pytestmark = pytest.mark.backend_independent


def test_demo_fit_prints_policy_scale_and_skipped_steps(capsys):
    kmp_cli.main(
        ["demo", "--epochs", "1", "--steps", "4", "--batch_size", "16"]
    )
    out = capsys.readouterr().out
    assert "policy          mixed_float16" in out
    assert "loss scale      32768" in out
    assert "skipped steps   0" in out


def test_demo_learns_and_restores_the_policy():
    import keras

    before = keras.config.dtype_policy().name
    result = demo.run(
        "mixed_float16", epochs=3, steps_per_epoch=16, batch_size=32, verbose=0
    )
    assert keras.config.dtype_policy().name == before
    assert result["accuracy"] > 0.6  # 4 classes: chance is 0.25
    assert result["history"]["loss"][-1] < result["history"]["loss"][0]
    assert result["optimizer"] == "LossScaleOptimizer"


def test_demo_under_float32_needs_no_scaler():
    result = demo.run("float32", epochs=1, steps_per_epoch=2, verbose=0)
    assert result["loss_scale"] is None and result["optimizer"] == "Adam"
