"""The `kmp` command's parser and dispatch (`kmp.app.cli`).

Bad input must end the command with one clear line and no traceback. The
checks run `kmp.app.cli.main` in this process: a shell shows a traceback
exactly when an exception other than SystemExit escapes `main`, and prints
a SystemExit's message on stderr with exit status 1. One test runs the
real entry point in a subprocess, to check that this holds there too.
"""

import os
import subprocess
import sys

import pytest
from util import fails_in_one_line

from kmp.app import cli

pytestmark = pytest.mark.backend_independent

KMP = os.path.join(os.path.dirname(sys.executable), "kmp")  # console script


@pytest.mark.parametrize(
    "argv, phrase, status",
    [
        (["nope"], "invalid choice: 'nope'", 2),
        (["train", "cifar10", "--polcy=x"], "Unknown command line flag", 2),
    ],
)
def test_the_entry_point_fails_in_one_line_too(argv, phrase, status):
    result = subprocess.run(
        [KMP, *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ),
    )
    assert result.returncode == status
    assert phrase in result.stderr
    assert "Traceback" not in result.stderr


def test_help_and_bad_flags_answer_without_importing_keras():
    # The console script defers `import kmp`'s load (kmp/__init__.py).
    code = (
        "import sys\n"
        "sys.argv[0] = 'kmp'\n"
        "from kmp.app import cli\n"
        "for argv in (['--help'], ['info', '--help'], ['demo', '--steps=0']):\n"
        "    try:\n"
        "        cli.main(argv)\n"
        "    except SystemExit:\n"
        "        pass\n"
        "print('keras imported:', 'keras' in sys.modules)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True
    )
    assert "keras imported: False" in result.stdout, result.stderr


@pytest.mark.parametrize("backend", ["tensorflow", "jax", "torch"])
def test_bench_takes_each_keras_backend(backend):
    args = cli._parser().parse_args(["bench", "--backend", backend])
    assert args.backend == backend


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
        "sys.argv[0] = 'kmp'\n"
        "from kmp.app import cli\n"
        "cli.main(['info'])\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, KERAS_BACKEND="torch"),
    )
    assert result.returncode == 2
    assert "No module named 'torch' (KERAS_BACKEND=torch)" in result.stderr
    assert "Traceback" not in result.stderr


def test_import_kmp_loads_the_api_and_registers_its_classes():
    code = (
        "import sys, kmp, keras\n"
        "print(keras.saving.get_registered_object("
        "'kmp>LossScaleOptimizer') is not None)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True
    )
    assert result.stdout.strip() == "True", result.stderr


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
        (["bench", "--backend", "numpy"], "invalid choice: 'numpy'"),
        (["nope"], "invalid choice: 'nope'"),
    ],
)
def test_bad_flags_get_one_clear_line_not_a_traceback(argv, phrase, capsys):
    assert (
        fails_in_one_line(argv, phrase, capsys) == 2
    )  # argparse's usage error


@pytest.mark.parametrize(
    "flags, phrase",
    [
        (["--steps=-1"], "kmp train cifar10: flag --steps=-1"),
        (["--polcy=x"], "Unknown command line flag 'polcy'"),
        (["--policy=float16"], "value should be one of"),
        (["--width=4"], "width"),
    ],
)
def test_train_bad_flag_is_one_line(flags, phrase, capsys):
    fails_in_one_line(["train", "cifar10", *flags], phrase, capsys)


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


def test_train_help_lists_the_example_flags(capsys):
    cli.main(["train", "imdb", "--help"])
    out = capsys.readouterr().out
    assert "--d_model" in out and "--policy" in out and "--strategy" in out
