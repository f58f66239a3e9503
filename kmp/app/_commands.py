"""What the `kmp` commands do, once `kmp_cli` has parsed and checked
them: `info`, `demo`, `audit`, `train` and `bench` (`doctor` has a module
of its own). Each imports what it needs (the examples, TensorFlow's data
pipelines, plotting) when it runs.
"""

import contextlib
import json
import os

from kmp_config.errors import fail
from kmp_config.names import MIXED_POLICY

# kmp.pin_float32's mark: `kmp.islands.pin_mark.MARK` (`_pinned_file`).
_MARK = "kmp_pinned.json"


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
        if key == "tf32" and not _has_tf32_hardware(report["devices"]):
            # TensorFlow's switch is on by default; only Ampere+ has TF32.
            print(
                f"{key:<{width}}  {value} (no effect here: TF32 needs an "
                "NVIDIA Ampere or newer GPU)"
            )
        elif key == "devices":
            for i, d in enumerate(value):
                cc = d["compute_capability"]
                shown = f"{d['platform']}: {d['name']}"
                shown += f" (compute capability {cc})" if cc else ""
                print(f"{'device ' + str(i):<{width}}  {shown}")
        else:
            print(f"{key:<{width}}  {value}")
    return report


def _has_tf32_hardware(devices) -> bool:
    return any(
        d["platform"] == "gpu"
        and d["compute_capability"]
        and tuple(d["compute_capability"]) >= (8, 0)
        for d in devices
    )


def demo(args) -> dict:
    """Runs `kmp.app.demo.run` with the parsed flags and prints a summary."""
    from kmp.app import demo as demo_lib

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
    """Loads a `.keras` model or an Orbax checkpoint directory's (`kmp_cli`
    checked that the path is there) and prints `kmp.audit`'s findings;
    returns them."""
    import kmp

    # Keras rebuilds the compiled optimizer under the global policy: a
    # scaler that its compile added is only re-added under mixed_float16.
    # Audit the model as it loads under the policy its layers were saved
    # with, i.e. as it was trained, and as Keras's load rebuilds it: the
    # pins `kmp.load_model` would add again are what a file may lack.
    model, policy = load_saved("kmp audit", args.path, args.imports, pin=False)
    if not args.json:
        print(
            f"kmp audit: {args.path}, loaded under {policy}, the policy "
            "its layers were saved with"
        )
        if _pinned_file(args.path):
            print(
                "kmp audit: the file records that kmp.pin_float32 pinned "
                "its model: kmp.load_model pins it again (the islands and "
                "output casts no file keeps); the findings are of the file "
                "as Keras's load rebuilds it"
            )
    report = kmp.audit(model, verbose=not args.json)
    if args.json:
        print(report.to_json())
    return report


def _pinned_file(path) -> bool:
    """Whether a `.keras` file or a checkpoint directory that loaded holds
    kmp.pin_float32's mark (`kmp.islands.pin_mark.MARK`, at the root of
    its assets: the app reads the library's public API only, so the name
    is written here too; commands_test's pinned-file tests fail where the
    two part).
    A directory's latest step tells by its assets' metadata: no value is
    read."""
    import zipfile

    if os.path.isdir(path):
        from orbax.checkpoint import v1 as ocp

        checkpointer = ocp.training.Checkpointer(directory=path)
        with contextlib.closing(checkpointer), ocp.Context():
            step = checkpointer.latest.step
            saved = checkpointer.checkpointables_metadata(step).metadata
        return _MARK in (saved.get("assets") or {})
    with zipfile.ZipFile(path) as archive:
        return f"assets/{_MARK}" in archive.namelist()


def load_saved(command, path, imports=(), pin=None):
    """`(model, policy)`: the compiled model of a `.keras` file, loaded by
    `kmp.load_model` under the mixed policy its layers record (as
    trained: a scaler Keras's compile added comes back, and the layers
    made inside other layers compute as their parents), after importing
    the user's modules that define its classes (`imports`: module names
    or `.py` paths). What a user can fix ends `command` in one line: a
    file that is not a Keras archive, a module that does not import, a
    class no imported module registers.

    `pin` is `kmp.load_model`'s: by default a model saved pinned is
    pinned again, one saved unpinned is as saved; `pin=False` keeps the
    layers as Keras's load rebuilds them (the audit checks the file, not
    what `kmp.load_model` repairs)."""
    import kmp

    for module in imports:
        _import_user_module(command, module)
    try:
        model = kmp.load_model(path, policy="saved", pin=pin)
    except kmp.InputError as error:
        if getattr(error, "class_name", None) is None:
            fail(command, error)
        fail(
            command,
            f"{path} uses the class {error.class_name!r}, which no imported "
            "module registers. Import the code that defines it: "
            f"{command} {path} --import=MODULE (a module name or a .py "
            "file; repeat the flag for several).",
        )
    half = [
        layer.compute_dtype
        for layer in model._flatten_layers()
        if layer.compute_dtype in MIXED_POLICY
    ]
    return model, MIXED_POLICY[half[0]] if half else "float32"


def _import_user_module(command, module):
    """Imports `module`: a dotted name, or a `.py` file (run as the
    module named for its file, as `python FILE` would not: its classes
    register under their package, not `__main__`)."""
    import importlib
    import importlib.util
    import sys

    try:
        if not module.endswith(".py"):
            importlib.import_module(module)
            return
        name = os.path.splitext(os.path.basename(module))[0]
        spec = importlib.util.spec_from_file_location(name, module)
        if spec is None or not os.path.isfile(module):
            raise FileNotFoundError(f"no such file: {module}")
        loaded = importlib.util.module_from_spec(spec)
        sys.modules[name] = loaded
        spec.loader.exec_module(loaded)
    except Exception as error:  # the user's code: one line, not a trace
        fail(
            command,
            f"--import={module} failed: {type(error).__name__}: {error}",
        )


def train(args) -> dict:
    """Runs examples/<name>.py's `train` on the config of its flags
    (parsed and checked by `kmp_cli`), with CPU sizes where no GPU is
    found for the sizes not given (`kmp.app.run.train_example`); prints
    the table, the summary and where the files went."""
    import kmp
    from kmp.app import protocol
    from kmp.app import run

    example = protocol.load_example(args.example)
    try:
        return run.train_example(example, args.config, args.given)
    except kmp.InputError as error:  # data, cluster, backup, cache
        fail(f"kmp train {args.example}", error)


def bench(args) -> list:
    """Runs `kmp.app.bench` and prints / writes its tables."""
    from kmp.app import bench as bench_module
    from kmp.app import report

    results = bench_module.run(
        args.models,
        args.size,
        args.steps,
        args.rounds,
        memory=args.memory,
        float8=args.float8,
    )
    for name in args.models:
        rows = [r for r in results if r["model"] == name]
        report.show(
            rows,
            f"kmp bench {name} ({backend_name()})",
            columns=bench_module.COLUMNS,
            note="memory: " + rows[0]["peak_memory_note"],
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


def backend_name():
    import keras

    return keras.backend.backend()
