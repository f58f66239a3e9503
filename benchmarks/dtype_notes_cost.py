"""What kmp's line on mixed-dtype errors costs a layer call that succeeds.

    python benchmarks/dtype_notes_cost.py                  # TensorFlow
    KERAS_BACKEND=torch python benchmarks/dtype_notes_cost.py

While a 16-bit kmp policy is on, `Layer._open_name_scope` returns kmp's
scope around Keras's (`kmp.backend.dtype_errors`), so that its exit can
note an error. This times eager calls of a user's layer holding a Dense
(the path where per-call Python cost shows; a compiled step runs no
`__call__`) with the line off and on, rounds interleaved, and reports
the median per-round time ratio on/off and the microseconds per call
each way; and, the same way, a scope opened and closed alone (what the
line adds, twice per layer call: `build`'s scope and `call`'s). Writes
a JSON file with the hardware and versions.
"""

import argparse
import os
import statistics

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import common  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402

import kmp  # noqa: E402
from kmp import backend  # noqa: E402


class Block(keras.layers.Layer):
    """A user's layer: a Dense and a residual add."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.dense = keras.layers.Dense(16)

    def call(self, x):
        return x + self.dense(x)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--calls", type=int, default=2000, help="per round")
    parser.add_argument("--out", default=None, help="JSON path")
    args = parser.parse_args()

    kmp.enable("mixed_float16")
    layer = Block()
    x = keras.ops.convert_to_tensor(np.ones((8, 16), "float16"))
    layer(x)

    def calls(on):
        def run():
            if on != backend.dtype_notes_on():
                kmp.enable("mixed_float16") if on else kmp.disable()
            for _ in range(args.calls):
                layer(x)

        return run

    def scopes(on):
        def run():
            if on != backend.dtype_notes_on():
                kmp.enable("mixed_float16") if on else kmp.disable()
            for _ in range(args.calls * 20):
                with layer._open_name_scope():
                    pass

        return run

    runs = {"on": calls(True), "off": calls(False)}
    scope_runs = {"scope on": scopes(True), "scope off": scopes(False)}
    for run in (*runs.values(), *scope_runs.values()):
        run()  # warm-up
    seconds = common.time_interleaved(runs, args.rounds)
    scope_seconds = common.time_interleaved(scope_runs, args.rounds)
    stats = {
        "on/off": common.ratio_stats(seconds, "on", "off"),
        "scope on/off": common.ratio_stats(
            scope_seconds, "scope on", "scope off"
        ),
    }
    # Each Block call opens four scopes: its build's and call's, and its
    # Dense's two.
    per_call = {
        name: statistics.median(s) / args.calls * 1e6
        for name, s in seconds.items()
    }
    per_scope = {
        name: statistics.median(s) / (args.calls * 20) * 1e6
        for name, s in scope_seconds.items()
    }
    print()
    print(common.ratio_table(stats))
    print(
        f"us per call: on {per_call['on']:.1f}, off {per_call['off']:.1f}; "
        f"per scope: on {per_scope['scope on']:.2f}, "
        f"off {per_scope['scope off']:.2f}"
    )
    common.write_result(
        {
            "benchmark": "dtype_notes_cost",
            "policy": "mixed_float16",
            "layer": "a user's layer holding a Dense(16), eager, (8, 16)",
            "calls_per_round": args.calls,
            "rounds": args.rounds,
            "round_seconds": seconds,
            "scope_round_seconds": scope_seconds,
            "ratios": stats,
            "microseconds_per_call": per_call,
            "microseconds_per_scope": per_scope,
        },
        f"dtype_notes_cost_{backend.name()}.json",
        args.out,
    )


if __name__ == "__main__":
    main()
