"""Many processes on JAX: `keras.distribution.initialize`, with the waits
bounded and the mistakes said.

Keras's `keras.distribution.initialize(job_addresses, num_processes,
process_id)` starts JAX's distributed runtime. Where a process never
comes, JAX waits five minutes and then aborts every process with a C++
check failure ("DEADLINE_EXCEEDED ... RegisterTask") that names no
process and no fix (BUILD_NOTES, defect 27).
`initialize_processes` first meets every process at the coordinator's
address (a plain TCP handshake, the way `kmp.multi_worker_strategy`
waits for TensorFlow's workers), so a missing, duplicated or mismatched
process is an `InputError` in Python within `timeout` seconds on every
process that came, naming the ids. Then it starts JAX's runtime with the
same bound on joining and on a process that stops answering (JAX ends
the others: never a hang), and Keras's shared random seed.
"""

import os
import socket
import time

from kmp import backend
from kmp.distributed.cluster import _host_and_port
from kmp.errors import InputError

# Keras's environment variables (what `keras.distribution.initialize`
# reads when an argument is not given).
ENV_ADDRESSES = "KERAS_DISTRIBUTION_JOB_ADDRESSES"
ENV_NUM_PROCESSES = "KERAS_DISTRIBUTION_NUM_PROCESSES"
ENV_PROCESS_ID = "KERAS_DISTRIBUTION_PROCESS_ID"
_HOW = (
    "start each process with the same coordinator and num_processes and "
    "its own process_id (kmp train: --coordinator=HOST:PORT "
    "--num_processes=N --process_id=I)"
)


def _integer(value, name, low):
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = None
    if number is None or isinstance(value, bool) or number < low:
        raise InputError(
            f"{name} must be an integer >= {low}, got {value!r}; {_HOW}."
        )
    return number


def _address(coordinator):
    parts = _host_and_port(coordinator)
    if parts is None:
        raise InputError(
            f"coordinator is {coordinator!r}; it must be HOST:PORT, process "
            "0's address and a free port on it (e.g. 10.0.0.1:1234), or "
            "'auto' on a cluster JAX detects (SLURM, Open MPI, Kubernetes, "
            "Cloud TPU)."
        )
    return parts


def _resolve(coordinator, num_processes, process_id):
    """The arguments, or Keras's environment variables where not given."""
    if coordinator is None:
        addresses = os.environ.get(ENV_ADDRESSES, "")
        coordinator = addresses.split(",")[0].strip() or None
    if num_processes is None:
        num_processes = os.environ.get(ENV_NUM_PROCESSES) or None
    if process_id is None:
        process_id = os.environ.get(ENV_PROCESS_ID) or None
    return coordinator, num_processes, process_id


def _meet_as_coordinator(port, num_processes, timeout):
    """Process 0: accepts every other process at `port` within `timeout`,
    checks that their ids are distinct and their counts agree, then lets
    them all go on (or tells them all what is wrong)."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind(("", port))
    except OSError as error:
        raise InputError(
            f"process 0 cannot listen on port {port} ({error.strerror}): "
            "the coordinator's port must be free on process 0's machine; "
            "pick another."
        ) from None
    listener.listen(num_processes)
    deadline = time.monotonic() + timeout
    joined, problem = {}, None
    try:
        while len(joined) < num_processes - 1 and problem is None:
            listener.settimeout(max(deadline - time.monotonic(), 0.01))
            try:
                peer, _ = listener.accept()
            except TimeoutError:
                break
            peer.settimeout(max(deadline - time.monotonic(), 1.0))
            try:
                words = peer.makefile().readline().split()
            except OSError:
                peer.close()
                continue
            if (
                len(words) != 3
                or words[0] != "kmp"
                or not (words[1].isdigit() and words[2].isdigit())
            ):
                peer.close()  # not one of ours
                continue
            their_id, their_count = int(words[1]), int(words[2])
            if their_count != num_processes:
                problem = (
                    f"process {their_id} says num_processes={their_count}, "
                    f"process 0 says {num_processes}"
                )
            elif their_id in joined or their_id == 0:
                problem = f"two processes say process_id={their_id}"
            joined[their_id if problem is None else -1 - len(joined)] = peer
        missing = sorted(set(range(1, num_processes)) - set(joined))
        if problem is None and missing:
            problem = (
                f"process(es) {', '.join(map(str, missing))} of "
                f"{num_processes} did not join within {timeout:g} s"
            )
        answer = "go" if problem is None else f"error {problem}"
        for peer in joined.values():
            try:
                peer.sendall((answer + "\n").encode())
                peer.recv(1)  # it closes first (its side keeps TIME_WAIT)
            except OSError:
                pass
            peer.close()
    finally:
        listener.close()
    if problem:
        raise InputError(f"{problem} (coordinator port {port}): {_HOW}.")


def _meet_as_peer(host, port, process_id, num_processes, timeout):
    """Process `process_id` > 0: joins process 0 at `host:port` and waits
    for it to say that every process came."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            connection = socket.create_connection(
                (host, port), timeout=max(deadline - time.monotonic(), 0.1)
            )
            break
        except OSError:
            if time.monotonic() > deadline:
                raise InputError(
                    f"process {process_id}: the coordinator {host}:{port} "
                    f"(process 0) did not answer within {timeout:g} s; "
                    f"{_HOW}, process 0 included."
                ) from None
            time.sleep(0.2)
    with connection:
        connection.settimeout(max(deadline - time.monotonic(), 1.0))
        connection.sendall(f"kmp {process_id} {num_processes}\n".encode())
        try:
            answer = connection.makefile().readline().strip()
        except OSError:
            answer = ""
    if answer.startswith("error "):
        raise InputError(f"{answer[6:]} (said by process 0): {_HOW}.")
    if answer != "go":
        raise InputError(
            f"process {process_id}: process 0 at {host}:{port} did not say "
            f"that every process joined within {timeout:g} s; {_HOW}."
        )


def initialize_processes(
    coordinator=None, num_processes=None, process_id=None, timeout=300.0
):
    """Joins this process to a multi-process JAX job.

    What `keras.distribution.initialize` does (JAX's distributed runtime,
    then one random seed for every process), after every process has met
    at the coordinator: a process that never comes, two that give the
    same id, or counts that disagree end every process that came with an
    `InputError` within `timeout` seconds. Afterwards a process that
    stops answering for `timeout` seconds ends the others too. Call it
    first, before anything runs on JAX; then set a
    `keras.distribution` over `keras.distribution.list_devices()` (every
    process's devices). On CPUs the collectives run over gloo. A SIGTERM
    (a scheduler's stop) reaches Python as it would without JAX: JAX's
    preemption service, which would take it and train on until the
    SIGKILL, stays off.

    Args:
        coordinator: Process 0's `"HOST:PORT"` (a free port there), or
            `"auto"` where JAX detects the cluster (SLURM, Open MPI,
            Kubernetes, Cloud TPU). Default: Keras's
            `KERAS_DISTRIBUTION_JOB_ADDRESSES` (its first address).
        num_processes: How many processes the job has. Default:
            `KERAS_DISTRIBUTION_NUM_PROCESSES`.
        process_id: This process's id, 0 to `num_processes - 1`; 0 is
            the chief, which writes files (`kmp.is_chief`). Default:
            `KERAS_DISTRIBUTION_PROCESS_ID`.
        timeout: Seconds to wait for every process, and for one that
            stopped answering.

    Returns:
        `(process_id, num_processes)`.

    Raises:
        kmp.InputError: Not on JAX, a bad or missing argument, JAX
            already started, or a process missing or mismatched.

    Example:

    ```python
    # On each of 2 machines, with its own process_id:
    kmp.initialize_processes("10.0.0.1:1234", num_processes=2, process_id=0)
    keras.distribution.set_distribution(keras.distribution.DataParallel())
    ```
    """
    if backend.name() != "jax":
        raise InputError(
            "initialize_processes starts JAX's distributed runtime "
            f"(KERAS_BACKEND=jax); the backend is {backend.name()!r}. On "
            "TensorFlow use kmp.multi_worker_strategy() with TF_CONFIG."
        )
    coordinator, num_processes, process_id = _resolve(
        coordinator, num_processes, process_id
    )
    if not timeout > 0:
        raise InputError(f"timeout must be > 0 seconds, got {timeout!r}.")
    if coordinator == "auto":  # JAX reads the cluster's environment
        return _join(None, None, None, timeout)
    if coordinator is None:
        raise InputError(
            "initialize_processes needs the coordinator's HOST:PORT (or "
            f"{ENV_ADDRESSES}); {_HOW}."
        )
    host, port = _address(coordinator)
    num_processes = _integer(num_processes, "num_processes", 1)
    process_id = _integer(process_id, "process_id", 0)
    if process_id >= num_processes:
        raise InputError(
            f"process_id={process_id} with num_processes={num_processes}: "
            f"the ids are 0..{num_processes - 1}, one per process."
        )
    now = backend.processes()
    if now[1] > 1 or backend.runtime_started():
        if now == (process_id, num_processes):
            return now  # joined already (a second call is a no-op)
        raise InputError(
            "JAX has started already (something ran on it, or another "
            "initialize_processes joined it as process "
            f"{now[0]} of {now[1]}): call initialize_processes first, "
            "before anything is built or run."
        )
    if num_processes > 1:
        if process_id == 0:
            _meet_as_coordinator(port, num_processes, timeout)
        else:
            _meet_as_peer(host, port, process_id, num_processes, timeout)
    return _join(coordinator, num_processes, process_id, timeout)


def _join(coordinator, num_processes, process_id, timeout):
    backend.join_processes(coordinator, num_processes, process_id, timeout)
    return backend.processes()
