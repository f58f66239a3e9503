"""What a run costs before its first step: the command, the imports, the data.

    python benchmarks/start_up.py [--rounds 5]

Times, in fresh processes, interleaved over rounds (the order rotated):
`kmp --help`, `python -c "import keras"` and `python -c "import keras,
kmp"`; and, in this process, `kmp.app.data.synthetic_images()` (60,000
CIFAR-shaped images, the synthetic twin's full size). `import kmp`'s cost
is the per-round difference of the two imports.

Writes benchmarks/results/start_up_<backend>.json with the hardware,
versions and this command. Targets (issue 14): `kmp --help` < 0.5 s,
`import kmp` adds < 0.5 s to `import keras`, synthetic CIFAR-10 < 0.5 s.
"""

import argparse
import os
import statistics
import subprocess
import sys
import time

import common

import kmp  # noqa: F401  (the environment record needs the backend)
from kmp.app import data

KMP = os.path.join(os.path.dirname(sys.executable), "kmp")
COMMANDS = {
    "kmp --help": [KMP, "--help"],
    "import keras": [sys.executable, "-c", "import keras"],
    "import keras, kmp": [sys.executable, "-c", "import keras, kmp"],
}


def _wall(argv) -> float:
    start = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True)
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", help="JSON path (default: results/)")
    args = parser.parse_args()

    seconds = {name: [] for name in [*COMMANDS, "synthetic_images()"]}
    names = list(seconds)
    for i in range(args.rounds):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            if name in COMMANDS:
                seconds[name].append(_wall(COMMANDS[name]))
            else:
                start = time.perf_counter()
                data.synthetic_images()
                seconds[name].append(time.perf_counter() - start)
        print(
            f"round {i + 1}: "
            + ", ".join(f"{n} {s[-1]:.3f} s" for n, s in seconds.items()),
            flush=True,
        )
    added = [
        b - a
        for a, b in zip(seconds["import keras"], seconds["import keras, kmp"])
    ]
    medians = {n: statistics.median(s) for n, s in seconds.items()}
    medians["import kmp adds"] = statistics.median(added)
    for name, value in medians.items():
        print(f"{name:22s} {value:.3f} s (median)")
    common.write_result(
        {"rounds": args.rounds, "seconds": seconds, "median_s": medians},
        f"start_up_{kmp.backend.name()}.json",
        args.out,
    )


if __name__ == "__main__":
    main()
