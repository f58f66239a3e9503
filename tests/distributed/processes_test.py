"""Many JAX processes: `kmp.initialize_processes`, the meeting at the
coordinator, and the examples trained by 2 processes on 127.0.0.1."""

import concurrent.futures
import os
import shutil
import subprocess
import sys
import threading
import time

import pytest
from util import HERE
from util import free_ports
from util import jax_only
from util import run_processes
from util import script_result

import kmp
from kmp.distributed import processes

SCRIPT = os.path.join(HERE, "jax_processes.py")


# ---------------------------------------------------------------- the meeting


def meet(ids, count, timeout=5.0):
    """Runs the meeting for processes `ids` (0 among them or not) of a job
    of `count`, each in a thread; returns each one's error text, or None."""
    (port,) = free_ports(1)
    errors = {}

    def one(process_id):
        try:
            if process_id == 0:
                processes._meet_as_coordinator(port, count, timeout)
            else:
                processes._meet_as_peer(
                    "127.0.0.1", port, process_id, count, timeout
                )
            errors[process_id] = None
        except kmp.InputError as error:
            errors[process_id] = str(error)

    threads = [threading.Thread(target=one, args=(i,)) for i in ids]
    for thread in threads:
        thread.start()
        time.sleep(0.05)  # process 0 listens first, usually
    for thread in threads:
        thread.join(timeout + 10)
    return errors


@pytest.mark.backend_independent
def test_every_process_comes_and_every_one_goes_on():
    assert meet([1, 0, 2], 3) == {0: None, 1: None, 2: None}


@pytest.mark.backend_independent
def test_a_process_that_never_comes_ends_the_others_in_bounded_time():
    start = time.monotonic()
    errors = meet([0, 1], 3, timeout=1.0)
    assert time.monotonic() - start < 8
    assert "process(es) 2 of 3 did not join within 1 s" in errors[0]
    assert "(said by process 0)" in errors[1]
    assert "--process_id=I" in errors[0]


@pytest.mark.backend_independent
def test_a_missing_coordinator_is_said_by_the_peer():
    errors = meet([1], 2, timeout=1.0)
    assert "coordinator 127.0.0.1:" in errors[1]
    assert "did not answer within 1 s" in errors[1]


@pytest.mark.backend_independent
def test_two_processes_with_one_id_are_refused_on_every_process():
    errors = meet([0, 1, 1], 3)
    assert "two processes say process_id=1" in errors[0]
    assert all("two processes say process_id=1" in e for e in errors.values())


@pytest.mark.backend_independent
def test_counts_that_disagree_are_refused():
    (port,) = free_ports(1)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        coordinator = pool.submit(processes._meet_as_coordinator, port, 2, 5.0)
        time.sleep(0.05)
        peer = pool.submit(
            processes._meet_as_peer, "127.0.0.1", port, 1, 3, 5.0
        )
        for future in (coordinator, peer):
            with pytest.raises(kmp.InputError, match="num_processes=3"):
                future.result()


# ---------------------------------------------------------- bad arguments


@jax_only
@pytest.mark.parametrize(
    "args, phrase",
    [
        (("10.0.0.1", 2, 0), "must be HOST:PORT"),
        (("10.0.0.1:99999", 2, 0), "must be HOST:PORT"),
        (("10.0.0.1:1234", 2, 2), "the ids are 0..1"),
        (("10.0.0.1:1234", 0, 0), "num_processes must be an integer >= 1"),
        (("10.0.0.1:1234", "two", 0), "num_processes must be an integer"),
        ((None, 2, 0), "needs the coordinator's HOST:PORT"),
    ],
)
def test_bad_arguments_are_said_before_anything_waits(
    args, phrase, monkeypatch
):
    monkeypatch.delenv(processes.ENV_ADDRESSES, raising=False)
    with pytest.raises(kmp.InputError, match=phrase):
        kmp.initialize_processes(*args, timeout=1)


@jax_only
def test_keras_environment_fills_what_is_not_given(monkeypatch):
    monkeypatch.setenv(processes.ENV_ADDRESSES, "10.0.0.1:1234,10.0.0.2:1234")
    monkeypatch.setenv(processes.ENV_NUM_PROCESSES, "2")
    monkeypatch.setenv(processes.ENV_PROCESS_ID, "1")
    assert processes._resolve(None, None, None) == ("10.0.0.1:1234", "2", "1")
    assert processes._resolve("h:1", 3, 0) == ("h:1", 3, 0)


@jax_only
def test_joining_after_jax_has_run_is_refused():
    import jax.numpy as jnp

    jnp.zeros(1).block_until_ready()  # JAX has started in this process
    with pytest.raises(kmp.InputError, match="call initialize_processes first"):
        kmp.initialize_processes("127.0.0.1:1234", 2, 1, timeout=1)


@pytest.mark.skipif(kmp.backend.name() == "jax", reason="not JAX")
def test_other_backends_are_pointed_to_their_engine():
    with pytest.raises(kmp.InputError, match="multi_worker_strategy"):
        kmp.initialize_processes("127.0.0.1:1234", 2, 0)


# ------------------------------------------------------- 2 real processes


def two(mode, *args, timeout=240, check=True):
    """Runs `tests/jax_processes.py MODE` as processes 0 and 1: their
    results, or with `check=False` their `(returncode, stdout, stderr)`."""
    (port,) = free_ports(1)
    outputs = run_processes(
        [[SCRIPT, mode, str(i), str(port), *map(str, args)] for i in (0, 1)],
        [{}, {}],
        timeout=timeout,
        backend="jax",
        check=check,
    )
    return [script_result(out) for out in outputs] if check else outputs


@pytest.mark.slow
@jax_only
def test_one_process_overflowing_makes_every_process_skip():
    ranks = two("scaler")
    # Each fed its own half of every global batch of 16, over 4 devices.
    assert [r["rows"] for r in ranks] == [32, 32]
    assert ranks[0]["first_row"] != ranks[1]["first_row"]
    assert [r["batch_devices"] for r in ranks] == [4, 4]
    for r in ranks:  # process 1's inf at step 2: both skip it
        assert r["monitor_scales"] == [1024.0, 1024.0, 512.0, 512.0]
        assert (r["skipped"], r["iterations"], r["scale"]) == (1, 3, 512.0)
        assert r["finite"]
    assert ranks[0]["weights"] == ranks[1]["weights"]


@pytest.mark.slow
@jax_only
def test_two_processes_train_as_one_resume_alike_and_write_once(tmp_path):
    # Stopped after epoch 1 (every process, its backup made), then rerun:
    # each process resumes from its own backup at epoch 2.
    out = tmp_path / "two"
    assert [r["stopped"] for r in two("train", out, 2, 1)] == [1, 1]
    assert sorted(os.listdir(out)) == ["backup", "backup_process_1"]
    # Process 1's backup gone (as if it was killed before making it):
    # a rerun of that copy is refused on every process.
    refused = tmp_path / "refused"
    shutil.copytree(out, refused)
    shutil.rmtree(refused / "backup_process_1")
    ranks = two("train", out, 2)
    # As one process of 4 devices would, on the same global batches,
    # uninterrupted: the resumed run's record holds both epochs.
    one = run_processes(
        [[SCRIPT, "one", "0", "0", str(tmp_path / "one"), "2"]],
        [{}],
        timeout=240,
        backend="jax",
    )
    alone = script_result(one[0])
    assert [r["processes"] for r in ranks] == [2, 2]
    assert [r["replicas"] for r in ranks] == [4, 4]
    assert [r["chief"] for r in ranks] == [True, False]
    assert [r["epochs"] for r in ranks] == [2, 2]
    assert ranks[0]["step_losses"] == ranks[1]["step_losses"]
    assert len(ranks[0]["step_losses"]) == 4
    assert ranks[0]["step_losses"] == pytest.approx(alone["step_losses"], 1e-5)
    assert set(ranks[0]["files"]) == {
        "imdb.keras",
        "results.json",
        "results.png",
    }
    loaded = kmp.load_model(str(out / "imdb.keras"))
    assert loaded.count_params() > 0

    outputs = two("train", refused, 2, timeout=200, check=False)
    for _, _, stderr in outputs:
        assert "resume at different epochs" in stderr
        assert "process 0: 1 epoch(s) done, process 1: 0 epoch(s) done" in (
            stderr
        )
    assert [code != 0 for code, _, _ in outputs] == [True, True]


@pytest.mark.slow
@jax_only
def test_a_process_that_never_comes_ends_the_job_within_its_timeout():
    (port,) = free_ports(1)
    start = time.monotonic()
    result = subprocess.run(
        [sys.executable, SCRIPT, "alone", "0", str(port)],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, KERAS_BACKEND="jax"),
    )
    result = script_result(result.stdout)
    assert "process(es) 1 of 2 did not join within 3 s" in result["error"]
    assert result["seconds"] < 10
    assert time.monotonic() - start < 60


@pytest.mark.slow
@jax_only
def test_a_process_that_dies_ends_the_other_within_a_bounded_time(tmp_path):
    start = time.monotonic()
    # Process 1 dies after epoch 1 of 3.
    outputs = two("train", tmp_path, 3, -1, timeout=200, check=False)
    # The survivor ends (its next collective fails, or JAX's heartbeat
    # check aborts it after --process_timeout=20 s), never hangs.
    assert [code != 0 for code, _, _ in outputs] == [True, True]
    assert time.monotonic() - start < 150
    assert "RESULT" not in outputs[0][1]
