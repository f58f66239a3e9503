"""Keras on PyTorch with kmp against PyTorch's own `torch.amp`, same net.

    KERAS_BACKEND=torch python benchmarks/torch_amp.py               # auto
    KERAS_BACKEND=torch python benchmarks/torch_amp.py --size full   # GPU
    KERAS_BACKEND=torch python benchmarks/torch_amp.py --compile
    KERAS_BACKEND=torch python benchmarks/torch_amp.py --size tiny  # host

The CIFAR-10 example's ResNet-9 (`examples/cifar10.build_model`) is
trained two ways in one process, each in float32, mixed float16 and
mixed bfloat16:

    keras float32       Keras 3 on torch, SGD
    keras fp16+kmp      kmp.enable("mixed_float16"), kmp.LossScaleOptimizer
    keras bf16          kmp.enable("mixed_bfloat16")
    ... Keras's BN      the same, with Keras's own BatchNormalization layers
                        (since 2026-11-28 `kmp.pin_float32` gives the
                        others kmp's, one fused kernel each on torch)
    torch float32       the same net in plain PyTorch (channels_last), SGD
    torch fp16+amp      torch.autocast(float16) and torch.amp.GradScaler
    torch bf16+amp      torch.autocast(bfloat16)

Both sides train on the same `--steps` distinct batches, which live on
the device (no input pipeline is timed: Keras's side calls its compiled
train function, `model.train_function`, on them, as `fit` does per
batch). After a warm-up, rounds interleave the variants in a rotating
order; each round ends with a read of the loss, so queued GPU work is
finished inside the timed span. Reported: images/s (median round), the
speed against the same side's float32, Keras against torch.amp at
the same precision, and the aten operations each variant dispatches a
step (one more round, counted; not timed). `--compile`:
`jit_compile=True` for Keras (which is torch.compile on this backend)
and `torch.compile` for plain PyTorch.

On a CPU, half precision is emulated and slower than float32 (expected);
the figures that answer "Keras-torch + kmp vs torch.amp" come from a GPU.
Writes a JSON file with the hardware and versions.
"""

import argparse
import os
import statistics

os.environ.setdefault("KERAS_BACKEND", "torch")

import common  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402

import kmp  # noqa: E402
from kmp import backend  # noqa: E402
from kmp.examples import cifar10  # noqa: E402

# (width, batch); "tiny" leaves almost no arithmetic: what a step costs
# the host (Python, dispatch, one kernel launch per op), which bounds an
# eager step on a GPU where the arithmetic is fast.
SIZES = {"tiny": (4, 2), "small": (16, 64), "full": (64, 512)}
# (policy, scaler, Keras's own BatchNormalization)
KERAS = {
    "keras float32": ("float32", None, False),
    "keras fp16+kmp": ("mixed_float16", "kmp", False),
    "keras bf16": ("mixed_bfloat16", None, False),
    "keras fp16+kmp, Keras's BN": ("mixed_float16", "kmp", True),
    "keras bf16, Keras's BN": ("mixed_bfloat16", None, True),
}
TORCH = {
    "torch float32": None,
    "torch fp16+amp": "float16",
    "torch bf16+amp": "bfloat16",
}
PAIRS = (
    ("keras float32", "torch float32"),
    ("keras fp16+kmp", "torch fp16+amp"),
    ("keras bf16", "torch bf16+amp"),
    ("keras fp16+kmp", "keras fp16+kmp, Keras's BN"),
    ("keras bf16", "keras bf16, Keras's BN"),
)


def keras_variant(variant, width, batches, compiled):
    """The example's model under the variant's policy; `run()` trains one
    step per batch and returns the last loss (read on the host)."""
    policy, scaler, keras_batch_norm = KERAS[variant]
    with kmp.policy_scope(policy):
        keras.utils.set_random_seed(0)
        model = kmp.pin_float32(cifar10.build_model(width))
        if keras_batch_norm:
            for layer in model._flatten_layers():
                if isinstance(layer, kmp.layers.BatchNormalization):
                    layer.__class__ = keras.layers.BatchNormalization
        inner = keras.optimizers.SGD(0.01, momentum=0.9, nesterov=True)
        model.compile(
            optimizer=kmp.LossScaleOptimizer(inner) if scaler else inner,
            loss="sparse_categorical_crossentropy",
            jit_compile=compiled,
            auto_scale_loss=False,
        )
        model.optimizer.build(model.trainable_variables)
    inputs = [
        (keras.ops.convert_to_tensor(x), keras.ops.convert_to_tensor(y))
        for x, y in batches
    ]
    # What `fit` does before its first step (a private method of Keras's
    # trainer): builds the compiled loss and metrics outside the train
    # function, which torch.compile (`--compile`) cannot trace building
    # them (torch 2.13: an AssertionError in dynamo's bytecode rewrite).
    model._symbolic_build(data_batch=inputs[0])
    model.make_train_function()

    def run():
        for batch in inputs:
            logs = model.train_function([batch])
        return float(logs["loss"])

    return run


def torch_resnet9(width, classes=10):
    """`cifar10.build_model` in plain PyTorch (NCHW; BatchNorm momentum
    0.9 in Keras's convention is 0.1 in PyTorch's)."""
    import torch
    from torch import nn

    def conv_bn(cin, cout):
        return nn.Sequential(
            nn.Conv2d(cin, cout, 3, padding=1, bias=False),
            nn.BatchNorm2d(cout, momentum=0.1, eps=1e-3),
            nn.ReLU(),
        )

    class Residual(nn.Module):
        def __init__(self, channels):
            super().__init__()
            self.inner = nn.Sequential(
                conv_bn(channels, channels), conv_bn(channels, channels)
            )

        def forward(self, x):
            return x + self.inner(x)

    class ResNet9(nn.Module):
        def __init__(self):
            super().__init__()
            w = width
            self.body = nn.Sequential(
                conv_bn(3, w),
                conv_bn(w, 2 * w),
                nn.MaxPool2d(2),
                Residual(2 * w),
                conv_bn(2 * w, 4 * w),
                nn.MaxPool2d(2),
                conv_bn(4 * w, 8 * w),
                nn.MaxPool2d(2),
                Residual(8 * w),
                nn.AdaptiveMaxPool2d(1),
                nn.Flatten(),
                nn.Linear(8 * w, classes),
            )

        def forward(self, x):
            return self.body(x) * 0.125  # logits, scaled as the example's

    torch.manual_seed(0)
    return ResNet9()


def torch_variant(variant, width, batches, compiled):
    """Plain PyTorch AMP, the recipe of PyTorch's documentation."""
    import torch

    half = TORCH[variant]
    device = keras.ops.convert_to_tensor(0.0).device  # Keras's device
    model = torch_resnet9(width).to(device, memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(
        model.parameters(), lr=0.01, momentum=0.9, nesterov=True
    )
    dtype = getattr(torch, half) if half else torch.float32
    scaler = torch.amp.GradScaler(device.type, enabled=half == "float16")
    forward = torch.compile(model) if compiled else model
    loss_fn = torch.nn.CrossEntropyLoss()
    inputs = [
        (
            torch.as_tensor(x, device=device)
            .permute(0, 3, 1, 2)
            .contiguous(memory_format=torch.channels_last),
            torch.as_tensor(y, device=device, dtype=torch.long),
        )
        for x, y in batches
    ]

    def run():
        model.train()
        for x, y in inputs:
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype, enabled=half is not None):
                loss = loss_fn(forward(x), y)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        return float(loss.detach())

    return run


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", choices=("auto", *SIZES))
    parser.add_argument("--steps", type=int, default=10, help="per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--out", default=None, help="JSON path")
    args = parser.parse_args()
    if backend.name() != "torch":
        parser.error("run it with KERAS_BACKEND=torch")
    size = args.size or "auto"
    if size == "auto":
        accelerated = backend.list_devices()[0].platform != "cpu"
        size = "full" if accelerated else "small"
    width, batch = SIZES[size]
    backend.disable_tf32()  # float32 means float32 on both sides

    rng = np.random.default_rng(0)
    batches = [
        (
            rng.normal(size=(batch, 32, 32, 3)).astype("float32"),
            rng.integers(0, 10, size=batch).astype("int32"),
        )
        for _ in range(args.steps)
    ]
    runs = {}
    for variant in KERAS:
        runs[variant] = keras_variant(variant, width, batches, args.compile)
    for variant in TORCH:
        runs[variant] = torch_variant(variant, width, batches, args.compile)
    losses_before = {name: run() for name, run in runs.items()}  # warm-up
    # One more round, counted: the aten calls of a step, and by name
    # (aten.clone is a full copy of an activation; aten.detach a view).
    aten_ops = {
        name: {
            op: count / args.steps
            for op, count in common.aten_calls(run).most_common()
        }
        for name, run in runs.items()
    }
    aten_calls = {name: sum(ops.values()) for name, ops in aten_ops.items()}
    seconds = common.time_interleaved(
        runs, args.rounds, unit=(args.steps * batch, "img/s")
    )
    losses_after = {name: run() for name, run in runs.items()}

    rates = {
        name: args.steps * batch / statistics.median(times)
        for name, times in seconds.items()
    }
    # Speed of a over b: b's time over a's, per round.
    per_round = {
        f"{a} / {b}": statistics.median(
            [y / x for x, y in zip(seconds[a], seconds[b])]
        )
        for a, b in PAIRS
        + (
            ("keras fp16+kmp", "keras float32"),
            ("torch fp16+amp", "torch float32"),
        )
    }
    print(f"\nResNet-9 width {width}, batch {batch}, compile={args.compile}")
    print(
        "| variant | img/s | aten calls a step | loss before | loss after |"
        "\n|---|---|---|---|---|"
    )
    for name in runs:
        print(
            f"| {name} | {rates[name]:.0f} | {aten_calls[name]:.0f} | "
            f"{losses_before[name]:.4f} | {losses_after[name]:.4f} |"
        )
    print("\n| speed ratio (median of rounds) | |\n|---|---|")
    for name, ratio in per_round.items():
        print(f"| {name} | {ratio:.3f}x |")
    common.write_result(
        {
            "benchmark": "torch_amp",
            "model": f"ResNet-9 width {width}",
            "batch_size": batch,
            "steps_per_round": args.steps,
            "rounds": args.rounds,
            "compile": args.compile,
            "images_per_s": rates,
            "aten_calls_per_step": aten_calls,
            "aten_ops_per_step": aten_ops,
            "speed_ratios": per_round,
            "loss_before": losses_before,
            "loss_after": losses_after,
            "round_seconds": seconds,
        },
        f"torch_amp_{size}{'_compiled' if args.compile else ''}.json",
        args.out,
    )


if __name__ == "__main__":
    main()
