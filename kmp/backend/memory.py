"""What a model's training holds in memory, known before it runs.

    state_bytes        bytes of the weights and of the optimizer's state,
                       from each variable's shape and dtype: exact, on
                       every backend
    train_step_memory  the compiled train step's buffers, from XLA's
                       memory analysis of the step lowered on shapes
                       alone (JAX): nothing is allocated, nothing runs
    device_memory_limit  the bytes a step may take: the first device's
                       limit (JAX's accelerators), else the host's memory

TensorFlow and torch compile nothing ahead of a step that reports its
buffers: there, what a step took is measured after it ran
(`machine.peak_memory`), and `train_step_memory` returns None.
"""

import math
import os
import time

import keras
import ml_dtypes
import numpy as np

from kmp.backend._current import name


def variable_bytes(variables) -> int:
    """Bytes of `variables`, from their shapes and dtypes (a variable
    that a layer and the optimizer share counts once)."""
    seen, total = set(), 0
    for variable in variables:
        if id(variable) in seen:
            continue
        seen.add(id(variable))
        itemsize = np.dtype(_numpy_dtype(variable.dtype)).itemsize
        total += math.prod(variable.shape) * itemsize
    return total


def state_bytes(model) -> dict:
    """`{"weights": bytes, "optimizer_state": bytes}` of a model: every
    weight (trainable or not: float32 masters, BatchNormalization's
    statistics, float8 histories), and every variable of its optimizer
    once built (the slots, the iteration count, a loss scale); 0 for an
    optimizer not built yet."""
    optimizer = getattr(model, "optimizer", None)
    built = optimizer is not None and optimizer.built
    return {
        "weights": variable_bytes(model.weights),
        "optimizer_state": variable_bytes(optimizer.variables) if built else 0,
    }


def train_step_memory(model, x, y, batch_size) -> dict | None:
    """The compiled train step's memory at `batch_size`, from XLA (JAX).

    The step `fit` compiles (`model.train_step` under `jax.jit`, its
    state donated) is lowered on the shapes of the model's variables and
    of a batch of `batch_size` rows shaped like `x` and `y` (arrays, or
    dicts of arrays, whose first dimension is the batch), compiled, and
    asked for its buffers. What the model has not built yet (its
    optimizer, its metrics) is built from one symbolic batch first.

    Args:
        model: A compiled Keras model.
        x: Inputs: arrays (or `jax.ShapeDtypeStruct`s) of any first
            dimension.
        y: Targets, the same.
        batch_size: The batch the step is compiled for.

    Returns:
        `{"argument", "output", "alias", "temp", "footprint"}` in bytes
        (`footprint = argument + output - alias + temp`: the buffers a
        step holds at once, its donated state counted once), and
        `"seconds"` the analysis took; None on TensorFlow and torch.

    Example:

    ```python
    memory = kmp.backend.train_step_memory(model, x, y, batch_size=512)
    memory["footprint"] / 2**30  # GiB
    ```
    """
    if name() != "jax":
        return None
    import jax

    def batch(tree):
        return jax.tree.map(
            lambda a: jax.ShapeDtypeStruct(
                (batch_size, *a.shape[1:]), _numpy_dtype(a.dtype)
            ),
            tree,
        )

    data = (batch(x), batch(y))
    start = time.perf_counter()
    # What Keras's own first step does (Trainer._symbolic_build, as
    # `train_on_batch` calls it): the model, its metrics, its loss and its
    # optimizer built from one symbolic batch, so that the state lowered
    # below holds all their variables. A no-op once built.
    model._symbolic_build(data_batch=data)

    def spec(variables):
        return [
            jax.ShapeDtypeStruct(tuple(v.shape), _numpy_dtype(v.dtype))
            for v in variables
        ]

    state = (
        spec(model.trainable_variables),
        spec(model.non_trainable_variables),
        spec(model.optimizer.variables),
        spec(model.metrics_variables),
    )
    compiled = (
        jax.jit(model.train_step, donate_argnums=0).lower(state, data).compile()
    )
    analysis = compiled.memory_analysis()
    sizes = {
        "argument": int(analysis.argument_size_in_bytes),
        "output": int(analysis.output_size_in_bytes),
        "alias": int(analysis.alias_size_in_bytes),
        "temp": int(analysis.temp_size_in_bytes),
    }
    sizes["footprint"] = (
        sizes["argument"] + sizes["output"] - sizes["alias"] + sizes["temp"]
    )
    sizes["seconds"] = time.perf_counter() - start
    return sizes


def device_memory_limit() -> tuple:
    """`(bytes, source)`: what the first device's allocator may hand out
    (JAX's `memory_stats()["bytes_limit"]` on a GPU or TPU), else the
    host's physical memory (a CPU's step lives there)."""
    if name() == "jax":
        import jax

        device = jax.devices()[0]
        stats = device.memory_stats() or {}
        if stats.get("bytes_limit"):
            return int(stats["bytes_limit"]), f"{device.device_kind} limit"
    pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return int(pages), "host memory"


def _numpy_dtype(dtype):
    """A NumPy dtype for a Keras, JAX, torch or NumPy dtype (bfloat16 and
    the float8 formats are ml_dtypes' types)."""
    standard = keras.backend.standardize_dtype(dtype)
    return np.dtype(getattr(ml_dtypes, standard, standard))
