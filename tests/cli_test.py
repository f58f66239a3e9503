import json
import os
import subprocess
import sys

import pytest

from kmp import cli
from kmp import demo


def _fails_in_one_line(argv, phrase):
    """Runs `kmp ARGV` in a subprocess: it must fail with `phrase` on
    stderr and no traceback. Returns its exit status."""
    result = subprocess.run(
        [sys.executable, "-m", "kmp.cli", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ),
    )
    assert result.returncode != 0
    assert phrase in result.stderr
    assert "Traceback" not in result.stderr
    return result.returncode


def test_info_reports_versions_devices_and_recommendation(capsys):
    report = cli.info(as_json=True)
    printed = json.loads(capsys.readouterr().out)
    assert printed == report
    for key in ("kmp", "keras", "backend", "devices", "recommended_policy"):
        assert key in report
    assert report["reason"]


def test_demo_fit_prints_policy_scale_and_skipped_steps(capsys):
    cli.main(["demo", "--epochs", "1", "--steps", "4", "--batch_size", "16"])
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


@pytest.mark.parametrize(
    "argv, phrase",
    [
        (["demo", "--policy", "float16"], "invalid choice: 'float16'"),
        (["demo", "--steps", "0"], "must be >= 1"),
        (["demo", "--epochs", "two"], "expected an integer"),
        (["train"], "required: example"),
        (["train", "mnist"], "invalid choice: 'mnist'"),
        (["bench", "--models", "mnist"], "invalid choice: 'mnist'"),
        (["bench", "--steps", "0"], "must be >= 1"),
        (["nope"], "invalid choice: 'nope'"),
    ],
)
def test_bad_flags_get_one_clear_line_not_a_traceback(argv, phrase):
    assert _fails_in_one_line(argv, phrase) == 2  # argparse's usage error


def test_audit_command_reads_a_saved_model(tmp_path, capsys):
    import keras

    import kmp

    kmp.enable("mixed_float16")
    model = keras.Sequential(
        [keras.Input((8,)), keras.layers.Dense(8, activation="softmax")]
    )
    model.compile(optimizer="adam", loss="categorical_crossentropy")
    model.optimizer.build(model.trainable_variables)  # saved with its state
    path = str(tmp_path / "model.keras")
    model.save(path)
    cli.main(["audit", path, "--json"])
    findings = json.loads(capsys.readouterr().out)
    errors = [f["problem"] for f in findings if f["severity"] == "error"]
    warnings = [f["problem"] for f in findings if f["severity"] == "warning"]
    assert any("float16 softmax" in p for p in errors)
    # compile() wrapped "adam" in Keras's stock scaler, saved with it.
    assert any("stock keras LossScaleOptimizer" in p for p in warnings)


def test_audit_command_rejects_a_path_that_is_not_a_keras_file(tmp_path):
    with pytest.raises(SystemExit, match="is not a .keras file"):
        cli.main(["audit", str(tmp_path / "missing.keras")])


@pytest.mark.parametrize(
    "flags, phrase",
    [
        (["--steps=-1"], "kmp train cifar10: flag --steps=-1"),
        (["--polcy=x"], "Unknown command line flag 'polcy'"),
        (["--policy=float16"], "value should be one of"),
        (["--width=4"], "width"),
    ],
)
def test_train_bad_flag_is_one_line(flags, phrase):
    _fails_in_one_line(["train", "cifar10", *flags], phrase)


def test_train_help_lists_the_example_flags(capsys):
    cli.main(["train", "imdb", "--help"])
    out = capsys.readouterr().out
    assert "--d_model" in out and "--policy" in out and "--strategy" in out


def test_train_runs_the_example_and_prints_the_table(tmp_path, capsys):
    results = cli.main(
        [
            "train",
            "cifar10",
            "--data=synthetic",
            "--synthetic_size=64",
            "--width=8",
            "--steps=2",
            "--epochs=1",
            "--batch_size=16",
            "--verbose=0",
            f"--output_dir={tmp_path}",
        ]
    )
    assert results == 0
    out = capsys.readouterr().out
    assert "kmp train cifar10" in out
    assert "cifar10 (SYNTHETIC data): policy" in out
    assert (tmp_path / "results.json").exists()


def test_bench_command_writes_markdown_and_json(tmp_path, monkeypatch, capsys):
    from kmp import bench

    monkeypatch.setitem(
        bench.SIZES,
        "small",
        {"imdb": {"d_model": 16, "batch_size": 4, "sequence_length": 8}},
    )
    cli.main(
        [
            "bench",
            "--models",
            "imdb",
            "--size",
            "small",
            "--steps",
            "1",
            "--rounds",
            "2",
            "--output",
            str(tmp_path),
        ]
    )
    table = (tmp_path / "bench.md").read_text()
    for variant in ("float32", "fp16+kmp", "fp16+stock", "bf16"):
        assert f"| {variant} |" in table
    record = json.loads((tmp_path / "bench.json").read_text())
    assert record["command"].startswith("kmp bench --models imdb")
    assert len(record["results"]) == 4
    assert "kmp bench imdb" in capsys.readouterr().out


def test_doctor_runs_an_example_and_writes_json_and_png(tmp_path, capsys):
    assert (
        cli.main(
            [
                "doctor",
                "cifar10",
                "--data=synthetic",
                "--width=8",
                "--batch_size=16",
                "--batches=1",
                f"--output_dir={tmp_path}",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "kmp doctor: resnet9 under mixed_float16, loss scale 32768" in out
    assert "recommended policy: mixed_float16" in out
    assert "kmp.pin_float32(model)" in out
    report = json.loads((tmp_path / "doctor.json").read_text())
    assert report["examples"] == 16 and report["pin"] == []
    assert (tmp_path / "doctor.png").read_bytes()[:4] == b"\x89PNG"


def test_doctor_reads_a_saved_model_and_npz(tmp_path, capsys):
    import keras
    import numpy as np

    import kmp

    with kmp.policy_scope("mixed_float16"):
        model = keras.Sequential(
            [keras.Input((4,)), keras.layers.Dense(2, name="head")]
        )
    model.compile(optimizer=kmp.wrap("sgd"), loss="mse")
    path = str(tmp_path / "m.keras")
    model.save(path)
    data = str(tmp_path / "d.npz")
    np.savez(data, x=np.ones((8, 4), "float32"), y=np.zeros((8, 2)))
    cli.main(
        [
            "doctor",
            path,
            f"--data={data}",
            "--batch_size=4",
            "--policy=mixed_bfloat16",
            f"--output_dir={tmp_path / 'out'}",
        ]
    )
    report = json.loads((tmp_path / "out" / "doctor.json").read_text())
    assert report["policy"] == "mixed_bfloat16"
    assert report["command"].startswith("kmp doctor ")
    assert report["environment"]["versions"]["keras"] == keras.__version__
    assert report["examples"] == 8 and report["batches"] == 2
    assert "recommended policy: mixed_bfloat16" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, phrase",
    [
        (["nothing.keras", "--data=x.npz"], "neither an example"),
        (["cifar10", "--policy=float32"], "--policy must be one of"),
        (["cifar10", "--batches=0"], "--batches=0"),
        (["MODEL", "--data=BAD"], "--data must name a .npz file"),
        (["MODEL", "--data=NPZ"], "it needs x and y"),
        (["MODEL", "--data=XY"], "needs a loss"),  # saved uncompiled
    ],
)
def test_doctor_bad_input_is_one_line(tmp_path, argv, phrase):
    import keras
    import numpy as np

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.save(str(tmp_path / "m.keras"))
    np.savez(str(tmp_path / "d.npz"), inputs=np.ones((2, 4)))
    np.savez(str(tmp_path / "xy.npz"), x=np.ones((2, 4)), y=np.ones((2, 2)))
    replace = {
        "--data=XY": "--data=" + str(tmp_path / "xy.npz"),
        "MODEL": str(tmp_path / "m.keras"),
        "--data=BAD": "--data=" + str(tmp_path / "missing.npz"),
        "--data=NPZ": "--data=" + str(tmp_path / "d.npz"),
    }
    _fails_in_one_line(["doctor", *[replace.get(a, a) for a in argv]], phrase)


def test_doctor_help_lists_example_and_doctor_flags(capsys):
    cli.main(["doctor", "cifar10", "--help"])
    out = capsys.readouterr().out
    assert "--width" in out and "--batches" in out and "--loss_scale" in out
