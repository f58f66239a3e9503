"""What the `kmp` command prints on stderr (`kmp.app.logs`): TensorFlow's
C++ log lines filtered, everything else kept, the user's choice kept."""

import logging
import os
import subprocess
import sys

import pytest

from kmp.app import logs

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


def test_verbose_or_a_users_setting_leaves_tensorflow_alone(monkeypatch):
    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL", raising=False)
    logs.quiet_start(verbose=True)
    assert "TF_CPP_MIN_LOG_LEVEL" not in os.environ
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


def _kmp(*argv, **env):
    command = os.path.join(os.path.dirname(sys.executable), "kmp")
    environ = {
        k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"
    }
    return subprocess.run(
        [command, *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env={**environ, **env},
    )


def test_a_kmp_command_prints_no_tensorflow_log_line():
    result = _kmp("info")
    assert result.returncode == 0, result.stderr
    assert "recommended_policy" in result.stdout
    assert not [
        line
        for line in result.stderr.splitlines(keepends=True)
        if logs.is_tensorflow_log(line)
    ], result.stderr
