"""What the `kmp` command prints on stderr (`kmp_cli.logs`): TensorFlow's
C++ log lines filtered, everything else kept, the user's choice kept,
whichever Keras backend runs."""

import contextlib
import io
import logging
import os
import subprocess
import sys

import pytest

from kmp_cli import logs

pytestmark = pytest.mark.backend_independent

# Lines TensorFlow 2.21 printed on this machine's start (shortened).
TF_LINES = [
    "WARNING: All log messages before absl::InitializeLog() is called are "
    "written to STDERR\n",
    "I0000 00:00:1795415658.687085    3275 port.cc:153] oneDNN custom "
    "operations are on.\n",
    "E0000 00:00:1795415667.213110    3275 cuda_platform.cc:52] failed call "
    "to cuInit: INTERNAL: CUDA error\n",
    "W1123 10:01:02.123456 140 tfrt_cpu_pjrt_client.cc:349] a warning\n",
    "To enable the following instructions: AVX2 AVX512F FMA, in other "
    "operations, rebuild TensorFlow with the appropriate compiler flags.\n",
]
OTHER_LINES = [
    "kmp: policy 'auto' -> float32.\n",
    "UserWarning: something Python said\n",
    "Traceback (most recent call last):\n",
    "I am a line that starts with I\n",
]


def test_tensorflow_lines_go_and_every_other_line_stays():
    for line in TF_LINES:
        assert logs.is_tensorflow_log(line), line
    for line in OTHER_LINES:
        assert not logs.is_tensorflow_log(line), line
    mixed = "".join(x for pair in zip(TF_LINES, OTHER_LINES) for x in pair)
    assert logs.filter_tensorflow_logs(mixed) == "".join(OTHER_LINES)


def test_verbose_leaves_tensorflow_alone_and_a_users_level_stands(
    monkeypatch,
):
    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL", raising=False)
    monkeypatch.delenv("KMP_VERBOSE", raising=False)
    logs.quiet_start(verbose=True)
    assert "TF_CPP_MIN_LOG_LEVEL" not in os.environ
    monkeypatch.setenv("KMP_VERBOSE", "1")
    logs.quiet_start()
    assert "TF_CPP_MIN_LOG_LEVEL" not in os.environ
    for value, wants in [("0", False), ("", False), ("1", True)]:
        monkeypatch.setenv("KMP_VERBOSE", value)
        assert logs.wants_tensorflow_logs() is wants
    monkeypatch.delenv("KMP_VERBOSE")
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "0")
    logs.quiet_start()
    assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == "0"


def test_kmp_records_show_as_their_own_lines(monkeypatch):
    logger = logging.getLogger("kmp")
    monkeypatch.setattr(logger, "handlers", [])
    monkeypatch.setattr(logger, "propagate", True)
    logs.quiet_start(verbose=True)
    logs.quiet_start(verbose=True)  # idempotent
    assert len(logger.handlers) == 1 and not logger.propagate


def test_kmp_records_go_to_stderr_as_it_is_when_written(monkeypatch):
    # A handler bound to the stderr of its setup would write into a stream
    # replaced (and closed) since, and logging would print a traceback.
    logger = logging.getLogger("kmp")
    monkeypatch.setattr(logger, "handlers", [])
    monkeypatch.setattr(logger, "propagate", True)
    with contextlib.redirect_stderr(io.StringIO()):
        logs.quiet_start(verbose=True)
    later = io.StringIO()
    with contextlib.redirect_stderr(later):
        logger.warning("kmp: a line")
    assert later.getvalue() == "kmp: a line\n"


def _run(command, **env):
    """Runs `command` with the user's environment (no log level set, no
    KMP_VERBOSE) and `env`."""
    unset = ("TF_CPP_MIN_LOG_LEVEL", "KMP_VERBOSE")
    environ = {k: v for k, v in os.environ.items() if k not in unset}
    return subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=300,
        env={**environ, **env},
    )


def _kmp(*argv, **env):
    command = os.path.join(os.path.dirname(sys.executable), "kmp")
    return _run([command, *argv], **env)


def _tensorflow_lines(stderr):
    return [
        line
        for line in stderr.splitlines(keepends=True)
        if logs.is_tensorflow_log(line)
    ]


def test_a_kmp_command_prints_no_tensorflow_log_line():
    result = _kmp("info")
    assert result.returncode == 0, result.stderr
    assert "recommended_policy" in result.stdout
    assert not _tensorflow_lines(result.stderr), result.stderr


# Keras on JAX imports no TensorFlow; Keras's set_random_seed does, later,
# where it is installed (here): its load-time lines must not get through.
_SEEDS_UNDER_JAX = (
    "import sys\n"
    "from kmp_cli import logs\n"
    "logs.quiet_start(tensorflow=True)\n"
    "import keras\n"
    "keras.utils.set_random_seed(0)\n"
    "print(keras.backend.backend(), 'tensorflow' in sys.modules)\n"
)


@pytest.mark.parametrize(
    "env, shown",
    [
        ({}, False),
        # The setting users export to silence TensorFlow: alone, it lets
        # six start-up lines through; under kmp it must give no more.
        ({"TF_CPP_MIN_LOG_LEVEL": "3"}, False),
        # Asked for: TensorFlow prints as it would anyway.
        ({"KMP_VERBOSE": "1"}, True),
    ],
)
def test_under_jax_tensorflow_loads_under_the_filter_too(env, shown):
    command = [sys.executable, "-c", _SEEDS_UNDER_JAX]
    result = _run(command, KERAS_BACKEND="jax", **env)
    assert result.stdout.split() == ["jax", "True"], result.stderr
    assert bool(_tensorflow_lines(result.stderr)) is shown, result.stderr


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["jax", "tensorflow"])
def test_kmp_train_prints_no_tensorflow_log_line(backend, tmp_path):
    # --width is not given: on a CPU the command picks it after asking
    # for the devices, which starts TensorFlow; its compile cache must be
    # set before that.
    result = _kmp(
        "train",
        "cifar10",
        "--data=synthetic",
        "--synthetic_size=64",
        "--batch_size=16",
        "--steps=1",
        "--epochs=1",
        "--verbose=0",
        f"--output_dir={tmp_path}",
        KERAS_BACKEND=backend,
        XDG_CACHE_HOME=str(tmp_path / "cache"),
    )
    assert result.returncode == 0, result.stderr
    assert "cifar10 (SYNTHETIC data): policy" in result.stdout
    assert not _tensorflow_lines(result.stderr), result.stderr
    assert "no compile cache" not in result.stderr
    if backend == "jax":  # TensorFlow compiles nothing with XLA on a CPU
        assert os.listdir(tmp_path / "cache" / "kmp" / "xla" / "jax")
