"""kmp bench: four variants, interleaved, same data and seed."""

import math
import statistics
import time

import pytest
from util import jax_only

from kmp.app import bench

TINY = {
    "cifar10": {"width": 8, "batch_size": 4},
    "imdb": {"d_model": 16, "batch_size": 4, "sequence_length": 8},
}


@pytest.mark.backend_independent("torch")
@pytest.mark.slow
def test_each_variant_is_timed_against_float32():
    # The IMDB model runs in tests/app/commands_test.py's `kmp bench` test;
    # on JAX, the bench runs in backend_test.py's job without TensorFlow.
    model = "cifar10"
    lines = []
    results = bench.bench_model(
        model, TINY, steps=1, rounds=2, log=lines.append
    )
    assert [r["variant"] for r in results] == list(bench.VARIANTS)
    by_variant = {r["variant"]: r for r in results}
    assert by_variant["float32"]["speed_vs_float32"] == 1.0
    for r in results:
        assert len(r["epoch_seconds"]) == len(r["steady_step_seconds"]) == 2
        # One step a round has no steady part: the call's time is its step.
        assert r["steady_step_seconds"] == r["epoch_seconds"]
        assert r["step_time_s"] == r["call_step_time_s"]
        assert r["examples_per_s"] == pytest.approx(4 / r["step_time_s"])
        assert r["loss"] > 0 and r["loss_before"] > 0
        assert r["tflops_achieved"] == pytest.approx(
            r["flops_per_example"] * r["examples_per_s"] / 1e12
        )
        assert r["tflops_peak"] is None and r["mfu"] is None  # a CPU
        assert "not per variant" in r["peak_memory_note"]
    # Every variant keeps float32 variables (mixed precision's masters);
    # a scaler adds its few scalars to the optimizer's state.
    weights = {r["state_bytes"]["weights"] for r in results}
    assert len(weights) == 1 and weights.pop() > 0
    state = {r["variant"]: r["state_bytes"]["optimizer_state"] for r in results}
    assert state["bf16"] == state["float32"] < state["fp16+kmp"]
    assert all(r["train_step_memory"] is None for r in results)  # no memory
    # kmp's and Keras's scalers apply the same updates with defaults.
    assert by_variant["fp16+kmp"]["loss"] == by_variant["fp16+stock"]["loss"]
    assert sum(line.startswith("round ") for line in lines) == 2
    # Every variant trained (its loss fell on the batch it repeats), and
    # the policies differ in the last digits: nothing to warn about.
    for r in results:
        assert r["loss"] < r["loss_before"], r["variant"]
        assert r["warning"] == "", r["variant"]


@pytest.mark.backend_independent("torch")
@pytest.mark.slow
def test_a_round_s_step_leaves_out_the_fit_call_s_start_and_end(monkeypatch):
    # Every `fit` call in this test starts its first step 1 s late (as a
    # slow first batch would), after StepLog's epoch start. The steady
    # step leaves that second out; the call's time carries it.
    import keras

    fit = keras.Model.fit

    def late_fit(self, *args, **kwargs):
        class Late(keras.callbacks.Callback):
            def on_train_batch_begin(self, batch, logs=None):
                if batch == 0:
                    time.sleep(1.0)

        callbacks = [Late(), *kwargs.pop("callbacks", [])]
        return fit(self, *args, callbacks=callbacks, **kwargs)

    monkeypatch.setattr(keras.Model, "fit", late_fit)
    monkeypatch.setattr(bench, "VARIANTS", {"float32": ("float32", None)})
    (row,) = bench.bench_model("cifar10", TINY, steps=3, rounds=2, log=None)
    assert len(row["steady_step_seconds"]) == len(row["epoch_seconds"]) == 2
    for step, call in zip(row["steady_step_seconds"], row["epoch_seconds"]):
        # Below a third of the late second: the mean of all three steps
        # would not be.
        assert step < 0.25 and call > 1.0
    assert row["step_time_s"] == statistics.median(row["steady_step_seconds"])
    assert row["call_step_time_s"] > 1.0 / 3


@pytest.mark.backend_independent("torch")
@pytest.mark.slow
def test_a_diverging_variant_is_flagged_in_the_warning_column(monkeypatch):
    import keras

    def too_fast(name, kind):
        # A learning rate no net survives: the loss rises or overflows.
        inner = keras.optimizers.SGD(1e4)
        if kind == "kmp":
            return bench.kmp.LossScaleOptimizer(inner)
        if kind == "stock":
            return keras.optimizers.LossScaleOptimizer(inner)
        return inner

    monkeypatch.setattr(bench, "_optimizer", too_fast)
    results = bench.bench_model("cifar10", TINY, steps=1, rounds=1, log=None)
    for r in results:
        assert not (r["loss"] < r["loss_before"]), r["variant"]
        assert r["warning"].startswith(("loss rose", "loss not finite"))


@pytest.mark.backend_independent
def test_a_run_that_does_not_feed_its_step_log_is_an_error():
    import sys

    from kmp.app import report

    interval = sys.getswitchinterval()
    runs, logs = {"a": lambda: None}, {"a": report.StepLog()}
    with pytest.raises(RuntimeError, match="saw 0 steps of a call of 3"):
        bench.time_fit_rounds(runs, logs, rounds=1, steps=3, log=None)
    assert sys.getswitchinterval() == interval  # restored


@pytest.mark.backend_independent
def test_time_interleaved_rotates_the_order():
    order = []
    runs = {name: (lambda n=name: order.append(n)) for name in "abc"}
    seconds = bench.time_interleaved(runs, rounds=3, log=None)
    assert order == list("abcbcacab")
    assert all(len(v) == 3 for v in seconds.values())


@pytest.mark.backend_independent
def test_markdown_has_one_table_per_model():
    rows = [
        dict(
            model=m,
            variant=v,
            step_time_s=0.01,
            examples_per_s=100.0,
            speed_vs_float32=1.0,
            peak_memory_mib=5.0,
            loss=0.5,
            sizes={"batch_size": 4},
        )
        for m in ("cifar10", "imdb")
        for v in bench.VARIANTS
    ]
    text = bench.markdown(rows)
    assert text.count("| variant |") == 2
    assert "**imdb** (batch_size 4)" in text


@pytest.mark.backend_independent
def test_mfu_is_achieved_tflops_over_the_peak_or_a_dash():
    from kmp import backend

    h100 = backend.Device("gpu", "NVIDIA H100 80GB HBM3", (9, 0))
    cpu = backend.Device("cpu", "AMD EPYC 9654")
    rows = [
        dict(variant=v, policy=p, flops_per_example=2e9, examples_per_s=e)
        for v, p, e in (
            ("float32", "float32", 1.0e4),
            ("bf16", "mixed_bfloat16", 4.945e4),
        )
    ]
    for row in rows:
        bench._tflops(row, h100, tf32=True)
    # 2 GFLOP x 10,000 examples/s = 20 TFLOP/s of TF32's 494;
    # 98.9 TFLOP/s of the 16-bit peak, 989.
    assert rows[0]["tflops_achieved"] == pytest.approx(20.0)
    assert rows[0]["tflops_peak"] == 494.0
    assert rows[0]["mfu"] == pytest.approx(20.0 / 494.0)
    assert rows[1]["mfu"] == pytest.approx(0.1)
    on_cpu = dict(rows[1])
    bench._tflops(on_cpu, cpu, tf32=None)
    assert on_cpu["tflops_peak"] is None and on_cpu["mfu"] is None
    for row in (*rows, on_cpu):
        row.update(model="m", sizes={"batch_size": 4})
    lines = bench.markdown([*rows, on_cpu]).splitlines()
    header = [cell.strip() for cell in lines[2].split("|")]
    assert header.index("MFU") == header.index("TFLOP/s") + 1
    cells = [[c.strip() for c in line.split("|")] for line in lines[4:]]
    mfu = header.index("MFU")
    assert [row[mfu] for row in cells] == ["4.0 %", "10.0 %", "-"]
    assert [row[mfu - 1] for row in cells] == ["20", "98.9", "98.9"]


def _row(variant, loss, before=1.0):
    return {"variant": variant, "loss": loss, "loss_before": before}


@pytest.mark.backend_independent
def test_warnings_flag_divergence_and_identical_losses():
    rows = [_row("float32", 0.5), _row("bf16", 1.5), _row("fp16", math.nan)]
    bench._warnings(rows)
    assert [r["warning"] for r in rows] == [
        "",
        "loss rose: diverging?",
        "loss not finite",
    ]
    same = [_row(v, 7.3035) for v in bench.VARIANTS]
    bench._warnings(same)
    assert all("same loss in every variant" in r["warning"] for r in same)
    assert "loss rose" in same[0]["warning"]


@pytest.mark.backend_independent("torch")
@pytest.mark.slow
def test_a_variants_memory_is_measured_in_a_process_of_its_own():
    mib, what = bench.variant_memory("cifar10", "bf16", TINY, steps=1)
    assert mib > 0, what
    assert what.endswith("this variant alone")


@jax_only
def test_a_variant_s_compiled_step_is_measured_before_it_runs():
    from kmp import backend

    model, _, inputs, _ = bench._variant("cifar10", "fp16+kmp", TINY, steps=1)
    small = backend.train_step_memory(model, *inputs, 4)
    large = backend.train_step_memory(model, *inputs, 64)
    assert 0 < small["footprint"] < large["footprint"]
    assert small["alias"] >= sum(backend.state_bytes(model).values())
