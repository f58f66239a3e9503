"""Run reports: table cells, Markdown, step timing, memory, the PNG."""

import math
import threading

import keras
import numpy as np
import pytest

import kmp
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
    assert report._median_after([9.0, 8.0, 1.0, 3.0, 2.0], 2) == 2.0
    assert report._median_after([9.0, 8.0, 1.0, 3.0], 2) == 2.0
    assert math.isnan(report._median_after([], 2))


@pytest.mark.backend_independent
def test_step_log_times_steps_by_arrival_in_step_order(monkeypatch):
    # Batch ends may come from Keras's threads out of order: a step's
    # time is from the arrival of the step before it (the epoch's start
    # for its first step), its loss in its place.
    clock = iter([10.0, 13.0, 11.5, 20.0, 21.0, 22.5])
    monkeypatch.setattr(report.time, "perf_counter", lambda: next(clock))
    log = report.StepLog()
    log.on_train_begin()
    log.on_epoch_begin(0)  # 10.0
    log.on_train_batch_end(1, {"loss": 0.5})  # 13.0
    log.on_train_batch_end(0, {"loss": 0.7})  # 11.5
    log.on_epoch_begin(1)  # 20.0
    log.on_train_batch_end(0, {"loss": 0.4})  # 21.0
    log.on_train_batch_end(1, {})  # 22.5, no loss logged
    assert log.times == [1.5, 1.5, 1.0, 1.5]
    assert log.losses == [0.7, 0.5, 0.4]
    assert log.median_step_time(skip=0) == 1.5


@pytest.mark.backend_independent
def test_step_log_steady_time_is_first_to_last_arrival_of_each_epoch(
    monkeypatch,
):
    # Epoch 0: starts at 0, steps end at 5, 6, 8 (out of order) -> its
    # steady part is (8 - 5) / 2. Epoch 1: starts at 10, steps end at
    # 17 and 18 -> 1. The epochs' starts (5 s and 7 s before their first
    # steps ended) are left out; the mean is over the 3 intervals.
    clock = iter([0.0, 5.0, 8.0, 6.0, 10.0, 17.0, 18.0, 20.0, 21.0])
    monkeypatch.setattr(report.time, "perf_counter", lambda: next(clock))
    log = report.StepLog()
    log.on_train_begin()
    log.on_epoch_begin(0)
    log.on_train_batch_end(0, {"loss": 1.0})
    log.on_train_batch_end(2, {"loss": 1.0})
    log.on_train_batch_end(1, {"loss": 1.0})
    log.on_epoch_begin(1)
    log.on_train_batch_end(0, {"loss": 1.0})
    log.on_train_batch_end(1, {"loss": 1.0})
    assert log.times == [5.0, 1.0, 2.0, 7.0, 1.0]
    assert log.steady_step_time() == pytest.approx((1.0 + 2.0 + 1.0) / 3)
    one_step = report.StepLog()
    one_step.on_train_begin()
    one_step.on_epoch_begin(0)
    one_step.on_train_batch_end(0, {"loss": 1.0})
    assert math.isnan(one_step.steady_step_time())


def test_fit_hands_the_run_s_batch_ends_to_keras_threads():
    # With StepLog, kmp's ProgressBar and monitor every callback is
    # async-safe: on JAX and torch Keras runs batch ends off the main
    # thread and dispatches the next step without waiting for the logs;
    # TensorFlow's Keras never does (not thread-safe there).
    class Where(keras.callbacks.Callback):
        async_safe = True

        def on_train_begin(self, logs=None):
            self.main = set()

        def on_train_batch_end(self, batch, logs=None):
            self.main.add(threading.current_thread() is threading.main_thread())

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    where, log = Where(), report.StepLog()
    x = np.ones((32, 4), "float32")
    model.fit(
        x,
        x[:, :1],
        batch_size=4,
        epochs=2,
        verbose=1,
        callbacks=[
            where,
            log,
            kmp.callbacks.ProgressBar(),
            kmp.callbacks.LossScaleMonitor(),
        ],
    )
    assert where.main == {keras.backend.backend() == "tensorflow"}
    assert len(log.times) == len(log.losses) == 16


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
