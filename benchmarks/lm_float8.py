"""The language-model example with and without float8, each in its own
process: tokens/s, peak memory, losses.

    KERAS_BACKEND=jax python benchmarks/lm_float8.py       # CPU sizes here
    KERAS_BACKEND=jax python benchmarks/lm_float8.py --steps=100 -- \
        --hidden_dim=1024 --layers=16 --batch_size=16    # a GPU's size

Runs `kmp train lm` (examples/lm.py) twice with the same flags,
once with `--float8`, alternately `--rounds` times (the machine is shared:
alternation spreads its noise over both), each run a fresh process so
that its peak memory is its own. Flags after `--` go to both runs.
Reports the median tokens/s of each, their ratio, each run's peak
memory and its final training and test losses, and writes
benchmarks/results/lm_float8_<backend>.json with the hardware and
versions. On a CPU float8 is emulated: it measures the cost of the
emulation, not what an H100 gains.
"""

import argparse
import os
import statistics
import tempfile

import common

import kmp  # noqa: F401  (versions and devices for the record)


def run(flags, float8, out):
    """One `kmp train lm` process; its results.json."""
    return common.train_run(
        "lm", [*flags, *(["--float8"] if float8 else [])], out
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--output", default=None)
    parser.add_argument("flags", nargs="*", help="flags for kmp train lm")
    args = parser.parse_args()
    flags = [f"--steps={args.steps}", "--epochs=1", *args.flags]
    runs = {"bfloat16": [], "float8": []}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):
            for name in runs:
                out = os.path.join(tmp, name)
                result = run(flags, name == "float8", out)
                runs[name].append(result)
                print(
                    f"round {round_ + 1} {name:>8}: "
                    f"{result['tokens_per_s']:,.0f} tokens/s, peak "
                    f"{result['peak_memory_mib']:.0f} MiB, final loss "
                    f"{result['final_loss']:.4f}",
                    flush=True,
                )
    summary = {
        name: {
            "tokens_per_s": statistics.median(
                r["tokens_per_s"] for r in results
            ),
            "peak_memory_mib": max(r["peak_memory_mib"] for r in results),
            "peak_memory_note": results[0]["peak_memory_note"],
            "final_loss": results[-1]["final_loss"],
            "test_loss": results[-1]["test_loss"],
            "float8_layers": results[-1]["float8_layers"],
            "config": results[-1]["config"],
        }
        for name, results in runs.items()
    }
    ratio = (
        summary["float8"]["tokens_per_s"] / summary["bfloat16"]["tokens_per_s"]
    )
    print(f"float8 / bfloat16 tokens/s: {ratio:.3f}")
    backend = os.environ.get("KERAS_BACKEND", "tensorflow")
    common.write_result(
        {
            "rounds": args.rounds,
            "flags": flags,
            "float8_over_bfloat16_tokens_per_s": ratio,
            "variants": summary,
            "runs": runs,
        },
        f"lm_float8_{backend}.json",
        args.output,
    )


if __name__ == "__main__":
    main()
