"""Where the replicas are: each backend's engine, and each process's
share of the data.

TensorFlow's `tf.distribute` strategies (`make_strategy`, `scope`,
`prepare`), Keras's `keras.distribution` on JAX (`make_distribution`,
its mesh and the batch split, `batch_replicas`), the processes of a
multi-process JAX job (`start_processes`), and the rows each process
feeds (`process_share`, `local_batch_size`, and `fit_arguments`, that
share as `fit` takes it). `kmp.app.run.Run` calls these for the
examples; `--distribution=model` splits the kernels an example's config
names (its `LAYOUT`, `layout_map`).
"""

import contextlib
import os

import keras
import numpy as np

import kmp
from kmp import backend


def make_strategy(name: str):
    """A `tf.distribute` strategy for `name`, or `None`. TensorFlow only:
    on JAX the engine is keras.distribution (`make_distribution`), and
    Keras's torch backend has neither."""
    if name == "none":
        return None
    backend = keras.backend.backend()
    if backend == "jax":
        raise kmp.InputError(
            f"strategy={name} is TensorFlow's tf.distribute; on JAX use "
            "--distribution=data (every device holds the model, the batch "
            "is split) or --distribution=model (the kernels are split too)."
        )
    if backend != "tensorflow":
        raise kmp.InputError(
            f"strategy={name} needs KERAS_BACKEND=tensorflow (it is "
            f"{backend!r}): Keras's torch backend has no multi-device fit "
            "(README, Beyond one machine)."
        )
    import tensorflow as tf

    if name == "mirrored":
        strategy = tf.distribute.MirroredStrategy()
    else:
        strategy = kmp.multi_worker_strategy()
    # A batch that does not split over the replicas is refused by
    # kmp.distribute when fit starts (see `prepare`).
    return strategy


# The mesh's axes under --distribution=model: the batch is split over
# "batch", the kernels an example's layout names over "model".
MODEL_AXIS = 2


def start_processes(config) -> tuple[int, int]:
    """Joins a multi-process JAX job (`kmp.initialize_processes`) when
    `--coordinator` or Keras's `KERAS_DISTRIBUTION_*` environment names
    one; returns `(process_id, num_processes)`. Call it first: JAX cannot
    join once it has run anything. Again later, a no-op."""
    from_env = os.environ.get("KERAS_DISTRIBUTION_JOB_ADDRESSES")
    if not (config.coordinator or config.num_processes > 1 or from_env):
        return 0, 1
    if config.distribution == "none":  # flags are checked; this is the env
        raise kmp.InputError(
            "KERAS_DISTRIBUTION_JOB_ADDRESSES names a multi-process job, "
            "which needs --distribution=data or model."
        )
    if config.coordinator:
        return kmp.initialize_processes(
            config.coordinator,
            config.num_processes,
            config.process_id,
            timeout=config.process_timeout,
        )
    return kmp.initialize_processes(timeout=config.process_timeout)


def local_batch_size(batch_size: int) -> int:
    """This process's part of a global batch: all of it, or under many
    JAX processes, an equal share (each process feeds its own rows and
    Keras makes the global batch of them)."""
    return batch_size // backend.processes()[1]


def process_share(data, batch_size):
    """This process's rows of `data`, batched as `local_batch_size`
    batches: `data` itself in a single process. Under many processes,
    process `p` of `P` takes the `p`-th of `P` equal parts of every
    global batch: of a batched `tf.data` (rebatched, then sharded), of a
    grain dataset of full batches (`kmp.app.feeding.Feeding.in_order`),
    or of an `(x, y[, weight])` tuple of arrays (`x` may be a dict), whose
    rows past the last full global batch are dropped. Every process then
    has the same number of batches, which a collective step needs."""
    process, count = backend.processes()
    if count == 1:
        return data
    local = batch_size // count
    if hasattr(data, "rebatch"):  # tf.data
        return data.rebatch(local).shard(count, process)
    if not isinstance(data, tuple):  # grain: each batch cut here

        def cut(batch):
            first = process * local
            return keras.tree.map_structure(
                lambda array: array[first : first + local], batch
            )

        return data.map(cut)
    first = (
        data[0]
        if not isinstance(data[0], dict)
        else next(iter(data[0].values()))
    )
    whole = len(first) // batch_size * batch_size
    rows = np.arange(whole).reshape(-1, count, local)[:, process].ravel()

    def take(array):
        if isinstance(array, dict):
            return {name: value[rows] for name, value in array.items()}
        return array[rows]

    return tuple(take(part) for part in data)


def fit_arguments(data, batch_size) -> tuple[tuple, dict]:
    """`(args, kwargs)` for `fit`: a batched dataset as is (its pipeline
    shuffles; `fit` would warn that it cannot), an `(x, y)` pair of arrays
    with `batch_size`; under many JAX processes, this process's share
    (`process_share`)."""
    data = process_share(data, batch_size)
    if isinstance(data, tuple):
        return data, {"batch_size": local_batch_size(batch_size)}
    return (data,), {"shuffle": False}


def batch_replicas() -> int:
    """Devices the batch is split over by the keras.distribution in force
    (1 without one)."""
    if keras.backend.backend() != "jax":
        return 1
    distribution = keras.distribution.distribution()
    if distribution is None:
        return 1
    mesh = distribution.device_mesh
    return mesh.shape[mesh.axis_names.index(distribution.batch_dim_name)]


def layout_map(config, mesh):
    """The `keras.distribution.LayoutMap` of `config`'s example on
    `mesh`: each kernel its config's `LAYOUT` names (a path pattern ->
    the axes of its dimensions), split over the "model" axis; the
    fields in `LAYOUT_SPLITS` must divide over that axis's devices.

    Raises:
        kmp.InputError: the config names no layout, or a field does not
            split over the "model" axis.
    """
    layout = getattr(config, "LAYOUT", None)
    if not layout:
        raise kmp.InputError(
            "distribution=model needs the model's layout (which kernels "
            "split over the devices); this example has none: use "
            "--distribution=data."
        )
    split = mesh.shape[mesh.axis_names.index("model")]
    fields = config.LAYOUT_SPLITS
    if any(getattr(config, name) % split for name in fields):
        shown = " and ".join(f"--{n}={getattr(config, n)}" for n in fields)
        raise kmp.InputError(
            f"{shown} must split over the {split} devices of the model axis."
        )
    layouts = keras.distribution.LayoutMap(mesh)
    for path, axes in layout.items():
        layouts[path] = axes
    return layouts


def make_distribution(config):
    """Sets keras.distribution for `config.distribution` on JAX and
    returns it, or `None` for "none".

    "data": `DataParallel` over every device. "model": `ModelParallel`
    on a (devices / 2, 2) mesh of axes ("batch", "model") with the
    kernels `layout_map` names split over "model" (one device: a 1 x 1
    mesh). The global batch must split over the "batch" axis.
    """
    name = config.distribution
    if name == "none":
        return None
    name_of_backend = keras.backend.backend()
    if name_of_backend != "jax":
        instead = (
            "--strategy=mirrored or multiworker (tf.distribute)"
            if name_of_backend == "tensorflow"
            else "one device: Keras's torch backend has no multi-device fit"
        )
        raise kmp.InputError(
            f"distribution={name} is keras.distribution, which runs on JAX "
            f"(KERAS_BACKEND=jax); on {name_of_backend}, use {instead}."
        )
    devices = keras.distribution.list_devices()  # every process's
    processes = backend.processes()[1]
    if name == "data":
        distribution = keras.distribution.DataParallel(devices=devices)
        batch_axis = len(devices)
    else:
        # The "model" axis stays inside a process (Keras lists devices
        # process by process): each process holds whole slices, which it
        # can save without asking the others.
        local = len(devices) // processes
        model_axis = MODEL_AXIS if local % MODEL_AXIS == 0 else 1
        batch_axis = len(devices) // model_axis
        mesh = keras.distribution.DeviceMesh(
            (batch_axis, model_axis), ["batch", "model"], devices
        )
        distribution = keras.distribution.ModelParallel(
            layout_map=layout_map(config, mesh), batch_dim_name="batch"
        )
    if config.batch_size % batch_axis:
        raise kmp.InputError(
            f"--batch_size={config.batch_size} does not split over the "
            f"{batch_axis} devices of the mesh's batch axis: use a multiple "
            f"of {batch_axis}."
        )
    # Every process shards its own data (`process_share`), arrays and
    # tf.data alike; Keras's own sharding takes tf.data only.
    distribution.auto_shard_dataset = processes == 1
    keras.distribution.set_distribution(distribution)
    return distribution


def scope(strategy):
    """The strategy's scope, or nothing."""
    return strategy.scope() if strategy else contextlib.nullcontext()


def prepare(model, strategy):
    """After `compile`: `kmp.distribute` under a strategy."""
    if strategy is not None:
        kmp.distribute(model)
    return model
