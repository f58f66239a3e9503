"""The one place where kmp's code differs between Keras backends.

Everything else in kmp is written against `keras.ops` and the public Keras
API. What cannot be, lives here, and each function branches exactly once:

- which accelerators are attached (`list_devices`), since Keras has no
  backend-neutral way to ask for a GPU's compute capability;
- the framework's name and version (`framework_versions`);
- how a train step exposes the optimizer state it just produced
  (`add_train_step_logs`): TF's step is stateful, JAX's is pure;
- how to take gradients with respect to intermediate tensors
  (`taped_gradients`): a tape watches them on TensorFlow, JAX adds a zero
  it can differentiate by;
- the persistent XLA compilation cache (`use_compile_cache`).

TensorFlow is imported only inside its branches: kmp trains with
`KERAS_BACKEND=jax` on a machine without TensorFlow.
"""

import importlib.metadata
import os
import platform
from typing import Callable
from typing import NamedTuple

import keras
from keras import ops

from kmp.errors import InputError


class Device(NamedTuple):
    """An accelerator or host device as kmp sees it.

    Attributes:
        platform: `"gpu"`, `"tpu"` or `"cpu"`.
        name: The framework's name for the device model, e.g.
            `"NVIDIA H100 80GB HBM3"`.
        compute_capability: `(major, minor)` for NVIDIA GPUs, else `None`.
    """

    platform: str
    name: str
    compute_capability: tuple[int, int] | None = None


def name() -> str:
    """Returns the Keras backend name (`"tensorflow"`, `"jax"`, ...)."""
    return keras.backend.backend()


def is_stateless() -> bool:
    """Whether `fit` runs the optimizer through `stateless_apply`."""
    return name() == "jax"


def list_devices() -> list[Device]:
    """Lists the devices the current Keras backend will compute on."""
    if name() == "jax":
        return _jax_devices()
    if name() == "tensorflow":
        return _tf_devices()
    # Other backends (torch, numpy): kmp does not probe them; report the
    # host so that the policy choice falls back to float32 with a reason.
    return [Device("cpu", host_cpu())]


def host_cpu() -> str:
    """The host CPU's model name, for reports."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "host CPU"


def _parse_capability(value) -> tuple[int, int] | None:
    if value is None:
        return None
    if isinstance(value, str):
        major, _, minor = value.partition(".")
        return int(major), int(minor or 0)
    major, minor = tuple(value)[:2]
    return int(major), int(minor)


def _jax_devices() -> list[Device]:
    import jax

    devices = []
    for device in jax.devices():
        capability = _parse_capability(
            getattr(device, "compute_capability", None)
        )
        kind = host_cpu() if device.platform == "cpu" else device.device_kind
        devices.append(Device(device.platform, str(kind), capability))
    return devices


def _tf_devices() -> list[Device]:
    import tensorflow as tf

    devices = []
    for gpu in tf.config.list_physical_devices("GPU"):
        details = tf.config.experimental.get_device_details(gpu)
        devices.append(
            Device(
                "gpu",
                details.get("device_name", gpu.name),
                _parse_capability(details.get("compute_capability")),
            )
        )
    for tpu in tf.config.list_logical_devices("TPU"):
        devices.append(Device("tpu", tpu.name))
    if not devices:
        devices.append(Device("cpu", host_cpu()))
    return devices


def framework_versions() -> dict[str, str]:
    """Returns the versions of Keras and of the framework under it."""
    versions = {"keras": keras.__version__, "backend": name()}
    framework = {"tensorflow": "tensorflow", "jax": "jax"}.get(name())
    if framework is not None:
        versions[framework] = importlib.metadata.version(framework)
    return versions


def environment() -> dict:
    """Versions and hardware, as recorded with every benchmark result."""
    from kmp._version import __version__

    return {
        "versions": {
            "kmp": __version__,
            "python": platform.python_version(),
            **framework_versions(),
        },
        "hardware": {
            "cpu": host_cpu(),
            "cores": os.cpu_count(),
            "devices": [
                {
                    "platform": d.platform,
                    "name": d.name,
                    "compute_capability": d.compute_capability
                    and "{}.{}".format(*d.compute_capability),
                }
                for d in list_devices()
            ],
        },
        "tf32": tf32_enabled(),
    }


def add_train_step_logs(
    model: keras.Model,
    extra_logs: Callable[[Callable], dict],
) -> None:
    """Makes `model.train_step` return extra logs computed inside the step
    (they leave the device with the loss, in the transfer Keras makes).

    Args:
        model: A compiled Keras model. Its `train_step` is wrapped on the
            instance; calling this again on the same model does nothing.
        extra_logs: `extra_logs(read)` returns a dict of tensors, where
            `read(variable)` gives an optimizer variable's value *after*
            this step's update.
    """
    if getattr(model.train_step, "_kmp_wrapped", False):
        return
    original = model.train_step

    if is_stateless():

        def train_step(state, data):
            logs, state = original(state, data)
            # state = (trainable, non_trainable, optimizer, metrics) values;
            # the optimizer's new values are only visible here, not through
            # its variables, which JAX updates when the epoch ends.
            optimizer_values = state[2]
            index = {id(v): i for i, v in enumerate(model.optimizer.variables)}

            def read(variable):
                return optimizer_values[index[id(variable)]]

            if isinstance(logs, dict):
                logs = {**logs, **extra_logs(read)}
            return logs, state

    else:

        def train_step(data):
            logs = original(data)
            # Inside the traced step, this read is ordered after the
            # optimizer's update by TensorFlow's automatic control deps.
            if isinstance(logs, dict):
                logs = {**logs, **extra_logs(ops.convert_to_tensor)}
            return logs

    train_step._kmp_wrapped = True
    model.train_step = train_step
    # A train function compiled before the wrap would not call it.
    model.train_function = None


def taped_gradients(loss_fn: Callable, jit_compile: bool = False):
    """Differentiates a loss by its inputs and by tensors marked inside it.

    `loss_fn(values, args, tap)` returns a scalar loss computed from the
    list `values` (e.g. trainable variable values) and `args`; inside it,
    `x = tap(key, x)` marks the floating tensor `x` and returns the tensor
    to compute on with. The marking leaves values unchanged.

    Args:
        loss_fn: The loss, as above. With `jit_compile`, it is traced once
            per input shape, so `tap` is called at trace time only.
        jit_compile: Compile with XLA.

    Returns:
        `run(values, *args)` -> `(loss, keys, tapped, value_grads,
        tap_grads)`, `keys` in `tap`'s call order; a tapped tensor's
        gradient has its dtype (a float16 activation's is float16). One
        the loss does not depend on is None (TF) or zeros (JAX).
    """
    keys = []

    if name() == "jax":
        import jax
        import jax.numpy as jnp

        def traced(values, zeros, args):
            keys.clear()
            taps = []
            supply = None if zeros is None else iter(zeros)

            def tap(key, x):
                keys.append(key)
                if supply is not None:
                    # d(loss)/d(zero) is d(loss)/d(x): JAX differentiates
                    # by inputs only, so each tapped tensor gets one.
                    x = x + next(supply)
                taps.append(x)
                return x

            return loss_fn(values, args, tap), taps

        grad = jax.value_and_grad(traced, argnums=(0, 1), has_aux=True)
        if jit_compile:
            grad = jax.jit(grad)

        shapes_by_input = {}

        def run(values, *args):
            signature = tuple(
                (tuple(jnp.shape(a)), str(jnp.result_type(a)))
                for a in jax.tree_util.tree_leaves(args)
            )
            if signature not in shapes_by_input:  # trace once per shape
                _, shapes_by_input[signature] = jax.eval_shape(
                    lambda v, a: traced(v, None, a), values, args
                )
            zeros = [
                jnp.zeros(s.shape, s.dtype) for s in shapes_by_input[signature]
            ]
            (loss, taps), (value_grads, tap_grads) = grad(values, zeros, args)
            return loss, list(keys), taps, value_grads, tap_grads

        return run

    if name() != "tensorflow":
        raise InputError(
            f"Gradients by intermediate tensors need the TensorFlow or JAX "
            f"backend; KERAS_BACKEND is {name()!r}."
        )
    import tensorflow as tf

    def step(values, args):
        keys.clear()
        taps = []
        with tf.GradientTape() as tape:
            tape.watch(values)

            def tap(key, x):
                tape.watch(x)
                keys.append(key)
                taps.append(x)
                return x

            loss = loss_fn(values, args, tap)
        value_grads, tap_grads = tape.gradient(loss, (values, taps))
        return loss, taps, value_grads, tap_grads

    if jit_compile:
        step = tf.function(step, jit_compile=True)

    def run(values, *args):
        values = [tf.convert_to_tensor(v) for v in values]
        loss, taps, value_grads, tap_grads = step(values, args)
        return loss, list(keys), taps, value_grads, tap_grads

    return run


def distribution_name() -> str | None:
    """The active `tf.distribute` strategy or Keras distribution, if any."""
    if name() == "tensorflow":
        import tensorflow as tf

        if tf.distribute.has_strategy():
            return type(tf.distribute.get_strategy()).__name__
    distribution = keras.distribution.distribution()
    return None if distribution is None else type(distribution).__name__


def _replica_context():
    """The `tf.distribute` replica context when several replicas are in
    sync, else None (also on JAX, whose arrays are already global)."""
    if name() != "tensorflow":
        return None
    import tensorflow as tf

    if not tf.distribute.has_strategy() or (
        tf.distribute.in_cross_replica_context()
    ):
        return None
    context = tf.distribute.get_replica_context()
    return context if context.num_replicas_in_sync > 1 else None


def all_replicas_agree(flag):
    """The AND of a boolean scalar over every replica on every worker.

    Under `tf.distribute`, each replica holds its own local gradients, so a
    local finiteness check can differ between replicas; this all-reduces
    it. On JAX the gradients are global arrays, so `flag` already covers
    every device.
    """
    context = _replica_context()
    if context is None:
        return flag
    import tensorflow as tf

    # ReduceOp has no MIN: count the replicas that disagree.
    dissent = context.all_reduce(
        tf.distribute.ReduceOp.SUM, tf.cast(tf.logical_not(flag), tf.float32)
    )
    return tf.equal(dissent, 0.0)


def sum_over_replicas(grads):
    """All-reduces (sums) gradients over `tf.distribute` replicas.

    Returns:
        `(grads, replicas)`: the summed gradients and the number of
        replicas in sync; the gradients unchanged and 1 outside a
        multi-replica `tf.distribute` replica context (and on JAX, whose
        gradients are already global).
    """
    grads = list(grads)
    context = _replica_context()
    if context is None:
        return grads, 1
    import tensorflow as tf

    present = [g for g in grads if g is not None]
    summed = iter(context.all_reduce(tf.distribute.ReduceOp.SUM, present))
    return [
        None if g is None else next(summed) for g in grads
    ], context.num_replicas_in_sync


def peak_memory() -> tuple[int | None, str]:
    """`(bytes, what)`: the first accelerator's peak allocation so far, or
    this process's peak resident memory when computing on a CPU."""
    device = list_devices()[0]
    if device.platform != "cpu":
        if name() == "tensorflow":
            import tensorflow as tf

            info = tf.config.experimental.get_memory_info("GPU:0")
            return info["peak"], "GPU:0 peak allocated (TensorFlow)"
        if name() == "jax":
            import jax

            stats = jax.devices()[0].memory_stats() or {}
            if "peak_bytes_in_use" in stats:
                return stats["peak_bytes_in_use"], "device peak bytes (JAX)"
    import resource

    # Linux reports KiB. Host memory covers the model and the data.
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return rss, "process peak RSS (CPU run: host memory)"


def use_compile_cache(directory: str | None) -> str | None:
    """Points the persistent XLA cache at `directory` (`None`: off);
    returns `None`, or why this backend cannot have one (BUILD_NOTES)."""
    if name() == "jax":
        import jax
        from jax.experimental.compilation_cache import compilation_cache

        jax.config.update("jax_compilation_cache_dir", directory)
        # Cache every program (JAX skips those compiled in under 1 s).
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        compilation_cache.reset_cache()  # read the directory at next use
        return None
    if name() != "tensorflow":
        return f"{name()} has none kmp can switch on"
    key = "--tf_xla_persistent_cache_directory="
    flags = os.environ.get("TF_XLA_FLAGS", "").split()
    if directory and key + directory in flags:
        return None  # already so (a second run in this process)
    flags = [f for f in flags if not f.startswith(key)]
    from tensorflow.python.eager import context  # (no public API)

    if directory and context.context()._initialized:
        return "TensorFlow has started (it reads TF_XLA_FLAGS once)"
    added = [key + directory] if directory else []
    os.environ["TF_XLA_FLAGS"] = " ".join(flags + added)
    return None


def disable_tf32() -> None:
    """Turns off TF32 matmuls, so float32 means float32 (for tests)."""
    if name() == "tensorflow":
        import tensorflow as tf

        tf.config.experimental.enable_tensor_float_32_execution(False)
    elif name() == "jax":
        import jax

        jax.config.update("jax_default_matmul_precision", "highest")


def tf32_enabled() -> bool | None:
    """Whether float32 matmuls may run as TF32; `None` if unknown."""
    if name() == "tensorflow":
        import tensorflow as tf

        return bool(tf.config.experimental.tensor_float_32_execution_enabled())
    if name() == "jax":
        import jax

        precision = jax.config.jax_default_matmul_precision
        return precision not in ("highest", "float32")
    return None
