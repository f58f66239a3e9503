"""A cold JAX start: which XLA programs compile, and for how long.

    python benchmarks/cold_start.py

Part 1, in one process: builds the ResNet-9 and its optimizer's
slots as Keras does (each variable's initializer compiled per shape),
then inside `kmp.backend.initialized_together` (one program), after
`jax.clear_caches()` each time, alternately `--rounds` times; counts the
programs and sums their compile seconds (`jax.log_compiles`), and
records how many values differ from Keras's and by how much (at most
one unit in the last place of their tensor's largest value, or it
stops). Part 2: a cold `kmp train cifar10` in a fresh process
(`--compile_cache=off`, synthetic data, 2 steps), its compiled programs
split into the train and test steps and everything else (the issue's
target: the rest under 1.5 s on a 2-core CPU), on one device and with
`--distribution=data` over `--devices` virtual devices. Writes
benchmarks/results/cold_start_jax.json.
"""

import argparse
import logging
import os
import re
import subprocess
import sys
import tempfile

os.environ["KERAS_BACKEND"] = "jax"

import common  # noqa: E402
import jax  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402

from kmp import backend  # noqa: E402
from kmp.examples import cifar10  # noqa: E402

COMPILED = re.compile(
    r"Finished XLA compilation of jit\((.*?)\) in ([\d.e-]+) sec"
)
STEPS = ("train_step", "test_step")


class Programs(logging.Handler):
    """Collects `(name, seconds)` of each compiled program."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.seen = []

    def emit(self, record):
        match = COMPILED.search(record.getMessage())
        if match:
            self.seen.append((match[1], float(match[2])))


def build(together, width):
    keras.utils.set_random_seed(0)
    handler = Programs()
    logging.getLogger("jax").addHandler(handler)
    jax.clear_caches()
    try:
        with jax.log_compiles():
            if together:
                with backend.initialized_together():
                    model = cifar10.build_model(width)
            else:
                model = cifar10.build_model(width)
            optimizer = keras.optimizers.SGD(0.1, momentum=0.9)
            if together:
                with backend.initialized_together():
                    optimizer.build(model.trainable_variables)
            else:
                optimizer.build(model.trainable_variables)
    finally:
        logging.getLogger("jax").removeHandler(handler)
    values = [np.asarray(v) for v in model.weights + optimizer.variables]
    return handler.seen, values


def cold_run(example, devices, distribution):
    env = dict(
        os.environ,
        KERAS_BACKEND="jax",
        JAX_LOG_COMPILES="1",
        XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
    )
    with tempfile.TemporaryDirectory() as out:
        command = [
            sys.executable,
            *("-m", "kmp_cli", "train", example),
            *("--data=synthetic", "--synthetic_size=256", "--epochs=1"),
            *("--steps=2", "--compile_cache=off", "--verbose=0"),
            f"--distribution={distribution}",
            f"--output_dir={out}",
        ]
        done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    seen = [(m[1], float(m[2])) for m in COMPILED.finditer(done.stderr)]
    rest = [(n, s) for n, s in seen if n not in STEPS]
    return {
        "distribution": distribution,
        "devices": devices,
        "programs": len(seen),
        "step_seconds": sum(s for n, s in seen if n in STEPS),
        "other_programs": len(rest),
        "other_seconds": sum(s for _, s in rest),
        "other": sorted(rest, key=lambda p: -p[1]),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--devices", type=int, default=4)
    parser.add_argument("--output", default=None)
    args = parser.parse_args()
    builds = {"keras": [], "together": []}
    reference = None
    for _ in range(args.rounds):
        for name in builds:
            seen, values = build(name == "together", args.width)
            builds[name].append(
                {"programs": len(seen), "seconds": sum(s for _, s in seen)}
            )
            if reference is None:
                reference = values
            # How far from Keras's own: in units in the last place of
            # each tensor's largest value (at most 1, or it stops).
            units, differing = 0.0, 0
            for a, b in zip(reference, values):
                if a.dtype == np.float32 and a.size:
                    unit = np.spacing(np.abs(a).max())
                    units = max(units, float(np.abs(a - b).max() / unit))
                    differing += int(np.count_nonzero(a != b))
                elif a.tobytes() != b.tobytes():
                    sys.exit(f"{name}: integer values differ from Keras's own")
            if units > 1:
                sys.exit(f"{name}: values {units} units from Keras's own")
            builds[name][-1].update(units=units, differing_values=differing)
    values_in_all = sum(v.size for v in reference)
    summary = {
        name: {
            "programs": runs[-1]["programs"],
            "median_seconds": float(np.median([r["seconds"] for r in runs])),
        }
        for name, runs in builds.items()
    }
    for name, row in summary.items():
        print(
            f"build + optimizer, {name:>8}: {row['programs']} programs, "
            f"{row['median_seconds']:.2f} s of compiling (median)"
        )
    runs = [
        cold_run("cifar10", 1, "none"),
        cold_run("cifar10", args.devices, "data"),
    ]
    for run in runs:
        print(
            f"cold kmp train cifar10 --distribution={run['distribution']} "
            f"({run['devices']} device(s)): {run['programs']} programs; "
            f"train and test steps {run['step_seconds']:.2f} s, "
            f"{run['other_programs']} others {run['other_seconds']:.2f} s"
        )
    common.write_result(
        {
            "width": args.width,
            "rounds": args.rounds,
            "values": values_in_all,
            "build": summary,
            "build_rounds": builds,
            "cold_runs": runs,
        },
        "cold_start_jax.json",
        args.output,
    )


if __name__ == "__main__":
    main()
