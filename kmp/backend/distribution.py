"""Replicas under a distribution: which one is active, the processes of
a multi-process JAX job, and the reductions that keep every replica's
scaler in agreement.

Under `tf.distribute` each replica holds its own local gradients, so its
own finiteness verdict; these reduce them (`_tf_replicas`). On JAX the
gradients are global arrays and Keras's torch backend runs one replica,
so there is nothing to reduce.
"""

import keras

from kmp.backend._current import name


def distribution_name() -> str | None:
    """The active `tf.distribute` strategy or Keras distribution, if any."""
    if name() == "tensorflow":
        import tensorflow as tf

        if tf.distribute.has_strategy():
            return type(tf.distribute.get_strategy()).__name__
    distribution = keras.distribution.distribution()
    return None if distribution is None else type(distribution).__name__


def mesh() -> tuple | None:
    """`(shape, axis_names, batch_devices)` of the keras.distribution in
    force (JAX), `batch_devices` being the size of its batch axis; `None`
    without one."""
    distribution = keras.distribution.distribution()
    if distribution is None:
        return None
    device_mesh = distribution.device_mesh
    names = list(device_mesh.axis_names)
    batch = distribution.batch_dim_name
    batch_devices = device_mesh.shape[names.index(batch)] if batch else 1
    return tuple(device_mesh.shape), names, batch_devices


def layout_problems(variables) -> list[tuple[str, str]]:
    """`(path, problem)` for each variable the keras.distribution in force
    (JAX) does not hold as its layout says: a dimension the layout splits
    over a mesh axis whose size does not divide it (JAX refuses to place
    such a variable), or a variable on fewer devices than the mesh (made
    before the distribution was set: Keras applies no layout then, and
    says nothing). Empty without a distribution, and on the other
    backends."""
    if name() != "jax":
        return []
    distribution = keras.distribution.distribution()
    if distribution is None:
        return []
    mesh = distribution.device_mesh
    sizes = dict(zip(mesh.axis_names, mesh.shape))
    everywhere = len(mesh.devices.flatten())
    problems = []
    for variable in variables:
        layout = distribution.get_variable_layout(variable)
        for dim, (length, axis) in enumerate(zip(variable.shape, layout.axes)):
            if axis is not None and length % sizes[axis]:
                problems.append(
                    (
                        variable.path,
                        f"dimension {dim} ({length}) does not split over "
                        f"the {sizes[axis]} devices of axis {axis!r}",
                    )
                )
        sharding = getattr(variable.value, "sharding", None)
        if sharding is not None and len(sharding.device_set) < everywhere:
            problems.append(
                (
                    variable.path,
                    f"on {len(sharding.device_set)} of the mesh's "
                    f"{everywhere} devices",
                )
            )
    return problems


def join_processes(coordinator, num_processes, process_id, timeout):
    """Starts JAX's distributed runtime for this process (what
    `keras.distribution.initialize` does, with bounded waits): every
    process joins within `timeout` seconds, and one that stops sending
    heartbeats for `timeout` seconds ends the others (JAX aborts them,
    never a hang). `coordinator=None`: JAX detects the cluster (SLURM,
    Open MPI, Kubernetes, Cloud TPU). On CPUs the collectives go through
    gloo (JAX has none across processes otherwise).

    JAX's preemption service stays off: it takes SIGTERM from Python (its
    C++ handler replaces Python's), and a Keras job, which never asks it
    whether to stop, then trains on until the scheduler's SIGKILL, where
    Python's default would have ended it, and `kmp` commands stop in one
    line (exit status 143)."""
    import jax
    from keras.src.backend.jax import distribution_lib

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.config.update("jax_enable_preemption_service", False)
    seconds = max(int(-(-timeout // 1)), 1)  # JAX takes whole seconds
    jax.distributed.initialize(
        coordinator,
        num_processes,
        process_id,
        initialization_timeout=seconds,
        heartbeat_timeout_seconds=seconds,
        shutdown_timeout_seconds=seconds,
    )
    # The rest of Keras's initialize: one random seed for every process
    # (a no-op once keras.utils.set_random_seed has set one).
    distribution_lib.initialize_rng()


def runtime_started() -> bool:
    """Whether JAX's backends have started (too late to join processes);
    False on the other backends."""
    if name() != "jax":
        return False
    from jax._src import xla_bridge  # JAX has no public name for it

    return xla_bridge.backends_are_initialized()


def processes() -> tuple[int, int]:
    """`(process_id, num_processes)` of a multi-process JAX job; `(0, 1)`
    otherwise (TensorFlow's workers are `kmp.is_chief`'s)."""
    if name() != "jax":
        return 0, 1
    import jax

    if not jax.distributed.is_initialized():
        return 0, 1  # never starts JAX's backends: a join may follow
    return jax.process_index(), jax.process_count()


def gather_over_processes(value: int) -> list[int]:
    """Every process's `value`, in process order (a collective: every
    process calls it); `[value]` in a single process."""
    if processes()[1] == 1:
        return [value]
    import numpy as np
    from jax.experimental import multihost_utils

    gathered = multihost_utils.process_allgather(np.array([value], "int64"))
    return [int(v) for v in np.asarray(gathered).ravel()]


def all_replicas_agree(flag):
    """The AND of a boolean scalar over every replica on every worker.

    Under `tf.distribute`, each replica holds its own local gradients, so a
    local finiteness check can differ between replicas; this all-reduces
    it (`kmp.backend._tf_replicas`). On JAX the gradients are global arrays, and
    Keras's torch backend runs one replica, so `flag` already covers
    every device.
    """
    if name() != "tensorflow":
        return flag
    from kmp.backend import _tf_replicas

    return _tf_replicas.all_agree(flag)


def sum_over_replicas(grads):
    """All-reduces (sums) gradients over `tf.distribute` replicas.

    Returns:
        `(grads, replicas)`: the summed gradients and the number of
        replicas in sync; the gradients unchanged and 1 outside a
        multi-replica `tf.distribute` replica context (and on JAX and
        torch, see `all_replicas_agree`).
    """
    if name() != "tensorflow":
        return list(grads), 1
    from kmp.backend import _tf_replicas

    return _tf_replicas.sum_over_replicas(grads)


def max_over_replicas(values):
    """The elementwise maximum of each tensor over `tf.distribute`
    replicas (the statistic of the global batch, where each replica saw
    its own part); unchanged outside a multi-replica replica context, and
    on JAX and torch (see `all_replicas_agree`)."""
    if name() != "tensorflow":
        return list(values)
    from kmp.backend import _tf_replicas

    return _tf_replicas.max_over_replicas(values)
