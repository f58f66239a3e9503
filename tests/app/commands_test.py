"""The `kmp` commands info, audit, train and bench (`kmp.app._commands`),
through `kmp_cli.main`."""

import json
import math

import pytest
from util import FIXTURES
from util import TRANSFORMER
from util import damage
from util import fails_in_one_line
from util import saved_keras_io_transformer

import kmp_cli
from kmp.app import _commands


@pytest.mark.backend_independent
def test_info_reports_versions_devices_and_recommendation(capsys):
    report = _commands.info(as_json=True)
    printed = json.loads(capsys.readouterr().out)
    assert printed == report
    for key in ("kmp", "keras", "backend", "devices", "recommended_policy"):
        assert key in report
    assert report["reason"]


@pytest.mark.backend_independent
def test_info_says_tf32_has_no_effect_without_an_ampere_gpu(capsys):
    cpu = {"platform": "cpu", "compute_capability": None}
    a100 = {"platform": "gpu", "compute_capability": [8, 0]}
    v100 = {"platform": "gpu", "compute_capability": [7, 0]}
    assert not _commands._has_tf32_hardware([cpu, v100])
    assert _commands._has_tf32_hardware([cpu, a100])
    report = _commands.info()
    if not _commands._has_tf32_hardware(report["devices"]):
        assert "no effect here" in capsys.readouterr().out


@pytest.mark.backend_independent
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
    status = kmp_cli.main(["audit", path, "--json"])
    findings = json.loads(capsys.readouterr().out)
    errors = [f["problem"] for f in findings if f["severity"] == "error"]
    warnings = [f["problem"] for f in findings if f["severity"] == "warning"]
    assert any("float16 softmax" in p for p in errors)
    # compile() wrapped "adam" in Keras's stock scaler, saved with it.
    assert any("stock keras LossScaleOptimizer" in p for p in warnings)
    assert status == 1  # an error finding: scripts and CI can tell


@pytest.mark.backend_independent
def test_audit_of_a_pinned_file_says_kmp_load_model_pins_it_again(
    tmp_path, capsys
):
    # A review: a pinned feature extractor's file, audited as Keras loads
    # it, got "Model output is float16 ... kmp.pin_float32(model)" and no
    # word that kmp.load_model does that.
    import keras

    import kmp

    kmp.enable("mixed_float16")
    inputs = keras.Input((8,))
    model = keras.Model(inputs, keras.layers.Dense(8)(inputs))
    path = str(tmp_path / "model.keras")
    model.save(path)
    kmp_cli.main(["audit", path])
    said = "the file records that kmp.pin_float32 pinned its model"
    assert said not in capsys.readouterr().out
    kmp.pin_float32(model).save(path)
    kmp_cli.main(["audit", path])
    assert said in capsys.readouterr().out


@pytest.mark.backend_independent
def test_audit_reads_an_orbax_checkpoint_directory(tmp_path, capsys):
    # The latest step of kmp.callbacks.OrbaxCheckpoint's directory, as
    # kmp.load_model loads it; a pinned model's mark read from its
    # assets' metadata.
    import keras
    import numpy as np

    import kmp

    kmp.enable("mixed_float16")
    model = kmp.pin_float32(
        keras.Sequential(
            [
                keras.Input((8,)),
                keras.layers.Dense(8, activation="relu"),
                keras.layers.Dense(2, activation="softmax"),
            ]
        )
    )
    model.compile(
        optimizer=kmp.wrap(keras.optimizers.Adam()),
        loss="sparse_categorical_crossentropy",
    )
    directory = str(tmp_path / "ckpt")
    saving = kmp.callbacks.OrbaxCheckpoint(directory, save_on_background=False)
    x, y = np.ones((8, 8), "float32"), np.zeros((8,), "int32")
    model.fit(x, y, epochs=1, verbose=0, callbacks=[saving])
    status = kmp_cli.main(["audit", directory])
    said = capsys.readouterr().out
    assert f"kmp audit: {directory}, loaded under mixed_float16" in said
    assert "the file records that kmp.pin_float32 pinned its model" in said
    assert "float16 softmax" not in said
    assert status == 0


@pytest.mark.backend_independent
def test_audit_exits_0_when_no_finding_is_an_error(tmp_path, capsys):
    import keras

    import kmp

    kmp.enable("mixed_float16")
    model = kmp.pin_float32(
        keras.Sequential(
            [keras.Input((8,)), keras.layers.Dense(2, activation="softmax")]
        )
    )
    # Keras's own scaler: a warning, which does not count.
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    model.optimizer.build(model.trainable_variables)
    path = str(tmp_path / "model.keras")
    model.save(path)
    status = kmp_cli.main(["audit", path, "--json"])
    severities = {f["severity"] for f in json.loads(capsys.readouterr().out)}
    assert "warning" in severities and "error" not in severities
    assert status == 0


def test_audit_command_rejects_a_path_that_is_not_a_keras_file(
    tmp_path, capsys
):
    argv = ["audit", str(tmp_path / "missing.keras")]
    assert fails_in_one_line(argv, "missing.keras does not exist", capsys) == 2
    text = tmp_path / "model.txt"
    text.write_text("")
    argv = ["audit", str(text)]
    assert fails_in_one_line(argv, "is neither a .keras file", capsys) == 2
    # A directory is let through to kmp.load_model, which reads
    # OrbaxCheckpoint directories and says what else is not one.
    argv = ["audit", str(tmp_path)]
    assert fails_in_one_line(argv, "reads .keras files and Orbax", capsys) == 2
    garbage = tmp_path / "garbage.keras"
    garbage.write_text("not a zip")
    argv = ["audit", str(garbage)]
    assert fails_in_one_line(argv, "is not a Keras archive", capsys) == 2


def test_a_damaged_keras_file_is_one_line_for_audit_and_doctor(
    tmp_path, capsys
):
    # One byte flipped inside the weights: a zip checksum error in
    # Keras's load, 73 lines of traceback before issue 40.
    import keras
    import numpy as np

    path = str(tmp_path / "damaged.keras")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    model.compile(optimizer="adam", loss="mse")
    model.save(path)
    damage(path)
    data = str(tmp_path / "data.npz")
    np.savez(data, x=np.zeros((8, 4)), y=np.zeros((8, 3)))
    for argv in (["audit", path], ["doctor", path, f"--data={data}"]):
        status = fails_in_one_line(argv, "is a damaged Keras archive", capsys)
        assert status == 2


@pytest.mark.slow
@pytest.mark.backend_independent
def test_train_runs_the_example_and_prints_the_table(tmp_path, capsys):
    results = kmp_cli.main(
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


@pytest.mark.slow
@pytest.mark.backend_independent("torch")
def test_bench_command_writes_markdown_and_json(tmp_path, monkeypatch, capsys):
    from kmp.examples import imdb

    monkeypatch.setitem(
        imdb.Config.BENCH_SIZES,
        "small",
        {"d_model": 16, "batch_size": 4, "sequence_length": 8},
    )
    kmp_cli.main(
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
            "--no-memory",  # per-variant processes: tests/app/bench_test.py
            "--float8",
            "--output",
            str(tmp_path),
        ]
    )
    table = (tmp_path / "bench.md").read_text()
    variants = ("float32", "fp16+kmp", "fp16+stock", "bf16", "bf16+fp8")
    for variant in (*variants, "fp16+kmp+fp8"):
        assert f"| {variant} |" in table
    record = json.loads((tmp_path / "bench.json").read_text())
    assert record["command"].startswith("kmp bench --models imdb")
    assert len(record["results"]) == 6
    for row in record["results"]:
        assert math.isfinite(row["loss"]), row["variant"]
    out = capsys.readouterr().out
    assert "kmp bench imdb" in out and "not per variant" in out


@pytest.mark.parametrize("optimizer", ["plain", "keras", "kmp"])
def test_audit_of_a_saved_model_agrees_with_the_model_s(
    optimizer, tmp_path, capsys
):
    import dataclasses

    import keras

    import kmp

    kmp.enable("mixed_float16")
    model = keras.Sequential(
        [
            keras.Input((8,)),
            keras.layers.Dense(8),
            keras.layers.Dense(2, activation="softmax", dtype="float32"),
        ]
    )
    model.compile(
        optimizer={
            "plain": lambda: "adam",  # Keras wraps it in its own scaler
            "keras": lambda: keras.optimizers.LossScaleOptimizer(
                keras.optimizers.Adam()
            ),
            "kmp": lambda: kmp.wrap("adam"),
        }[optimizer](),
        loss="sparse_categorical_crossentropy",
    )
    model.optimizer.build(model.trainable_variables)
    in_memory = [dataclasses.asdict(f) for f in kmp.audit(model, verbose=0)]
    path = str(tmp_path / "m.keras")
    model.save(path)
    kmp.disable()  # as in a new process
    capsys.readouterr()
    kmp_cli.main(["audit", path, "--json"])

    def named(findings):
        # A layer's path is Keras's: "sequential/dense_1" in the model
        # that built it, "dense_1" once loaded. Compare its name.
        return [{**f, "where": f["where"].split("/")[-1]} for f in findings]

    assert named(json.loads(capsys.readouterr().out)) == named(in_memory)
    saving = [f for f in in_memory if "a .keras file records" in f["problem"]]
    assert len(saving) == (optimizer == "plain")
    if optimizer == "plain":
        # What the warning says: loaded under float32, no scaler.
        loaded = keras.saving.load_model(path)
        assert isinstance(loaded.optimizer, keras.optimizers.Adam)
        assert not isinstance(
            loaded.optimizer, keras.optimizers.LossScaleOptimizer
        )


@pytest.mark.backend_independent
def test_audit_of_the_user_s_own_classes_needs_their_module(
    tmp_path, capsys, monkeypatch, registry
):
    path = str(tmp_path / "transformer.keras")
    saved_keras_io_transformer(path)
    code = fails_in_one_line(["audit", path], "--import=MODULE", capsys)
    assert code == 2  # bad input, not "an error-severity finding" (1)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        kmp_cli.main(["audit", path])
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "'TokenAndPositionEmbedding'" in line
    assert exited.value.code == 2
    # With the flag (a .py path, or a module name on sys.path): audited.
    assert kmp_cli.main(["audit", path, f"--import={TRANSFORMER}"]) in (0, 1)
    assert "loaded under mixed_float16" in capsys.readouterr().out
    # A module name on sys.path works too.
    monkeypatch.syspath_prepend(str(FIXTURES))
    saved_keras_io_transformer(path)
    argv = ["audit", path, "--import=keras_io_transformer", "--json"]
    assert kmp_cli.main(argv) in (0, 1)
    assert isinstance(json.loads(capsys.readouterr().out), list)


@pytest.mark.backend_independent
def test_an_import_that_fails_is_one_line(tmp_path, capsys):
    path = tmp_path / "m.keras"
    path.write_bytes(b"")
    argv = ["audit", str(path), "--import=no_such_module_kmp"]
    phrase = "--import=no_such_module_kmp failed: ModuleNotFoundError"
    assert fails_in_one_line(argv, phrase, capsys) == 2
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('half-written')\n")
    argv = ["audit", str(path), f"--import={broken}"]
    phrase = "failed: RuntimeError: half-written"
    assert fails_in_one_line(argv, phrase, capsys) == 2
