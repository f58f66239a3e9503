"""The `kmp` command line.

    kmp info                 versions, devices, recommended policy and why
    kmp demo [--policy ...]  a short mixed-precision fit with loss-scale logs
    kmp audit PATH.keras     mixed-precision hazards in a saved model

The Keras backend is the usual `KERAS_BACKEND` environment variable.
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
    args = _parser().parse_args(argv)
    if args.command == "info":
        info(as_json=args.json)
    elif args.command == "demo":
        demo(args)
    elif args.command == "audit":
        audit(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
