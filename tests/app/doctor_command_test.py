"""`kmp doctor` (`kmp.app._doctor_command`), through `kmp_cli.main`."""

import json

import pytest
from util import TRANSFORMER
from util import fails_in_one_line
from util import saved_keras_io_transformer

import kmp_cli

pytestmark = pytest.mark.backend_independent


@pytest.mark.slow
def test_doctor_runs_an_example_and_writes_json_and_png(tmp_path, capsys):
    assert (
        kmp_cli.main(
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
    assert report["config"]["width"] == 8  # the config diagnosed
    assert (tmp_path / "doctor.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("saved", ["file", "directory"])
def test_doctor_reads_a_saved_model_and_npz(tmp_path, capsys, saved):
    # A .keras file, or an OrbaxCheckpoint directory's latest step.
    import keras
    import numpy as np

    import kmp

    with kmp.policy_scope("mixed_float16"):
        model = keras.Sequential(
            [keras.Input((4,)), keras.layers.Dense(2, name="head")]
        )
    model.compile(optimizer=kmp.wrap("sgd"), loss="mse")
    data = str(tmp_path / "d.npz")
    np.savez(data, x=np.ones((8, 4), "float32"), y=np.zeros((8, 2)))
    path = str(tmp_path / "m.keras")
    if saved == "file":
        model.save(path)
    else:
        path = str(tmp_path / "ckpt")
        checkpoint = kmp.callbacks.OrbaxCheckpoint(
            path, save_on_background=False
        )
        x, y = np.ones((8, 4), "float32"), np.zeros((8, 2), "float32")
        model.fit(x, y, verbose=0, callbacks=[checkpoint])
    kmp_cli.main(
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
        (["nothing.keras", "--data=x.npz"], "nothing.keras does not exist"),
        (["nothing.h5"], "nor a .keras file or an OrbaxCheckpoint"),
        (["EMPTY", "--data=XY"], "reads .keras files and OrbaxCheckpoint"),
        (["cifar10", "--policy=float32"], "--policy must be one of"),
        (["cifar10", "--batches=0"], "--batches=0"),
        (["cifar10", "--data=x.npz"], "a .npz file is for saved models"),
        (["MODEL", "--data=BAD"], "--data must name a .npz file"),
        (["MODEL", "--data=NPZ"], "it needs x and y"),
        (["MODEL", "--data=XY"], "needs a loss"),  # saved uncompiled
        (["JUNK", "--data=XY"], "is not a Keras archive"),
        (["cifar10", "--epochs=3"], "--epochs does not apply to kmp doctor"),
        (["imdb", "--norestart"], "--restart does not apply"),
        (["cifar10", "--strategy=mirrored"], "one process on one device"),
        (["cifar10", "--batch_size=max"], "--batch_size=max sizes a training"),
    ],
)
def test_doctor_bad_input_is_one_line(tmp_path, argv, phrase, capsys):
    import keras
    import numpy as np

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.save(str(tmp_path / "m.keras"))
    np.savez(str(tmp_path / "d.npz"), inputs=np.ones((2, 4)))
    np.savez(str(tmp_path / "xy.npz"), x=np.ones((2, 4)), y=np.ones((2, 2)))
    (tmp_path / "junk.keras").write_text("not a zip")
    replace = {
        "--data=XY": "--data=" + str(tmp_path / "xy.npz"),
        "MODEL": str(tmp_path / "m.keras"),
        "JUNK": str(tmp_path / "junk.keras"),
        "EMPTY": str(tmp_path),  # a directory, but no checkpoint
        "--data=BAD": "--data=" + str(tmp_path / "missing.npz"),
        "--data=NPZ": "--data=" + str(tmp_path / "d.npz"),
    }
    fails_in_one_line(
        ["doctor", *[replace.get(a, a) for a in argv]], phrase, capsys
    )


def test_doctor_of_the_user_s_own_classes_needs_their_module(
    tmp_path, capsys, registry
):
    import numpy as np

    path = str(tmp_path / "transformer.keras")
    saved_keras_io_transformer(path)
    data = str(tmp_path / "d.npz")
    tokens = np.arange(64).reshape(4, 16) % 64
    np.savez(data, x=tokens, y=np.eye(2)[np.arange(4) % 2])
    argv = ["doctor", path, f"--data={data}", "--batch_size=2"]
    fails_in_one_line(argv, "'TokenAndPositionEmbedding'", capsys)
    fails_in_one_line(argv, "--import=MODULE", capsys)
    out = f"--output_dir={tmp_path / 'out'}"
    assert kmp_cli.main([*argv, f"--import={TRANSFORMER}", out]) == 0
    report = json.loads((tmp_path / "out" / "doctor.json").read_text())
    assert report["examples"] == 4


def test_doctor_help_lists_example_and_doctor_flags(capsys):
    assert kmp_cli.main(["doctor", "cifar10", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--width" in out and "--batches" in out and "--loss_scale" in out
    assert "--master_weights" in out and "--epochs" not in out
    # An example's help where it speaks of training gives the doctor's.
    assert "--output_dir: Where doctor.txt, doctor.json and doctor.png" in out
    assert "--policy: The mixed policy to test" in out
    assert "the sizes not given are --batch_size=128, --width=16" in out


class _Diagnosed(Exception):
    """Raised by a stand-in for `kmp.diagnose` once it has its inputs."""


def test_doctor_sizes_the_example_as_train_does_with_every_flag(
    monkeypatch, tmp_path, capsys
):
    import keras

    import kmp
    from kmp import backend

    if backend.list_devices()[0].platform != "cpu":
        pytest.skip("the CPU sizes are for a machine without a GPU")
    seen = {}

    def diagnose(model, data, **kwargs):
        seen.update(model=model, **kwargs)
        raise _Diagnosed

    monkeypatch.setattr(kmp, "diagnose", diagnose)
    argv = [
        "doctor",
        "cifar10",
        "--data=synthetic",
        "--synthetic_size=256",  # two batches of 128
        "--policy=mixed_bfloat16",
        "--master_weights=bfloat16",
        "--verbose=0",
        f"--output_dir={tmp_path}",
    ]
    with pytest.raises(_Diagnosed):
        kmp_cli.main(argv)
    out = capsys.readouterr().out
    assert "kmp: no GPU found: width=16 (CPU sizes)" in out
    assert "building the model" not in out  # --verbose=0
    conv = [
        layer
        for layer in seen["model"]._flatten_layers()
        if isinstance(layer, keras.layers.Conv2D)
    ][0]
    assert conv.filters == 16 and conv.kernel.dtype == "bfloat16"
    assert seen["batch_size"] == 128 and seen["verbose"] is False


def test_a_bug_inside_diagnose_keeps_its_traceback(monkeypatch, tmp_path):
    # Only kmp.InputError is the user's to fix; any other error is a bug,
    # and the traceback is what it takes to fix one.
    import kmp

    def broken(*args, **kwargs):
        raise ValueError("a bug, not bad input")

    monkeypatch.setattr(kmp, "diagnose", broken)
    argv = [
        "doctor",
        "imdb",
        "--data=synthetic",
        "--synthetic_size=64",
        "--batch_size=8",
        f"--output_dir={tmp_path}",
    ]
    with pytest.raises(ValueError, match="a bug"):
        kmp_cli.main(argv)
