"""`--batch_size=max`: the largest batch whose compiled train step fits,
found from XLA's memory analysis before anything runs.

Lightning's `BatchSizeFinder` and Accelerate's `find_executable_batch_size`
run steps until one runs out of memory and back off. Here no step runs:
each candidate batch's train step is lowered on shapes and compiled, and
XLA says what it holds (`kmp.backend.train_step_memory`: arguments,
outputs and temporaries, the donated state counted once). A step's
bytes grow about linearly with its batch (the state is fixed, the
activations go with the rows), so after probes at 8 and 16 the search
goes where the line through its two nearest probes meets the limit, in
multiples of 8 (tensor cores): 4 compiles when the bytes are linear,
each one recorded. Where they are not, it keeps a bracket and falls
back to halving it:

    probe(b)  = train_step_memory(model, x, y, b)["footprint"]
    fits(b)   = probe(b) <= limit
    low = 8 (it fits; else bisect 0..8 a row at a time), high = none yet
    until high - low == 8:
        b = the line through (low, probe(low)) and (high, or the probe
            below low) at the limit, floored to 8, inside (low, high)
            (under 64 * low with no high);
            the middle instead when the last guess did not halve the
            bracket, 2 * low after two fits in a row that did not double
            low (with no high)
        fits(b) ? low = b : high = b

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


def trained_model(example, config) -> tuple:
    """`(model, x, y)`: `example`'s model compiled as `config` trains it
    (policy, master weights, optimizer state, remat: call it inside the
    config's `kmp.policy_scope`) and one synthetic example for it; the
    batch a step is compiled for does not change the model."""
    module = protocol.load_example(example)
    probe_config = dataclasses.replace(config, batch_size=START)
    keras.utils.set_random_seed(config.seed)
    model = module.compile_model(probe_config, 1)
    _, x, y = module.bench_inputs(probe_config, 1)
    return model, x, y


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
    limit, source = _limit(config)
    with kmp.policy_scope(config.policy, config.master_weights):
        model, x, y = trained_model(example, config)
        probes = {}

        def footprint(batch):
            memory = backend.train_step_memory(model, x, y, batch)
            probes[batch] = memory
            ok = memory["footprint"] <= limit
            show(
                f"kmp: batch {batch:>7}: train step "
                f"{memory['footprint'] / 2**20:,.1f} MiB "
                f"{'fits' if ok else 'does not fit'} in "
                f"{limit / 2**20:,.0f} MiB ({memory['seconds']:.1f} s)"
            )
            return memory["footprint"]

        batch = _search(footprint, limit)
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


def _search(footprint, limit) -> int:
    """The largest `b` in [1, CAP] with `footprint(b) <= limit`
    (`footprint` not decreasing), to a multiple of 8 from 8 up; 0 when
    even 1 does not fit (module doc: the line through the two nearest
    probes, kept inside the bracket; a bisection whenever a guess did not
    halve it, a doubling after two fits in a row that did not)."""
    seen = {}

    def fits(batch):
        if batch not in seen:
            seen[batch] = footprint(batch)
        return seen[batch] <= limit

    if not fits(START):
        low, high, step = 0, START, 1  # bisect under 8, one row at a time
    else:
        low, high, step = START, None, START
    halve, creep = False, 0
    while high is None or high - low > step:
        if high is None and low >= CAP:
            return CAP
        width = None if high is None else high - low
        if (high is None and creep >= 2) or halve or low not in seen:
            guess = _bisection(low, high, step)
        else:
            guess = _secant(seen, limit, low, high, step)
        if fits(guess):
            # Fits that less than double, twice in a row: double instead.
            creep = creep + 1 if guess < 2 * low else 0
            low = guess
        else:
            high, creep = guess, 0
        halve = width is not None and high - low > width / 2
    return low


def _bisection(low, high, step):
    """Double `low` with no miss yet, else the bracket's middle."""
    if high is None:
        return min(2 * low, CAP)
    middle = (low + high) // 2 // step * step
    return middle if low < middle < high else low + step


def _secant(seen, limit, low, high, step):
    """Where the line through `low` and the nearest other probe (`high`,
    or the fitting probe below `low`) reaches the limit, floored to
    `step`, strictly between `low` and `high` (with no miss yet: above
    `low`, at most 64 times it; double `low` from a single probe)."""
    below = [b for b in seen if b < low and seen[b] <= limit]
    other = high if high is not None else max(below, default=None)
    guess = 2 * low
    if other is not None and seen[other] != seen[low]:
        slope = (seen[other] - seen[low]) / (other - low)
        if slope > 0:
            guess = int(low + (limit - seen[low]) / slope) // step * step
    if high is None:
        # A near-flat line would send the guess to CAP, and the bracket
        # would then take 17 halvings: 64 times `low` at most.
        return min(max(guess, low + step), 64 * low, CAP)
    return min(max(guess, low + step), high - step)


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
