"""Run reports: table cells, Markdown, step timing, memory, the PNG."""

import math

import pytest

from kmp.app import report

RUN = {
    "policy": "mixed_float16",
    "data": "synthetic",
    "epochs": 2,
    "examples_per_s": 1234.4,
    "step_time_s": 0.0256,
    "peak_memory_mib": 100.2,
    "final_loss": 0.123456,
    "accuracy": 0.5,
    "loss_scale": 32768.0,
    "skipped_steps": 3.0,
    "config": {"master_weights": "bfloat16", "optimizer_states": "float32"},
}


@pytest.mark.backend_independent
def test_markdown_formats_every_column():
    table = report.markdown([RUN])
    header, rule, row = table.splitlines()
    assert header == (
        "| policy | master weights | optimizer state | data | epochs | "
        "examples/s | step time (ms) | peak memory (MiB) | "
        "training loss (last epoch) | test accuracy | loss scale | "
        "skipped steps |"
    )
    assert rule == "|" + "---|" * 12
    assert row == (
        "| mixed_float16 | bfloat16 | float32 | synthetic | 2 | 1234 | 25.6 "
        "| 100 | 0.1235 | 0.5000 | 32768 | 3 |"
    )


@pytest.mark.backend_independent
def test_missing_and_nan_values_show_as_a_dash():
    run = dict(RUN, loss_scale=None, accuracy=math.nan)
    del run["peak_memory_mib"], run["config"]
    _, (row,) = report.rows([run])
    assert row[1] == row[2] == row[7] == row[9] == row[10] == "-"


@pytest.mark.backend_independent
def test_show_prints_one_run_and_several(capsys):
    report.show([RUN], "one run", note="memory: test")
    out = capsys.readouterr().out
    assert "one run" in out and "examples/s" in out and "32768" in out
    report.show([RUN, dict(RUN, policy="float32")], "two runs")
    out = capsys.readouterr().out
    assert "float32" in out and "mixed_float16" in out


@pytest.mark.backend_independent
def test_step_log_median_skips_compiling_steps():
    log = report.StepLog()
    log.times = [9.0, 8.0, 1.0, 3.0, 2.0]
    assert log.median_step_time() == 2.0
    log.times = [9.0, 8.0, 1.0, 3.0]
    assert log.median_step_time() == 2.0
    log.times = []
    assert math.isnan(log.median_step_time())


def test_peak_memory_is_measured_and_says_what():
    mib, what = report.peak_memory_mib()
    assert mib > 10
    assert "peak" in what


@pytest.mark.backend_independent
def test_plot_writes_a_png(tmp_path):
    run = dict(
        RUN, step_losses=[2.0, 1.5, 1.0, 0.8], history={"val_loss": [1.2, 0.9]}
    )
    path = report.plot(run, str(tmp_path / "r.png"), [8.0, 8.0, 4.0, 8.0])
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    path = report.plot(dict(run, policy="float32"), str(tmp_path / "f.png"))
    with open(path, "rb") as f:
        assert f.read(4) == b"\x89PNG"


def test_validation_inside_fit_shows_progress(capsys):
    import keras
    import numpy as np

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    x, y = np.zeros((16, 3)), np.zeros((16, 1))
    progress = report.ValidationProgress(steps=2)
    model.fit(
        x,
        y,
        batch_size=8,
        validation_data=(x, y),
        epochs=1,
        verbose=1,
        callbacks=[progress],
    )
    shown = capsys.readouterr().out
    assert "validation" in shown
    assert "2/2" in shown.split("validation", 1)[1]
    model.evaluate(x, y, batch_size=8, verbose=0, callbacks=[progress])
    assert "validation" not in capsys.readouterr().out  # fit's only
