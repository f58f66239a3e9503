"""The `kmp` command's start (`kmp_cli.main`) and dispatch
(`kmp.app.cli`).

Bad input must end the command with one clear line and no traceback,
before Keras loads. Most checks run `kmp_cli.main` (the console
script's entry point) in this process: a shell shows a traceback exactly when
an exception other than SystemExit escapes `main`, and prints a
SystemExit's message on stderr with exit status 1. What needs a fresh
interpreter (Keras not imported yet, the installed console script,
`python -m kmp_cli`) runs in a subprocess.
"""

import json
import os
import subprocess
import sys

import pytest
from util import fails_in_one_line

import kmp_cli

pytestmark = pytest.mark.backend_independent

KMP = os.path.join(os.path.dirname(sys.executable), "kmp")  # console script
# The two ways to start the command.
STARTS = {
    "console script": [KMP],
    "python -m": [sys.executable, "-m", "kmp_cli"],
}

# Refused before Keras loads: argparse's checks, the examples' flags
# (their own ones too), the doctor's, the audit's path.
REFUSED = [
    (["nope"], "invalid choice: 'nope'"),
    (["demo", "--steps=0"], "must be >= 1"),
    (["train", "cifar10", "--policy=float17"], "value should be one of"),
    (["train", "cifar10", "--epochs=-1"], "flag --epochs=-1"),
    (["train", "cifar10", "--batch_size=0"], "flag --batch_size=0"),
    (["train", "cifar10", "--polcy=x"], "Unknown command line flag 'polcy'"),
    (["train", "cifar10", "--width=4"], "flag --width=4"),
    (["train", "imdb", "--d_model=10", "--heads=3"], "multiple of heads"),
    (["doctor", "imdb", "--d_model=10", "--heads=3"], "multiple of heads"),
    (["doctor", "cifar10", "--policy=float32"], "--policy must be one of"),
    (["audit", "/nonexistent.keras"], "does not exist"),
]


def _fresh(code, **env):
    """Runs `code` in a fresh interpreter; returns the finished process."""
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, **env),
    )


def test_help_and_bad_input_answer_before_keras_or_kmp_is_imported():
    code = (
        "import contextlib, io, json, sys\n"
        "from kmp_cli import main\n"
        f"cases = {json.dumps([argv for argv, _ in REFUSED])}\n"
        "cases += [['--help'], ['train', '--help'], ['doctor', '--help'],\n"
        "          ['train', 'imdb', '--help'], ['audit', '--help']]\n"
        "said = []\n"
        "for argv in cases:\n"
        "    with contextlib.redirect_stderr(io.StringIO()) as err:\n"
        "        try:\n"
        "            status = main(argv)\n"
        "        except SystemExit as exit:\n"
        "            status = exit.code\n"
        "    said.append([status, err.getvalue()])\n"
        "loaded = sorted({m.split('.')[0] for m in sys.modules}\n"
        "                & {'keras', 'tensorflow', 'jax', 'torch', 'kmp'})\n"
        "print('RESULT', json.dumps([said, loaded]))\n"
    )
    result = _fresh(code)
    line = [x for x in result.stdout.splitlines() if x.startswith("RESULT")]
    assert line, result.stderr
    said, loaded = json.loads(line[0][len("RESULT ") :])
    assert loaded == []
    refused, helped = said[: len(REFUSED)], said[len(REFUSED) :]
    for (argv, phrase), (status, stderr) in zip(REFUSED, refused):
        # The last line says it (argparse's own errors print the usage
        # first).
        assert status == 2 and phrase in stderr.splitlines()[-1], argv
        assert "Traceback" not in stderr
    assert helped == [[0, ""]] * 5


@pytest.mark.parametrize("start", STARTS)
def test_each_way_to_start_refuses_a_bad_flag_in_one_line(start):
    argv = ["train", "imdb", "--d_model=10", "--heads=3"]
    result = subprocess.run(
        [*STARTS[start], *argv], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "kmp train imdb: d_model (10) must be a multiple of heads (3): each "
        "head gets d_model / heads dimensions. Change --d_model or --heads."
    ]


def test_python_m_runs_a_command():
    result = subprocess.run(
        [*STARTS["python -m"], "info", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["recommended_policy"]


def test_import_kmp_loads_the_api_and_registers_its_classes():
    # Nothing lazy left: the names are in the module once it is imported,
    # and Keras finds kmp's classes for load_model.
    code = (
        "import kmp, keras\n"
        "print('LossScaleOptimizer' in vars(kmp), 'diagnose' in vars(kmp),\n"
        "      keras.saving.get_registered_object('kmp>LossScaleOptimizer')\n"
        "      is kmp.LossScaleOptimizer)\n"
    )
    result = _fresh(code)
    assert result.stdout.split() == ["True"] * 3, result.stderr


def test_a_backend_that_is_not_installed_is_keras_s_error_in_one_line():
    # PyTorch absent, as on a machine without it, under KERAS_BACKEND=torch.
    code = (
        "import importlib.abc, sys\n"
        "class NoTorch(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name.split('.')[0] == 'torch':\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}',"
        " name=name)\n"
        "sys.meta_path.insert(0, NoTorch())\n"
        "from kmp_cli import main\n"
        "main(['info'])\n"
    )
    result = _fresh(code, KERAS_BACKEND="torch")
    assert result.returncode == 2
    assert "No module named 'torch' (KERAS_BACKEND=torch)" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("argv, phrase", REFUSED)
def test_bad_input_is_one_line_in_process_too(argv, phrase, capsys):
    assert fails_in_one_line(argv, phrase, capsys) == 2


@pytest.mark.parametrize(
    "argv, phrase",
    [
        (["demo", "--policy", "float16"], "invalid choice: 'float16'"),
        (["demo", "--epochs", "two"], "expected an integer"),
        (["train"], "required: EXAMPLE"),
        (["train", "mnist"], "invalid choice: 'mnist'"),
        (["train", "cifar10", "--steps=-1"], "kmp train cifar10: flag --steps"),
        (["train", "cifar10", "20"], "unexpected argument '20'"),
        (["bench", "--models", "mnist"], "invalid choice: 'mnist'"),
        (["bench", "--steps", "0"], "must be >= 1"),
        (["bench", "--backend", "numpy"], "invalid choice: 'numpy'"),
    ],
)
def test_bad_flags_get_one_clear_line_not_a_traceback(argv, phrase, capsys):
    assert fails_in_one_line(argv, phrase, capsys) == 2


@pytest.mark.parametrize(
    "tf_config, phrase",
    [
        ("", "strategy=multiworker needs TF_CONFIG"),
        ("{not json", "TF_CONFIG is not valid JSON"),
        ('{"cluster": {"worker": ["h:1"]}}', "TF_CONFIG has no 'task'"),
    ],
)
def test_a_cluster_that_is_not_configured_is_one_line(
    tf_config, phrase, capsys, monkeypatch
):
    monkeypatch.setenv("TF_CONFIG", tf_config)
    argv = ["train", "cifar10", "--strategy=multiworker"]
    assert fails_in_one_line(argv, phrase, capsys) == 2


@pytest.mark.parametrize("command", ["train", "doctor"])
def test_train_and_doctor_help_list_the_examples_and_how_to_see_flags(
    command, capsys
):
    with pytest.raises(SystemExit) as exited:
        kmp_cli.main([command, "--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert "cifar10" in out and "imdb" in out
    assert f"kmp {command} cifar10 --help" in out.replace("EXAMPLE", "cifar10")


def test_train_help_lists_the_example_flags_and_cpu_sizes(capsys):
    assert kmp_cli.main(["train", "imdb", "--help"]) == 0
    out = capsys.readouterr().out
    for flag in ("--d_model", "--heads", "--policy", "--strategy", "restart"):
        assert flag in out
    assert "no GPU is found, the sizes not given are --batch_size=32" in out


def test_audit_help_says_what_the_exit_status_means(capsys):
    with pytest.raises(SystemExit):
        kmp_cli.main(["audit", "--help"])
    out = capsys.readouterr().out
    assert "1  at least one finding is an error" in out
    assert "warnings and notes are printed, not counted" in out


@pytest.mark.parametrize("backend", ["tensorflow", "jax", "torch"])
def test_bench_takes_each_keras_backend(backend):
    from kmp_cli import parser

    args = parser.parse(["bench", "--backend", backend])
    assert args.backend == backend
