"""The `kmp` command line.

    kmp info                 versions, devices, recommended policy and why
    kmp demo [--policy ...]  a short mixed-precision fit with loss-scale logs
    kmp train cifar10|imdb [--flags]   the example trainers (same code)
    kmp bench [--models ...] float32 vs mixed, interleaved, on those models
    kmp audit PATH.keras     mixed-precision hazards in a saved model
    kmp doctor cifar10|imdb|PATH.keras [--flags]   where float16 hurts

The Keras backend is the usual `KERAS_BACKEND` environment variable
(`kmp bench --backend jax` sets it). `kmp --verbose COMMAND` shows
TensorFlow's C++ logs, which the command otherwise filters
(`kmp.app.logs`).

Parsing comes first and imports no Keras, so `kmp --help` and a bad flag
answer at once; `import kmp` is deferred for this command only (see
`kmp/__init__.py`) and happens when a command runs.
"""

import argparse
import os
import sys

from kmp.app._commands import EXAMPLES
from kmp.app._commands import audit
from kmp.app._commands import bench
from kmp.app._commands import demo
from kmp.app._commands import fail
from kmp.app._commands import info
from kmp.app._commands import train
from kmp.app._doctor_command import doctor
from kmp.app.logs import quiet_start

POLICIES = ("mixed_float16", "mixed_bfloat16", "float32", "auto")


def _positive_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected an integer, got {text!r}"
        ) from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _positive_float(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a number, got {text!r}"
        ) from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def _parser():
    parser = argparse.ArgumentParser(
        prog="kmp",
        description="Mixed-precision training for Keras 3.",
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="show TensorFlow's C++ logs (the command filters them)",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True

    info_parser = commands.add_parser(
        "info", help="versions, devices, recommended policy and why"
    )
    info_parser.add_argument(
        "--json", action="store_true", help="print the report as JSON"
    )

    demo_parser = commands.add_parser(
        "demo",
        help="a short mixed-precision fit showing the loss scale",
        description="Trains a small convnet on generated images and prints "
        "the policy, final loss scale and skipped steps.",
    )
    demo_parser.add_argument(
        "--policy", choices=POLICIES, default="mixed_float16"
    )
    demo_parser.add_argument("--epochs", type=_positive_int, default=2)
    demo_parser.add_argument(
        "--steps", type=_positive_int, default=20, help="steps per epoch"
    )
    demo_parser.add_argument("--batch_size", type=_positive_int, default=64)
    demo_parser.add_argument(
        "--initial_scale", type=_positive_float, default=2.0**15
    )
    demo_parser.add_argument("--seed", type=int, default=0)
    train_parser = commands.add_parser(
        "train",
        help="train the CIFAR-10 or IMDB example",
        description="Runs examples/cifar10.py or examples/imdb.py (the "
        "same code). Flags use absl syntax, e.g. --steps=20; "
        "`kmp train cifar10 --help` lists them.",
        add_help=False,
    )
    train_parser.add_argument("example", choices=EXAMPLES)
    train_parser.add_argument("flags", nargs=argparse.REMAINDER)

    bench_parser = commands.add_parser(
        "bench",
        help="float32 vs mixed precision on the example models",
        description="Times float32, mixed_float16 (kmp and stock scalers) "
        "and mixed_bfloat16 on the example models, interleaved in one "
        "process after a warm-up, on synthetic data.",
    )
    bench_parser.add_argument(
        "--models", nargs="+", choices=EXAMPLES, default=list(EXAMPLES)
    )
    bench_parser.add_argument(
        "--size",
        choices=("auto", "small", "full"),
        default="auto",
        help="model and batch sizes: small for a CPU, full for a GPU "
        "(auto: by device)",
    )
    bench_parser.add_argument(
        "--steps",
        type=_positive_int,
        default=10,
        help="distinct batches per round",
    )
    bench_parser.add_argument("--rounds", type=_positive_int, default=5)
    bench_parser.add_argument(
        "--memory",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="peak memory of each variant alone, in a process of its own "
        "(--no-memory: one process-wide figure, no extra processes)",
    )
    bench_parser.add_argument(
        "--float8",
        action="store_true",
        help="also bf16 and fp16 with kmp.float8 (models with matmul "
        "layers: imdb); float8 is fast on H100/H200, slow on a CPU",
    )
    bench_parser.add_argument(
        "--backend",
        choices=("tensorflow", "jax", "torch"),
        help="Keras backend (default: KERAS_BACKEND)",
    )
    bench_parser.add_argument(
        "--data",
        choices=("synthetic",),
        default="synthetic",
        help="bench always uses synthetic batches (same for all variants)",
    )
    bench_parser.add_argument(
        "--output", help="directory for bench.md and bench.json"
    )

    doctor_parser = commands.add_parser(
        "doctor",
        help="which layers float16 hurts, and the loss scale to use",
        description="Runs kmp.diagnose on an example model (cifar10, imdb; "
        "their flags apply) or on a saved .keras model with --data=PATH.npz "
        "(arrays x, y); prints the table, writes doctor.txt, .json and .png. "
        "`kmp doctor cifar10 --help` lists the flags.",
        add_help=False,
    )
    doctor_parser.add_argument("target", help="cifar10, imdb or PATH.keras")
    doctor_parser.add_argument("flags", nargs=argparse.REMAINDER)

    audit_parser = commands.add_parser(
        "audit",
        help="mixed-precision hazards in a saved .keras model",
        description="Loads a .keras model (with its compiled loss and "
        "optimizer) and prints kmp.audit's findings.",
    )
    audit_parser.add_argument("path", help="a .keras file")
    audit_parser.add_argument(
        "--json", action="store_true", help="print the findings as JSON"
    )
    return parser


def _backend_missing(error: ImportError):
    """Keras's own error for a backend whose framework is not installed,
    in one line (exit status 2); any other import error is re-raised."""
    backend = os.environ.get("KERAS_BACKEND", "tensorflow")
    if (error.name or "").split(".")[0] != backend:
        raise error
    fail(
        "kmp",
        f"{type(error).__name__}: {error} (KERAS_BACKEND={backend}). "
        f"Install it (pip install {backend}), or choose another backend "
        "with KERAS_BACKEND.",
    )


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = _parser().parse_args(argv)
    args.argv = argv
    if (
        args.command == "bench"
        and args.backend
        and (args.backend != os.environ.get("KERAS_BACKEND", "tensorflow"))
    ):
        # The backend is fixed when Keras is imported: start afresh.
        os.environ["KERAS_BACKEND"] = args.backend
        if os.path.basename(sys.argv[0]) == "kmp":  # the console script
            os.execv(sys.argv[0], [sys.argv[0], *argv])
        os.execv(sys.executable, [sys.executable, "-m", "kmp.app.cli", *argv])
    try:
        quiet_start(verbose=args.verbose)
        import kmp

        # The first public name loads the API, and registers kmp's classes
        # before a command loads a `.keras` file.
        kmp.LossScaleOptimizer  # noqa: B018
    except ImportError as error:
        _backend_missing(error)
    if args.command == "info":
        info(as_json=args.json)
    elif args.command == "demo":
        demo(args)
    elif args.command == "audit":
        audit(args)
    elif args.command == "train":
        train(args)
    elif args.command == "bench":
        bench(args)
    elif args.command == "doctor":
        doctor(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
