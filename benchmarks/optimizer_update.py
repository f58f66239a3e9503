"""The time of one optimizer update in kmp's 16-bit modes, eagerly.

    KERAS_BACKEND=torch python benchmarks/optimizer_update.py
    KERAS_BACKEND=torch python benchmarks/optimizer_update.py \
        --hidden_dim=1024 --layers=8            # a GPU's size

On a KerasHub GPT-2 backbone's trainable variables (CPU sizes by
default: 2 layers of width 64, vocabulary 5000), times
`optimizer.apply(grads, variables)` of AdamW with weight decay,
interleaved round by round:

    float32       Keras's AdamW over float32 variables (on torch its
                  multi-tensor update)
    bf16 state    kmp.wrap(AdamW, state_dtype="bfloat16")
    both          bfloat16 variables (Keras's "bfloat16" policy),
                  bfloat16 slots, stochastic rounding
    int8 state    kmp.wrap(AdamW, state_dtype="int8"): 8-bit codes in
                  blocks of 256 with a float32 scale each
    int8 + bf16 masters
                  bfloat16 variables, int8 slots, stochastic rounding

and on torch `bf16 state` and `both` again without kmp's grouped update (`per
variable`: Keras's per-variable `update_step` in float32, each write
rounded alone, what kmp runs on JAX, TensorFlow and for Nadam).
Eager on every backend: on TensorFlow and JAX `fit` compiles the update
into its step, so only torch's figures are what a run pays; on JAX
`--compiled` times `jax.jit(optimizer.stateless_apply)` instead, the
update as `fit` compiles it. Reports
each variant's median milliseconds and its ratio to float32 (median of
per-round ratios). Writes
benchmarks/results/optimizer_update_<backend>.json.
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import common  # noqa: E402
import keras  # noqa: E402
import keras_hub  # noqa: E402
import numpy as np  # noqa: E402

import kmp  # noqa: E402
from kmp import backend  # noqa: E402
from kmp.memory import grouped_update  # noqa: E402


def _variables(args, dtype):
    """The backbone's trainable variables, made under `dtype`'s policy."""
    keras.config.set_dtype_policy(dtype)
    try:
        keras.utils.set_random_seed(0)
        model = keras_hub.models.GPT2Backbone(
            vocabulary_size=args.vocabulary_size,
            num_layers=args.layers,
            num_heads=max(1, args.hidden_dim // 64),
            hidden_dim=args.hidden_dim,
            intermediate_dim=4 * args.hidden_dim,
            max_sequence_length=args.sequence_length,
        )
    finally:
        keras.config.set_dtype_policy("float32")
    return model.trainable_variables


def _update(variables, optimizer, applies, grouped=True, compiled=False):
    """A zero-argument run: `applies` updates with fixed gradients
    (`compiled`: JAX's jitted stateless update, as `fit` runs it)."""
    rng = np.random.default_rng(0)
    grads = [
        keras.ops.convert_to_tensor(
            rng.normal(scale=1e-3, size=v.shape).astype("float32"),
            backend.stored_dtype(v),
        )
        for v in variables
    ]
    optimizer.build(variables)
    if compiled:
        return _compiled_update(variables, optimizer, grads, applies)

    def run():
        in_groups = backend.updates_in_groups
        if not grouped:  # kmp's update before the grouped one
            backend.updates_in_groups = lambda: False
        try:
            for _ in range(applies):
                optimizer.apply(grads, variables)
            # A GPU queues the kernels: the clock waits for the last one.
            keras.ops.convert_to_numpy(variables[-1])
        finally:
            backend.updates_in_groups = in_groups

    run()  # builds what the first call makes
    return run


def _compiled_update(variables, optimizer, grads, applies):
    """JAX: `applies` jitted `stateless_apply`s, the values threaded
    through (the variables themselves are left as they are)."""
    import jax

    step = jax.jit(optimizer.stateless_apply)
    values = [
        [v.value for v in variables],
        [v.value for v in optimizer.variables],
    ]

    def run():
        for _ in range(applies):
            values[0], values[1] = step(values[1], grads, values[0])
        jax.block_until_ready(values)

    run()  # compiles
    return run


def _adamw():
    return keras.optimizers.AdamW(1e-3, weight_decay=0.01)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hidden_dim", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--vocabulary_size", type=int, default=5000)
    parser.add_argument("--sequence_length", type=int, default=128)
    parser.add_argument("--applies", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument(
        "--compiled",
        action="store_true",
        help="JAX: time the jitted stateless update (what fit runs)",
    )
    parser.add_argument(
        "--group_elements",
        type=int,
        default=grouped_update.GROUP_ELEMENTS,
        help="torch: weights' elements updated together",
    )
    parser.add_argument(
        "--rounded_elements",
        type=int,
        default=grouped_update.ROUNDED_ELEMENTS,
        help="torch: elements rounded stochastically in one pass",
    )
    parser.add_argument("--output", default=None)
    args = parser.parse_args()
    grouped_update.GROUP_ELEMENTS = args.group_elements
    grouped_update.ROUNDED_ELEMENTS = args.rounded_elements
    if args.compiled and backend.name() != "jax":
        parser.error("--compiled is JAX's: set KERAS_BACKEND=jax")
    compiled = args.compiled

    float32 = _variables(args, "float32")
    # Each mode: the policy its variables are made under, kmp.wrap's flags.
    modes = {
        "bf16 state": ("float32", {"state_dtype": "bfloat16"}),
        "both": (
            "bfloat16",
            {"state_dtype": "bfloat16", "rounding": "stochastic"},
        ),
        "int8 state": ("float32", {"state_dtype": "int8"}),
        "int8 + bf16 masters": (
            "bfloat16",
            {"state_dtype": "int8", "rounding": "stochastic"},
        ),
    }
    runs = {
        "float32": _update(float32, _adamw(), args.applies, compiled=compiled)
    }
    for name, (dtype, flags) in modes.items():
        runs[name] = _update(
            _variables(args, dtype),
            kmp.wrap(_adamw(), **flags),
            args.applies,
            compiled=compiled,
        )
    if backend.updates_in_groups() and not compiled:
        runs["bf16 state, per variable"] = _update(
            _variables(args, "float32"),
            kmp.wrap(_adamw(), state_dtype="bfloat16"),
            args.applies,
            grouped=False,
        )
        runs["both, per variable"] = _update(
            _variables(args, "bfloat16"),
            kmp.wrap(_adamw(), state_dtype="bfloat16", rounding="stochastic"),
            args.applies,
            grouped=False,
        )
    seconds = common.time_interleaved(runs, args.rounds)
    parameters = sum(int(np.prod(v.shape)) for v in float32)
    rows = {}
    for name in runs:
        ms = sorted(s / args.applies * 1e3 for s in seconds[name])
        rows[name] = {
            "median_ms": ms[len(ms) // 2],
            "over_float32": common.ratio_stats(seconds, name, "float32"),
        }
    print(f"{len(float32)} tensors, {parameters} parameters:")
    print("| update | ms (median) | x float32 (median of rounds) |")
    print("|---|---|---|")
    for name, row in rows.items():
        print(
            f"| {name} | {row['median_ms']:.2f} | "
            f"{row['over_float32']['median']:.2f} |"
        )
    common.write_result(
        {
            "tensors": len(float32),
            "parameters": parameters,
            "flags": vars(args),
            "compiled": compiled,
            "updates": rows,
            "seconds": seconds,
        },
        f"optimizer_update_{backend.name()}"
        + ("_compiled" if compiled else "")
        + ".json",
        args.output,
    )


if __name__ == "__main__":
    main()
