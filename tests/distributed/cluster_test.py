"""TF_CONFIG checks, the chief, and the bounded wait for workers."""

import json
import socket
import time

import pytest
from util import not_tf
from util import tf_only

import kmp
from kmp import backend
from kmp.distributed import cluster

WORKERS = {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}


def config(cluster_spec=None, kind="worker", index=0):
    return json.dumps(
        {
            "cluster": cluster_spec or WORKERS,
            "task": {"type": kind, "index": index},
        }
    )


@pytest.mark.backend_independent
def test_unset_tf_config_is_a_single_worker_job(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    assert kmp.parse_tf_config() is None
    assert kmp.is_chief()


@pytest.mark.backend_independent
def test_valid_tf_config_is_returned(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", config(index=1))
    assert kmp.parse_tf_config()["task"] == {"type": "worker", "index": 1}
    assert not kmp.is_chief()


@pytest.mark.backend_independent
@pytest.mark.parametrize(
    "cluster_spec, kind, index, chief",
    [
        (WORKERS, "worker", 0, True),
        (WORKERS, "worker", 1, False),
        ({"chief": ["h:1"], "worker": ["h:2"]}, "chief", 0, True),
        ({"chief": ["h:1"], "worker": ["h:2"]}, "worker", 0, False),
    ],
)
def test_chief_is_the_chief_task_or_worker_zero(
    cluster_spec, kind, index, chief
):
    parsed = kmp.parse_tf_config(config(cluster_spec, kind, index))
    assert kmp.is_chief(parsed) is chief


@pytest.mark.backend_independent
@pytest.mark.parametrize(
    "text, message",
    [
        ("{cluster: 1}", "not valid JSON"),
        ("[]", "no 'cluster'"),
        (json.dumps({"cluster": WORKERS}), "no 'task'"),
        (config({"worker": "h:1"}), "non-empty list"),
        (config({"worker": ["h"]}), '"host:port"'),
        (config({"worker": ["h:99999"]}), "1..65535"),
        (config({"ps": ["h:1"], "worker": ["h:2"]}), "ParameterServer"),
        (config({"master": ["h:1"]}), "job 'master'"),
        (config({"evaluator": ["h:1"]}, "evaluator"), "no 'worker'"),
        (config(kind="chief"), "task type is 'chief'"),
        (config(index=2), "index is 2"),
        (config(index="0"), "index is '0'"),
        (config(index=True), "index is True"),
    ],
)
def test_malformed_tf_config_says_what_is_wrong(text, message):
    with pytest.raises(ValueError, match="TF_CONFIG") as error:
        kmp.parse_tf_config(text)
    assert message in str(error.value)


@tf_only
def test_multi_worker_strategy_rejects_malformed_tf_config_at_once(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", '{"cluster": ')
    start = time.monotonic()
    with pytest.raises(ValueError, match="not valid JSON"):
        kmp.multi_worker_strategy()
    assert time.monotonic() - start < 5


@pytest.mark.backend_independent
@pytest.mark.parametrize("timeout", [0, -1, "60", None])
def test_multi_worker_strategy_rejects_a_bad_timeout(timeout):
    with pytest.raises(ValueError, match="timeout must be a positive"):
        kmp.multi_worker_strategy(timeout=timeout)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.backend_independent
def test_wait_for_peers_names_the_missing_worker_after_the_timeout():
    own, missing = _free_port(), _free_port()
    parsed = kmp.parse_tf_config(
        config({"worker": [f"127.0.0.1:{own}", f"127.0.0.1:{missing}"]})
    )
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=f"127.0.0.1:{missing}"):
        cluster._wait_for_peers(parsed, timeout=1.0)
    assert time.monotonic() - start < 10


@pytest.mark.backend_independent
def test_wait_for_peers_returns_once_the_peer_listens():
    own = _free_port()
    with socket.socket() as peer:
        peer.bind(("127.0.0.1", 0))
        peer.listen()
        port = peer.getsockname()[1]
        parsed = kmp.parse_tf_config(
            config({"worker": [f"127.0.0.1:{own}", f"127.0.0.1:{port}"]})
        )
        start = time.monotonic()
        cluster._wait_for_peers(parsed, timeout=10.0)
        assert time.monotonic() - start < 5  # not the whole timeout
        # It returned because it reached the peer: its connection waits.
        peer.settimeout(5)
        connection, _ = peer.accept()
        connection.close()


@pytest.mark.backend_independent
def test_a_busy_own_port_is_a_clear_error():
    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen()
        port = busy.getsockname()[1]
        parsed = kmp.parse_tf_config(
            config({"worker": [f"127.0.0.1:{port}", "127.0.0.1:1"]})
        )
        with pytest.raises(ValueError, match=f"port {port} cannot be opened"):
            cluster._wait_for_peers(parsed, timeout=1.0)


@not_tf
def test_multi_worker_strategy_needs_the_tensorflow_backend():
    instead = {
        "jax": "keras.distribution.DataParallel",
        "torch": "torch.nn.parallel.DistributedDataParallel",
    }[backend.name()]
    with pytest.raises(ValueError, match="KERAS_BACKEND=tensorflow") as error:
        kmp.multi_worker_strategy()
    assert instead in str(error.value)


@tf_only
def test_a_worker_that_never_comes_up_is_a_timeout_error(monkeypatch):
    # The check comes before TensorFlow's strategy exists, so it runs in
    # this process; TensorFlow alone would block forever.
    workers = [f"127.0.0.1:{_free_port()}", f"127.0.0.1:{_free_port()}"]
    monkeypatch.setenv("TF_CONFIG", config({"worker": workers}))
    start = time.monotonic()
    with pytest.raises(TimeoutError) as error:
        kmp.multi_worker_strategy(timeout=3)
    assert "did not come up" in str(error.value)
    assert "127.0.0.1" in str(error.value)
    assert time.monotonic() - start < 60
