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
or the device's (`kmp.backend.device_memory_limit`); on a CPU, whose
"device" is the host everyone shares, at most `CPU_LIMIT` and half the
memory available now, said in one line. No batch is larger than what the
data feeds: the training split's rows (per step under `--steps`, so
that no epoch runs out of data); the search probes that batch first,
and when its step fits it is the answer, after one compile (said so).
"""

import dataclasses
import os

import keras

import kmp
from kmp import backend
from kmp.app import batching
from kmp_config import configs

CAP = 1 << 20  # no batch beyond a million rows is looked for
START = 8
# A CPU's limit without --memory_limit: the host is shared (other
# processes, the data, the Python heap), and a CPU's throughput stops
# growing long before a batch fills gigabytes.
CPU_LIMIT = 4 * 2**30


def available_memory() -> int:
    """Bytes the host can hand out now without swapping: Linux's
    `MemAvailable`, else the free pages."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def memory_limit(config, available=available_memory) -> tuple:
    """`(bytes, source)`: what a train step may take under `config`:
    `--memory_limit`; else the accelerator's memory; else (the host's
    memory, on a CPU) `CPU_LIMIT` or half of `available()`, the smaller,
    with a source that says so."""
    if config.memory_limit:
        return config.memory_limit, "--memory_limit"
    limit, source = backend.device_memory_limit()
    if source != "host memory":
        return limit, source
    half = available() // 2
    return min(CPU_LIMIT, half, limit), (
        f"a CPU's default: the smaller of {CPU_LIMIT / 2**30:g} GiB and "
        f"half the {2 * half / 2**30:.1f} GiB available; --memory_limit "
        "sets it"
    )


def trained_model(example, config) -> tuple:
    """`(model, x, y)`: `example`'s model (its module) compiled as
    `config` trains it (policy, master weights, optimizer state, remat:
    call it inside the config's `kmp.policy_scope`) and one synthetic
    example for it; the batch a step is compiled for does not change the
    model."""
    probe_config = dataclasses.replace(config, batch_size=START)
    keras.utils.set_random_seed(config.seed)
    model = example.compile_model(probe_config, 1)
    _, x, y = example.bench_inputs(probe_config, 1)
    return model, x, y


def _name(example) -> str:
    return example.__name__.rsplit(".", 1)[-1]


def largest_batch(example, config, show=print, most=None) -> tuple:
    """`(batch_size, record)`: the largest batch of `example` under
    `config` whose compiled train step fits the limit, and the search.

    Args:
        example: The example's module (`kmp.app.protocol.load_example`).
        config: Its config, `batch_size` being `configs.MAX_BATCH`.
        show: Where each probe's line goes (a progress line per compile).
        most: The largest batch wanted (`data_bound`), or None: when its
            step fits, it is the answer, after one compile.

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
    limit, source = memory_limit(config)
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

        batch = _bounded_search(footprint, limit, most)
    if batch == 0:
        one = probes[1]["footprint"]
        raise kmp.InputError(
            f"Not one row fits: the {_name(example)} train step takes "
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


def _bounded_search(footprint, limit, most=None) -> int:
    """`most` when its footprint fits (one probe), else `_search`'s
    answer (below `most`: the footprint does not decrease)."""
    if most is not None and footprint(most) <= limit:
        return most
    return _search(footprint, limit)


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


def data_bound(example, config) -> tuple:
    """`(rows, what)`: the largest batch `example`'s training data under
    `config` feeds whole: its training split's rows, or under `--steps`
    the rows of one step (an epoch takes `steps` batches of the split,
    and would run out of data); `(None, None)` for an example without
    `load_data`."""
    if not hasattr(example, "load_data"):
        return None, None
    rows = batching.split_size(example.load_data(config).train)
    if config.steps:
        return rows // config.steps, (
            f"the {rows} training rows over --steps={config.steps}"
        )
    return rows, f"the {rows} training rows"


def run_config(example, config, show=print) -> tuple:
    """`(config, record)`: `config` with the batch `--batch_size=max`
    stands for, and the search; `config` and None for a given batch.
    The batch is at most what the data feeds (`data_bound`), said so.

    Args:
        example: The example's module (`kmp.app.protocol.load_example`).
        config: Its config.
        show: Where the search's lines go.
    """
    if config.batch_size != configs.MAX_BATCH:
        return config, None
    rows, what = data_bound(example, config)
    if rows is not None and rows < 1:
        raise kmp.InputError(
            f"--batch_size=max: {what} leave not one row per step; lower "
            "--steps or give more data."
        )
    batch, record = largest_batch(example, config, show, most=rows)
    step = (
        f"train step {record['train_step']['footprint'] / 2**20:,.1f} MiB "
        f"of {record['limit_bytes'] / 2**20:,.0f} MiB, "
        f"{record['limit_source']}"
    )
    if batch == rows:
        record["data_bound"] = rows
        show(
            f"kmp: --batch_size=max -> {batch}: {what}, the most the data "
            f"feeds without repeating rows ({step})"
        )
    else:
        show(f"kmp: --batch_size=max -> {batch} ({step})")
    return dataclasses.replace(config, batch_size=batch), record
