"""`--batch_size=max`: the largest batch whose compiled train step fits,
found from XLA's memory analysis before anything runs.

Lightning's `BatchSizeFinder` and Accelerate's `find_executable_batch_size`
run steps until one runs out of memory and back off. Here no step runs:
each candidate batch's train step is lowered on shapes and compiled, and
XLA says what it holds (`kmp.backend.train_step_memory`: arguments,
outputs and temporaries, the donated state counted once). The search
doubles from 8 until a step does not fit, then bisects between the last
that fit and the first that did not, in multiples of 8 (tensor cores):
at most 2 log2(batch / 8) + 3 compiles (14 for a batch of 512), each
one recorded.

    probe(b)  = train_step_memory(model, x, y, b)["footprint"]
    fits(b)   = probe(b) <= limit
    b = 8; while fits(b) and b < cap: b *= 2         (doubling)
    then bisect (last fit, first miss) to a step of 8 (or of 1 under 8)

JAX only: TensorFlow and torch have no analysis of a compiled step
before it runs (a clear error says so). The limit is `--memory_limit`,
or the device's (`kmp.backend.device_memory_limit`).
"""

import dataclasses

import keras

import kmp
from kmp import backend
from kmp.app import protocol
from kmp_config import configs

CAP = 1 << 20  # no batch beyond a million rows is looked for
START = 8


def _limit(config):
    if config.memory_limit:
        return config.memory_limit, "--memory_limit"
    limit, source = backend.device_memory_limit()
    return limit, source


def largest_batch(example, config, show=print) -> tuple:
    """`(batch_size, record)`: the largest batch of `example` under
    `config` whose compiled train step fits the limit, and the search.

    Args:
        example: The example's name (`kmp train EXAMPLE`).
        config: Its config, `batch_size` being `configs.MAX_BATCH`.
        show: Where each probe's line goes (a progress line per compile).

    Returns:
        The batch, and `{"limit_bytes", "limit_source", "probes",
        "batch_size", "train_step"}`: every probe's `batch_size`,
        `footprint`, `fits` and compile `seconds`; `train_step` is the
        chosen batch's `train_step_memory`.

    Raises:
        kmp.InputError: on TensorFlow or torch, under a
            `--distribution` (a sharded step: not searched yet), or
            when not even one row fits.
    """
    if backend.name() != "jax":
        raise kmp.InputError(
            f"--batch_size=max reads XLA's analysis of the compiled train "
            f"step, which only the JAX backend gives before a step runs; "
            f"this is {backend.name()}. Run with KERAS_BACKEND=jax, or "
            "give --batch_size."
        )
    if config.distribution != "none" or config.strategy != "none":
        raise kmp.InputError(
            "--batch_size=max measures one device's step; with "
            f"--distribution={config.distribution} or --strategy="
            f"{config.strategy} give --batch_size (per-device search is "
            "not done yet)."
        )
    module = protocol.load_example(example)
    limit, source = _limit(config)
    # The model as the run trains it (policy, master weights, optimizer
    # state, remat); the batch it is compiled for does not change it.
    probe_config = dataclasses.replace(config, batch_size=START)
    with kmp.policy_scope(config.policy, config.master_weights):
        keras.utils.set_random_seed(config.seed)
        model = module.compile_model(probe_config, 1)
        _, x, y = module.bench_inputs(probe_config, 1)
        probes = {}

        def fits(batch):
            memory = backend.train_step_memory(model, x, y, batch)
            probes[batch] = memory
            ok = memory["footprint"] <= limit
            show(
                f"kmp: batch {batch:>7}: train step "
                f"{memory['footprint'] / 2**20:,.1f} MiB "
                f"{'fits' if ok else 'does not fit'} in "
                f"{limit / 2**20:,.0f} MiB ({memory['seconds']:.1f} s)"
            )
            return ok

        batch = _search(fits)
    if batch == 0:
        one = probes[1]["footprint"]
        raise kmp.InputError(
            f"Not one row fits: the {example} train step takes "
            f"{one:,} bytes at batch 1, over the limit of {limit:,} "
            f"({source}). Shrink the model or raise --memory_limit."
        )
    record = {
        "limit_bytes": limit,
        "limit_source": source,
        "probes": [
            {
                "batch_size": b,
                "footprint": m["footprint"],
                "fits": m["footprint"] <= limit,
                "seconds": m["seconds"],
            }
            for b, m in probes.items()
        ],
        "batch_size": batch,
        "train_step": probes[batch],
    }
    return batch, record


def _search(fits) -> int:
    """The largest `b` in [1, CAP] with `fits(b)` (`fits` monotone),
    to a multiple of 8 from 8 up; 0 when even 1 does not fit."""
    if not fits(START):
        low, high, step = 0, START, 1
    else:
        low = START
        while low < CAP and fits(min(2 * low, CAP)):
            low = min(2 * low, CAP)
        if low == CAP:
            return CAP
        high, step = min(2 * low, CAP), START
    # Bisect: `low` fits (or is 0), `high` does not.
    while high - low > step:
        middle = (low + high) // 2 // step * step
        if middle in (low, high):
            break
        if fits(middle):
            low = middle
        else:
            high = middle
    return low


def run_config(example, config, show=print) -> tuple:
    """`(config, record)`: `config` with the batch `--batch_size=max`
    stands for, and the search; `config` and None for a given batch."""
    if config.batch_size != configs.MAX_BATCH:
        return config, None
    batch, record = largest_batch(example, config, show)
    show(
        f"kmp: --batch_size=max -> {batch} (train step "
        f"{record['train_step']['footprint'] / 2**20:,.1f} MiB of "
        f"{record['limit_bytes'] / 2**20:,.0f} MiB, {record['limit_source']})"
    )
    return dataclasses.replace(config, batch_size=batch), record
