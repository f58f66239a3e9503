"""What every kmp benchmark shares: interleaved timing, ratio statistics,
and a JSON result that names the hardware, versions and command; torch's
aten calls counted; the float8 matmul stacks' arguments, records and
table (float8_matmul.py on JAX, float8_matmul_torch.py on torch).

Variants are timed in one process, one after another within a round, with
their order rotated every round, so that the shared machine's noise falls
on all of them alike; ratios are taken within a round.
"""

import json
import os
import socket
import statistics
import subprocess
import sys

from kmp import backend
from kmp.app.bench import time_fit_rounds as _time_fit_rounds
from kmp.app.bench import time_interleaved as _time_interleaved

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def train_run(example, flags, out):
    """One `kmp train EXAMPLE` process with `flags`, its output in `out`
    (restarted, quiet); its results.json. A failed run ends the
    benchmark with its error."""
    command = [
        sys.executable,
        "-m",
        "kmp_cli",
        "train",
        example,
        f"--output_dir={out}",
        "--restart",
        "--verbose=0",
        *flags,
    ]
    done = subprocess.run(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    if done.returncode:
        sys.exit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    with open(os.path.join(out, "results.json")) as f:
        return json.load(f)


def parse_with_flags(parser):
    """`(args, flags)`: `parser`'s arguments, and the flags after `--`
    (for the `kmp train` runs a benchmark makes)."""
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    return parser.parse_args(argv[:cut]), argv[cut + 1 :]


def jit_compile_flag(parser):
    """`--jit_compile {auto,on,off}`; `auto` (the default) is XLA on
    TensorFlow and JAX and eager on torch, which is Keras's default there
    (torch.compile's first step costs 30-70 s on a 2-core CPU)."""
    parser.add_argument(
        "--jit_compile", choices=("auto", "on", "off"), default="auto"
    )


def jit_compile(args) -> bool:
    """The `jit_compile` value `--jit_compile` stands for."""
    if args.jit_compile == "auto":
        return backend.name() != "torch"
    return args.jit_compile == "on"


def time_interleaved(runs, rounds, unit=None):
    """`kmp.app.bench.time_interleaved`, printing a line per round."""
    return _time_interleaved(
        runs, rounds, lambda line: print(line, flush=True), unit
    )


def time_fit_rounds(runs, step_logs, rounds, steps):
    """`kmp.app.bench.time_fit_rounds`, printing a line per round:
    `(call_seconds, steady_step_seconds)`, each round's whole `fit` call
    and its steady step."""
    return _time_fit_rounds(
        runs, step_logs, rounds, steps, lambda line: print(line, flush=True)
    )


def ratio_stats(seconds, a, b):
    """Statistics of the time ratio a/b over rounds.

    Returns:
        Dict with the median and quartiles of the per-round ratios, and
        the ratio of each variant's fastest round (noise on a shared
        machine only adds time, so that is the least disturbed pair).
    """
    per_round = [x / y for x, y in zip(seconds[a], seconds[b])]
    q1, median, q3 = statistics.quantiles(per_round, n=4, method="inclusive")
    return {
        "median": median,
        "q1": q1,
        "q3": q3,
        "fastest": min(seconds[a]) / min(seconds[b]),
    }


def ratio_table(stats):
    """Markdown table of `{name: ratio_stats(...)}`."""
    lines = [
        "| ratio of times | median of per-round ratios | 25th-75th "
        "percentile | ratio of fastest rounds |",
        "|---|---|---|---|",
    ]
    for name, s in stats.items():
        lines.append(
            f"| {name} | {s['median']:.3f} | {s['q1']:.3f}-{s['q3']:.3f} "
            f"| {s['fastest']:.3f} |"
        )
    return "\n".join(lines)


def write_result(result, filename, out=None):
    """Writes `result` plus the command, hardware and versions as JSON."""
    path = out or os.path.join(RESULTS, filename)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    record = {
        "command": "python " + " ".join(sys.argv),
        **backend.environment(),
        **result,
    }
    with open(path, "w") as f:
        json.dump(record, f, indent=2)
    print(f"wrote {path}")
    return path


def free_ports(count):
    """`count` ports free on 127.0.0.1 now (for processes started next)."""
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def aten_calls(run):
    """The aten operations `run()` dispatches, by name (a `Counter`):
    each is a kernel launch and a trip through Python on eager torch."""
    import collections

    from torch.utils._python_dispatch import TorchDispatchMode

    calls = collections.Counter()

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            calls[str(func)] += 1
            return func(*args, **(kwargs or {}))

    with Count():
        run()
    return calls


def matmul_stack_arguments(parser):
    """The float8 matmul benchmarks' stack (float8_matmul.py on JAX,
    float8_matmul_torch.py on torch): sizes, rows, layers, rounds."""
    parser.add_argument(
        "--size", default="8192", help="kernel sizes, comma-separated"
    )
    parser.add_argument("--tokens", type=int, default=None, help="= size")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10, help="per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default=None, help="JSON path")


def matmul_stack_record(size, tokens, layers, seconds, steps, losses, counts):
    """One size's record of a matmul stack timed in rounds (`seconds`,
    `bf16` among them): each matmul's step time, TFLOP/s (the 3 matmuls
    of each layer, forward and backward), loss and `counts` (`{field:
    {matmul: value}}`: the float8 GEMMs each ran), and each one's speed
    against bf16 (the median of per-round ratios)."""
    flops = 3 * 2 * tokens * size**2 * layers
    runs = {}
    for name, times in seconds.items():
        step_s = statistics.median(times) / steps
        runs[name] = {
            "step_time_s": step_s,
            "tflops": flops / step_s / 1e12,
            "loss": losses[name],
            **{field: values[name] for field, values in counts.items()},
            "round_seconds": times,
        }
        if name != "bf16":
            runs[name]["speed_vs_bf16"] = statistics.median(
                b / f for b, f in zip(seconds["bf16"], times)
            )
    return {
        "size": size,
        "tokens": tokens,
        "layers": layers,
        "speed_vs_bf16": runs["float8"]["speed_vs_bf16"],
        "runs": runs,
    }


def measure_matmul_stacks(args, measure, result, count):
    """`measure(size, tokens)` for each of `--size`, the JSON (`result`
    plus the records, `<benchmark>_<sizes>.json`) rewritten after each
    size so that a time limit keeps what was measured; then the table,
    with `count = (field, header)` as its GEMM-count column."""
    records = []
    for size in [int(size) for size in args.size.split(",")]:
        records.append(measure(size, args.tokens or size))
        write_result(
            {**result, "sizes": records},
            f"{result['benchmark']}_{args.size.replace(',', '_')}.json",
            args.out,
        )
    field, header = count
    print(
        f"| size | tokens | matmul | step (ms) | TFLOP/s | loss | {header} "
        "| speed vs bf16 |\n|---|---|---|---|---|---|---|---|"
    )
    for record in records:
        for name, r in record["runs"].items():
            speed = f"{r['speed_vs_bf16']:.3f}x" if name != "bf16" else ""
            print(
                f"| {record['size']} | {record['tokens']} | {name} "
                f"| {1000 * r['step_time_s']:.2f} | {r['tflops']:.3g} "
                f"| {r['loss']:.5f} | {r[field]} | {speed} |"
            )
