"""The doctor's progress lines (`kmp.doctor._progress`), and that
`kmp.diagnose` says each stage as it starts, or nothing when quiet."""

import re

import keras
import numpy as np
import pytest

import kmp
from kmp.doctor._progress import Progress


def test_a_step_is_said_as_it_starts_and_timed_as_it_ends(capsys):
    progress = Progress(verbose=True)
    with progress.step("batch 1/2: float32 pass"):
        started = capsys.readouterr().out
    assert started == "kmp doctor: batch 1/2: float32 pass ..."
    assert re.fullmatch(r" \d+ s\n", capsys.readouterr().out)


def test_a_failed_step_says_so_and_the_error_goes_on(capsys):
    with pytest.raises(ValueError, match="broken"):
        with Progress(verbose=True).step("counting"):
            raise ValueError("broken")
    assert capsys.readouterr().out == "kmp doctor: counting ... failed\n"


def test_a_quiet_progress_prints_nothing(capsys):
    progress = Progress(verbose=False)
    progress.say("anything")
    with progress.step("counting"):
        pass
    assert capsys.readouterr().out == ""


def _model():
    keras.utils.set_random_seed(0)
    with kmp.policy_scope("mixed_float16"):
        model = keras.Sequential(
            [keras.Input((4,)), keras.layers.Dense(2, name="head")]
        )
    model.compile(optimizer=kmp.wrap("sgd"), loss="mse")
    data = (np.ones((8, 4), "float32"), np.zeros((8, 2), "float32"))
    return model, data


def test_diagnose_says_each_stage_in_order(capsys):
    model, data = _model()
    kmp.diagnose(model, data, batches=2, batch_size=4)
    lines = capsys.readouterr().out.splitlines()
    stages = [
        re.sub(r" \d+ s$", "", line)
        for line in lines
        if line.startswith("kmp doctor: ")
    ]
    assert stages == [
        "kmp doctor: reading 2 batch(es) ...",
        "kmp doctor: batch 1/2: float32 pass ...",
        "kmp doctor: batch 1/2: mixed_float16 pass ...",
        "kmp doctor: batch 1/2: counting ...",
        "kmp doctor: batch 2/2: float32 pass ...",
        "kmp doctor: batch 2/2: mixed_float16 pass ...",
        "kmp doctor: batch 2/2: counting ...",
        "kmp doctor: verdicts ...",
    ]


def test_diagnose_is_quiet_when_asked(capsys):
    model, data = _model()
    kmp.diagnose(model, data, batches=1, batch_size=4, verbose=False)
    assert capsys.readouterr().out == ""
