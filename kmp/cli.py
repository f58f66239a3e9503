"""The `kmp` command line.

    kmp info                 versions, devices, recommended policy and why
    kmp demo [--policy ...]  a short mixed-precision fit with loss-scale logs
    kmp train cifar10|imdb [--flags]   the example trainers (same code)
    kmp bench [--models ...] float32 vs mixed, interleaved, on those models
    kmp audit PATH.keras     mixed-precision hazards in a saved model
    kmp doctor cifar10|imdb|PATH.keras [--flags]   where float16 hurts

The Keras backend is the usual `KERAS_BACKEND` environment variable
(`kmp bench --backend jax` sets it).
"""

import argparse
import json
import os
import sys

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


def info(as_json: bool = False) -> dict:
    """Prints (and returns) versions, devices and the recommended policy."""
    import kmp
    from kmp import backend

    recommendation = kmp.recommend_policy()
    env = backend.environment()
    report = {
        **env["versions"],
        "cpu": env["hardware"]["cpu"],
        "devices": env["hardware"]["devices"],
        "tf32": env["tf32"],
        "recommended_policy": recommendation.policy,
        "reason": recommendation.reason,
    }
    if as_json:
        print(json.dumps(report, indent=2))
        return report
    width = max(len(k) for k in report)
    for key, value in report.items():
        if key == "devices":
            for i, d in enumerate(value):
                cc = d["compute_capability"]
                shown = f"{d['platform']}: {d['name']}"
                shown += f" (compute capability {cc})" if cc else ""
                print(f"{'device ' + str(i):<{width}}  {shown}")
        else:
            print(f"{key:<{width}}  {value}")
    return report


def demo(args) -> dict:
    """Runs `kmp.demo.run` with the parsed flags and prints a summary."""
    from kmp import demo as demo_lib

    result = demo_lib.run(
        policy=args.policy,
        epochs=args.epochs,
        steps_per_epoch=args.steps,
        batch_size=args.batch_size,
        initial_scale=args.initial_scale,
        seed=args.seed,
        verbose=2,
    )
    scale = result["loss_scale"]
    print()
    print(f"policy          {result['policy']}")
    print(f"optimizer       {result['optimizer']}")
    print(f"final loss      {result['loss']:.4f}")
    print(f"final accuracy  {result['accuracy']:.4f}")
    print(
        "loss scale      "
        + (
            "none (this policy needs no scaling)"
            if scale is None
            else f"{scale:g}"
        )
    )
    print(f"skipped steps   {result['skipped_steps']}")
    print(f"examples/s      {result['examples_per_second']:.0f}")
    return result


def audit(args) -> list:
    """Loads a `.keras` model and prints `kmp.audit`'s findings."""
    if not args.path.endswith(".keras") or not os.path.isfile(args.path):
        raise SystemExit(
            f"kmp audit: {args.path!r} is not a .keras file. Save the model "
            "with model.save('model.keras') first."
        )
    import keras

    import kmp

    model = keras.saving.load_model(args.path, compile=True)
    report = kmp.audit(model, verbose=not args.json)
    if args.json:
        print(report.to_json())
    return report


EXAMPLES = ("cifar10", "imdb")


def train(args) -> dict:
    """Runs examples/<name>.py's `train` with its flags (absl syntax)."""
    import importlib

    from absl import flags

    from kmp import data
    from kmp import recipes

    module = importlib.import_module(f"kmp.examples.{args.example}")
    values = flags.FlagValues()
    recipes.define_flags(module.Config, values)
    if {"-h", "--help", "--helpfull"} & set(args.flags):
        print(f"usage: kmp train {args.example} [--flag=value ...]\n")
        print(values.get_help())
        return {}
    try:
        values([f"kmp train {args.example}", *args.flags])
        config = recipes.config_from_flags(module.Config, values)
        config.check()
    except (flags.Error, ValueError) as error:
        raise SystemExit(f"kmp train {args.example}: {error}") from None
    try:
        results = module.train(config)
    except data.DataUnavailable as error:
        raise SystemExit(f"kmp train {args.example}: {error}") from None
    from kmp import report

    report.show(
        [results],
        f"kmp train {args.example}",
        note="memory: " + results["peak_memory_note"],
    )
    print(recipes.summary(args.example, results))
    return results


def bench(args) -> list:
    """Runs `kmp.bench` and prints / writes its tables."""
    from kmp import bench as bench_module
    from kmp import report

    results = bench_module.run(args.models, args.size, args.steps, args.rounds)
    for name in args.models:
        rows = [r for r in results if r["model"] == name]
        report.show(
            rows,
            f"kmp bench {name} ({backend_name()})",
            columns=bench_module.COLUMNS,
            note="memory: "
            + rows[0]["peak_memory_note"]
            + ", after compiling all variants (not per variant)",
        )
    text = bench_module.markdown(results)
    if args.output:
        os.makedirs(args.output, exist_ok=True)
        with open(os.path.join(args.output, "bench.md"), "w") as f:
            f.write(text + "\n")
        with open(os.path.join(args.output, "bench.json"), "w") as f:
            from kmp import backend

            json.dump(
                {
                    "command": "kmp " + " ".join(args.argv),
                    **backend.environment(),
                    "results": results,
                },
                f,
                indent=2,
            )
        print(f"wrote {args.output}/bench.md and bench.json")
    else:
        print(text)
    return results


DOCTOR_POLICIES = ("mixed_float16", "mixed_bfloat16")


def _doctor_flags(values, target):
    """The doctor's own flags; an example's come from its Config."""
    from absl import flags

    from kmp import recipes

    if target in EXAMPLES:
        import importlib

        module = importlib.import_module(f"kmp.examples.{target}")
        recipes.define_flags(module.Config, values)
        # Two batches need little data; the CIFAR cost figure is at 128.
        values.set_default("policy", "mixed_float16")
        values.set_default("batch_size", 128)
        values.set_default("synthetic_size", 2048)
        values.set_default("output_dir", f"runs/doctor_{target}")
        return module
    flags.DEFINE_string(
        "data", None, "A .npz file with arrays x and y.", flag_values=values
    )
    flags.DEFINE_string(
        "policy",
        "",
        "Mixed policy to test (default: the model's own).",
        flag_values=values,
    )
    flags.DEFINE_integer(
        "batch_size", 128, "Batch size.", lower_bound=1, flag_values=values
    )
    flags.DEFINE_string(
        "loss",
        "",
        "A Keras loss name (default: the saved model's compiled loss).",
        flag_values=values,
    )
    flags.DEFINE_string(
        "output_dir",
        "runs/doctor",
        "Where doctor.json and doctor.png go.",
        flag_values=values,
    )
    return None


def doctor(args):
    """Runs `kmp.diagnose` on an example model or a saved one; prints the
    table and writes doctor.json and doctor.png."""
    from absl import flags

    name = f"kmp doctor {args.target}"
    values = flags.FlagValues()
    module = _doctor_flags(values, args.target)
    flags.DEFINE_integer(
        "batches", 2, "Batches to run.", lower_bound=1, flag_values=values
    )
    flags.DEFINE_float(
        "loss_scale",
        0.0,
        "Loss scale to test (0: the model's optimizer's current one).",
        lower_bound=0.0,
        flag_values=values,
    )
    if {"-h", "--help", "--helpfull"} & set(args.flags):
        print(f"usage: {name} [--flag=value ...]\n")
        print(values.get_help())
        return None
    try:
        values([name, *args.flags])
        if values["policy"].value and (
            values["policy"].value not in DOCTOR_POLICIES
        ):
            raise ValueError(
                f"--policy must be one of {', '.join(DOCTOR_POLICIES)} "
                f"(the mixed policy under test); got {values.policy!r}."
            )
        model, data = (
            _example_inputs(module, values)
            if module
            else _saved_inputs(args.target, values)
        )
    except (flags.Error, ValueError, OSError) as error:
        raise SystemExit(f"{name}: {error}") from None
    import kmp

    try:
        report = kmp.diagnose(
            model,
            data,
            loss=None if module else (values.loss or None),
            batches=values.batches,
            batch_size=values.batch_size,
            loss_scale=values.loss_scale or None,
            policy=None if module else (values.policy or None),
        )
    except (ValueError, TypeError) as error:
        raise SystemExit(f"{name}: {error}") from None
    report.show()
    os.makedirs(values.output_dir, exist_ok=True)
    with open(os.path.join(values.output_dir, "doctor.json"), "w") as f:
        record = {"command": "kmp " + " ".join(args.argv)}
        json.dump({**record, **json.loads(report.to_json())}, f, indent=2)
    report.plot(os.path.join(values.output_dir, "doctor.png"))
    print(f"wrote {values.output_dir}/doctor.json and doctor.png")
    return report


def _example_inputs(module, values):
    """The example's compiled model (under --policy) and training data."""
    import keras

    from kmp import data as kmp_data
    from kmp import policy as policy_lib
    from kmp import recipes

    config = recipes.config_from_flags(module.Config, values).check()
    keras.utils.set_random_seed(config.seed)  # data order, augmentation
    try:
        splits = module.load_splits(config)
    except kmp_data.DataUnavailable as error:
        raise ValueError(str(error)) from None
    train_data, _ = module.make_datasets(splits, config)
    with policy_lib.policy_scope(config.policy):
        model = module.compile_model(config, steps=1)
    return model, train_data


def _saved_inputs(path, values):
    """A saved model and the arrays of --data."""
    if not path.endswith(".keras") or not os.path.isfile(path):
        raise ValueError(
            f"{path!r} is neither an example ({', '.join(EXAMPLES)}) nor a "
            ".keras file."
        )
    if not values.data or not os.path.isfile(values.data):
        raise ValueError(
            f"--data must name a .npz file with arrays x and y; got "
            f"{values.data!r}."
        )
    import numpy as np

    with np.load(values.data) as arrays:
        missing = {"x", "y"} - set(arrays.files)
        if missing:
            raise ValueError(
                f"{values.data} has arrays {sorted(arrays.files)}; it needs "
                "x and y (np.savez(path, x=inputs, y=targets))."
            )
        need = values.batches * values.batch_size
        data = (arrays["x"][:need], arrays["y"][:need])
    import keras

    import kmp.examples.imdb  # noqa: F401  (registers its custom layer)

    return keras.saving.load_model(path, compile=True), data


def backend_name():
    import keras

    return keras.backend.backend()


def _parser():
    parser = argparse.ArgumentParser(
        prog="kmp",
        description="Mixed-precision training for Keras 3.",
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
    bench_parser.add_argument("--steps", type=_positive_int, default=10)
    bench_parser.add_argument("--rounds", type=_positive_int, default=5)
    bench_parser.add_argument(
        "--backend",
        choices=("tensorflow", "jax"),
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
        "(arrays x, y); prints the table, writes doctor.json and doctor.png. "
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
        os.execv(sys.executable, [sys.executable, "-m", "kmp.cli", *argv])
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
