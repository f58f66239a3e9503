"""Ctrl-C and SIGTERM (`kmp_cli.interrupts`): one line that says where
the run stopped and how it resumes, exit status 130 (143 for SIGTERM),
on every backend; and the interrupt that Keras's `pythonify_logs`
swallowed (where JAX's main thread waits for its step) is raised all
the same."""

import json
import os
import signal
import subprocess
import sys
import time
import types

import pytest

import kmp_cli
from kmp_cli import interrupts
from kmp_config import configs


def _train_args(tmp_path, **changes):
    config = configs.Cifar10Config(output_dir=str(tmp_path), epochs=4)
    for name, value in changes.items():
        setattr(config, name, value)
    return types.SimpleNamespace(
        command="train", example="cifar10", config=config
    )


def test_the_line_says_the_epochs_backed_up_and_how_to_resume(tmp_path):
    args = _train_args(tmp_path)
    assert interrupts.line(args) == (
        "kmp train cifar10: interrupted before its first epoch ended; "
        "nothing is backed up: the same command starts over."
    )
    backup = tmp_path / "backup"
    backup.mkdir()
    # Keras's BackupAndRestore records the epochs it holds so.
    (backup / "training_metadata.json").write_text(json.dumps({"epoch": 2}))
    assert interrupts.line(args) == (
        f"kmp train cifar10: interrupted after 2 of 4 epochs, backed up in "
        f"{backup}: the same command resumes at epoch 3."
    )
    restart = _train_args(tmp_path, restart=True)
    assert "the same command without --restart resumes" in interrupts.line(
        restart
    )
    bench = types.SimpleNamespace(command="bench")
    assert interrupts.line(bench) == "kmp bench: interrupted."


def test_a_sigterm_stops_a_command_in_one_line_with_status_143(
    tmp_path, monkeypatch, capsys
):
    # What Slurm, Kubernetes or a preemptible VM sends before the kill:
    # Python's default would end the process on the spot, without a line.
    backup = tmp_path / "backup"
    backup.mkdir()
    (backup / "training_metadata.json").write_text(json.dumps({"epoch": 1}))

    def training(args):
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1000):  # Python runs the handler between bytecodes
            pass
        raise AssertionError("the SIGTERM did not stop the command")

    monkeypatch.setattr(kmp_cli, "_run", training)
    before = signal.getsignal(signal.SIGTERM)
    status = kmp_cli.main(
        ["train", "cifar10", "--epochs=3", f"--output_dir={tmp_path}"]
    )
    assert status == 143
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"kmp train cifar10: stopped by SIGTERM after 1 of 3 epochs, "
        f"backed up in {backup}: the same command resumes at epoch 2."
    )
    assert signal.getsignal(signal.SIGTERM) is before
    assert interrupts.status(KeyboardInterrupt()) == 130


class _SignalsWhenRead:
    """A log value whose conversion to a float delivers a SIGINT (as a
    Ctrl-C during the wait for a JAX step would)."""

    def __float__(self):
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):  # Python runs the handler between bytecodes
            pass
        return 1.0


def _logs_read_with_a_sigint():
    from keras.src.utils import python_utils

    logs = python_utils.pythonify_logs({"loss": _SignalsWhenRead()})
    return logs  # the interrupt is raised on the line after the call


def test_an_interrupt_inside_keras_s_bare_except_is_raised_after_it():
    previous = signal.getsignal(signal.SIGINT)
    try:
        # Python's own handler: Keras's bare `except` swallows it (and
        # keeps the value unconverted).
        signal.signal(signal.SIGINT, signal.default_int_handler)
        logs = _logs_read_with_a_sigint()
        assert isinstance(logs["loss"], _SignalsWhenRead)
        with interrupts.handled(), pytest.raises(KeyboardInterrupt):
            _logs_read_with_a_sigint()
        assert sys.gettrace() is None  # the trace is gone with it
        # Python's handler is back.
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.slow
def test_ctrl_c_in_kmp_train_is_one_line_and_status_130(tmp_path):
    # A hang detector, not a timing: the JAX run was still
    # training 60 s after its SIGINT.
    command = [
        *(sys.executable, "-m", "kmp_cli", "train", "cifar10"),
        *("--data=synthetic", "--synthetic_size=256", "--width=8"),
        *("--batch_size=32", "--steps=2", "--epochs=3", "--verbose=2"),
        f"--output_dir={tmp_path}",
    ]
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )
    after = None
    try:
        for text in process.stdout:
            if after is not None:
                after.append(text.rstrip("\n"))
            elif text.startswith("Epoch 2/3"):
                process.send_signal(signal.SIGINT)
                sent, after = time.monotonic(), []
        process.wait(timeout=60)
    finally:
        process.kill()
    assert after is not None, "no second epoch began"
    assert time.monotonic() - sent < 60
    assert process.returncode == 130
    # Epoch 2's line may come first, when the interrupt lands after its
    # last step: then two epochs are backed up.
    last = [line for line in after if not line.startswith("2/2 - ")]
    backup = os.path.join(tmp_path, "backup")
    assert last in (
        [
            f"kmp train cifar10: interrupted after {done} of 3 epochs, "
            f"backed up in {backup}: the same command resumes at epoch "
            f"{done + 1}."
        ]
        for done in (1, 2)
    )


def _logs_read_last():
    from keras.src.utils import python_utils

    return python_utils.pythonify_logs({"loss": _SignalsWhenRead()})


def test_the_interrupt_is_raised_where_the_caller_returns_at_once():
    with interrupts.handled(), pytest.raises(KeyboardInterrupt):
        _logs_read_last()  # no line left after the call: its return
    assert sys.gettrace() is None
