"""What `kmp.diagnose` costs, in training steps of the same model.

    python benchmarks/doctor_cost.py [--width 64] [--batch_size 128]

Builds the CIFAR-10 example's ResNet-9 (examples/cifar10.py:
`compile_model`, mixed_float16, kmp's loss scale, float32 softmax) and,
in one process, alternates for a few rounds: two training steps
(`train_on_batch`, which returns host values, so each is timed to its
end) and one `kmp.diagnose(model, data, batches=2)` at the same batch
size. Diagnose compiles its two passes anew on every call (a user calls
it once), so its time includes that; the training steps are timed after
the train function has been compiled (a warm-up fit of two steps), which
is the stricter comparison. The ratio is taken within each round.

Writes benchmarks/results/doctor_cost_<backend>.json with the hardware,
versions and this command. Target (issue 6): under 10x on this CPU.
"""

import argparse
import statistics
import time

import common
import keras
import numpy as np

import kmp
from kmp.examples import cifar10


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--batch_size", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", help="JSON path (default: results/)")
    args = parser.parse_args()

    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    n = 2 * args.batch_size
    x = rng.normal(size=(n, 32, 32, 3)).astype("float32")
    y = rng.integers(0, 10, n)
    config = cifar10.Config(width=args.width, batch_size=args.batch_size)
    with kmp.policy_scope("mixed_float16"):
        model = cifar10.compile_model(config, steps=100)
    model.fit(x, y, batch_size=args.batch_size, epochs=1, verbose=0)

    rounds = []
    for i in range(args.rounds):
        start = time.perf_counter()
        for step in range(2):
            batch = slice(step * args.batch_size, (step + 1) * args.batch_size)
            model.train_on_batch(x[batch], y[batch])
        two_steps = time.perf_counter() - start
        start = time.perf_counter()
        report = kmp.diagnose(
            model,
            (x, y),
            batches=2,
            batch_size=args.batch_size,
            verbose=False,
        )
        doctor = time.perf_counter() - start
        rounds.append(
            {
                "two_steps_s": two_steps,
                "diagnose_s": doctor,
                "ratio": doctor / two_steps,
            }
        )
        print(
            f"round {i + 1}: two steps {two_steps:.2f} s, diagnose "
            f"{doctor:.2f} s, ratio {doctor / two_steps:.2f}",
            flush=True,
        )
    ratios = [r["ratio"] for r in rounds]
    result = {
        "model": f"resnet9 width {args.width}",
        "policy": "mixed_float16",
        "batch_size": args.batch_size,
        "batches": 2,
        "rounds": rounds,
        "median_ratio": statistics.median(ratios),
        "max_ratio": max(ratios),
        "target_ratio": 10.0,
        "layers_observed": len(report.layers),
        "pin": report.pin,
        "scale_range": report.scale_range,
    }
    print(
        f"diagnose / two training steps: median {result['median_ratio']:.2f}"
        f", max {result['max_ratio']:.2f} (target < 10)"
    )
    common.write_result(
        result, f"doctor_cost_{keras.backend.backend()}.json", args.out
    )


if __name__ == "__main__":
    main()
