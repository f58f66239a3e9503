"""The machine: devices and their compute capability, framework
versions, the environment record of every result, and peak memory.

Each framework names its devices its own way; `list_devices` gives one
`Device` list for all of them, from which `kmp.recommend_policy`, the
audit and the reports read.
"""

import datetime
import importlib.metadata
import os
import platform
import subprocess
from typing import NamedTuple

import keras
from keras import ops

from kmp.backend._current import name
from kmp.backend.settings import tf32_enabled


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


def float16_attention_fails(devices) -> bool:
    """Whether Keras's attention fails to compile under mixed_float16 on
    `devices`: JAX's CPU has no float16 matmul that accumulates in
    float32, which Keras's fused attention asks for (`dtype_errors` adds
    kmp's line to the error); bfloat16's it has."""
    return name() == "jax" and all(d.platform == "cpu" for d in devices)


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
    """When, from which code, on which versions and hardware: what every
    benchmark result records (`date`: UTC, to the second; `commit`:
    kmp's, see `source_commit`)."""
    from kmp._version import __version__

    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(
            timespec="seconds"
        ),
        "commit": source_commit(),
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


def source_commit() -> str | None:
    """The git commit kmp runs from, `+changes` when its tracked files
    differ from it; `None` for an installed copy (no repository)."""
    return _commit_of(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    )


def _commit_of(here):
    """`source_commit` of the package folder `here`: the commit of the
    repository whose top folder holds it, else `None`."""

    def git(*args):
        return subprocess.run(
            ["git", "-C", here, *args],
            capture_output=True,
            text=True,
            timeout=10,
        )

    try:
        # kmp's own repository only: an installed copy in a virtualenv
        # inside another project's repository is not that project's code.
        top = git("rev-parse", "--show-toplevel")
        if top.returncode != 0 or not os.path.samefile(
            top.stdout.strip(), os.path.dirname(here)
        ):
            return None
        head = git("rev-parse", "HEAD")
        if head.returncode != 0:
            return None
        # No index lock taken: another git command may be running.
        changed = git(
            "--no-optional-locks",
            "status",
            "--porcelain",
            "--untracked-files=no",
        )
    except (OSError, subprocess.SubprocessError):  # no git here
        return None
    return head.stdout.strip() + ("+changes" if changed.stdout.strip() else "")


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
