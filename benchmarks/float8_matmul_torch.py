"""kmp's float8 matmul on torch (`torch._scaled_mm`) against bfloat16
matmuls, forward and backward: float8_matmul.py's stack, on PyTorch.

    KERAS_BACKEND=torch python benchmarks/float8_matmul_torch.py   # GPU
    KERAS_BACKEND=torch python benchmarks/float8_matmul_torch.py \
        --size=4096,8192 --tokens=8192 --compile
    KERAS_BACKEND=torch python benchmarks/float8_matmul_torch.py --size=128

A stack of `layers` square kernels (`size` x `size`, bfloat16) applied to
`tokens` x `size` bfloat16 activations, a mean-square loss, and its
gradients with respect to every kernel and the input:

- `bf16`: `x @ w` on the bfloat16 operands;
- `float8`: `kmp.fp8.scaled_matmul.float8_matmul`, whose forward and two
  backward matmuls are `torch._scaled_mm`s on float8 operands on a GPU of
  compute capability 8.9+ (elsewhere, the float8 values multiplied
  dequantized: on a CPU this checks the script, not float8's speed).
  There each operand's quantization runs compiled;
- `float8 eager`: the same with every quantization eager, as before:
  its passes over memory as separate kernels (0.57x-0.88x bfloat16 on
  the 2026-11-29 H200). Under `--compile` it is `float8`'s program (the
  step's compile traces the quantization either way).

Eager by default (Keras's default on torch); `--compile` runs every step
under `torch.compile`. The three are timed interleaved
(`common.time_interleaved`), `steps` steps a round; TFLOP/s count the 3
matmuls of each layer. `scaled_mm_calls` is how many `_scaled_mm`s one
eager step ran (3 a layer where they run, the input's gradient included),
`aten_calls` how many aten operations (each a kernel launch, eager;
counted under a dispatch mode, where kmp quantizes eagerly, so the two
float8 forms count alike).
The JSON is rewritten after each size, so a time limit keeps what was
measured; it records the device and versions.
"""

import argparse
import functools
import os

os.environ.setdefault("KERAS_BACKEND", "torch")

import common  # noqa: E402
import torch  # noqa: E402

from kmp import backend  # noqa: E402
from kmp.fp8 import _torch_matmul  # noqa: E402
from kmp.fp8.scaled_matmul import float8_matmul  # noqa: E402

MATMULS = {
    "bf16": lambda x, w: x @ w,
    "float8": float8_matmul,
    "float8 eager": float8_matmul,
}
EAGER_QUANTIZATION = {"float8 eager"}


def quantizing_eagerly(step):
    """`step`, with kmp's float8 quantization eager throughout (forward
    and backward): its compiled form set aside while it runs."""

    def run(*args):
        saved, _torch_matmul._compiled = _torch_matmul._compiled, False
        try:
            return step(*args)
        finally:
            _torch_matmul._compiled = saved

    return run


def train_step(matmul, compile_step, name=""):
    """A step: the loss, its gradients by the input and every kernel
    (left in their `.grad`, set to None before each step); `name` in
    `EAGER_QUANTIZATION` quantizes eagerly."""

    def step(x, kernels):
        x.grad = None
        for w in kernels:
            w.grad = None
        y = x
        for w in kernels:
            y = matmul(y, w)
        loss = torch.mean(torch.square(y.float()))
        loss.backward()
        return loss

    step = torch.compile(step) if compile_step else step
    return quantizing_eagerly(step) if name in EAGER_QUANTIZATION else step


def stack(size, tokens, layers, device, seed=0):
    """Activations and kernels scaled to keep the stack's outputs ~1."""
    generator = torch.Generator(device="cpu").manual_seed(seed)

    def normal(*shape, scale=1.0):
        values = torch.randn(*shape, generator=generator) * scale
        return values.to(device, torch.bfloat16).requires_grad_()

    x = normal(tokens, size)
    return x, [normal(size, size, scale=size**-0.5) for _ in range(layers)]


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(size, tokens, layers, steps, rounds, compile_step, device):
    """One size's record: each matmul's step time, TFLOP/s, loss and
    `_scaled_mm` count, and float8's speed against bf16."""
    x, kernels = stack(size, tokens, layers, device)
    runs, losses, calls, aten = {}, {}, {}, {}
    for name, matmul in MATMULS.items():
        eager = functools.partial(train_step(matmul, False, name), x, kernels)
        counted = common.aten_calls(eager)
        calls[name] = counted["aten._scaled_mm.default"]
        aten[name] = sum(counted.values())
        step = train_step(matmul, compile_step, name)
        losses[name] = float(step(x, kernels))  # compiles, if asked

        def run(step=step):
            for _ in range(steps):
                step(x, kernels)
            synchronize(device)

        runs[name] = run
    seconds = common.time_interleaved(runs, rounds)
    record = common.matmul_stack_record(
        size,
        tokens,
        layers,
        seconds,
        steps,
        losses,
        {"scaled_mm_calls": calls, "aten_calls": aten},
    )
    return {**record, "compiled": compile_step}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    common.matmul_stack_arguments(parser)
    parser.add_argument(
        "--compile", action="store_true", help="torch.compile both steps"
    )
    args = parser.parse_args()
    if backend.name() != "torch":
        raise SystemExit(
            "float8_matmul_torch.py runs on torch: KERAS_BACKEND=torch "
            "(float8_matmul.py is JAX's)"
        )
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    kind = (
        torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    )
    print(f"device: {kind}, torch {torch.__version__}")
    common.measure_matmul_stacks(
        args,
        lambda size, tokens: measure(
            size,
            tokens,
            args.layers,
            args.steps,
            args.rounds,
            args.compile,
            device,
        ),
        {"benchmark": "float8_matmul_torch", "device_kind": kind},
        ("scaled_mm_calls", "_scaled_mm a step"),
    )


if __name__ == "__main__":
    main()
