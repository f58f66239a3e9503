"""The `kmp` command line, parsed and checked without Keras
(`kmp_cli.parser`); the refusals themselves are in cli_test.py."""

import pytest

from kmp_cli import parser
from kmp_config import configs

pytestmark = pytest.mark.backend_independent


def test_train_gets_the_example_s_config_and_the_flags_given():
    args = parser.parse(["train", "cifar10", "--width=16", "--steps=3"])
    assert isinstance(args.config, configs.Cifar10Config)
    assert (args.config.width, args.config.steps) == (16, 3)
    assert args.config.batch_size == 512  # not given: the default
    assert args.given == {"width", "steps"}
    assert args.help_text is None


def test_train_s_progress_is_a_line_per_epoch_in_a_file(monkeypatch):
    # Keras's progress bar writes ANSI codes: not into a file or a pipe
    # (stdout here is pytest's capture), nor under NO_COLOR.
    monkeypatch.delenv("NO_COLOR", raising=False)
    assert parser.parse(["train", "cifar10"]).config.verbose == 2
    given = parser.parse(["train", "cifar10", "--verbose=1"])
    assert given.config.verbose == 1
    monkeypatch.setattr("sys.stdout.isatty", lambda: True)
    assert parser.parse(["train", "cifar10"]).config.verbose == 1
    monkeypatch.setenv("NO_COLOR", "1")
    assert parser.parse(["train", "cifar10"]).config.verbose == 2


def test_doctor_gets_the_example_s_config_with_the_doctor_s_defaults():
    args = parser.parse(["doctor", "imdb", "--batches=1", "--d_model=32"])
    assert isinstance(args.config, configs.ImdbConfig)
    assert (args.config.policy, args.config.batch_size) == (
        "mixed_float16",
        128,
    )
    assert args.config.d_model == 32
    assert args.flag_values.batches == 1


def test_doctor_of_a_saved_model_takes_its_own_flags(tmp_path):
    model, data = tmp_path / "m.keras", tmp_path / "d.npz"
    model.write_bytes(b"")
    data.write_bytes(b"")
    args = parser.parse(["doctor", str(model), f"--data={data}"])
    assert args.config is None
    assert args.flag_values.data == str(data)
    assert args.flag_values.output_dir == "runs/doctor"


@pytest.mark.parametrize(
    "argv, phrase",
    [
        (["doctor", "model.h5"], "neither an example"),
        (["doctor", "cifar10", "--data=x.npz"], "a .npz file is for saved"),
        (["doctor", "MODEL", "--data=missing.npz"], "--data must name a .npz"),
        (["audit", "NOT_KERAS"], "is neither a .keras file nor an"),
    ],
)
def test_files_are_checked_before_keras(argv, phrase, tmp_path, capsys):
    (tmp_path / "m.keras").write_bytes(b"")
    (tmp_path / "m.txt").write_bytes(b"")
    where = {"MODEL": tmp_path / "m.keras", "NOT_KERAS": tmp_path / "m.txt"}
    with pytest.raises(SystemExit) as exited:
        parser.parse([str(where.get(a, a)) for a in argv])
    assert exited.value.code == 2
    assert phrase in capsys.readouterr().err


def test_help_after_an_example_is_its_flags_not_a_run():
    args = parser.parse(["doctor", "cifar10", "--width=4", "--help"])
    assert args.help_text.startswith("usage: kmp doctor cifar10")
    assert "--batches" in args.help_text and "--width" in args.help_text
    assert not hasattr(args, "config")
