"""The memory modes of an example, each in its own process: bytes of
weights and optimizer state (exact), final losses after the same steps
and seeds, speed, and with `--max_batch` the largest batch that fits.

    KERAS_BACKEND=jax python benchmarks/memory_modes.py lm        # CPU sizes
    KERAS_BACKEND=jax python benchmarks/memory_modes.py cifar10 -- \
        --data=synthetic
    KERAS_BACKEND=jax python benchmarks/memory_modes.py lm --steps=100 \
        --max_batch -- --hidden_dim=1024 --layers=16   # a GPU's size

Runs `kmp train EXAMPLE` under `--policy=mixed_bfloat16` once per mode:

    float32 state, float32 masters   Keras's mixed_bfloat16 (the baseline)
    bfloat16 state                   --optimizer_states=bfloat16
    bfloat16 masters                 --master_weights=bfloat16
    both                             the two
    float32 + remat, both + remat    --remat

with the same `--seed` and `--steps`. Reports weights + state bytes as a
ratio of the baseline's (the issue's targets: 0.67x with bfloat16
state, 0.5x with both), each final training loss beside the baseline's
(within 1 % for bfloat16 state, 2 % for both), examples/s (tokens/s
for lm), peak memory, and with `--max_batch` each mode's
`--batch_size=max` (JAX: the batch and its compiled step's bytes).
Writes benchmarks/results/memory_modes_<example>_<backend>.json with
the hardware and versions. Flags after `--` go to every run.
"""

import argparse
import os
import tempfile

import common

import kmp  # noqa: F401  (versions and devices for the record)

MODES = {
    "float32": [],
    "bf16 state": ["--optimizer_states=bfloat16"],
    "bf16 masters": ["--master_weights=bfloat16"],
    "both": ["--optimizer_states=bfloat16", "--master_weights=bfloat16"],
    "float32 + remat": ["--remat"],
    "both + remat": [
        "--optimizer_states=bfloat16",
        "--master_weights=bfloat16",
        "--remat",
    ],
}
# The bounds on the final loss, as a fraction of the baseline's.
LOSS_BOUNDS = {"bf16 state": 0.01, "bf16 masters": 0.02, "both": 0.02}


def run(example, flags, out):
    """One `kmp train` process under mixed_bfloat16; its results.json."""
    return common.train_run(example, ["--policy=mixed_bfloat16", *flags], out)


def row(name, result, baseline):
    state = result["state_bytes"]
    total = state["weights"] + state["optimizer_state"]
    base = sum(baseline["state_bytes"].values())
    loss_change = result["final_loss"] / baseline["final_loss"] - 1
    summary = {
        "weights_bytes": state["weights"],
        "optimizer_state_bytes": state["optimizer_state"],
        "bytes_over_float32": total / base,
        "final_loss": result["final_loss"],
        "test_loss": result["test_loss"],
        "loss_change": loss_change,
        "loss_bound": LOSS_BOUNDS.get(name),
        "examples_per_s": result["examples_per_s"],
        "tokens_per_s": result.get("tokens_per_s"),
        "peak_memory_mib": result["peak_memory_mib"],
        "peak_memory_note": result["peak_memory_note"],
        "batch_size": result["batch_size"],
    }
    search = result.get("batch_search")
    if search:
        summary["max_batch"] = search["batch_size"]
        summary["train_step_bytes"] = search["train_step"]["footprint"]
        summary["limit_bytes"] = search["limit_bytes"]
    return summary


def table(rows):
    """The markdown table BENCHMARKS.md shows (the largest batch only
    where the runs searched for it)."""
    searched = any("max_batch" in r for r in rows.values())
    tokens = any(r.get("tokens_per_s") for r in rows.values())
    lines = [
        "| mode | weights + state (bytes) | x float32 | final loss "
        "(change) | examples/s |"
        + (" tokens/s |" if tokens else "")
        + " peak MiB |"
        + (" largest batch | step at it (MiB) |" if searched else ""),
        "|---|---|---|---|---|---|"
        + ("---|" if tokens else "")
        + ("---|---|" if searched else ""),
    ]
    for name, r in rows.items():
        bound = r["loss_bound"]
        within = (
            ""
            if bound is None
            else (" ok" if abs(r["loss_change"]) <= bound else " MISSED")
        )
        line = (
            f"| {name} | "
            f"{r['weights_bytes'] + r['optimizer_state_bytes']} | "
            f"{r['bytes_over_float32']:.3f} | {r['final_loss']:.4f} "
            f"({r['loss_change']:+.2%}{within}) | "
            f"{r['examples_per_s']:.0f} |"
            + (f" {r['tokens_per_s']:.0f} |" if tokens else "")
            + f" {r['peak_memory_mib']:.0f} |"
        )
        if searched:
            line += f" {r['max_batch']} | {r['train_step_bytes'] / 2**20:.0f} |"
        lines.append(line)
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("example", choices=("lm", "cifar10", "imdb"))
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--max_batch",
        action="store_true",
        help="run each mode at --batch_size=max (JAX)",
    )
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--output", default=None)
    args, extra = common.parse_with_flags(parser)
    flags = [
        f"--steps={args.steps}",
        "--epochs=1",
        f"--seed={args.seed}",
        *(["--batch_size=max"] if args.max_batch else []),
        *extra,
    ]
    modes = args.modes.split(",")
    results, rows = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in modes:
            out = os.path.join(tmp, name.replace(" ", "_"))
            results[name] = run(args.example, [*flags, *MODES[name]], out)
            rows[name] = row(name, results[name], results[modes[0]])
            r = rows[name]
            print(
                f"{name:>16}: weights + state x{r['bytes_over_float32']:.3f}"
                f", final loss {r['final_loss']:.4f} "
                f"({r['loss_change']:+.2%}), "
                f"{r['examples_per_s']:.0f} examples/s"
                + (f", max batch {r['max_batch']}" if "max_batch" in r else ""),
                flush=True,
            )
    print(table(rows))
    backend = os.environ.get("KERAS_BACKEND", "tensorflow")
    common.write_result(
        {
            "example": args.example,
            "flags": flags,
            "policy": "mixed_bfloat16",
            "modes": rows,
            "config": results[modes[0]]["config"],
        },
        f"memory_modes_{args.example}_{backend}.json",
        args.output,
    )


if __name__ == "__main__":
    main()
