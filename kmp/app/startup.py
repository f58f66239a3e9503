"""What a run does before its example's `train` builds anything: once.

    start        joins the processes of a multi-process JAX job and turns
                 the compile cache on: both before the backends run
                 anything (JAX joins before it computes; TensorFlow
                 reads its cache setting when it starts), once per
                 process and settings
    device_sized where no GPU is found, the example's CPU sizes for the
                 sizes the user did not give, and the line that says so
    prepare      `kmp train`'s order: `start`, `device_sized`, then
                 `--batch_size=max`'s search (`kmp.app.batch_search`),
                 handed the example module

`kmp.app.run.Run` calls `start` as it enters, so that an example's
`train` called on its own (a test, a notebook) starts the same way;
under `kmp train` `prepare` has started it first and the `Run`'s call
finds it done. `kmp doctor` sizes its run with `device_sized` too.
"""

import keras

import kmp
from kmp import backend
from kmp.app import batch_search
from kmp.app import scale_out

# The settings this process started with: `start` runs once for each.
_started = set()


def has_accelerator() -> bool:
    """Whether the backend computes on a GPU or TPU (its first device)."""
    return backend.list_devices()[0].platform != "cpu"


def use_compile_cache(config) -> str | None:
    """`--compile_cache`: `kmp.enable_compile_cache` unless it is `off`.
    With `auto`, a backend without a cache is no reason to warn."""
    if config.compile_cache == "off":
        return None
    if config.compile_cache == "auto":
        if keras.backend.backend() not in ("jax", "tensorflow"):
            return None
        return kmp.enable_compile_cache()
    return kmp.enable_compile_cache(config.compile_cache)


def start(config) -> None:
    """Joins a multi-process JAX job (`scale_out.start_processes`) and
    turns the compile cache on (`use_compile_cache`), in that order,
    once per process for the same settings."""
    settings = (
        config.coordinator,
        config.num_processes,
        config.process_id,
        config.compile_cache,
    )
    if settings in _started:
        return
    scale_out.start_processes(config)  # before JAX runs anything
    use_compile_cache(config)  # a rerun loads its compiled steps
    _started.add(settings)


def device_sized(config, given=()):
    """`(config, note)`: where no GPU is found, `config` with the
    example's CPU sizes (`CPU_SIZES`) for the sizes not in `given` (the
    flags the user set), and the line that says so; else `config` and
    `None`. Asks the backend for its devices only when a size is left
    to choose: call it after the flags are checked.

    A multi-worker run keeps its sizes: listing devices starts
    TensorFlow's runtime, after which the cluster's collective ops can no
    longer be configured (and such a job is sized for its GPUs)."""
    sized, changes = config.cpu_sized(given)
    if not changes or config.strategy == "multiworker" or has_accelerator():
        return config, None
    shown = ", ".join(f"{name}={value}" for name, value in changes.items())
    return sized, (
        f"kmp: no GPU found: {shown} (CPU sizes); pass them to override."
    )


def prepare(example, config, given=(), show=print) -> tuple:
    """`(config, search)`: what `kmp train` trains `example` (its module)
    with: started (`start`), CPU-sized for the sizes not `given`, with
    the batch `--batch_size=max` finds; `search` is that search's record
    (None for a given batch). Each change is said in a line (`show`)."""
    start(config)  # before the devices are listed
    config, note = device_sized(config, given)
    if note:
        show(note)
    return batch_search.run_config(example, config, show)
