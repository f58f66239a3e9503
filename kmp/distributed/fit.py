"""`kmp.distribute(model)`: plain `model.fit` under `tf.distribute`,
multi-worker included.

Keras 3's `fit` cannot run under `tf.distribute.MultiWorkerMirroredStrategy`
(keras-team/keras#20585, with or without mixed precision) because of two
lines of its TensorFlow trainer:

1. before the first step, `_maybe_symbolic_build` averages the first input
   batch over all workers (`strategy.reduce("MEAN", batch, axis=None)`) only
   to learn its shapes, and that strategy cannot reduce per-replica inputs;
2. after every step, `reduce_per_replica` reduces each scalar log with
   `strategy.reduce("MEAN", value, axis=0)`, which needs rank >= 1.

`distribute` replaces those two steps on the model instance (the shapes of
a local batch; logs of shape `[1]`, which the same reduction turns into
the mean over workers), and around `fit`, `evaluate` and `predict` adds
what Keras is silent about on a cluster:

- a global batch that does not split evenly over the replicas is an error
  (the replicas would weigh their examples differently);
- `ModelCheckpoint` and `BackupAndRestore` write on the chief only (on
  every worker they would race on the same files), and a backup that only
  some workers can read is an error instead of replicas that silently
  start from different weights;
- Keras's own loss scaler, which `compile` puts around a plain optimizer
  under mixed_float16, becomes kmp's: with Keras's, a step that overflows
  on one worker only is skipped there and applied on the others, whose
  all-reduce then waits for the skipping worker forever (and under
  `MirroredStrategy` the other replicas' overflow reaches the weights).
"""

import functools
import inspect
import logging
import os

import keras

from kmp.distributed.cluster import is_chief
from kmp.distributed.cluster import require_tensorflow
from kmp.errors import InputError
from kmp.errors import InputTypeError
from kmp.scaling import LossScaleOptimizer
from kmp.scaling import upgrade_stock_scaler

logger = logging.getLogger("kmp")


def distribute(model: keras.Model) -> keras.Model:
    """Makes `fit`, `evaluate` and `predict` work under the model's strategy.

    Call it once, after building and compiling the model inside
    `strategy.scope()`; then use `model.fit` as usual, outside or inside
    the scope, with any callbacks. Under `MirroredStrategy` (one machine,
    several GPUs) Keras's `fit` already works; the checks and kmp's
    scaler are added. A model compiled with Keras's own loss scaler (what
    `compile` puts around a plain optimizer under mixed_float16) gets
    kmp's in its place, with its state. Calling it again does nothing.

    Data: pass a `tf.data.Dataset` batched with the *global* batch size
    (per-replica batch times `strategy.num_replicas_in_sync`); TensorFlow
    shards it so that each worker sees different examples. Every worker
    must build the same pipeline (same files, same shuffle seed).

    Args:
        model: A Keras model created under a `tf.distribute` strategy's
            scope (TensorFlow backend).

    Returns:
        The same model.

    Example:

    ```python
    strategy = kmp.multi_worker_strategy()  # reads TF_CONFIG
    with strategy.scope():
        model = make_model()
        model.compile(optimizer=kmp.wrap("adam"), loss="...")
    kmp.distribute(model)
    model.fit(train.batch(64 * strategy.num_replicas_in_sync), epochs=10,
              callbacks=[keras.callbacks.BackupAndRestore("/shared/bk")])
    ```
    """
    require_tensorflow("kmp.distribute")
    import tensorflow as tf

    if not isinstance(model, keras.Model):
        raise InputTypeError(
            f"kmp.distribute takes a keras.Model, got {type(model).__name__}."
        )
    if getattr(model, "_kmp_distributed", False):
        return model
    # Keras's TensorFlow trainer records the strategy whose scope the model
    # was created in; fit runs under that one.
    strategy = getattr(model, "_distribute_strategy", None)
    if strategy is None:
        raise InputError(
            f"Model {model.name!r} was created outside a tf.distribute "
            "strategy scope, so its variables live on one device. Create "
            "and compile it inside `with strategy.scope():`, then call "
            "kmp.distribute(model)."
        )
    multi_worker = (
        isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
        and strategy.extended._in_multi_worker_mode()
    )
    _use_kmp_scaler(model, strategy)
    if multi_worker:
        _fix_multi_worker_steps(model, strategy)
    for method in ("fit", "evaluate", "predict"):
        setattr(model, method, _checked(model, method, strategy, multi_worker))
    model._kmp_distributed = True
    return model


def _use_kmp_scaler(model, strategy):
    """Makes the model's loss scaler kmp's, whose replicas agree about
    overflow, or refuses one it cannot make so."""
    optimizer = getattr(model, "optimizer", None)
    if not isinstance(
        optimizer, keras.optimizers.LossScaleOptimizer
    ) or isinstance(optimizer, LossScaleOptimizer):
        return
    if type(optimizer) is not keras.optimizers.LossScaleOptimizer:
        raise InputError(
            f"Model {model.name!r} is compiled with "
            f"{type(optimizer).__name__}, a subclass of Keras's "
            "LossScaleOptimizer: under several replicas a step that "
            "overflows on one of them can hang the job. Compile with "
            "optimizer=kmp.wrap(inner_optimizer) instead."
        )
    with strategy.scope():  # a built scaler gains two variables
        upgrade_stock_scaler(optimizer)
    model.train_function = None  # a step traced before would keep Keras's
    logger.warning(
        "kmp.distribute: model %r was compiled with Keras's "
        "LossScaleOptimizer, under which one worker's overflow hangs the "
        "others; it is now kmp.LossScaleOptimizer (same inner optimizer "
        "and scale). Compile with kmp.wrap(optimizer) to set its "
        "arguments.",
        model.name,
    )


def _fix_multi_worker_steps(model, strategy):
    import tensorflow as tf

    def local(value):
        if isinstance(value, tf.distribute.DistributedValues):
            return strategy.experimental_local_results(value)[0]
        return value

    def maybe_symbolic_build(iterator=None, data_batch=None):
        # Only the shapes matter here, and every replica's batch has them:
        # take this worker's first replica instead of averaging over
        # workers.
        if iterator is not None:
            for _, _, batches in iterator:
                data_batch = next(batches)
                break
        data_batch = keras.tree.map_structure(local, data_batch)
        with strategy.scope():
            model._symbolic_build(data_batch=data_batch)

    make_function = model._make_function

    def make_step_function(step_function):
        return make_function(_with_rank_1_logs(step_function))

    model._maybe_symbolic_build = maybe_symbolic_build
    # `_make_function` is where Keras wraps the train and test steps (read
    # when the function is made), so this composes with any wrapper of
    # `train_step`, such as kmp.callbacks.LossScaleMonitor's.
    model._make_function = make_step_function
    model.train_function = model.test_function = None


def _with_rank_1_logs(step_function):
    import tensorflow as tf

    @functools.wraps(step_function)
    def step(*args):
        logs = step_function(*args)
        if not isinstance(logs, dict):
            return logs
        return {
            key: tf.reshape(value, [1])
            if tf.is_tensor(value) and value.shape.rank == 0
            else value
            for key, value in logs.items()
        }

    return step


def _checked(model, method, strategy, multi_worker):
    original = getattr(model, method)
    signature = inspect.signature(original)

    @functools.wraps(original)
    def run(*args, **kwargs):
        # fit calls evaluate for validation: check once, at the outer call.
        if getattr(model, "_kmp_in_call", False):
            return original(*args, **kwargs)
        bound = signature.bind_partial(*args, **kwargs).arguments
        _check_batch_size(
            bound.get("x"),
            bound.get("batch_size"),
            strategy.num_replicas_in_sync,
        )
        callbacks = bound.get("callbacks") or []
        # A CallbackList (what fit passes on) holds the user's list.
        callbacks = list(getattr(callbacks, "callbacks", callbacks))
        _check_backups_agree(callbacks, strategy)
        if method == "fit" and multi_worker and _is_arrays(bound.get("x")):
            args, kwargs = (), _arrays_to_dataset(bound, strategy)
        model._kmp_in_call = True
        try:
            with _chief_writes_only(callbacks):
                return original(*args, **kwargs)
        finally:
            model._kmp_in_call = False

    return run


def _is_arrays(x):
    import tensorflow as tf

    leaves = keras.tree.flatten(x) if x is not None else []
    return bool(leaves) and all(
        hasattr(leaf, "shape") and not isinstance(leaf, tf.data.Dataset)
        for leaf in leaves
    )


def _arrays_to_dataset(arguments, strategy):
    """Turns fit's array arguments into a dataset every worker shuffles
    alike.

    Keras shuffles arrays with TensorFlow's random ops, whose order depends
    on each worker's own seed state, and TensorFlow's sharding then hands
    some examples to two workers and others to none (measured: 29 of 96
    each way per epoch). Here the epoch orders come from one NumPy
    generator seeded by the chief, so every worker draws the same ones.
    """
    import numpy as np
    import tensorflow as tf

    arguments = dict(arguments)
    data = tuple(
        arguments.pop(name)
        for name in ("x", "y", "sample_weight")
        if arguments.get(name) is not None
    )
    arguments.pop("y", None), arguments.pop("sample_weight", None)
    batch_size = arguments.pop("batch_size", None) or 32
    shuffle = arguments.pop("shuffle", True)
    split = arguments.pop("validation_split", 0.0) or 0.0
    size = int(keras.tree.flatten(data)[0].shape[0])
    if split:
        # As Keras does: the last `split` of the arrays, before shuffling.
        at = int(size * (1.0 - split))
        if arguments.get("validation_data") is None:
            arguments["validation_data"] = keras.tree.map_structure(
                lambda a: a[at:], data
            )
        data, size = keras.tree.map_structure(lambda a: a[:at], data), at
    rng = np.random.default_rng(_agreed_seed(strategy))

    def epoch_order():
        # Called once per pass over the dataset, on every worker alike.
        yield from rng.permutation(size) if shuffle else range(size)

    tensors = keras.tree.map_structure(tf.convert_to_tensor, data)
    indices = tf.data.Dataset.from_generator(
        epoch_order, output_signature=tf.TensorSpec((), tf.int64)
    )
    arguments["x"] = (
        indices.batch(batch_size)
        .map(
            lambda i: keras.tree.map_structure(
                lambda t: tf.gather(t, i), tensors
            )
        )
        .prefetch(tf.data.AUTOTUNE)
    )
    return arguments


def _agreed_seed(strategy):
    """A random seed, the chief's, known to every worker."""
    mine = int.from_bytes(os.urandom(4), "big") % 2**31 if is_chief() else 0
    # Each of the chief's local replicas contributes it once.
    return int(_sum_over_replicas(strategy, mine)) // len(
        strategy.extended.worker_devices
    )


def _sum_over_replicas(strategy, value):
    import tensorflow as tf

    per_replica = strategy.run(
        tf.function(lambda: tf.constant(value, tf.int64))
    )
    return strategy.reduce("SUM", per_replica, axis=None).numpy()


def _dataset_batch_size(dataset):
    """The batch size of a batched `tf.data.Dataset`, if it says.

    tf.data keeps it on the batching dataset; ops after `batch` (map,
    prefetch, ...) keep a link to their input.
    """
    while dataset is not None:
        size = getattr(dataset, "_batch_size", None)
        if size is not None:
            return int(size)
        dataset = getattr(dataset, "_input_dataset", None)
    return None


def _check_batch_size(x, batch_size, replicas):
    import tensorflow as tf

    if replicas <= 1:
        return
    if isinstance(x, tf.data.Dataset):
        size, given = _dataset_batch_size(x), "the dataset's batch size"
    elif (
        x is None
        or not hasattr(x, "__len__")
        or isinstance(x, tf.distribute.DistributedDataset)
        or isinstance(x, keras.utils.PyDataset)
    ):
        return  # batches the user already made or split
    else:
        size, given = batch_size or 32, "batch_size"
    if size is not None and size % replicas:
        raise InputError(
            f"{given} is {size}, which does not split evenly over "
            f"{replicas} replicas. Use a multiple of {replicas}, e.g. "
            f"{size // replicas * replicas or replicas}: the global batch "
            "is per-replica batch * strategy.num_replicas_in_sync."
        )


def _backups(callbacks):
    return [
        c for c in callbacks if isinstance(c, keras.callbacks.BackupAndRestore)
    ]


def _check_backups_agree(callbacks, strategy):
    """Fails if a backup exists on some workers' disks but not others'.

    First the chief finishes what a kill left of a save of kmp's backup
    (`kmp.callbacks.BackupAndRestore`), before the collective below, so
    that on shared storage every worker then reads the same files; the
    others' `fit` does not (`_chief_writes_only`)."""
    for callback in _backups(callbacks):
        if hasattr(callback, "_settle"):
            if is_chief():
                callback._settle()
            # Every worker waits for it before it looks.
            _sum_over_replicas(strategy, 0)
        present = int(os.path.exists(callback._weights_path))
        count = _sum_over_replicas(strategy, present)
        total = strategy.num_replicas_in_sync
        if 0 < count < total:
            raise InputError(
                f"BackupAndRestore's backup_dir {callback.backup_dir!r} "
                f"holds a backup for {count} of {total} replicas: the "
                "other workers would start from different weights. Put "
                "backup_dir on storage every worker reads (a shared "
                "filesystem, GCS, ...)."
            )


class _chief_writes_only:
    """On non-chief workers, turns off checkpoint writes for one call."""

    def __init__(self, callbacks):
        self.silenced = []
        if is_chief():
            return
        for callback in callbacks:
            if isinstance(callback, keras.callbacks.ModelCheckpoint):
                self.silenced.append((callback, ("_save_model",)))
            elif isinstance(callback, keras.callbacks.BackupAndRestore):
                # on_train_end deletes the backup directory: the chief's;
                # and kmp's backup settles it on the chief (above).
                methods = ("_save_model", "on_train_end")
                if hasattr(callback, "_settle"):
                    methods += ("_settle",)
                self.silenced.append((callback, methods))

    def __enter__(self):
        for callback, methods in self.silenced:
            for method in methods:
                setattr(callback, method, _do_nothing)

    def __exit__(self, *exc):
        for callback, methods in self.silenced:
            for method in methods:
                delattr(callback, method)


def _do_nothing(*args, **kwargs):
    return None
