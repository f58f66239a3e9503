"""The `kmp` command line, parsed and checked before Keras loads.

    kmp info                 versions, devices, recommended policy and why
    kmp demo [--policy ...]  a short mixed-precision fit with loss-scale logs
    kmp train cifar10|imdb|lm [--flags]   the example trainers (same code)
    kmp bench [--models ...] float32 vs mixed, interleaved, on those models
    kmp audit PATH.keras     mixed-precision hazards in a saved model
    kmp doctor cifar10|imdb|PATH.keras [--flags]   where float16 hurts

`parse` returns argparse's namespace with what the commands need from
their flags: an example's config (`kmp_config.flags`), the flags the user
gave, a help text to print. Everything that can be refused without Keras
is refused here, in one line with exit status 2 (`fail`).
"""

import argparse
import os
import sys

from absl import flags as absl_flags

from kmp_config import configs
from kmp_config import flags
from kmp_config import names
from kmp_config.errors import fail

HELP = ("-h", "--help", "--helpfull")


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


def _listed(rows) -> str:
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"  {name:<{width}}  {what}" for name, what in rows)


# Each example with its config's summary line.
EXAMPLES = [(name, c.__doc__) for name, c in configs.EXAMPLES.items()]
CLASSIFIERS = [row for row in EXAMPLES if row[0] in configs.CLASSIFIERS]

TRAIN_EPILOG = f"""examples:
{_listed(EXAMPLES)}

`kmp train EXAMPLE --help` lists the example's flags (absl syntax:
--steps=20). Where no GPU is found, the sizes you do not set are the
example's CPU sizes (the command says which). Rerun an interrupted
command to resume it from --output_dir; --restart starts over."""

SAVED = [
    ("PATH.keras", "a saved model, with --data=PATH.npz"),
    ("DIRECTORY", "an OrbaxCheckpoint's latest step, with --data=PATH.npz"),
]

DOCTOR_EPILOG = f"""targets:
{_listed([*CLASSIFIERS, *SAVED])}

`kmp doctor cifar10 --help` (or imdb, or PATH.keras) lists the flags:
an example's that bear on the model and data, with the doctor's
--batches and --loss_scale. Where no GPU is found, the sizes you do not
set are the example's CPU sizes, as for `kmp train`."""

AUDIT_EPILOG = """exit status:
  0  no finding is an error (warnings and notes are printed, not counted)
  1  at least one finding is an error: results would be wrong
  2  bad input: no such file, not a Keras archive, a class of the
     model's own that no --import registers
so `kmp audit model.keras && python train.py` gates a script or CI job."""


def build() -> argparse.ArgumentParser:
    """The `kmp` command's argparse parser."""
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
    raw = argparse.RawDescriptionHelpFormatter

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
        "--policy", choices=names.POLICIES, default="mixed_float16"
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
        help="train the CIFAR-10, IMDB or language-model example",
        description="Runs examples/cifar10.py, examples/imdb.py or "
        "examples/lm.py (the same code), prints a results "
        "table and writes results.json, results.png and the model to "
        "--output_dir.",
        epilog=TRAIN_EPILOG,
        formatter_class=raw,
    )
    train_parser.add_argument(
        "example",
        choices=configs.EXAMPLES,
        metavar="EXAMPLE",
        help=" or ".join(configs.EXAMPLES) + " (below)",
    )
    train_parser.add_argument(
        "flags", nargs=argparse.REMAINDER, help="the example's flags"
    )

    bench_parser = commands.add_parser(
        "bench",
        help="float32 vs mixed precision on the example models",
        description="Times float32, mixed_float16 (kmp and stock scalers) "
        "and mixed_bfloat16 on the example models, interleaved in one "
        "process after a warm-up, on synthetic data.",
    )
    bench_parser.add_argument(
        "--models",
        nargs="+",
        choices=configs.CLASSIFIERS,
        default=list(configs.CLASSIFIERS),
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
        description="Runs kmp.diagnose on an example model (its flags "
        "apply) or on a saved .keras model with --data=PATH.npz; prints "
        "the tables, writes doctor.txt, doctor.json and doctor.png.",
        epilog=DOCTOR_EPILOG,
        formatter_class=raw,
    )
    doctor_parser.add_argument(
        "target",
        metavar="TARGET",
        help="an example, PATH.keras or an OrbaxCheckpoint DIRECTORY (below)",
    )
    doctor_parser.add_argument(
        "flags", nargs=argparse.REMAINDER, help="the target's flags"
    )

    audit_parser = commands.add_parser(
        "audit",
        help="mixed-precision hazards in a saved .keras model",
        description="Loads a .keras model or the latest step of an "
        "OrbaxCheckpoint directory (with its compiled loss and optimizer) "
        "and prints kmp.audit's findings.",
        epilog=AUDIT_EPILOG,
        formatter_class=raw,
    )
    audit_parser.add_argument(
        "path", help="a .keras file or an OrbaxCheckpoint directory"
    )
    audit_parser.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help="a module or .py file that defines the model's own classes "
        "(registered with keras.saving.register_keras_serializable), "
        "imported before the load; repeatable",
    )
    audit_parser.add_argument(
        "--json", action="store_true", help="print the findings as JSON"
    )
    return parser


def parse(argv) -> argparse.Namespace:
    """Parses and checks `kmp ARGV` without importing Keras or kmp.

    Returns argparse's namespace, plus: `argv`; `help_text` (not `None`:
    print it, run nothing); for `train`, `config` and `given` (the names
    of the flags on the command line); for `doctor`, `config` (`None`
    for a saved model), `given` and `flag_values`. Bad input ends the
    process here (`fail`), or in argparse, with exit status 2."""
    argv = list(argv)
    args = build().parse_args(argv)
    args.argv, args.help_text = argv, None
    if args.command in ("train", "doctor"):
        _parse_flags(args)
    elif args.command == "audit":
        if not os.path.exists(args.path):
            fail(
                "kmp audit",
                f"{args.path} does not exist (no such file); check the path.",
            )
        # A directory: an OrbaxCheckpoint's, which kmp.load_model checks.
        keras_file = args.path.endswith(".keras") and os.path.isfile(args.path)
        if not keras_file and not os.path.isdir(args.path):
            fail(
                "kmp audit",
                f"{args.path!r} is neither a .keras file nor an "
                "OrbaxCheckpoint directory. Save the model with "
                "model.save('model.keras') first.",
            )
    return args


def plain_output() -> bool:
    """Whether stdout wants no colour or redrawing: it is not a terminal
    (a file, a pipe), or `NO_COLOR` is set (no-color.org)."""
    return bool(os.environ.get("NO_COLOR")) or not sys.stdout.isatty()


def _parse_flags(args) -> None:
    """The flags after `kmp train EXAMPLE` or `kmp doctor TARGET`, into
    `args`: a help text, or the checked config and flags."""
    train = args.command == "train"
    target = args.example if train else args.target
    name = f"kmp {args.command} {target}"
    if set(HELP) & set(args.flags):
        usage = f"usage: {name} [--flag=value ...]"
        values = (
            flags.example_flags(target) if train else flags.doctor_flags(target)
        )
        args.help_text = flags.help_text(usage, values)
        if target in configs.EXAMPLES:
            sizes = configs.EXAMPLES[target].CPU_SIZES
            args.help_text += (
                "\n\nWhere no GPU is found, the sizes not given are "
                + ", ".join(f"--{k}={v}" for k, v in sizes.items())
                + "."
            )
        return
    try:
        if train:
            args.config, args.given = flags.parse_example(
                name, target, args.flags
            )
            if "verbose" not in args.given and plain_output():
                # Keras's progress bar writes ANSI colour codes, and a
                # line per update where it cannot redraw: a file gets
                # fit's line per epoch instead.
                args.config.verbose = 2
        else:
            args.config, args.flag_values = flags.parse_doctor(
                name, target, args.flags
            )
            args.given = (
                set()
                if args.config is None
                else flags.given(type(args.config), args.flag_values)
            )
    except absl_flags.Error as error:
        fail(name, error)
