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
    int8 state                       --optimizer_states=int8
    int8 + bf16 masters              int8 state, bfloat16 masters
    float32 + remat, both + remat    --remat

with the same seeds and `--steps`. Reports weights + state bytes as a
ratio of the baseline's (the issue's targets: 0.67x with bfloat16
state, 0.5x with both), each final training loss beside the baseline's
(within 1 % for bfloat16 state, 2 % for both), examples/s (tokens/s
for lm), peak memory, and with `--max_batch` each mode's
`--batch_size=max` (JAX: the batch and its compiled step's bytes).
Writes benchmarks/results/memory_modes_<example>_<backend>.json with
the hardware and versions, rewritten after each mode (`complete`:
whether it holds them all), so a run cut short keeps the modes it
finished. Flags after `--` go to every run.

With `--seeds=0,1,2,3` each mode runs once per seed: a few dozen steps'
loss moves with the seed by as much as the bounds (ResNet-9, 40 steps:
4 % between float32 runs), so the table then gives each mode's mean
loss, each seed's change against the first mode's run with that seed,
and how far the first mode's own losses spread.
"""

import argparse
import os
import statistics
import tempfile

import common

import kmp  # noqa: F401  (versions and devices for the record)

MODES = {
    "float32": [],
    "bf16 state": ["--optimizer_states=bfloat16"],
    "bf16 masters": ["--master_weights=bfloat16"],
    "both": ["--optimizer_states=bfloat16", "--master_weights=bfloat16"],
    "int8 state": ["--optimizer_states=int8"],
    "int8 + bf16 masters": [
        "--optimizer_states=int8",
        "--master_weights=bfloat16",
    ],
    "float32 + remat": ["--remat"],
    "both + remat": [
        "--optimizer_states=bfloat16",
        "--master_weights=bfloat16",
        "--remat",
    ],
}
# The bounds on the final loss, as a fraction of the baseline's.
LOSS_BOUNDS = {
    "bf16 state": 0.01,
    "bf16 masters": 0.02,
    "both": 0.02,
    "int8 state": 0.01,
    "int8 + bf16 masters": 0.02,
}


def run(example, flags, out):
    """One `kmp train` process under mixed_bfloat16; its results.json."""
    return common.train_run(example, ["--policy=mixed_bfloat16", *flags], out)


def _mean(values):
    return sum(values) / len(values)


def row(name, results, baselines):
    """A mode's summary over its runs (one per seed), beside the
    baseline's runs with the same seeds."""
    result = results[0]
    state = result["state_bytes"]
    total = state["weights"] + state["optimizer_state"]
    base = sum(baselines[0]["state_bytes"].values())
    losses = [r["final_loss"] for r in results]
    base_losses = [r["final_loss"] for r in baselines]
    summary = {
        "weights_bytes": state["weights"],
        "optimizer_state_bytes": state["optimizer_state"],
        "bytes_over_float32": total / base,
        # One seed: that run's loss; several: their mean, and each
        # seed's change against the baseline's run with the same seed.
        "final_loss": _mean(losses),
        "test_loss": _mean([r["test_loss"] for r in results]),
        "loss_change": _mean(losses) / _mean(base_losses) - 1,
        "loss_bound": LOSS_BOUNDS.get(name),
        "examples_per_s": _mean([r["examples_per_s"] for r in results]),
        "tokens_per_s": result.get("tokens_per_s")
        and _mean([r["tokens_per_s"] for r in results]),
        "peak_memory_mib": max(r["peak_memory_mib"] for r in results),
        "peak_memory_note": result["peak_memory_note"],
        "batch_size": result["batch_size"],
    }
    if len(results) > 1:
        summary["final_losses"] = losses
        summary["loss_changes"] = [
            loss / b - 1 for loss, b in zip(losses, base_losses)
        ]
        # How far the baseline's own runs spread: the noise a change
        # is measured against (sample standard deviation over the mean).
        summary["baseline_spread"] = statistics.stdev(base_losses) / _mean(
            base_losses
        )
    search = result.get("batch_search")
    if search:
        summary["max_batch"] = search["batch_size"]
        summary["train_step_bytes"] = search["train_step"]["footprint"]
        summary["limit_bytes"] = search["limit_bytes"]
    return summary


def table(rows):
    """The markdown table BENCHMARKS.md shows (the largest batch only
    where the runs searched for it; with several seeds, the mean loss
    and each seed's change)."""
    searched = any("max_batch" in r for r in rows.values())
    tokens = any(r.get("tokens_per_s") for r in rows.values())
    seeds = any("loss_changes" in r for r in rows.values())
    lines = [
        "| mode | weights + state (bytes) | x float32 | "
        + ("mean final loss (change) | change per seed |" if seeds else "")
        + ("" if seeds else "final loss (change) |")
        + " examples/s |"
        + (" tokens/s |" if tokens else "")
        + " peak MiB |"
        + (" largest batch | step at it (MiB) |" if searched else ""),
        "|---|---|---|---|---|---|"
        + ("---|" if seeds else "")
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
            f"({r['loss_change']:+.2%}{within}) |"
        )
        if seeds:
            line += (
                " " + ", ".join(f"{c:+.2%}" for c in r["loss_changes"]) + " |"
            )
        line += (
            f" {r['examples_per_s']:.0f} |"
            + (f" {r['tokens_per_s']:.0f} |" if tokens else "")
            + f" {r['peak_memory_mib']:.0f} |"
        )
        if searched:
            line += f" {r['max_batch']} | {r['train_step_bytes'] / 2**20:.0f} |"
        lines.append(line)
    if seeds:
        spread = next(iter(rows.values()))["baseline_spread"]
        lines.append(
            f"\nThe first row's final losses spread {spread:.2%} over the "
            "seeds (sample standard deviation over the mean)."
        )
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("example", choices=("lm", "cifar10", "imdb"))
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument(
        "--seeds",
        default="0",
        help="comma-separated seeds; several: each mode once per seed, "
        "its mean loss and each seed's change reported",
    )
    parser.add_argument(
        "--max_batch",
        action="store_true",
        help="run each mode at --batch_size=max (JAX)",
    )
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--output", default=None)
    args, extra = common.parse_with_flags(parser)
    seeds = [int(seed) for seed in args.seeds.split(",")]
    flags = [
        f"--steps={args.steps}",
        "--epochs=1",
        *(["--batch_size=max"] if args.max_batch else []),
        *extra,
    ]
    modes = args.modes.split(",")
    backend = os.environ.get("KERAS_BACKEND", "tensorflow")
    results, rows = {}, {}

    def save():
        # After each mode, so that a run cut short (a device call's time
        # limit) keeps the modes it finished; `complete` says whether it
        # holds them all.
        return common.write_result(
            {
                "example": args.example,
                "flags": flags,
                "seeds": seeds,
                "policy": "mixed_bfloat16",
                "complete": len(rows) == len(modes),
                "modes": rows,
                "config": results[modes[0]][0]["config"],
            },
            f"memory_modes_{args.example}_{backend}.json",
            args.output,
        )

    with tempfile.TemporaryDirectory() as tmp:
        for name in modes:
            results[name] = []
            for seed in seeds:
                out = os.path.join(tmp, f"{name.replace(' ', '_')}_{seed}")
                results[name].append(
                    run(
                        args.example,
                        [*flags, f"--seed={seed}", *MODES[name]],
                        out,
                    )
                )
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
            save()
    print(table(rows))


if __name__ == "__main__":
    main()
