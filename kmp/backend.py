"""The one place where kmp's code differs between Keras backends.

Everything else in kmp is written against `keras.ops` and the public Keras
API. What cannot be, branches here, each function once:

- the machine: accelerators and their compute capability
  (`list_devices`), framework versions, peak memory, TF32, the persistent
  XLA compilation cache, what compiles a step (`step_compiler`);
- the train step: its logs of optimizer state (`add_train_step_logs`;
  TF's and torch's steps are stateful, JAX's is pure), gradients by
  intermediate tensors (`taped_gradients`), the scaler's branch, fused
  unscale and stateless copies (`cond`, `fused_unscale`, `own_values`:
  torch runs eagerly), replicas under `tf.distribute`
  (`all_replicas_agree`, `sum_over_replicas`).

A framework's longer bodies live in private modules that branch on
nothing: `_taped_gradients`, `_torch_step`, `_tf_replicas`. Each
framework is imported only inside its branches: kmp trains with
`KERAS_BACKEND=jax` or `torch` on a machine without TensorFlow.
"""

import importlib.metadata
import os
import platform
from typing import Callable
from typing import NamedTuple

import keras
from keras import ops


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


def step_compiler() -> str:
    """What compiles a train step under `jit_compile=True`: `"XLA"`, or
    `"torch.compile"` on PyTorch (which Keras runs eagerly by default,
    and which makes no float8 GEMMs of kmp's float8 layers)."""
    return "torch.compile" if name() == "torch" else "XLA"


def cond(pred, true_fn: Callable, false_fn: Callable):
    """`keras.ops.cond`; on torch a Python `if` on the tensor, without
    the operation `ops.cond` builds per call (`kmp._torch_step.cond`
    says why: torch.compile recompiles for each one)."""
    if name() != "torch":
        return ops.cond(pred, true_fn, false_fn)
    from kmp import _torch_step

    return _torch_step.cond(pred, true_fn, false_fn)


def fused_unscale(grads: list, scale):
    """`(grads / scale, all finite)`, `None`s kept, in one fused kernel on
    torch (`kmp._torch_step.fused_unscale`); `None` elsewhere (XLA fuses
    the stock ops itself) and on torch devices the kernel does not serve.
    """
    if name() != "torch":
        return None
    from kmp import _torch_step

    return _torch_step.fused_unscale(grads, scale)


def own_values(values: list) -> list:
    """`values`, as tensors a stateless update may change in place: on
    torch, copies (`kmp._torch_step.own_values`); elsewhere arrays are
    immutable and `values` is returned as it is."""
    if name() != "torch":
        return values
    from kmp import _torch_step

    return _torch_step.own_values(values)


def crossentropy_reads_logits() -> bool:
    """Whether Keras's crossentropy on softmax or sigmoid probabilities
    recovers the logits they came from (`_keras_logits`): TensorFlow
    only. JAX and torch compute it from the probabilities, clipped to
    [1e-7, 1 - 1e-7], in float32 as in float16."""
    return name() == "tensorflow"


def list_devices() -> list[Device]:
    """Lists the devices the current Keras backend will compute on."""
    if name() == "jax":
        return _jax_devices()
    if name() == "tensorflow":
        return _tf_devices()
    if name() == "torch":
        return _torch_devices()
    # Other backends (numpy): nothing to probe; report the host so that
    # the policy choice falls back to float32 with a reason.
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


def _torch_devices(kind: str | None = None) -> list[Device]:
    """The torch devices of `kind` (`"cuda"`, ...); by default of the
    kind Keras computes on (its choice, read off a tensor)."""
    import torch

    kind = kind or ops.convert_to_tensor(0.0).device.type
    if kind == "cuda":
        return [
            Device(
                "gpu",
                torch.cuda.get_device_name(i),
                tuple(torch.cuda.get_device_capability(i)),
            )
            for i in range(torch.cuda.device_count())
        ]
    if kind in ("mps", "xpu"):
        return [Device("gpu", f"{kind.upper()} ({host_cpu()})")]
    return [Device("cpu", host_cpu())]


def framework_versions() -> dict[str, str]:
    """Returns the versions of Keras and of the framework under it."""
    versions = {"keras": keras.__version__, "backend": name()}
    framework = name() if name() in ("tensorflow", "jax", "torch") else None
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
            # Read after the update (TF: automatic control deps), as a
            # copy: torch assigns variables in place (an eager TF read is
            # the variable too), and Keras may read logs on a thread steps
            # later. A scalar copy on the device, no transfer.
            if isinstance(logs, dict):
                logs = {**logs, **extra_logs(ops.copy)}
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
    to compute on with. The marking leaves values unchanged. Each
    framework's way of doing it is in `kmp._taped_gradients`.

    Args:
        loss_fn: The loss, as above. With `jit_compile`, it is traced once
            per input shape, so `tap` is called at trace time only.
        jit_compile: Compile with XLA (TensorFlow, JAX); PyTorch runs
            eagerly either way.

    Returns:
        `run(values, *args)` -> `(loss, keys, tapped, value_grads,
        tap_grads)`, `keys` in `tap`'s call order; a tapped tensor's
        gradient has its dtype (a float16 activation's is float16). One
        the loss does not depend on is None (TF, torch) or zeros (JAX).
    """
    from kmp import _taped_gradients

    return _taped_gradients.maker(name())(loss_fn, jit_compile)


def distribution_name() -> str | None:
    """The active `tf.distribute` strategy or Keras distribution, if any."""
    if name() == "tensorflow":
        import tensorflow as tf

        if tf.distribute.has_strategy():
            return type(tf.distribute.get_strategy()).__name__
    distribution = keras.distribution.distribution()
    return None if distribution is None else type(distribution).__name__


def all_replicas_agree(flag):
    """The AND of a boolean scalar over every replica on every worker.

    Under `tf.distribute`, each replica holds its own local gradients, so a
    local finiteness check can differ between replicas; this all-reduces
    it (`kmp._tf_replicas`). On JAX the gradients are global arrays, and
    Keras's torch backend runs one replica, so `flag` already covers
    every device.
    """
    if name() != "tensorflow":
        return flag
    from kmp import _tf_replicas

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
    from kmp import _tf_replicas

    return _tf_replicas.sum_over_replicas(grads)


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
        if name() == "torch" and device.compute_capability is not None:
            import torch

            peak = torch.cuda.max_memory_allocated()
            return peak, "CUDA peak allocated (PyTorch)"
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
    if name() == "torch":
        return (
            "Keras runs torch eagerly unless jit_compile=True, and "
            "torch.compile keeps its own cache (TORCHINDUCTOR_CACHE_DIR)"
        )
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
    elif name() == "torch":
        import torch

        # PyTorch's own defaults: TF32 off for matmuls, on for cuDNN
        # convolutions.
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False


def tf32_enabled() -> bool | None:
    """Whether float32 matmuls may run as TF32; `None` if unknown."""
    if name() == "tensorflow":
        import tensorflow as tf

        return bool(tf.config.experimental.tensor_float_32_execution_enabled())
    if name() == "jax":
        import jax

        precision = jax.config.jax_default_matmul_precision
        return precision not in ("highest", "float32")
    if name() == "torch":
        import torch

        return bool(
            torch.backends.cuda.matmul.allow_tf32
            or torch.backends.cudnn.allow_tf32
        )
    return None
