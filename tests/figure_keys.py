"""Where each figure of the docs' tables comes from: the results file of
its row and the key of each of its cells (`docs_figures_test.py`).

`BENCHMARKS_KEYS[(heading, k)]` holds the keys of the k-th table (from
0) under the `## heading` of BENCHMARKS.md, `DOCS_KEYS[(page, heading,
k)]` those of a table of a page under docs/ (`page` as `docs/x.md`),
`README_KEYS` those of README's Results table, and `PROSE_KEYS` those
of the figures a guide gives in a sentence. A table's keys:
`{"cells": n, "rows": {row: (file, {column: [path, ...]})}}`.
`row` is the row's first cell, or with `cells` = n > 1 the tuple of its
first n cells, exactly as written; `file` a path under
`benchmarks/results/` that the table's section names; `column` a header
cell as written. The figures of a cell, in order, are the values at its
paths, in order: a cell "0.956-1.065" has two paths, one with nothing to
check none. A path is a tuple of JSON keys, list indices and dicts (in
a list, the item with those fields: `{"variant": "bf16"}`), or a
function of the file's JSON for a figure that is derived (said where).
A column not listed holds no figures (a label such as "yes").
A `.txt` file (what a command printed: `steps.txt`, a run's summary) is
read as text, by a function path (`wall_seconds`, `printed`).
"""

import json
import pathlib
import re
import statistics
from functools import cache

RESULTS = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "results"


@cache
def load(name):
    text = (RESULTS / name).read_text()
    return text if name.endswith(".txt") else json.loads(text)


def resolve(name, path):
    """The value at `path` in the results file `name`."""
    data = load(name)
    if callable(path):
        return path(data)
    return _at(data, path)


def ratio_keys(pair):
    """A `common.ratio_table` row: median, quartiles, fastest."""
    return {
        "median": [("ratios", pair, "median")],
        "quartiles": [("ratios", pair, "q1"), ("ratios", pair, "q3")],
        "fastest": [("ratios", pair, "fastest")],
    }


def median_of(*path):
    """A derived figure: the median of the list at `path`."""
    return lambda data: statistics.median(_at(data, path))


def lowest_of(*path):
    """A derived figure: the smallest value of the list at `path`."""
    return lambda data: min(_at(data, path))


def highest_of(*path):
    """A derived figure: the largest value of the list at `path`."""
    return lambda data: max(_at(data, path))


def wall_seconds(step):
    """A figure of a `steps.txt` (`benchmarks/gpu_session.sh`): `step`'s
    wall time in seconds."""
    pattern = rf"(?m)^{re.escape(step)} rc=0 wall_s=([\d.]+)$"
    return lambda text: float(re.search(pattern, text)[1])


def printed(label):
    """A figure of a printed `kmp train` summary: its table's `label` row."""
    pattern = rf"│ {re.escape(label)} +│ +([\d.]+) │"
    return lambda text: float(re.search(pattern, text)[1])


def _at(data, path):
    for key in path:
        if isinstance(key, dict):
            (data,) = [
                item
                for item in data
                if all(item.get(k) == v for k, v in key.items())
            ]
        else:
            data = data[key]
    return data


def _ratio_columns(pair, median, quartiles, fastest):
    """The columns of a `common.ratio_table` row, for the ratio `pair`."""
    keys = ratio_keys(pair)
    return {
        median: keys["median"],
        quartiles: keys["quartiles"],
        fastest: keys["fastest"],
    }


_OVERHEAD = {  # BENCHMARKS.md's label -> the benchmark's ratio
    "**kmp / stock**": "kmp/stock",
    "kmp+monitor / kmp": "kmp+mon/kmp",
    "stock / none": "stock/none",
    "kmp / none": "kmp/none",
}
_BACKEND_NAMES = {
    "TensorFlow": "tensorflow",
    "JAX": "jax",
    "torch (eager)": "torch",
}
# The two columns after the median in most ratio tables.
_SPREAD = ("25th-75th percentile", "ratio of fastest epochs")


def _bench_columns(variants):
    """A row of the H100 bench table: per variant (each its own column)
    the examples/s and the speed against float32 (`kmp bench`'s own
    fields), and the one memory figure (float32's)."""
    columns = {}
    for variant in variants:
        row = ("results", {"variant": variant})
        paths = [(*row, "examples_per_s")]
        if variant != "float32":
            paths.append((*row, "speed_vs_float32"))
        columns[variant] = paths
    columns["memory (one figure)"] = [
        ("results", {"variant": "float32"}, "peak_memory_mib")
    ]
    return columns


_H100 = "h100_2026-11-22/"
_H100_BENCH = ("float32", "fp16+kmp", "fp16+stock", "bf16")
_PROBE = {
    "float32 (TF32)": "float32",
    "fp16 + kmp scaler": "fp16+kmp",
    "fp16 + stock scaler": "fp16+stock",
    "bf16": "bf16",
}


def _probe_row(run, speeds):
    """A Keras probe row: images/s, and the speed against float32 where
    the cell gives one."""
    columns = {}
    for column, variant in _PROBE.items():
        paths = [(run, variant, "img_s")]
        if variant in speeds:
            paths.append((run, variant, "vs_f32"))
        columns[column] = paths
    return (_H100 + "probe_keras.json", columns)


_TORCH_AMP = {
    "Keras float32": "keras float32",
    "Keras fp16 + kmp": "keras fp16+kmp",
    "Keras bf16": "keras bf16",
    "Keras fp16 + kmp, Keras's BN": "keras fp16+kmp, Keras's BN",
    "Keras bf16, Keras's BN": "keras bf16, Keras's BN",
    "PyTorch float32": "torch float32",
    "PyTorch fp16 + `torch.amp`": "torch fp16+amp",
    "PyTorch bf16 + `torch.amp`": "torch bf16+amp",
}
_TORCH_TINY = (
    "Keras bf16",
    "Keras bf16, Keras's BN",
    "PyTorch bf16 + `torch.amp`",
)
_TORCH_RATIOS = {
    "Keras float32 / PyTorch float32": "keras float32 / torch float32",
    "Keras fp16 + kmp / PyTorch fp16 + `torch.amp`": (
        "keras fp16+kmp / torch fp16+amp"
    ),
    "Keras bf16 / PyTorch bf16 + `torch.amp`": "keras bf16 / torch bf16+amp",
    "Keras bf16, fused BN / Keras's BN": "keras bf16 / keras bf16, Keras's BN",
    "Keras fp16 + kmp, fused BN / Keras's BN": (
        "keras fp16+kmp / keras fp16+kmp, Keras's BN"
    ),
}
_POLICY_SPEED = {
    "TensorFlow, XLA": "policy_speed_tensorflow_jit_true.json",
    "TensorFlow, no XLA": "policy_speed_tensorflow_jit_false.json",
    "JAX (XLA)": "policy_speed_jax_jit_true.json",
}
_PROCESSES = ("1 process", "2 processes")

# The columns of a `benchmarks/fit_overlap.py` row (its JSON's keys).
_FIT_OVERLAP_COLUMNS = {
    "waits: step (ms)": [("variants", "waits", "step_ms")],
    "kmp: step (ms)": [("variants", "kmp", "step_ms")],
    "waits: epoch (s)": [("variants", "waits", "epoch_s")],
    "kmp: epoch (s)": [("variants", "kmp", "epoch_s")],
    "waits / kmp, epoch (median of rounds, quartiles)": [
        ("waits_over_kmp", key) for key in ("median", "q1", "q3")
    ],
}

_PART1 = {
    ("Loss-scale overhead: kmp vs the stock Keras scaler", 0): {
        "cells": 2,
        "rows": {
            (label, backend): (
                f"loss_scale_overhead_{_BACKEND_NAMES[backend]}.json",
                _ratio_columns(
                    pair,
                    "median of 25 per-round ratios",
                    *_SPREAD,
                ),
            )
            for label, pair in _OVERHEAD.items()
            for backend in _BACKEND_NAMES
            # kmp / none: the table shows torch's only (its fused unscale).
            if pair != "kmp/none" or backend == "torch (eager)"
        },
    },
    ("Cost of `kmp.pin_float32` on a transformer", 0): {
        "cells": 2,
        "rows": {
            ("pinned / unpinned", backend): (
                f"pinning_cost_{_BACKEND_NAMES[backend]}.json",
                _ratio_columns(
                    "pinned/unpinned",
                    "median of 15 per-round ratios",
                    *_SPREAD,
                ),
            )
            for backend in ("TensorFlow", "JAX")
        },
    },
    ("Cost of `kmp.pin_float32` on a transformer", 1): {
        "cells": 2,
        "rows": {
            ("pinned / unpinned", "JAX, H100"): (
                _H100 + "pinning_cost_jax_h100.json",
                _ratio_columns(
                    "pinned/unpinned",
                    "median of 8 per-round ratios",
                    *_SPREAD,
                ),
            )
        },
    },
    ("Dtype policy speed on this CPU", 0): {
        "rows": {
            label: (
                name,
                {
                    "float32 img/s": [("images_per_second", "float32")],
                    **{
                        policy: [
                            ("images_per_second", policy),
                            ("speed_vs_float32", policy),
                        ]
                        for policy in ("mixed_bfloat16", "mixed_float16")
                    },
                },
            )
            for label, name in _POLICY_SPEED.items()
        }
    },
    (
        "Replica agreement: kmp vs the stock scaler under MirroredStrategy",
        0,
    ): {
        "rows": {
            "kmp / stock": (
                "mirrored_agreement_tensorflow.json",
                _ratio_columns(
                    "kmp/stock",
                    "median of 15 per-round ratios",
                    *_SPREAD,
                ),
            )
        }
    },
    ("Multi-worker: 2 workers vs 1 on the same global batch", 0): {
        "rows": {
            "median step time, ms (3 rounds)": (
                "multi_worker_scaling_tensorflow.json",
                {
                    workers: [("step_seconds", workers, i) for i in range(3)]
                    for workers in ("1 worker", "2 workers")
                },
            )
        }
    },
    ("Multi-worker: 2 workers vs 1 on the same global batch", 1): {
        "rows": {
            "2 workers / 1 worker": (
                "multi_worker_scaling_tensorflow.json",
                _ratio_columns(
                    "2 workers / 1 worker",
                    "median of 3 per-round ratios",
                    "25th-75th percentile",
                    "ratio of fastest rounds",
                ),
            )
        }
    },
    ("Many JAX processes: 2 processes vs 1 on the same global batches", 0): {
        "rows": {
            label: (
                "jax_processes_cpu.json",
                {column: [(field, column)] for column in _PROCESSES},
            )
            for label, field in (
                ("examples/s (median of 3)", "examples_per_s"),
                ("final loss", "final_loss"),
                ("skipped steps", "skipped_steps"),
            )
        }
    },
    ("Many JAX processes: 2 processes vs 1 on the same global batches", 1): {
        "rows": {
            "largest step-loss difference over the 40 steps": (
                "jax_processes_cpu.json",
                {"value": [("largest_step_loss_difference",)]},
            ),
            "2 processes / 1 process, examples/s": (
                "jax_processes_cpu.json",
                {"value": [("two_over_one_examples_per_s",)]},
            ),
        }
    },
    ("On an H100 (Keras JAX backend, 2026-11-22)", 0): {
        "rows": {
            'Keras `fit`, arrays (`probe_keras.json`, "fit")': _probe_row(
                "fit", ("fp16+kmp", "fp16+stock", "bf16")
            ),
            "Keras, one jitted stateless step, data on device "
            '("raw")': _probe_row("raw", ("fp16+kmp",)),
            "PyTorch eager, channels_last, torch.amp (`probe_torch.json`)": (
                _H100 + "probe_torch.json",
                {
                    "float32 (TF32)": [("results", "float32", "img_s")],
                    "fp16 + kmp scaler": [
                        ("results", "fp16+GradScaler", "img_s")
                    ],
                    "bf16": [("results", "bf16", "img_s")],
                },
            ),
            "PyTorch `torch.compile`": (
                _H100 + "probe_torch.json",
                {
                    "fp16 + kmp scaler": [
                        ("results", "fp16+GradScaler compiled", "img_s")
                    ],
                    "bf16": [("results", "bf16 compiled", "img_s")],
                },
            ),
            "`kmp train cifar10 --data=synthetic` (3 epochs, batch 512; "
            "`train_cifar10_fp16_h100.json`)": (
                _H100 + "train_cifar10_fp16_h100.json",
                {"fp16 + kmp scaler": [("examples_per_s",)]},
            ),
        }
    },
    ("On an H100 (Keras JAX backend, 2026-11-22)", 1): {
        "rows": {
            "cifar10 (width 64, batch 512), examples/s": (
                _H100 + "bench_cifar10_jax_h100.json",
                _bench_columns(_H100_BENCH),
            ),
            "imdb (d_model 512, batch 64, seq 256), examples/s": (
                _H100 + "bench_imdb_jax_h100.json",
                _bench_columns(_H100_BENCH),
            ),
        }
    },
    ("Does `fit` wait for each step's logs?", 0): {
        "rows": {
            name: (
                f"fit_overlap_{name}.json",
                _FIT_OVERLAP_COLUMNS,
            )
            for name in ("jax", "torch")
        }
    },
    ("Float8 on PyTorch: kmp's matmul through `torch._scaled_mm`", 0): {
        "cells": 2,
        "rows": {
            ("256", matmul): (
                "float8_matmul_torch_256.json",
                {
                    "step (ms)": [
                        lambda data, m=matmul: (
                            1000 * data["sizes"][0]["runs"][m]["step_time_s"]
                        )
                    ],
                    "`_scaled_mm` a step": [
                        ("sizes", 0, "runs", matmul, "scaled_mm_calls")
                    ],
                    "speed vs bf16": (
                        [("sizes", 0, "speed_vs_bf16")]
                        if matmul == "float8"
                        else []
                    ),
                },
            )
            for matmul in ("bf16", "float8")
        },
    },
    ("Keras on PyTorch with kmp vs PyTorch's own `torch.amp`", 0): {
        "rows": {
            label: (
                "torch_amp_small.json",
                {
                    "images/s (median round)": [("images_per_s", variant)],
                    "aten calls a step": [("aten_calls_per_step", variant)],
                    "loss before": [("loss_before", variant)],
                    "loss after": [("loss_after", variant)],
                },
            )
            for label, variant in _TORCH_AMP.items()
        }
    },
    ("Keras on PyTorch with kmp vs PyTorch's own `torch.amp`", 2): {
        "rows": {
            label: (
                "torch_amp_tiny.json",
                {
                    "images/s (median round)": [
                        ("images_per_s", _TORCH_AMP[label])
                    ],
                    "aten calls a step": [
                        ("aten_calls_per_step", _TORCH_AMP[label])
                    ],
                },
            )
            for label in _TORCH_TINY
        }
    },
    ("Keras on PyTorch with kmp vs PyTorch's own `torch.amp`", 3): {
        "rows": {
            label: (
                "torch_amp_tiny_compiled.json",
                {
                    "images/s (median round)": [
                        ("images_per_s", _TORCH_AMP[label])
                    ]
                },
            )
            for label in ("Keras bf16", "PyTorch bf16 + `torch.amp`")
        }
    },
    ("Keras on PyTorch with kmp vs PyTorch's own `torch.amp`", 1): {
        "rows": {
            label: ("torch_amp_small.json", {"": [("speed_ratios", ratio)]})
            for label, ratio in _TORCH_RATIOS.items()
        }
    },
}


def _feed_row(name):
    return (
        name,
        {
            # Derived: the medians of the per-round rates.
            "feed img/s": [median_of("images_per_s", "feed")],
            "resident img/s": [median_of("images_per_s", "resident")],
            # The median is stored; the range is derived (lowest, highest
            # per-round ratio).
            "feed / resident (median of rounds, range)": [
                ("median_ratio",),
                lowest_of("feed_over_resident_per_round"),
                highest_of("feed_over_resident_per_round"),
            ],
        },
    )


def _start_up_row(what, rounds=True):
    columns = {"median of 5 rounds (s)": [("median_s", what)]}
    if rounds:  # derived: the fastest and the slowest round
        columns["fastest-slowest round (s)"] = [
            lowest_of("seconds", what),
            highest_of("seconds", what),
        ]
    return ("start_up_tensorflow.json", columns)


def _cold_build(which):
    return (
        "cold_start_jax.json",
        {
            "programs": [("build", which, "programs")],
            "compile s (median of 3)": [("build", which, "median_seconds")],
        },
    )


def _cold_run(distribution):
    run = ("cold_runs", {"distribution": distribution})
    return (
        "cold_start_jax.json",
        {
            "programs": [(*run, "programs")],
            "train and test steps (s)": [(*run, "step_seconds")],
            "other programs": [(*run, "other_programs")],
            "others (s)": [(*run, "other_seconds")],
        },
    )


def _lm_row(backend, variant):
    at = ("variants", variant)
    return (
        f"lm_float8_{backend}.json",
        {
            "tokens/s": [(*at, "tokens_per_s")],
            "peak memory (MiB)": [(*at, "peak_memory_mib")],
            "final loss": [(*at, "final_loss")],
            "test loss": [(*at, "test_loss")],
        },
    )


def _share_of_peak(at):
    """A derived figure: a bench row's TFLOP/s over the device's peak."""
    return lambda data: (
        _at(data, (*at, "tflops_achieved")) / _at(data, (*at, "tflops_peak"))
    )


def _bench_table(name, model, peak=False):
    """A `kmp bench` table as `bench.md` writes it; `peak`: its TFLOP/s
    cells read "113 (23% of 494)" (a device whose peak kmp knows)."""
    rows = {}
    for variant in ("float32", "fp16+kmp", "fp16+stock", "bf16"):
        at = ("results", {"model": model, "variant": variant})
        tflops = [(*at, "tflops_achieved")]
        if peak:
            tflops += [_share_of_peak(at), (*at, "tflops_peak")]
        rows[variant] = (
            name,
            {
                "step time (ms)": [(*at, "step_time_s")],  # seconds, x1000
                "examples/s": [(*at, "examples_per_s")],
                "speed vs float32": [(*at, "speed_vs_float32")],
                "TFLOP/s": tflops,
                "peak memory (MiB)": [(*at, "peak_memory_mib")],
                "loss before": [(*at, "loss_before")],
                "loss after": [(*at, "loss")],
            },
        )
    return {"cells": 1, "rows": rows}


def _parity_row(example, policy):
    # IMDB's rows are the IMDB rerun's file (its float8 row is only
    # there; its other rows equal the first file's, the section says).
    name = f"parity{'_imdb' if example == 'imdb' else ''}_tensorflow.json"
    at = ("runs", {"example": example, "policy": policy})
    return (
        name,
        {
            "test accuracy": [(*at, "accuracy")],
            "final training loss": [(*at, "final_loss")],
        },
    )


def _doctor_row(name):
    return (
        name,
        {
            "two training steps (s)": [
                ("rounds", i, "two_steps_s") for i in range(3)
            ],
            "diagnose (s)": [("rounds", i, "diagnose_s") for i in range(3)],
            "ratio per round": [("rounds", i, "ratio") for i in range(3)],
            "median": [("median_ratio",)],
        },
    )


_BENCH = "`kmp bench`: float32 vs mixed precision on the example models"
_H100_25 = "h100_2026-11-25/"
_ON_H100_25 = "On an H100 (Keras JAX backend, 2026-11-25)"
_FLOAT8 = "Float8: `kmp.float8` vs bfloat16 vs Keras's float8"
_FLOAT8_VARIANTS = (
    "bf16",
    "bf16+kmp.float8",
    "bf16+keras.float8",
    "fp16+kmp.float8",
)
_TRAIN_COLUMNS = {  # in-fit column: (results.json field, summary row)
    "examples/s": ("examples_per_s", "examples/s"),
    "step time (ms)": ("step_time_s", "step time (ms)"),
    "peak memory (MiB)": ("peak_memory_mib", "peak memory (MiB)"),
    "final loss": ("final_loss", "final loss"),
    "test accuracy": ("accuracy", "accuracy"),
    "loss scale": ("loss_scale", "loss scale"),
    "skipped steps": ("skipped_steps", "skipped steps"),
}


def _float8_row(model, variant):
    at = ("runs", {"model": model, "variant": variant})
    return (
        _H100_25 + "float8_speed_jax.json",
        {
            "step (ms)": [(*at, "step_time_s")],  # seconds, x1000
            "speed vs bf16": [(*at, "speed_vs_bf16")],
            "TFLOP/s": [(*at, "tflops")],
            "loss before": [(*at, "loss_before")],
            "loss after": [(*at, "loss_after")],
        },
    )


_PARITY = [
    ("cifar10", "float32"),
    ("cifar10", "mixed_float16"),
    ("cifar10", "mixed_bfloat16"),
    ("imdb", "float32"),
    ("imdb", "mixed_float16"),
    ("imdb", "mixed_bfloat16"),
    ("imdb", "mixed_bfloat16+float8"),
]

_MEMORY = "Memory modes: 16-bit state, 16-bit master weights, remat"
_INT8 = '8-bit optimizer state (`state_dtype="int8"`)'
_INT8_MODES = ("float32", "bf16 state", "int8 state", "int8 + bf16 masters")
_INT8_UPDATES = (
    "float32",
    "bf16 state",
    "both",
    "int8 state",
    "int8 + bf16 masters",
)
_H200_26 = "h200_2026-11-26/"
_ON_H200_26 = "Memory modes on an H200 (Keras JAX backend, 2026-11-26)"
_MEMORY_MODES = (
    "float32",
    "bf16 state",
    "bf16 masters",
    "both",
    "float32 + remat",
    "both + remat",
)


def _memory_row(path, mode, tokens=False):
    """A row of `benchmarks/memory_modes.py`'s table (`tokens`: with its
    tokens/s column, the language model's)."""
    at = ("modes", mode)
    columns = {
        "weights + state (bytes)": [
            lambda data: (
                _at(data, (*at, "weights_bytes"))
                + _at(data, (*at, "optimizer_state_bytes"))
            )
        ],
        "x float32": [(*at, "bytes_over_float32")],
        "final loss (change)": [(*at, "final_loss"), (*at, "loss_change")],
        "examples/s": [(*at, "examples_per_s")],
        "peak MiB": [(*at, "peak_memory_mib")],
    }
    if tokens:
        columns["tokens/s"] = [(*at, "tokens_per_s")]
    return path, columns


def _memory_table(path, modes=_MEMORY_MODES, tokens=False):
    return {"rows": {mode: _memory_row(path, mode, tokens) for mode in modes}}


def _seeds_row(path, mode, seeds, tokens=False):
    """A row of `memory_modes.py --seeds=...`'s table: the mean loss,
    and each seed's change."""
    path, columns = _memory_row(path, mode, tokens)
    at = ("modes", mode)
    columns["mean final loss (change)"] = columns.pop("final loss (change)")
    columns["change per seed"] = [
        (*at, "loss_changes", i) for i in range(seeds)
    ]
    return path, columns


def _update_row(name, path="optimizer_update_torch.json"):
    """A row of `benchmarks/optimizer_update.py`'s table."""
    at = ("updates", name)
    return (
        path,
        {
            "ms (median)": [(*at, "median_ms")],
            "x float32 (median of rounds)": [(*at, "over_float32", "median")],
        },
    )


_MIB = 2**20


def _printed_footprint(mode, group):
    """A figure of `memory_footprint.py`'s printed line for `mode`:
    weights (1), state (2), footprint MiB (3), temp MiB (4)."""
    pattern = (
        rf"(?m)^ *{re.escape(mode)}: weights ([\d,]+) B, state ([\d,]+) B, "
        r"step footprint ([\d,.]+) MiB \(temp ([\d,.]+) MiB\)"
    )
    return lambda text: float(re.search(pattern, text)[group].replace(",", ""))


def _printed_probe(batch):
    """A figure of a printed `--batch_size=max` probe: its step's MiB."""
    pattern = rf"(?m)^kmp: batch +{batch}: train step ([\d,.]+) MiB"
    return lambda text: float(re.search(pattern, text)[1].replace(",", ""))


def _footprint_row(path, mode):
    """A row of `benchmarks/memory_footprint.py`'s table."""
    at = ("modes", mode)
    step = (*at, "train_step")
    return (
        path,
        {
            "weights": [(*at, "weights")],
            "optimizer state": [(*at, "optimizer_state")],
            "step temp": [(*step, "temp")],
            "step footprint": [(*step, "footprint")],
            "x first": [
                lambda data: (
                    _at(data, (*step, "footprint"))
                    / _at(data, ("modes", "float32", "train_step", "footprint"))
                )
            ],
        },
    )


_PART2 = {
    (_MEMORY, 0): _memory_table("memory_modes_lm_jax.json", tokens=True),
    (_MEMORY, 1): _memory_table("memory_modes_cifar10_jax.json"),
    (_MEMORY, 2): _memory_table("memory_modes_cifar10_jax_40_steps.json"),
    (_MEMORY, 3): {
        "rows": {
            mode: _seeds_row(
                "memory_modes_cifar10_jax_40_steps_4_seeds.json", mode, 4
            )
            for mode in ("float32", "bf16 state", "bf16 masters", "both")
        }
    },
    (_MEMORY, 4): {
        "rows": {
            mode: _footprint_row("memory_footprint_lm_jax.json", mode)
            for mode in _MEMORY_MODES
        }
    },
    (_MEMORY, 5): _memory_table(
        "memory_modes_lm_torch.json",
        ("float32", "bf16 state", "both"),
        tokens=True,
    ),
    (_MEMORY, 6): {
        "rows": {
            name: _update_row(name)
            for name in (
                "float32",
                "bf16 state",
                "both",
                "bf16 state, per variable",
                "both, per variable",
            )
        }
    },
    (_INT8, 0): {
        "rows": {
            mode: _seeds_row("memory_modes_lm_int8_jax.json", mode, 3, True)
            for mode in ("float32", "int8 state", "int8 + bf16 masters")
        }
    },
    (_INT8, 1): {
        "rows": {
            mode: _seeds_row("memory_modes_cifar10_int8_jax.json", mode, 4)
            for mode in ("float32", "int8 state", "int8 + bf16 masters")
        }
    },
    (_INT8, 2): {
        "rows": {
            mode: _seeds_row(
                "memory_modes_cifar10_int8_120_steps_6_seeds_jax.json",
                mode,
                6,
            )
            for mode in ("float32", "both", "int8 + bf16 masters")
        }
    },
    (_INT8, 3): {
        "rows": {
            name: _update_row(name, "optimizer_update_jax_compiled.json")
            for name in _INT8_UPDATES
        }
    },
    (_INT8, 4): {
        "rows": {
            name: _update_row(name, "optimizer_update_torch_int8.json")
            for name in (
                *_INT8_UPDATES,
                "bf16 state, per variable",
                "both, per variable",
            )
        }
    },
    (_INT8, 5): {
        "rows": {
            mode: _footprint_row("memory_footprint_lm_int8_jax.json", mode)
            for mode in _INT8_MODES
        }
    },
    (_INT8, 6): {
        "rows": {
            mode: _footprint_row(
                "memory_footprint_lm_int8_barriers_jax.json", mode
            )
            for mode in _INT8_MODES
        }
    },
    (_ON_H200_26, 0): _memory_table(
        _H200_26 + "memory_modes_lm_jax.json",
        ("float32", "bf16 state", "both", "both + remat"),
        tokens=True,
    ),
    (_ON_H200_26, 1): {
        "rows": {
            **{
                mode: (
                    _H200_26 + "footprint.txt",
                    {
                        "weights (bytes)": [_printed_footprint(mode, 1)],
                        "optimizer state (bytes)": [
                            _printed_footprint(mode, 2)
                        ],
                        "step temp (MiB)": [_printed_footprint(mode, 4)],
                        "step footprint (MiB)": [_printed_footprint(mode, 3)],
                    },
                )
                for mode in ("float32", "bf16 state", "bf16 masters", "both")
            },
            **{
                mode: (
                    _H200_26 + "footprint_remat.json",
                    {
                        "weights (bytes)": [("modes", mode, "weights")],
                        "optimizer state (bytes)": [
                            ("modes", mode, "optimizer_state")
                        ],
                        "step temp (MiB)": [
                            lambda data, m=mode: (
                                _at(data, ("modes", m, "train_step", "temp"))
                                / _MIB
                            )
                        ],
                        "step footprint (MiB)": [
                            lambda data, m=mode: (
                                _at(
                                    data,
                                    ("modes", m, "train_step", "footprint"),
                                )
                                / _MIB
                            )
                        ],
                    },
                )
                for mode in ("float32 + remat", "both + remat")
            },
        }
    },
    (_ON_H200_26, 2): {
        "cells": 2,
        "rows": {
            **{
                ("float32", str(batch)): (
                    _H200_26 + "max_batch_float32.txt",
                    {"train step (MiB)": [_printed_probe(batch)]},
                )
                for batch in (8, 16, 32, 64)
            },
            **{
                ("float32", str(batch)): (
                    _H200_26 + f"footprint_float32_{batch}.json",
                    {
                        "train step (MiB)": [
                            lambda data: (
                                _at(
                                    data,
                                    (
                                        "modes",
                                        "float32",
                                        "train_step",
                                        "footprint",
                                    ),
                                )
                                / _MIB
                            )
                        ]
                    },
                )
                for batch in (48, 40)
            },
            **{
                ("both + remat", str(batch)): (
                    _H200_26 + "max_batch_both.txt",
                    {"train step (MiB)": [_printed_probe(batch)]},
                )
                for batch in (8, 16)
            },
        },
    },
    # The 2026-11-25 H100 section (before the 2026-11-22 one in the doc).
    (_ON_H100_25, 0): {
        "rows": {
            f"{cache} compile cache": (
                _H100_25 + "steps.txt",
                {
                    "wall time, process start to exit (s)": [
                        wall_seconds(f"train_cifar10_{cache}")
                    ]
                },
            )
            for cache in ("cold", "warm")
        }
    },
    (_ON_H100_25, 1): {
        "rows": {
            "cold compile cache": (
                _H100_25 + "train_cifar10_cold_results.json",
                {c: [(field,)] for c, (field, _) in _TRAIN_COLUMNS.items()},
            ),
            # Its results.json did not come back from the device; what it
            # printed did.
            "warm compile cache": (
                _H100_25 + "train_cifar10_warm_summary.txt",
                {c: [printed(row)] for c, (_, row) in _TRAIN_COLUMNS.items()},
            ),
        }
    },
    (_ON_H100_25, 2): _bench_table(_H100_25 + "bench.json", "cifar10", True),
    (_ON_H100_25, 3): _bench_table(_H100_25 + "bench.json", "imdb", True),
    (_FLOAT8, 0): {
        "cells": 2,
        "rows": {
            (model, variant): _float8_row(model, variant)
            for model in ("stack", "transformer")
            for variant in _FLOAT8_VARIANTS
        },
    },
    ("Does the input feed starve the step?", 0): {
        "cells": 1,
        "rows": {
            "tensorflow": _feed_row("feed_tensorflow.json"),
            "jax": _feed_row("feed_jax.json"),
        },
    },
    ("Start-up: the command, the imports, the synthetic data", 0): {
        "cells": 1,
        "rows": {
            "`kmp --help`": _start_up_row("kmp --help"),
            '`python -c "import keras"`': _start_up_row("import keras"),
            '`python -c "import keras, kmp"`': _start_up_row(
                "import keras, kmp"
            ),
            "what `import kmp` adds (median of per-round differences)": (
                _start_up_row("import kmp adds", rounds=False)
            ),
            "`synthetic_images()`": _start_up_row("synthetic_images()"),
        },
    },
    ("A cold JAX start: the programs compiled before training", 0): {
        "cells": 1,
        "rows": {
            "Keras (a program per initializer and shape)": _cold_build("keras"),
            "`initialized_together`": _cold_build("together"),
        },
    },
    ("A cold JAX start: the programs compiled before training", 1): {
        "cells": 1,
        "rows": {
            "one device": _cold_run("none"),
            "`--distribution=data`, 4 virtual devices": _cold_run("data"),
        },
    },
    ("Language model: bfloat16 vs `kmp.float8` (examples/lm.py)", 0): {
        "cells": 1,
        "rows": {
            f"{label}, {variant}": _lm_row(backend, variant)
            for label, backend in (("JAX", "jax"), ("TensorFlow", "tensorflow"))
            for variant in ("bfloat16", "float8")
        },
    },
    **{
        ("Language model: bfloat16 vs `kmp.float8` (examples/lm.py)", k): {
            "rows": {
                variant: (
                    f"lm_float8_300_steps_kmp_matmul_{name}.json",
                    {
                        "float8 layers": [
                            ("variants", variant, "float8_layers")
                        ],
                        "final loss": [("variants", variant, "final_loss")],
                        "test loss": [("variants", variant, "test_loss")],
                    },
                )
                for variant in ("bfloat16", "float8")
            },
        }
        for k, name in ((1, "jax"), (2, "torch"))
    },
    (_BENCH, 0): _bench_table("bench_cpu_tensorflow/bench.json", "cifar10"),
    (_BENCH, 1): _bench_table("bench_cpu_tensorflow/bench.json", "imdb"),
    (_BENCH, 2): _bench_table("bench_cpu_jax/bench.json", "cifar10"),
    (_BENCH, 3): _bench_table("bench_cpu_jax/bench.json", "imdb"),
    ("Accuracy parity: float32 vs mixed precision", 0): {
        "cells": 3,
        "rows": {
            (example, "synthetic", policy): _parity_row(example, policy)
            for example, policy in _PARITY
        },
    },
    ("Cost of `kmp.diagnose`", 0): {
        "cells": 1,
        "rows": {
            "TensorFlow (eager: Keras turns XLA off on a CPU-only TF machine, "
            "for `fit` and so for the doctor)": _doctor_row(
                "doctor_cost_tensorflow.json"
            ),
            "JAX (XLA)": _doctor_row("doctor_cost_jax.json"),
        },
    },
}
_H200_27 = "h200_2026-11-27/"
_ON_H200_27 = "On an H200 (Keras JAX backend, 2026-11-27)"


def _matmul_row(size):
    """A row of `float8_matmul.py`'s size sweep."""
    at = ("sizes", {"size": size})
    return (
        _H200_27 + "float8_matmul_jax.json",
        {
            "bf16 step (ms)": [(*at, "runs", "bf16", "step_time_s")],
            "float8 step (ms)": [(*at, "runs", "float8", "step_time_s")],
            "bf16 TFLOP/s": [(*at, "runs", "bf16", "tflops")],
            "float8 TFLOP/s": [(*at, "runs", "float8", "tflops")],
            "FP8 GEMMs": [(*at, "runs", "float8", "fp8_gemms")],
            "float8 vs bf16": [(*at, "speed_vs_bf16")],
        },
    )


def _lm_speed_row(name, variant, alone, folder=_H200_27, tokens=False):
    """A row of `lm_speed.py` in `folder`: a variant's step timed alone
    after its compile (`alone`), or the median of interleaved rounds;
    with its tokens/s column (`tokens`)."""
    at = ("runs", {"variant": variant})
    step, mfu = (
        ("solo_step_time_s", "solo_mfu")
        if alone
        else (
            "step_time_s",
            "mfu",
        )
    )
    columns = {
        "step (ms)": [(*at, step)],
        "MFU": [(*at, mfu)],
        "loss": [(*at, "loss_solo")],
    }
    if tokens:
        columns["tokens/s"] = [(*at, "tokens_per_s")]
    return folder + name, columns


_FLOAT8_FIT = _H200_27 + "float8_speed_two_variants_jax.json"
_FUSED = "bf16+flash+causal"
_PART3 = {
    (_ON_H200_27, 0): {
        "rows": {
            str(size): _matmul_row(size) for size in (1024, 2048, 4096, 8192)
        }
    },
    (_ON_H200_27, 1): {
        "cells": 2,
        "rows": {
            (model, variant): (
                _FLOAT8_FIT,
                {
                    "step (ms)": [
                        (
                            "runs",
                            {"model": model, "variant": variant},
                            "step_time_s",
                        )
                    ],
                    "speed vs bf16": [
                        (
                            "runs",
                            {"model": model, "variant": variant},
                            "speed_vs_bf16",
                        )
                    ],
                    "TFLOP/s": [
                        ("runs", {"model": model, "variant": variant}, "tflops")
                    ],
                    "loss after": [
                        (
                            "runs",
                            {"model": model, "variant": variant},
                            "loss_after",
                        )
                    ],
                },
            )
            for model in ("stack", "transformer")
            for variant in ("bf16", "bf16+kmp.float8(matmul=kmp)")
        },
    },
    (_ON_H200_27, 2): {
        "cells": 2,
        "rows": {
            ("1024 x 16, batch 32", "bf16"): _lm_speed_row(
                "lm_speed_narrow_jax.json", "bf16", alone=True
            ),
            ("1024 x 16, batch 32", _FUSED): _lm_speed_row(
                "lm_speed_narrow_jax.json", _FUSED, alone=True
            ),
            ("1024 x 16, batch 32", _FUSED + "+kmp.float8"): _lm_speed_row(
                "lm_speed_narrow_jax.json", _FUSED + "+kmp.float8", alone=True
            ),
            ("2048 x 24, batch 16", _FUSED): _lm_speed_row(
                "lm_speed_wide_jax.json", _FUSED, alone=False
            ),
            ("2048 x 24, batch 16", _FUSED + "+kmp.float8"): _lm_speed_row(
                "lm_speed_wide_jax.json", _FUSED + "+kmp.float8", alone=False
            ),
            ("2048 x 24, batch 32", _FUSED): _lm_speed_row(
                "lm_speed_wide_b32_jax.json", _FUSED, alone=False
            ),
        },
    },
    (_ON_H200_27, 3): {
        "rows": {
            variant: (
                _H200_27 + "torch_amp_full.json",
                {"images/s": [("images_per_s", variant)]},
            )
            for variant in (
                "keras float32",
                "keras fp16+kmp",
                "keras bf16",
                "torch float32",
                "torch fp16+amp",
                "torch bf16+amp",
            )
        }
    },
}

_H200_28 = "h200_2026-11-28/"
_ON_H200_28 = "On an H200 (Keras JAX backend, 2026-11-28)"
# float8_matmul.py's names then: "float8" wrote float32 (kmp's form
# before 2026-11-28), "float8 out16" bfloat16 (kmp's form since).
_FORMS_28 = {
    "bf16": "bf16",
    "f32 out": "float8",
    "bf16 out": "float8 out16",
    "dequantized": "float8 dequantized",
}


def _forms_row(size):
    """A row of the 2026-11-28 sweep of float8 GEMM forms."""
    name = (
        "float8_matmul_8192_jax.json"
        if size == 8192
        else ("float8_matmul_jax.json")
    )
    runs = ("sizes", {"size": size}, "runs")
    columns = {
        f"{label} step (ms)": [(*runs, run, "step_time_s")]
        for label, run in _FORMS_28.items()
    }
    columns.update(
        {
            f"{label} vs bf16": [(*runs, run, "speed_vs_bf16")]
            for label, run in _FORMS_28.items()
            if label != "bf16"
        }
    )
    columns["FP8 GEMMs: f32 out, bf16 out, dequantized"] = [
        (*runs, run, "fp8_gemms")
        for label, run in _FORMS_28.items()
        if label != "bf16"
    ]
    return (_H200_28 + name, columns)


def _lm_row_28(name, variant):
    """A row of the 2026-11-28 `lm_speed.py` runs (interleaved medians)."""
    return _lm_speed_row(name, variant, False, _H200_28, tokens=True)


_PART4 = {
    (_ON_H200_28, 0): {
        "rows": {
            str(size): _forms_row(size) for size in (1024, 2048, 4096, 8192)
        }
    },
    (_ON_H200_28, 1): {
        "cells": 2,
        "rows": {
            ("1024 x 16, batch 32", variant): _lm_row_28(
                "lm_speed_narrow_jax.json", variant
            )
            for variant in ("bf16+flash", _FUSED)
        }
        | {
            ("2048 x 24, batch 16", variant): _lm_row_28(
                "lm_speed_2048x24_jax.json", variant
            )
            for variant in (_FUSED, _FUSED + "+kmp.float8")
        }
        | {
            ("4096 x 8, batch 8", variant): _lm_row_28(
                "lm_speed_wide_jax.json", variant
            )
            for variant in (_FUSED, _FUSED + "+kmp.float8")
        },
    },
}
_COMPILED = "What XLA compiles for an H200, read on a CPU (2026-11-29)"
_LM_COMPILED = {  # BENCHMARKS.md's label -> gpu_compile.py's variant
    "bf16": "bf16+nodrop",
    "float8": "bf16+nodrop+kmp.float8",
    "float8 out32": "bf16+nodrop+kmp.float8 out32",
    "float8 noamax": "bf16+nodrop+kmp.float8 noamax",
}


def _compiled_row(
    program, config, variant, columns, *within, file="gpu_compile_h200.json"
):
    """A row of `gpu_compile.py`'s records: `columns` maps each header to
    its key (under `within`: `per_block` for the language model's)."""
    record = (
        "records",
        {"program": program, "config": config, "variant": variant},
    )
    return (
        file,
        {header: [(*record, *within, key)] for header, key in columns.items()},
    )


_STACK_COMPILED_OUTSIDE = {
    "kernels outside GEMMs": "kernels_outside_gemms",
    "of them < 64 KB": "small_kernels_outside_gemms",
    "GB outside GEMMs": "gb_outside_gemms",
    "ms at 4.8 TB/s": "ms_outside_gemms_at_bandwidth",
}
_STACK_COMPILED = {"FP8 GEMMs": "fp8_gemms", **_STACK_COMPILED_OUTSIDE}
_PART5 = {
    (_COMPILED, 0): {
        "cells": 2,
        "rows": {
            (str(size), variant): _compiled_row(
                "stack",
                f"4 x {size}^2, 8192 tokens",
                variant,
                _STACK_COMPILED,
            )
            for size in (2048, 4096, 8192)
            for variant in (
                "bf16",
                "float8",
                "float8 out32",
                "float8 dequantized",
                "float8 noamax",
            )
        },
    },
    (_COMPILED, 1): {
        "cells": 2,
        "rows": {
            (f"{width}, batch {batch}", label): _compiled_row(
                "lm",
                f"{width}x2, batch {batch}",
                variant,
                {
                    **_STACK_COMPILED,
                    "16-bit GEMMs": "gemms_16bit",
                    "FP8 TFLOP": "fp8_gemm_tflop",
                },
                "per_block",
            )
            for width, batch in ((2048, 16), (4096, 8))
            for label, variant in _LM_COMPILED.items()
        },
    },
    (_COMPILED, 2): {
        "cells": 2,
        "rows": {
            (f"8192 x {size}", variant): _compiled_row(
                "quantize",
                f"8192 x {size}",
                variant,
                {
                    "kernels": "kernels_outside_gemms",
                    "Triton kernels": "triton_fusions",
                    "GB moved": "gb_outside_gemms",
                },
            )
            for size in (2048, 4096, 8192)
            for variant in (
                "per tensor",
                "per row",
                "per row, no scales out",
            )
        },
    },
}
_POSITIONS = (
    "KerasHub's position embedding and XLA's GPU layouts, read on a CPU "
    "(2026-11-29)"
)
_POSITION_VARIANTS = {  # BENCHMARKS.md's label -> gpu_compile.py's variant
    "kmp's": _FUSED,
    "KerasHub's": _FUSED + "+hubpos",
}


def _positions_row(config, variant, columns, *within):
    return _compiled_row(
        "lm",
        config,
        variant,
        columns,
        *within,
        file="gpu_compile_h200_position_embedding.json",
    )


_PART6 = {
    (_POSITIONS, 0): {
        "cells": 2,
        "rows": {
            ("1024 x 16, batch 32", label): _positions_row(
                "1024x16, batch 32", variant, _STACK_COMPILED_OUTSIDE
            )
            for label, variant in _POSITION_VARIANTS.items()
        },
    },
    (_POSITIONS, 1): {
        "cells": 2,
        "rows": {
            (f"{width}, batch {batch}", label): _positions_row(
                config,
                variant,
                {
                    "kernels outside GEMMs": "kernels_outside_gemms",
                    "GB outside GEMMs": "gb_outside_gemms",
                    "ms at 4.8 TB/s": "ms_outside_gemms_at_bandwidth",
                },
                "per_block",
            )
            for width, batch, config in (
                (1024, 32, "1024x16, batch 32"),
                (2048, 32, "2048x2, batch 32"),
                (2048, 16, "2048x2, batch 16"),
            )
            for label, variant in _POSITION_VARIANTS.items()
        },
    },
    (_POSITIONS, 2): {
        "cells": 2,
        "rows": {
            (str(batch), label): _compiled_row(
                "layout",
                f"batch {batch}, width 1024",
                variant,
                {
                    "kernels outside GEMMs": "kernels_outside_gemms",
                    "GB outside GEMMs": "gb_outside_gemms",
                    "16-bit GEMMs": "gemms_16bit",
                    "batch-innermost shapes named": "batch_innermost",
                },
                file="gpu_compile_h200_position_embedding.json",
            )
            for batch in (16, 31, 32, 64)
            for label, variant in (
                ("`broadcast_to`", "broadcast_to"),
                ("kmp's", "broadcast_over_batch"),
            )
        },
    },
}
_GELU = "A GELU recomputed in the backward pass, read on a CPU (2026-11-29)"
_GELU_VARIANTS = {  # BENCHMARKS.md's label -> gpu_compile.py's variant
    "recomputed": _FUSED,
    "as written": _FUSED + "+hubgelu",
}
_GELU_COLUMNS = {
    "kernels outside GEMMs": "kernels_outside_gemms",
    "GB outside GEMMs": "gb_outside_gemms",
    "GB in GEMMs": "gemm_operand_gb",
}


def _gelu_row(program, config, variant, *within):
    return _compiled_row(
        program,
        config,
        variant,
        _GELU_COLUMNS,
        *within,
        file="gpu_compile_h200_gelu.json",
    )


_PART7 = {
    (_GELU, 0): {
        "cells": 2,
        "rows": {
            (name, form): _gelu_row(
                "activation",
                "16384 tokens, 1024 -> 4096 -> 1024",
                f"{name}, {form}",
            )
            for name in ("gelu approximate", "gelu exact", "relu", "silu")
            for form in ("as written", "recomputed")
        },
    },
    (_GELU, 1): {
        "cells": 2,
        "rows": {
            (f"{width}, batch {batch}", label): _gelu_row(
                "lm", config, variant, "per_block"
            )
            for width, batch, config in (
                (1024, 32, "1024x16, batch 32"),
                (2048, 16, "2048x2, batch 16"),
                (4096, 8, "4096x2, batch 8"),
            )
            for label, variant in _GELU_VARIANTS.items()
        },
    },
    (_GELU, 2): {
        "cells": 2,
        "rows": {
            ("1024 x 16, batch 32", label): _gelu_row(
                "lm", "1024x16, batch 32", variant
            )
            for label, variant in _GELU_VARIANTS.items()
        },
    },
}
_BIAS = (
    "An attention's projection biases in the matmul, read on a CPU (2026-11-29)"
)
_BIAS_VARIANTS = {  # BENCHMARKS.md's label -> gpu_compile.py's variant
    "flat": _FUSED,
    "as written": _FUSED + "+hubbias",
}


def _bias_row(variant, *within):
    return _compiled_row(
        "lm",
        "1024x16, batch 32",
        variant,
        _GELU_COLUMNS,
        *within,
        file="gpu_compile_h200_bias.json",
    )


_PART8 = {
    (_BIAS, 0): {
        "cells": 2,
        "rows": {
            (scope, label): _bias_row(variant, *within)
            for scope, within in (
                ("one block", ("per_block",)),
                ("the whole step", ()),
            )
            for label, variant in _BIAS_VARIANTS.items()
        },
    },
}
_CAUSAL = "A decoder's causal mask told to cuDNN, read on a CPU (2026-11-29)"
_CAUSAL_VARIANTS = {  # BENCHMARKS.md's label -> gpu_compile.py's variant
    "the mask and is_causal (kmp)": "bf16+flash",
    "the mask alone (KerasHub)": "bf16+flash+hubcausal",
    "is_causal, no mask (the patch)": _FUSED,
}
_PART9 = {
    (_CAUSAL, 0): {
        "rows": {
            label: _compiled_row(
                "lm",
                "1024x2, batch 32",
                variant,
                {
                    "GB outside GEMMs": "gb_outside_gemms",
                    "GB in GEMMs": "gemm_operand_gb",
                },
                "per_block",
                file="gpu_compile_h200_causal.json",
            )
            for label, variant in _CAUSAL_VARIANTS.items()
        },
    },
}
_FAMILY = "The Llama family's causal mask, read on a CPU (2026-11-29)"
_FAMILY_VARIANTS = {  # BENCHMARKS.md's label -> gpu_compile.py's variant
    "the mask and is_causal (kmp)": "pinned",
    "the mask alone (KerasHub)": "hubcausal",
    "the mask and is_causal, keys and values grouped": "ungrouped",
}


_HUB_COLUMNS = {
    "kernels outside GEMMs": "kernels_outside_gemms",
    "GB outside GEMMs": "gb_outside_gemms",
    "GB in GEMMs": "gemm_operand_gb",
    "16-bit GEMM TFLOP": "gemm_16bit_tflop",
}


def _hub_compiled(program, width, variants, file=None, columns=None):
    """A table of gpu_compile.py's `llama` or `gemma` program: a decoder
    block's kernels and bytes for each of `variants` (label -> variant),
    from `file` (the program's by default)."""
    return {
        "rows": {
            label: _compiled_row(
                program,
                f"width {width}, 2 blocks, batch 8 x 1024",
                variant,
                columns or _HUB_COLUMNS,
                "per_block",
                file=file or f"gpu_compile_h200_{program}.json",
            )
            for label, variant in variants.items()
        },
    }


def _hub_block_bytes(program, width, key="gb_outside_gemms", file=""):
    """A README row's figures from that program's file (with `file`'s
    suffix): a block's `key`, kmp's call's and KerasHub's (GB outside
    the GEMMs unless it says)."""
    return [
        (
            f"gpu_compile_h200_{program}{file}.json",
            (
                "records",
                {
                    "program": program,
                    "config": f"width {width}, 2 blocks, batch 8 x 1024",
                    "variant": variant,
                },
                "per_block",
                key,
            ),
        )
        for variant in ("pinned", "hubcausal")
    ]


_PART9[(_FAMILY, 0)] = _hub_compiled("llama", 2048, _FAMILY_VARIANTS)
_GEMMA = "Gemma's causal mask, read on a CPU (2026-11-29)"
_PART9[(_GEMMA, 0)] = _hub_compiled(
    "gemma", 1152, dict(list(_FAMILY_VARIANTS.items())[:2])
)
_PART9[
    ("Gemma's sliding window told to cuDNN, read on a CPU (2026-11-29)", 0)
] = _hub_compiled(
    "gemma",
    1152,
    {
        "the mask, is_causal and the window (kmp)": "pinned",
        "the mask alone (KerasHub)": "hubcausal",
    },
    file="gpu_compile_h200_gemma_window.json",
    columns={
        "cuDNN calls told a window": "windowed_attention_calls",
        **{k: v for k, v in _HUB_COLUMNS.items() if "TFLOP" not in k},
    },
)
_H200_29 = "h200_2026-11-29/"
_ON_H200_29 = "On an H200 (Keras JAX backend, 2026-11-29)"


def _stack_row_29(size):
    """A row of the 2026-11-29 stack at `size` (Triton's GEMMs on)."""
    runs = ("sizes", {"size": size}, "runs")
    forms = ("bf16", "float8", "float8 out32")
    columns = {f"{f} step (ms)": [(*runs, f, "step_time_s")] for f in forms}
    columns.update(
        {f"{f} vs bf16": [(*runs, f, "speed_vs_bf16")] for f in forms[1:]}
    )
    columns["FP8 GEMMs: float8, float8 out32"] = [
        (*runs, f, "fp8_gemms") for f in forms[1:]
    ]
    return (_H200_29 + "float8_matmul_jax.json", columns)


def _cublas_row_29(form):
    """A row of the 2026-11-29 stack at 8192 with Triton's GEMMs off."""
    at = ("sizes", {"size": 8192}, "runs", form)
    columns = {
        "step (ms)": [(*at, "step_time_s")],
        "FP8 GEMMs": [(*at, "fp8_gemms")],
    }
    if form != "bf16":
        columns["vs bf16"] = [(*at, "speed_vs_bf16")]
    return (_H200_29 + "float8_matmul_cublas_jax.json", columns)


_PART10 = {
    (_ON_H200_29, 0): {
        "rows": {str(size): _stack_row_29(size) for size in (4096, 8192)}
    },
    (_ON_H200_29, 1): {
        "rows": {
            form: _cublas_row_29(form)
            for form in (
                "bf16",
                "float8",
                "float8 dequantized",
                "float8 noamax",
            )
        }
    },
    (_ON_H200_29, 2): {
        "cells": 2,
        "rows": {
            ("1024 x 16, batch 32", variant): _lm_speed_row(
                "lm_speed_1024_jax.json", variant, False, _H200_29, True
            )
            for variant in (
                "bf16+flash",
                "bf16+flash+hubcausal",
                _FUSED,
                _FUSED + "+hubpos+hubgelu+hubbias",
            )
        }
        | {
            ("2048 x 24, batch 16", variant): _lm_speed_row(
                "lm_speed_2048_float8_jax.json", variant, False, _H200_29, True
            )
            for variant in (_FUSED, _FUSED + "+kmp.float8")
        },
    },
}
_H200_29B = "h200_2026-11-29b/"
_ON_H200_29B = "On an H200 (Keras JAX backend, 2026-11-29, second session)"
_BENCH_29B = _H200_29B + "fit/bench/bench.json"
_TRAIN_29B = _H200_29B + "fit/train_cifar10/results.json"


def _in_fit_over_bench(results):
    """The main job's rate in `fit` over the bench's fp16+kmp row (two
    files, so derived: the row's file is the job's)."""
    bench = _at(load(_BENCH_29B), ("results", {"variant": "fp16+kmp"}))
    return results["examples_per_s"] / bench["examples_per_s"]


def _bench_row_29b(variant):
    at = ("results", {"variant": variant})
    return (
        _BENCH_29B,
        {
            "step (ms)": [(*at, "step_time_s")],
            "examples/s": [(*at, "examples_per_s")],
            "speed vs float32": [(*at, "speed_vs_float32")],
            "MFU": [(*at, "mfu")],
            "loss after": [(*at, "loss")],
        },
    )


def _hub_speed_row(file, model, variant):
    """A row of `hub_attention_speed.py`: the step, its speed against
    KerasHub's mask alone, and its cuDNN calls of the CAUSAL type and
    those told a window (a derived count: every window but 0)."""
    at = ("runs", {"model": model, "variant": variant})
    return (
        _H200_29B + file,
        {
            "step (ms)": [(*at, "step_ms")],
            "vs hubcausal": [(*at, "speed_vs_hubcausal")],
            "cuDNN calls: CAUSAL": [
                lambda data: _at(data, (*at, "attention_mask_types")).get(
                    "CAUSAL", 0
                )
            ],
            "cuDNN calls told a window": [
                lambda data: sum(
                    count
                    for window, count in _at(
                        data, (*at, "attention_windows")
                    ).items()
                    if window != "0"
                )
            ],
        },
    )


_PART11 = {
    (_ON_H200_29B, 0): {
        "rows": {
            "`kmp bench`, fp16+kmp: the median of 2 rounds of 10 steps": (
                _BENCH_29B,
                {
                    "step (ms)": [
                        ("results", {"variant": "fp16+kmp"}, "step_time_s")
                    ],
                    "examples/s": [
                        ("results", {"variant": "fp16+kmp"}, "examples_per_s")
                    ],
                },
            ),
            "`kmp train`: `StepLog`'s median step in `fit`": (
                _TRAIN_29B,
                {
                    "step (ms)": [("step_time_s",)],
                    "examples/s": [("examples_per_s",)],
                    "in fit / bench": [_in_fit_over_bench],
                },
            ),
        }
    },
    (_ON_H200_29B, 1): {
        "rows": {
            v: _bench_row_29b(v)
            for v in ("float32", "fp16+kmp", "fp16+stock", "bf16")
        }
    },
    (_ON_H200_29B, 2): {
        "rows": {
            "jax": (
                _H200_29B + "fit/fit_overlap_jax.json",
                _FIT_OVERLAP_COLUMNS,
            )
        }
    },
    (_ON_H200_29B, 3): {
        "rows": {
            label: (
                _H200_29B + "fit/torch_amp_full.json",
                {
                    "images/s (median round)": [("images_per_s", variant)],
                    "aten calls a step": [("aten_calls_per_step", variant)],
                    "loss after": [("loss_after", variant)],
                },
            )
            for label, variant in _TORCH_AMP.items()
        }
    },
    (_ON_H200_29B, 4): {
        "rows": {
            label: (
                _H200_29B + "fit/torch_amp_full.json",
                {"": [("speed_ratios", _TORCH_RATIOS[label])]},
            )
            for label in (
                "Keras fp16 + kmp / PyTorch fp16 + `torch.amp`",
                "Keras bf16 / PyTorch bf16 + `torch.amp`",
                "Keras fp16 + kmp, fused BN / Keras's BN",
                "Keras bf16, fused BN / Keras's BN",
            )
        }
    },
    (_ON_H200_29B, 5): {
        "cells": 2,
        "rows": {
            (str(size), matmul): (
                _H200_29B + "fit/float8_matmul_torch.json",
                {
                    "step (ms)": [(*at, "step_time_s")],
                    "TFLOP/s": [(*at, "tflops")],
                    "`_scaled_mm` a step": [(*at, "scaled_mm_calls")],
                    "speed vs bf16": (
                        [(*at, "speed_vs_bf16")] if matmul == "float8" else []
                    ),
                },
            )
            for size in (4096, 8192)
            for matmul in ("bf16", "float8")
            for at in [("sizes", {"size": size}, "runs", matmul)]
        },
    },
    (_ON_H200_29B, 6): {
        "cells": 2,
        "rows": {
            ("4096 x 8, batch 8", variant): _lm_speed_row(
                "lm_speed_4096_jax.json", variant, False, _H200_29B, True
            )
            for variant in (_FUSED, _FUSED + "+kmp.float8")
        }
        | {
            (f"1024 x 16, batch {batch}", _FUSED): _lm_speed_row(
                f"lm_speed_1024_b{batch}_jax.json",
                _FUSED,
                False,
                _H200_29B,
                True,
            )
            for batch in (64, 128)
        },
    },
    (_ON_H200_29B, 7): {
        "cells": 2,
        "rows": {
            (f"{name}, {tokens}", variant): _hub_speed_row(file, model, variant)
            for name, model, tokens, file, variants in (
                (
                    "Llama",
                    "llama",
                    "8 x 1024",
                    "hub_attention_speed.json",
                    ("pinned", "hubcausal"),
                ),
                (
                    "Gemma 3",
                    "gemma",
                    "8 x 1024",
                    "hub_attention_speed.json",
                    ("pinned", "nowindow", "hubcausal"),
                ),
                (
                    "Gemma 3",
                    "gemma",
                    "4 x 4096",
                    "hub_attention_speed_long.json",
                    ("pinned", "nowindow", "hubcausal"),
                ),
            )
            for variant in variants
        },
    },
}
_PART11[("Float8 on PyTorch: kmp's matmul through `torch._scaled_mm`", 1)] = {
    "rows": {
        "eager": (
            "float8_quantize_torch_4096.json",
            {
                "ms a call": [("call_ms", "eager")],
                "aten calls": [("eager_aten_calls",)],
            },
        ),
        "compiled": (
            "float8_quantize_torch_4096.json",
            {
                "ms a call": [("call_ms", "compiled")],
                "compiled's speed vs eager (median of rounds, quartiles)": [
                    ("compiled_speedup", key) for key in ("median", "q1", "q3")
                ],
            },
        ),
    }
}
BENCHMARKS_KEYS = {
    **_PART1,
    **_PART2,
    **_PART3,
    **_PART4,
    **_PART5,
    **_PART6,
    **_PART7,
    **_PART8,
    **_PART9,
    **_PART10,
    **_PART11,
}


def _runs(example, policy, field):
    """A field of a parity run (`benchmarks/parity.py`)."""
    return ("runs", {"example": example, "policy": policy}, field)


def _bench(model, field="speed_vs_float32", variant="fp16+kmp"):
    return ("results", {"model": model, "variant": variant}, field)


def _lm_step_bytes(file, undone):
    """The bytes outside and in the GEMMs of the 1024 x 16 step at batch
    32 with kmp's fix and with it `undone`, in that order."""
    return [
        (
            file,
            (
                "records",
                {"program": "lm", "config": "1024x16, batch 32", "variant": v},
                key,
            ),
        )
        for key in ("gb_outside_gemms", "gemm_operand_gb")
        for v in (_FUSED, _FUSED + undone)
    ]


# README's Results table has one figure column: each row's figures, in
# order, are `(file, path)` pairs (a row may gather several files).
_OVERHEAD_FILES = [
    f"loss_scale_overhead_{b}.json" for b in ("tensorflow", "jax", "torch")
]
README_KEYS = {
    'kmp\'s own float8 matmul (`kmp.float8(model, matmul="kmp")`, JAX) vs '
    "bfloat16, a jitted forward and backward step of 4 square kernels on "
    "8192 rows, kernels of 4096 / 8192 (issue 41's target at 8192: >= "
    "1.5x); in `fit`, the Dense stack of 8192 / the IMDB Transformer at "
    "d_model 2048": [
        (
            _H200_27 + "float8_matmul_jax.json",
            ("sizes", {"size": size}, "speed_vs_bf16"),
        )
        for size in (4096, 8192)
    ]
    + [
        (
            _FLOAT8_FIT,
            (
                "runs",
                {"model": model, "variant": "bf16+kmp.float8(matmul=kmp)"},
                "speed_vs_bf16",
            ),
        )
        for model in ("stack", "transformer")
    ],
    "KerasHub's GPT-2 in bfloat16 at width 2048 (24 layers, sequence 512, "
    "batch 16), dropout 0 and cuDNN flash attention: model FLOPs "
    "utilization (issue 41's target: >= 40%), and tokens/s with kmp's "
    "float8 matmul / without (target: >= 1.3x)": [
        (
            _H200_27 + "lm_speed_wide_jax.json",
            ("runs", {"variant": _FUSED}, "mfu"),
        ),
        (
            _H200_27 + "lm_speed_wide_jax.json",
            ("runs", {"variant": _FUSED + "+kmp.float8"}, "speed_vs_first"),
        ),
    ],
    "the memory modes on KerasHub's GPT-2 at width 1024 (8 layers, sequence "
    "512, AdamW, mixed_bfloat16, batch 16): weights + optimizer state with "
    "bfloat16 state / with bfloat16 state and master weights (issue 32's "
    "targets: 0.67x / 0.5x), and the device's peak in float32 mode / with "
    "both and `--remat`": [
        (_H200_26 + "memory_modes_lm_jax.json", ("modes", mode, key))
        for mode, key in (
            ("bf16 state", "bytes_over_float32"),
            ("both", "bytes_over_float32"),
            ("float32", "peak_memory_mib"),
            ("both + remat", "peak_memory_mib"),
        )
    ],
    "epoch time, kmp scaler / stock Keras scaler (median of 25 interleaved "
    "rounds)": [
        (name, ("ratios", "kmp/stock", "median")) for name in _OVERHEAD_FILES
    ],
    "epoch time with / without `LossScaleMonitor`": [
        (name, ("ratios", "kmp+mon/kmp", "median")) for name in _OVERHEAD_FILES
    ],
    "epoch time, pinned / unpinned small transformer": [
        (f"pinning_cost_{b}.json", ("ratios", "pinned/unpinned", "median"))
        for b in ("tensorflow", "jax")
    ],
    "epoch time, kmp / stock scaler under MirroredStrategy (2 logical CPUs)": [
        ("mirrored_agreement_tensorflow.json", path)
        for path in ratio_keys("kmp/stock")["median"]
        + ratio_keys("kmp/stock")["quartiles"]
    ],
    "step time, 2 workers / 1 worker, same global batch (ResNet-9 example)": [
        (
            "multi_worker_scaling_tensorflow.json",
            ("ratios", "2 workers / 1 worker", "median"),
        )
    ],
    "the main job (`kmp train cifar10`, mixed_float16, ResNet-9 width 64, "
    "batch 512): its rate in `fit` over `kmp bench`'s (issue 41's target: "
    ">= 0.90); the language model in bfloat16 at width 1024 (16 layers, "
    "batch 64): MFU (target: >= 40%); at width 4096 (8 layers, batch 8): "
    "`kmp.float8` vs bfloat16; Keras on torch with kmp vs PyTorch with "
    "`torch.amp` on ResNet-9, float16 / bfloat16, eager; kmp's float8 "
    "matmul on eager torch vs bfloat16, kernels of 8192": [
        (_TRAIN_29B, _in_fit_over_bench),
        (
            _H200_29B + "lm_speed_1024_b64_jax.json",
            ("runs", {"variant": _FUSED}, "mfu"),
        ),
        (
            _H200_29B + "lm_speed_4096_jax.json",
            ("runs", {"variant": _FUSED + "+kmp.float8"}, "speed_vs_first"),
        ),
        (
            _H200_29B + "fit/torch_amp_full.json",
            ("speed_ratios", "keras fp16+kmp / torch fp16+amp"),
        ),
        (
            _H200_29B + "fit/torch_amp_full.json",
            ("speed_ratios", "keras bf16 / torch bf16+amp"),
        ),
        (
            _H200_29B + "fit/float8_matmul_torch.json",
            ("sizes", {"size": 8192}, "speed_vs_bf16"),
        ),
    ],
    "kmp's float8 matmul on torch (`torch._scaled_mm`) vs bfloat16, an "
    "eager forward and backward step of 4 square kernels (256 wide on a CPU)": [
        ("float8_matmul_torch_256.json", ("sizes", 0, "speed_vs_bf16"))
    ],
    "ResNet-9 in Keras on torch with kmp vs the same net in PyTorch with "
    "`torch.amp`, bfloat16; kmp's fused BatchNormalization (`pin_float32` "
    "on torch) vs Keras's": [
        ("torch_amp_small.json", ("images_per_s", "keras bf16")),
        ("torch_amp_small.json", ("images_per_s", "torch bf16+amp")),
        (
            "torch_amp_small.json",
            ("speed_ratios", "keras bf16 / torch bf16+amp"),
        ),
        (
            "torch_amp_small.json",
            ("speed_ratios", "keras bf16 / keras bf16, Keras's BN"),
        ),
    ],
    "`kmp bench` (ResNet-9 / IMDB Transformer, small sizes): mixed_float16 "
    "speed vs float32": [
        (f"bench_cpu_{b}/bench.json", _bench(model))
        for b in ("tensorflow", "jax")
        for model in ("cifar10", "imdb")
    ],
    "test accuracy, float32 vs mixed_float16 vs mixed_bfloat16, on synthetic "
    "data with 10% of its labels redrawn (which caps CIFAR-10 at the share "
    "of labels left right, IMDB at about 95%)": [
        ("parity_tensorflow.json", _runs("cifar10", "float32", "accuracy")),
        *(
            ("parity_imdb_tensorflow.json", _runs("imdb", p, "accuracy"))
            for p in ("float32", "mixed_float16", "mixed_bfloat16")
        ),
        (
            "parity_imdb_tensorflow.json",
            _runs("imdb", "mixed_bfloat16+float8", "accuracy"),
        ),
        (
            "parity_imdb_tensorflow.json",
            _runs("imdb", "mixed_bfloat16+float8", "final_loss"),
        ),
        (
            "parity_imdb_tensorflow.json",
            _runs("imdb", "mixed_bfloat16", "final_loss"),
        ),
    ],
    "in-fit rate, the example's feed / one resident batch (ResNet-9 width "
    "16, batch 128; target >= 0.90)": [
        (f"feed_{b}.json", ("median_ratio",)) for b in ("tensorflow", "jax")
    ],
    "`kmp.diagnose` time / two training steps, CIFAR-10 ResNet-9, batch "
    "128, 2 batches (target < 10)": [
        (f"doctor_cost_{b}.json", ("median_ratio",))
        for b in ("tensorflow", "jax")
    ],
    "mixed vs float32 speed on CPU, 4-conv net": [
        # The ranges' ends: the lowest and highest mixed speed per case.
        ("policy_speed_jax_jit_true.json", ("speed_vs_float32", p))
        for p in ("mixed_float16", "mixed_bfloat16")
    ]
    + [
        ("policy_speed_tensorflow_jit_false.json", ("speed_vs_float32", p))
        for p in ("mixed_bfloat16", "mixed_float16")
    ],
    "epoch time, pinned / unpinned transformer at d_model 1024 (target on a "
    "GPU <= 1.03)": [
        (
            "h100_2026-11-22/pinning_cost_jax_h100.json",
            ("ratios", "pinned/unpinned", "median"),
        )
    ],
    '8-bit optimizer state (`kmp.wrap(..., state_dtype="int8")`), the '
    "language model at CPU sizes with AdamW, 3 seeds: weights + state vs "
    "float32's with float32 / bfloat16 masters (issue 42's bounds: 0.51x / "
    "0.345x), and the mean final loss's change (bounds: 1% / 2%); ResNet-9 "
    "(SGD) with bfloat16 masters, 4 seeds at 40 steps / 6 seeds at 120 "
    "steps": [
        ("memory_modes_lm_int8_jax.json", ("modes", mode, key))
        for key in ("bytes_over_float32", "loss_change")
        for mode in ("int8 state", "int8 + bf16 masters")
    ]
    + [
        (path, ("modes", "int8 + bf16 masters", "loss_change"))
        for path in (
            "memory_modes_cifar10_int8_jax.json",
            "memory_modes_cifar10_int8_120_steps_6_seeds_jax.json",
        )
    ],
    "kmp's float8 matmul since 2026-11-28, its GEMM writing bfloat16 "
    "itself, vs bfloat16: the same step of 4 square kernels on 8192 rows, "
    "kernels of 4096 / 8192 (issue 41's target at 8192: >= 1.5x); the "
    "language model at width 1024 (16 layers, batch 32) with the example's "
    "`--dropout=0`: MFU (target >= 40%)": [
        (
            _H200_28 + "float8_matmul_jax.json",
            ("sizes", {"size": 4096}, "runs", "float8 out16", "speed_vs_bf16"),
        ),
        (
            _H200_28 + "float8_matmul_8192_jax.json",
            ("sizes", {"size": 8192}, "runs", "float8 out16", "speed_vs_bf16"),
        ),
        (
            _H200_28 + "lm_speed_narrow_jax.json",
            ("runs", {"variant": "bf16+flash"}, "mfu"),
        ),
    ],
    "kmp's float8 matmul, its GEMM writing bfloat16, vs bfloat16: the step "
    "of 4 square kernels of 8192 on 8192 rows (issue 41's target: >= 1.5x); "
    "the language model at width 2048 (24 layers, batch 16): `kmp.float8` "
    "vs bfloat16 (target >= 1.3x), and bfloat16's MFU (target >= 40%)": [
        (
            _H200_29 + "float8_matmul_jax.json",
            ("sizes", {"size": 8192}, "runs", "float8", "speed_vs_bf16"),
        ),
        (
            _H200_29 + "lm_speed_2048_float8_jax.json",
            ("runs", {"variant": _FUSED + "+kmp.float8"}, "speed_vs_first"),
        ),
        (
            _H200_29 + "lm_speed_2048_float8_jax.json",
            ("runs", {"variant": _FUSED}, "mfu"),
        ),
    ],
    "`kmp.float8` speed vs bfloat16, a stack of 4 Dense layers of 8192 x "
    "8192 / the IMDB Transformer at d_model 2048 (issue 15's targets: >= "
    "1.5x / >= 1.3x)": [
        (
            _H100_25 + "float8_speed_jax.json",
            ("runs", {"model": model, "variant": variant}, "speed_vs_bf16"),
        )
        for variant in ("bf16+kmp.float8", "bf16+keras.float8")
        for model in ("stack", "transformer")
    ],
    "the main job, `kmp train cifar10 --data=synthetic --epochs=6` "
    "(mixed_float16, ResNet-9 width 64, batch 512): wall time with a cold / "
    "warm compile cache, and the in-fit rate": [
        (_H100_25 + "steps.txt", wall_seconds("train_cifar10_cold")),
        (_H100_25 + "steps.txt", wall_seconds("train_cifar10_warm")),
        (_H100_25 + "train_cifar10_cold_results.json", ("examples_per_s",)),
    ],
    "`kmp bench --size full` (ResNet-9 width 64, batch 512 / IMDB "
    "Transformer d_model 512, batch 64): speed vs float32 (TF32)": [
        (_H100_25 + "bench.json", _bench(model, variant=variant))
        for variant in ("fp16+kmp", "bf16")
        for model in ("cifar10", "imdb")
    ],
    "what XLA compiles for an H200, read on this CPU (deviceless "
    "compilation): per decoder block of KerasHub's GPT-2 at width 2048 "
    "(batch 16, sequence 512), the kernels outside the GEMMs and the GB "
    "they move, in bfloat16 / with kmp's float8 matmul": [
        (
            "gpu_compile_h200.json",
            (
                "records",
                {"program": "lm", "config": "2048x2, batch 16", "variant": v},
                "per_block",
                key,
            ),
        )
        for v in ("bf16+nodrop", "bf16+nodrop+kmp.float8")
        for key in ("kernels_outside_gemms", "gb_outside_gemms")
    ],
    "KerasHub's GPT-2 at width 1024 (16 layers, batch 32, sequence 512), "
    "compiled for an H200 on this CPU: the GB a train step moves outside "
    "its GEMMs with `kmp.pin_float32`'s position embedding / with "
    "KerasHub's, whose gradient's sum over the batch gets the activations "
    "laid out batch-innermost": [
        (
            "gpu_compile_h200_position_embedding.json",
            (
                "records",
                {"program": "lm", "config": "1024x16, batch 32", "variant": v},
                "gb_outside_gemms",
            ),
        )
        for v in (_FUSED, _FUSED + "+hubpos")
    ],
    "the same step with `kmp.pin_float32`'s GELU recomputed in the "
    "backward pass / differentiated as written (its `tanh` kept for the "
    "backward pass, no cuBLASLt GELU epilogue): GB moved outside the GEMMs "
    "and by them": _lm_step_bytes("gpu_compile_h200_gelu.json", "+hubgelu"),
    "the same step with `kmp.pin_float32`'s query/key/value biases added "
    "on the flat output / as Keras writes them (broadcast to the output by "
    "a kernel, read and added by the GEMM; no cuBLASLt BIAS epilogue): GB "
    "moved outside the GEMMs and by them": (
        _lm_step_bytes("gpu_compile_h200_bias.json", "+hubbias")
    ),
    "a decoder block of the same model (2 blocks compiled, batch 32): "
    "cuDNN's attention mask type and the GB moved outside the GEMMs, with "
    "`kmp.pin_float32`'s decoders telling their self-attention the mask "
    "is causal / with KerasHub's mask alone (the example's `--dropout=0` "
    "until now)": [
        (
            "gpu_compile_h200_causal.json",
            (
                "records",
                {"program": "lm", "config": "1024x2, batch 32", "variant": v},
                "per_block",
                "gb_outside_gemms",
            ),
        )
        for v in ("bf16+flash", "bf16+flash+hubcausal")
    ],
    "a decoder block of KerasHub's Llama at width 2048 (16 query heads, 4 "
    "key/value heads, batch 8 x 1024) compiled the same way: cuDNN's "
    "attention mask type and the GB moved outside the GEMMs, with "
    "`kmp.pin_float32`'s decoders telling their attention the mask is "
    "causal / with KerasHub's mask alone": _hub_block_bytes("llama", 2048),
    "a decoder block of KerasHub's Gemma 3 text backbone in its 1B model's "
    "shape (width 1152, 4 query heads and 1 key/value head of 256, a window "
    "of 512 tokens, batch 8 x 1024) compiled the same way: cuDNN's "
    "attention mask type and the GB moved outside the GEMMs, with "
    "`kmp.pin_float32`'s decoders telling their attention the mask is "
    "causal / with KerasHub's mask alone": _hub_block_bytes("gemma", 1152),
    "the same Gemma 3 block compiled with the target's cuDNN at 9.10.2, "
    "from which cuDNN takes a sliding window beside a mask: cuDNN's "
    "attention calls (forward and backward) told the window of 512 tokens "
    "and the GB moved outside the GEMMs, with `kmp.pin_float32`'s decoders "
    "(`kmp.backend.causal_attention`) / with KerasHub's mask alone": [
        *_hub_block_bytes("gemma", 1152, "windowed_attention_calls", "_window"),
        *_hub_block_bytes("gemma", 1152, file="_window"),
    ],
}


def _f8(model, variant):
    """A `float8_speed.py` run's speed against bfloat16."""
    return ("runs", {"model": model, "variant": variant}, "speed_vs_bf16")


# The guides' tables (docs/*.md) whose section names a results file must
# have their keys here, figures or not (the defect, model-zoo and API
# tables name none and hold no measured figure). The one today:
# float32-islands' KerasHub backbones, whose cells are words ("yes",
# "no"), not figures (`docs_figures_test` checks the words against the
# census); the rows' file is the census they come from.
_KERAS_HUB_ROWS = [
    "GPT-2, Bart, Whisper",
    "OPT",
    "BERT, RoBERTa, XLM-RoBERTa, DistilBERT, ALBERT, ELECTRA",
    "FNet",
    "DeBERTa-v3",
    "GPT-NeoX",
    "Qwen, Qwen2, Qwen-MoE",
    "Falcon",
    "Bloom, GPT-OSS",
    "ESM, ESM2, Moonshine",
    "Llama, Llama 3, Mistral, Mixtral, Phi-3, Qwen3, Qwen3-MoE, Qwen3.5, "
    "Qwen3.5-MoE, SmolLM3",
    "Gemma, Gemma 3, Gemma 4",
    "T5, XLNet, RoFormer-v2, T5Gemma, T5Gemma 2, EdRec, RWKV-7",
]
DOCS_KEYS = {
    ("docs/float32-islands.md", "Which KerasHub models the four reach", 0): {
        "rows": {
            row: ("keras_hub_islands_jax.json", {}) for row in _KERAS_HUB_ROWS
        }
    }
}

# Figures a guide gives in a sentence: `(page, passage)` -> the
# `(file, path)` of each of the passage's figures, in order. The passage
# is written as on the page, whitespace aside; the test finds it with
# its digits masked, so a changed figure is read and checked, not missed.
PROSE_KEYS = {
    ("docs/float8.md", "0.90x on a stack of"): [
        (_H100_25 + "float8_speed_jax.json", _f8("stack", "bf16+kmp.float8"))
    ],
    ("docs/float8.md", "(bfloat16: 25.1 ms a step)"): [
        (
            _H100_25 + "float8_speed_jax.json",
            ("runs", {"model": "stack", "variant": "bf16"}, "step_time_s"),
        )
    ],
    ("docs/float8.md", "and 0.93x on the IMDB Transformer"): [
        (
            _H100_25 + "float8_speed_jax.json",
            _f8("transformer", "bf16+kmp.float8"),
        )
    ],
    ("docs/float8.md", '`model.quantize("float8")` 0.96x and 0.93x.'): [
        (_H100_25 + "float8_speed_jax.json", _f8(model, "bf16+keras.float8"))
        for model in ("stack", "transformer")
    ],
    ("docs/float8.md", "on an H200 again: 1.33x"): [
        (
            _H200_29 + "float8_matmul_jax.json",
            ("sizes", {"size": 4096}, "runs", "float8", "speed_vs_bf16"),
        )
    ],
    ("docs/float8.md", "and 1.59x at"): [
        (
            _H200_29 + "float8_matmul_jax.json",
            ("sizes", {"size": 8192}, "runs", "float8", "speed_vs_bf16"),
        )
    ],
    ("docs/float8.md", "1.11x in the language model"): [
        (
            _H200_29 + "lm_speed_2048_float8_jax.json",
            ("runs", {"variant": _FUSED + "+kmp.float8"}, "speed_vs_first"),
        )
    ],
    ("docs/float8.md", "later that day 1.21x at width"): [
        (
            _H200_29B + "lm_speed_4096_jax.json",
            ("runs", {"variant": _FUSED + "+kmp.float8"}, "speed_vs_first"),
        )
    ],
    ("docs/float8.md", "ran at 0.57x bfloat16 with kernels of"): [
        (
            _H200_29B + "fit/float8_matmul_torch.json",
            ("sizes", {"size": 4096}, "speed_vs_bf16"),
        )
    ],
    ("docs/float8.md", "and 0.88x with kernels of"): [
        (
            _H200_29B + "fit/float8_matmul_torch.json",
            ("sizes", {"size": 8192}, "speed_vs_bf16"),
        )
    ],
    ("docs/float32-islands.md", "1.02x KerasHub's mask alone"): [
        (
            _H200_29 + "lm_speed_1024_jax.json",
            (
                lambda data: (
                    _at(data, ("runs", {"variant": "bf16+flash"}))[
                        "tokens_per_s"
                    ]
                    / _at(data, ("runs", {"variant": "bf16+flash+hubcausal"}))[
                        "tokens_per_s"
                    ]
                )
            ),
        )
    ],
    ("docs/float32-islands.md", "blocks train 1.06x faster"): [
        (
            _H200_29B + "hub_attention_speed.json",
            (
                "runs",
                {"model": "llama", "variant": "pinned"},
                "speed_vs_hubcausal",
            ),
        )
    ],
    ("docs/float32-islands.md", "(1.00x: heads of"): [
        (
            _H200_29B + "hub_attention_speed.json",
            (
                "runs",
                {"model": "gemma", "variant": "pinned"},
                "speed_vs_hubcausal",
            ),
        )
    ],
    (
        "docs/float32-islands.md",
        "the step ran 1.31x KerasHub's mask alone, 1.14x",
    ): [
        (
            _H200_29B + "hub_attention_speed_long.json",
            (
                "runs",
                {"model": "gemma", "variant": variant},
                "speed_vs_hubcausal",
            ),
        )
        for variant in ("pinned", "nowindow")
    ],
    ("docs/doctor.md", "Cost: 2.2x the time of two training steps"): [
        ("doctor_cost_tensorflow.json", ("median_ratio",))
    ],
    ("docs/doctor.md", "TensorFlow, 3.8x on JAX"): [
        ("doctor_cost_jax.json", ("median_ratio",))
    ],
}
