"""The cluster a multi-worker job runs on: `TF_CONFIG`, the chief, and a
bounded wait for the other workers.

`tf.distribute.MultiWorkerMirroredStrategy()` reads `TF_CONFIG` with
TensorFlow's own parser (errors that name no field) and, when a worker
never comes up, blocks forever in its constructor. `kmp.multi_worker_strategy`
checks the config first and waits a bounded time; `kmp.distribute` (in
`kmp/distributed/fit.py`) then makes `model.fit` work under the strategy.
"""

import json
import logging
import os
import socket
import time

from kmp import backend
from kmp.errors import InputError

logger = logging.getLogger("kmp")

_TF_CONFIG_EXAMPLE = (
    '{"cluster": {"worker": ["host1:12345", "host2:12345"]}, '
    '"task": {"type": "worker", "index": 0}}'
)
_TASK_TYPES = ("chief", "worker")


def _host_and_port(address) -> tuple[str, int] | None:
    """`(host, port)` of a `"host:port"` (a port in 1..65535; an IPv6
    host may be bracketed), or `None` when it is not one."""
    host, sep, port = str(address).rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    return host.strip("[]"), int(port)


def _split_address(address, where):
    parts = _host_and_port(address)
    if parts is None:
        raise InputError(
            f"TF_CONFIG lists {address!r} in {where}; each address must be "
            '"host:port" with a port in 1..65535, e.g. "10.0.0.2:12345".'
        )
    return parts


def parse_tf_config(text: str | None = None) -> dict | None:
    """Checks a `TF_CONFIG` and returns it as a dict.

    Args:
        text: The JSON text; by default the `TF_CONFIG` environment
            variable.

    Returns:
        The parsed config, or `None` when `TF_CONFIG` is unset or empty
        (a single-worker job).

    Raises:
        ValueError: saying what is wrong and what a valid one looks like.
    """
    if text is None:
        text = os.environ.get("TF_CONFIG", "")
    if not text.strip():
        return None
    hint = f"A valid TF_CONFIG looks like {_TF_CONFIG_EXAMPLE}."
    try:
        config = json.loads(text)
    except json.JSONDecodeError as error:
        raise InputError(
            f"TF_CONFIG is not valid JSON ({error}): {text!r}. {hint}"
        ) from None
    if not isinstance(config, dict) or not isinstance(
        config.get("cluster"), dict
    ):
        raise InputError(f"TF_CONFIG has no 'cluster' object: {text!r}. {hint}")
    cluster = config["cluster"]
    if "ps" in cluster:
        raise InputError(
            "TF_CONFIG has 'ps' tasks: that is ParameterServerStrategy, "
            "which kmp.distribute does not support. Use 'chief'/'worker' "
            f"tasks only. {hint}"
        )
    for job, addresses in cluster.items():
        if job not in _TASK_TYPES + ("evaluator",):
            raise InputError(
                f"TF_CONFIG's cluster has a job {job!r}; allowed: 'chief', "
                f"'worker', 'evaluator'. {hint}"
            )
        if not isinstance(addresses, list) or not addresses:
            raise InputError(
                f"TF_CONFIG's cluster[{job!r}] must be a non-empty list of "
                f'"host:port" strings, got {addresses!r}. {hint}'
            )
        for address in addresses:
            _split_address(address, f"cluster[{job!r}]")
    if not any(job in cluster for job in _TASK_TYPES):
        raise InputError(f"TF_CONFIG's cluster has no 'worker' list. {hint}")
    task = config.get("task")
    if not isinstance(task, dict):
        raise InputError(f"TF_CONFIG has no 'task' object: {text!r}. {hint}")
    kind, index = task.get("type"), task.get("index")
    if kind not in cluster:
        raise InputError(
            f"TF_CONFIG's task type is {kind!r}, which is not a job of its "
            f"cluster ({sorted(cluster)}). {hint}"
        )
    if (
        not isinstance(index, int)
        or isinstance(index, bool)
        or not 0 <= index < len(cluster[kind])
    ):
        raise InputError(
            f"TF_CONFIG's task index is {index!r}, but cluster[{kind!r}] has "
            f"{len(cluster[kind])} address(es): the index must be an integer "
            f"in 0..{len(cluster[kind]) - 1}, different on each process."
        )
    return config


def is_chief(config: dict | None = None) -> bool:
    """Whether this process is the chief (the worker that writes files).

    The chief is the `"chief"` task, or worker 0 when the cluster has none;
    in a multi-process JAX job (`kmp.initialize_processes`), process 0; a
    job of one process is its own chief.

    Args:
        config: A parsed `TF_CONFIG`; by default the environment's.
    """
    if config is None:
        config = parse_tf_config()
    if config is None:
        return backend.processes()[0] == 0
    kind, index = config["task"]["type"], config["task"]["index"]
    if "chief" in config["cluster"]:
        return kind == "chief"
    return kind == "worker" and index == 0


def _wait_for_peers(config, timeout):
    """Returns once every other chief/worker task accepts a connection.

    TensorFlow's strategy constructor blocks forever (holding the GIL, so
    no Python timer can interrupt it) when a worker is missing. So each
    worker first listens on its own port, unaccepted (the kernel completes
    the handshake), and connects to every peer's port until all answer or
    `timeout` passes. A peer that is further along answers from
    TensorFlow's own server on the same port.
    """
    kind, index = config["task"]["type"], config["task"]["index"]
    own = config["cluster"][kind][index]
    peers = [
        address
        for job in _TASK_TYPES
        for i, address in enumerate(config["cluster"].get(job, []))
        if (job, i) != (kind, index)
    ]
    _, port = _split_address(own, "its own task")
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind(("", port))
    except OSError as error:
        listener.close()
        raise InputError(
            f"This worker's address in TF_CONFIG is {own}, but port {port} "
            f"cannot be opened ({error}). Another process holds it: give "
            "this task a free port."
        ) from None
    listener.listen(64)
    pending = list(peers)
    deadline = time.monotonic() + timeout
    try:
        while pending and time.monotonic() < deadline:
            for address in list(pending):
                try:
                    socket.create_connection(
                        _split_address(address, "cluster"), timeout=1.0
                    ).close()
                    pending.remove(address)
                except OSError:
                    pass
            if pending:
                time.sleep(0.2)
    finally:
        listener.close()
    if pending:
        raise TimeoutError(
            f"Waited {timeout:g} s for the worker(s) at {pending} listed in "
            "TF_CONFIG; they did not come up. Start every task of the "
            "cluster (same 'cluster', its own 'task' index), check that "
            "the hosts can reach each other on those ports, or pass a "
            "larger `timeout`."
        )


def multi_worker_strategy(timeout: float = 120.0, communication_options=None):
    """Creates a `tf.distribute.MultiWorkerMirroredStrategy` safely.

    Checks `TF_CONFIG` first (a clear `ValueError` instead of TensorFlow's
    parse errors) and waits at most `timeout` seconds for every other
    worker to come up (a `TimeoutError` naming the missing ones instead of
    a hang). Without `TF_CONFIG` it returns a one-worker strategy, so the
    same script runs on a laptop.

    Args:
        timeout: Seconds to wait for the other workers.
        communication_options: Passed to the strategy, e.g.
            `tf.distribute.experimental.CommunicationOptions(
            implementation=tf.distribute.experimental.
            CommunicationImplementation.NCCL)` on GPUs.

    Returns:
        The strategy. Build and compile the model in its `scope()`, then
        call `kmp.distribute(model)`.

    Example:

    ```python
    strategy = kmp.multi_worker_strategy()
    with strategy.scope():
        model = make_model()
        model.compile(optimizer=kmp.wrap("adam"), loss="...")
    kmp.distribute(model)
    model.fit(dataset, epochs=10, callbacks=[
        keras.callbacks.BackupAndRestore("/shared/backup")])
    ```
    """
    if not isinstance(timeout, (int, float)) or not timeout > 0:
        raise InputError(
            f"timeout must be a positive number of seconds, got {timeout!r}."
        )
    require_tensorflow("kmp.multi_worker_strategy")
    import tensorflow as tf

    config = parse_tf_config()
    if config is None:
        logger.info("kmp: TF_CONFIG is not set; training on this machine.")
    else:
        if config["task"]["type"] not in _TASK_TYPES:
            raise InputError(
                f"This task is an {config['task']['type']!r}; "
                "multi_worker_strategy runs on 'chief' and 'worker' tasks."
            )
        _wait_for_peers(config, timeout)
    return tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=communication_options
    )


# What a user of each other backend does instead of tf.distribute.
_INSTEAD = {
    "jax": "On JAX, use keras.distribution.DataParallel (kmp train "
    "--distribution=data) or ModelParallel (--distribution=model): kmp's "
    "loss scaler works under them as is.",
    "torch": "Keras's torch backend has no multi-device fit: in a custom "
    "loop, wrap the model in torch.nn.parallel.DistributedDataParallel "
    "(keras.io, 'Multi-GPU distributed training with PyTorch'). It "
    "averages the gradients in backward, so kmp.LossScaleOptimizer sees "
    "the same gradients, and skips the same steps, on every process.",
}


def require_tensorflow(what):
    """Refuses, in one line, a tf.distribute feature on another backend,
    saying what to use there instead."""
    if backend.name() != "tensorflow":
        raise InputError(
            f"{what} is for tf.distribute strategies and needs "
            f"KERAS_BACKEND=tensorflow; the backend is {backend.name()!r}. "
            + _INSTEAD.get(backend.name(), "")
        )
