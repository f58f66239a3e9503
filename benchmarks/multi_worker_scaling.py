"""Step time of 2-worker MultiWorkerMirroredStrategy training vs 1 worker.

    python benchmarks/multi_worker_scaling.py

Runs examples/cifar10.py (ResNet-9, mixed_float16, kmp's scaler, synthetic
data) at the same global batch, as one process without a strategy and as
two worker processes on 127.0.0.1 (TF_CONFIG, kmp.multi_worker_strategy,
kmp.distribute), alternating for a few rounds. Each run reports the median
step time after its first two (compiling) steps; the ratio is taken within
a round. Both workers share this machine's cores, so on a 2-core VM the
2-worker run cannot be faster: the figure bounds the cost of the
collectives and of the agreement check, it is not a speed-up.

TensorFlow backend only. Writes a JSON file with hardware and versions.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import common

EXAMPLE = os.path.join(
    os.path.dirname(os.path.abspath(__file__)),
    os.pardir,
    "examples",
    "cifar10.py",
)


def run(workers, flags, timeout):
    """Runs the example as `workers` processes; returns the chief's
    results."""
    out = tempfile.mkdtemp(prefix="kmp_scaling_")
    argv = [sys.executable, EXAMPLE, *flags, f"--output_dir={out}"]
    env = dict(os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="3")
    if workers == 1:
        procs = [subprocess.Popen(argv + ["--strategy=none"], env=env)]
    else:
        hosts = [f"127.0.0.1:{p}" for p in common.free_ports(workers)]
        procs = []
        for index in range(workers):
            config = {
                "cluster": {"worker": hosts},
                "task": {"type": "worker", "index": index},
            }
            procs.append(
                subprocess.Popen(
                    argv + ["--strategy=multiworker"],
                    env=dict(env, TF_CONFIG=json.dumps(config)),
                )
            )
    try:
        for p in procs:
            if p.wait(timeout=timeout) != 0:
                raise SystemExit(f"a worker failed with code {p.returncode}")
    finally:
        for p in procs:
            p.kill()
    with open(os.path.join(out, "results.json")) as f:
        return json.load(f)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch_size", type=int, default=128)
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--policy", default="mixed_float16")
    parser.add_argument("--timeout", type=int, default=600)
    parser.add_argument("--out", default=None, help="JSON path")
    args = parser.parse_args()
    flags = [
        f"--policy={args.policy}",
        "--data=synthetic",
        "--synthetic_size=8192",
        f"--width={args.width}",
        "--epochs=1",
        f"--steps={args.steps}",
        f"--batch_size={args.batch_size}",
        "--verbose=0",
    ]
    seconds = {"1 worker": [], "2 workers": []}
    for r in range(args.rounds):
        order = [1, 2] if r % 2 == 0 else [2, 1]
        for workers in order:
            results = run(workers, flags, args.timeout)
            name = "1 worker" if workers == 1 else "2 workers"
            seconds[name].append(results["step_time_s"])
        print(
            f"round {r + 1}/{args.rounds}: "
            + ", ".join(
                f"{k} {v[-1] * 1000:.0f} ms/step" for k, v in seconds.items()
            ),
            flush=True,
        )
    stats = {
        "2 workers / 1 worker": common.ratio_stats(
            seconds, "2 workers", "1 worker"
        )
    }
    print()
    print(common.ratio_table(stats))
    common.write_result(
        {
            "benchmark": "multi_worker_scaling",
            "policy": args.policy,
            "model": f"ResNet-9, width {args.width}",
            "global_batch_size": args.batch_size,
            "steps": args.steps,
            "rounds": args.rounds,
            "step_seconds": seconds,
            "ratios": stats,
        },
        "multi_worker_scaling_tensorflow.json",
        args.out,
    )


if __name__ == "__main__":
    main()
