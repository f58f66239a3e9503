"""What each memory mode's compiled train step holds, before it runs:
XLA's memory analysis (JAX) of an example's step at one batch size.

    KERAS_BACKEND=jax python benchmarks/memory_footprint.py lm   # CPU sizes
    KERAS_BACKEND=jax python benchmarks/memory_footprint.py lm \
        --batch_size=16 -- --hidden_dim=1024 --layers=8       # a GPU's size

For each mode of benchmarks/memory_modes.py, in this one process: the
example's model and optimizer as `kmp train` builds them
(`compile_model` under `--policy=mixed_bfloat16` and the mode's flags),
its weights and optimizer state in bytes (exact), and its train step
lowered on shapes and compiled for `--batch_size`
(`kmp.backend.train_step_memory`: arguments, outputs, temporaries and
the footprint, the donated state counted once). Nothing runs on the
device. XLA's CPU compiler schedules without regard to memory: there,
rematerialization shows no saving (measured: BENCHMARKS.md); on a GPU
it does. Writes benchmarks/results/memory_footprint_<example>_<backend>.json.

`--keep_barriers` schedules a CPU's step as a GPU's compiler does in
one respect: XLA's CPU pipeline removes optimization barriers before it
schedules, its GPU pipeline after, so that only there do they order the
step. The 8-bit state's dequantization waits for its gradient behind one
(`kmp.backend.ordered_after`); without the flag a CPU's analysis shows
it hoisted to the step's start.
"""

import os
import sys

if "--keep_barriers" in sys.argv:  # read when JAX starts XLA: set first
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "")
        + " --xla_disable_hlo_passes=cse_barrier_expander"
    ).strip()

import argparse
import dataclasses

import common
from memory_modes import MODES

import kmp
from kmp import backend
from kmp.app import batch_search
from kmp.app import protocol
from kmp_config import flags as kmp_flags


def footprint(example, config):
    """Bytes of state and of the compiled step of `example` under
    `config` (its policy and memory modes)."""
    with kmp.policy_scope(config.policy, config.master_weights):
        model, x, y = batch_search.trained_model(
            protocol.load_example(example), config
        )
        step = backend.train_step_memory(model, x, y, config.batch_size)
        state = backend.state_bytes(model)
    return {**state, "train_step": step}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("example", choices=("lm", "cifar10", "imdb"))
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--output", default=None)
    parser.add_argument(
        "--keep_barriers",
        action="store_true",
        help="keep XLA's optimization barriers through scheduling, as "
        "its GPU compiler does (module doc)",
    )
    args, extra = common.parse_with_flags(parser)
    if backend.name() != "jax":
        raise SystemExit("XLA's memory analysis needs KERAS_BACKEND=jax.")
    rows = {}
    for name in args.modes.split(","):
        argv = ["--policy=mixed_bfloat16", *extra, *MODES[name]]
        config, _ = kmp_flags.parse_example(
            "memory_footprint", args.example, argv
        )
        config = dataclasses.replace(config, batch_size=args.batch_size)
        rows[name] = footprint(args.example, config)
        step = rows[name]["train_step"]
        print(
            f"{name:>16}: weights {rows[name]['weights']:,} B, state "
            f"{rows[name]['optimizer_state']:,} B, step footprint "
            f"{step['footprint'] / 2**20:,.1f} MiB (temp "
            f"{step['temp'] / 2**20:,.1f} MiB)",
            flush=True,
        )
    base = rows[next(iter(rows))]["train_step"]["footprint"]
    print(
        "| mode | weights | optimizer state | step temp | step footprint "
        "| x first |"
    )
    print("|---|---|---|---|---|---|")
    for name, r in rows.items():
        step = r["train_step"]
        print(
            f"| {name} | {r['weights']} | {r['optimizer_state']} | "
            f"{step['temp']} | {step['footprint']} | "
            f"{step['footprint'] / base:.3f} |"
        )
    common.write_result(
        {
            "example": args.example,
            "batch_size": args.batch_size,
            "flags": extra,
            "policy": "mixed_bfloat16",
            "keep_barriers": args.keep_barriers,
            "modes": rows,
        },
        f"memory_footprint_{args.example}_{backend.name()}.json",
        args.output,
    )


if __name__ == "__main__":
    main()
