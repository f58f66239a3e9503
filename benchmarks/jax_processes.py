"""Two JAX processes against one: the same `kmp train` run, its losses
and its speed.

    python benchmarks/jax_processes.py                    # CPU: 4 devices
    python benchmarks/jax_processes.py --example=cifar10 -- --width=16
    python benchmarks/jax_processes.py --platform=gpu --devices=8 \
        --example=cifar10 -- --steps=200 --batch_size=1024  # 8 GPUs

Runs `kmp train EXAMPLE --distribution=data` on the same global batches
twice, alternately `--rounds` times: once as one process of
`--devices` virtual CPU devices (or GPUs, `--platform=gpu`), once as 2
processes of `--devices / 2` each (GPUs split by CUDA_VISIBLE_DEVICES)
on 127.0.0.1 (`--coordinator`, collectives over gloo). Correctness: the
two runs' per-step losses must agree (they train the same model on the
same batches; the printed figure is the largest difference). Overhead:
examples/s of each (median over rounds) and their ratio; here the two
processes share this machine's cores, so the ratio is the cost of the
processes' collectives and feeding, not a scaling figure. Writes
benchmarks/results/jax_processes_<platform>.json with the hardware and
versions. Flags after `--` go to every run (they override the small
defaults below).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

import common

os.environ["KERAS_BACKEND"] = "jax"

import kmp  # noqa: E402, F401  (versions and devices for the record)

FLAGS = [
    "--distribution=data",
    "--data=synthetic",
    "--synthetic_size=2048",
    "--epochs=1",
    "--steps=40",
    "--eval_steps=2",
    "--batch_size=32",
    "--policy=mixed_float16",
    "--compile_cache=off",
    "--verbose=0",
    "--restart",
]


def command(example, out, flags, devices, platform, process=None, port=None):
    env = dict(os.environ, KERAS_BACKEND="jax")
    if platform == "cpu":
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    elif process is not None:  # this process's half of the GPUs
        first = process * devices
        env["CUDA_VISIBLE_DEVICES"] = ",".join(
            str(first + i) for i in range(devices)
        )
    argv = [sys.executable, "-m", "kmp_cli", "train", example]
    argv += [f"--output_dir={out}", *FLAGS, *flags]
    if process is not None:
        argv += [
            f"--coordinator=127.0.0.1:{port}",
            "--num_processes=2",
            f"--process_id={process}",
        ]
    return argv, env


def run(example, out, flags, devices, platform, processes):
    """One run of `processes` processes; the chief's results.json."""
    if processes == 1:
        jobs = [command(example, out, flags, devices, platform)]
    else:
        (port,) = common.free_ports(1)
        jobs = [
            command(example, out, flags, devices // 2, platform, i, port)
            for i in (0, 1)
        ]
    # Each process's stderr to a file: pipes drained one after the other
    # could stall the collective the process being drained waits in.
    logs = [tempfile.TemporaryFile("w+") for _ in jobs]
    procs = [
        subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=log)
        for (argv, env), log in zip(jobs, logs)
    ]
    try:
        for p, log in zip(procs, logs):
            if p.wait():
                log.seek(0)
                sys.exit(f"{' '.join(p.args)} failed:\n{log.read()[-3000:]}")
    finally:
        for p in procs:
            p.kill()  # a peer of a failed process would wait for it
    with open(os.path.join(out, "results.json")) as f:
        return json.load(f)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--example", default="imdb")
    parser.add_argument("--devices", type=int, default=4)
    parser.add_argument("--platform", choices=("cpu", "gpu"), default="cpu")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--output", default=None)
    parser.add_argument("flags", nargs="*", help="flags for kmp train")
    args = parser.parse_args()
    runs = {"1 process": [], "2 processes": []}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):
            for name in runs:
                out = os.path.join(tmp, name.replace(" ", "_"))
                count = int(name[0])
                result = run(
                    args.example,
                    out,
                    args.flags,
                    args.devices,
                    args.platform,
                    count,
                )
                runs[name].append(result)
                print(
                    f"round {round_ + 1} {name:>11}: "
                    f"{result['examples_per_s']:,.0f} examples/s, final loss "
                    f"{result['final_loss']:.4f}, skipped steps "
                    f"{result['skipped_steps']:g}",
                    flush=True,
                )
    one, two = runs["1 process"][-1], runs["2 processes"][-1]
    difference = max(
        abs(a - b) for a, b in zip(one["step_losses"], two["step_losses"])
    )
    speeds = {
        name: statistics.median(r["examples_per_s"] for r in results)
        for name, results in runs.items()
    }
    ratio = speeds["2 processes"] / speeds["1 process"]
    print(
        f"largest step-loss difference {difference:.2e} over "
        f"{len(one['step_losses'])} steps; 2 processes / 1: {ratio:.3f}x "
        "examples/s"
    )
    common.write_result(
        {
            "example": args.example,
            "devices": args.devices,
            "platform": args.platform,
            "rounds": args.rounds,
            "flags": FLAGS + args.flags,
            "examples_per_s": speeds,
            "two_over_one_examples_per_s": ratio,
            "largest_step_loss_difference": difference,
            "steps": len(one["step_losses"]),
            "final_loss": {n: r[-1]["final_loss"] for n, r in runs.items()},
            "skipped_steps": {
                n: r[-1]["skipped_steps"] for n, r in runs.items()
            },
            "replicas": {n: r[-1]["replicas"] for n, r in runs.items()},
            "processes": {n: r[-1]["processes"] for n, r in runs.items()},
        },
        f"jax_processes_{args.platform}.json",
        args.output,
    )


if __name__ == "__main__":
    main()
