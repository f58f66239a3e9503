"""kmp's float8 quantization on torch, eager against compiled: what
compiling it buys each operand of `kmp.float8`'s matmul.

    KERAS_BACKEND=torch python benchmarks/float8_quantize_torch.py
    KERAS_BACKEND=torch python benchmarks/float8_quantize_torch.py \
        --size 8192 --rounds 5 --out /tmp/q.json

`kmp.fp8._torch_matmul.quantize` scales a tensor by its amax and casts
it to float8. Eager torch runs its passes (absolute value, amax, a
float32 copy, the division, the clamp, the cast) as separate kernels,
each a trip through memory; where `torch._scaled_mm` is fast (a GPU of
compute capability 8.9+) kmp runs it under `torch.compile`, a
reduction and one elementwise pass. This times both on one bfloat16
tensor of `size` x `size` (E4M3) on whatever device there is,
interleaved (`common.time_interleaved`), `steps` calls a round, after
recording whether they gave the same bits (on a CPU they must; a GPU's
Inductor may divide by multiplying by a reciprocal, so a scale may
differ in its last bit, `scale_difference`). On a CPU it measures the passes on
the host's memory, not a GPU's.
"""

import argparse
import os
import statistics

os.environ.setdefault("KERAS_BACKEND", "torch")

import common  # noqa: E402
import torch  # noqa: E402

from kmp import backend  # noqa: E402
from kmp.fp8 import _torch_matmul  # noqa: E402
from kmp.fp8.quantization import E4M3  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default=None, help="JSON path")
    args = parser.parse_args()
    if backend.name() != "torch":
        raise SystemExit("float8_quantize_torch.py runs on torch.")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    generator = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(args.size, args.size, generator=generator)
    x = x.to(device, torch.bfloat16)
    # The function kmp compiles, compiled as kmp compiles it.
    forms = {
        "eager": _torch_matmul._quantize,
        "compiled": torch.compile(_torch_matmul._quantize, dynamic=True),
    }
    outputs = {name: quantize(x, E4M3) for name, quantize in forms.items()}
    (q_eager, s_eager), (q_compiled, s_compiled) = outputs.values()
    same = torch.equal(
        q_eager.view(torch.uint8), q_compiled.view(torch.uint8)
    ) and torch.equal(s_eager, s_compiled)
    differing = int(
        (q_eager.view(torch.uint8) != q_compiled.view(torch.uint8)).sum()
    )

    def timed(quantize):
        def run():
            for _ in range(args.steps):
                quantize(x, E4M3)
            if device.type == "cuda":
                torch.cuda.synchronize(device)

        return run

    seconds = common.time_interleaved(
        {name: timed(quantize) for name, quantize in forms.items()},
        args.rounds,
    )
    eager_calls = common.aten_calls(lambda: _torch_matmul._quantize(x, E4M3))
    record = {
        "benchmark": "float8_quantize_torch",
        "size": args.size,
        "dtype": "bfloat16",
        "steps_per_round": args.steps,
        "same_bits": same,
        "values_differing": differing,
        "scale_difference": float(abs(s_eager - s_compiled)),
        "eager_aten_calls": sum(eager_calls.values()),
        # The median round's time a call.
        "call_ms": {
            name: 1000 * statistics.median(times) / args.steps
            for name, times in seconds.items()
        },
        # eager's time over compiled's: compiled's speed against eager's.
        "compiled_speedup": common.ratio_stats(seconds, "eager", "compiled"),
        "round_seconds": seconds,
    }
    common.write_result(
        record, f"float8_quantize_torch_{args.size}.json", args.out
    )
    print(
        f"{args.size}^2 bfloat16 -> float8: eager "
        f"{record['call_ms']['eager']:.2f} ms "
        f"({record['eager_aten_calls']} aten calls), "
        f"compiled {record['call_ms']['compiled']:.2f} ms; compiled "
        f"{record['compiled_speedup']['median']:.2f}x eager's speed"
    )


if __name__ == "__main__":
    main()
