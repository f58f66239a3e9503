"""`kmp doctor cifar10|imdb|PATH.keras`: `kmp.diagnose` from the shell.

On an example, the doctor diagnoses exactly the model and data pipeline
that `kmp train` trains (the example's own `compile_model` and
`make_datasets`, under its flags); on a saved model, the arrays of a
`.npz` file. It writes what it printed (doctor.txt), the report as JSON
and the gradient histogram (PNG). Bad input is one line, not a traceback.
"""

import contextlib
import io
import json
import os

import kmp
from kmp.app._commands import EXAMPLES
from kmp.app._commands import fail
from kmp.app._commands import saved_policy

DOCTOR_POLICIES = ("mixed_float16", "mixed_bfloat16")


def _doctor_flags(values, target):
    """The doctor's own flags; an example's come from its Config."""
    from absl import flags

    from kmp.app import recipes

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
        "Where doctor.txt, doctor.json and doctor.png go.",
        flag_values=values,
    )
    return None


def doctor(args):
    """Runs `kmp.diagnose` on an example model or a saved one; prints the
    table and writes doctor.txt, doctor.json and doctor.png."""
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
    except flags.IllegalFlagValueError as error:
        data = [a for a in args.flags if a.startswith("--data=")]
        if module and data and data[-1].endswith(".npz"):
            fail(
                name,
                f"{data[-1]}: a .npz file is for saved models (kmp doctor "
                "PATH.keras --data=PATH.npz); an example takes --data="
                "auto, tfds or synthetic.",
            )
        fail(name, error)
    except flags.Error as error:
        fail(name, error)
    try:
        if values["policy"].value and (
            values["policy"].value not in DOCTOR_POLICIES
        ):
            raise kmp.InputError(
                f"--policy must be one of {', '.join(DOCTOR_POLICIES)} "
                f"(the mixed policy under test); got {values.policy!r}."
            )
        model, data = (
            _example_inputs(module, values)
            if module
            else _saved_inputs(args.target, values)
        )
    except (kmp.InputError, OSError) as error:
        fail(name, error)
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
    except kmp.InputError as error:  # diagnose's input checks
        fail(name, error)
    report.show()
    os.makedirs(values.output_dir, exist_ok=True)
    # The tables as printed to a pipe (160 columns): README's sample is
    # cut from such a file, and tests/readme_test.py checks it.
    with contextlib.redirect_stdout(io.StringIO()) as shown:
        report.show()
    with open(os.path.join(values.output_dir, "doctor.txt"), "w") as f:
        f.write(shown.getvalue())
    with open(os.path.join(values.output_dir, "doctor.json"), "w") as f:
        record = {"command": "kmp " + " ".join(args.argv)}
        json.dump({**record, **json.loads(report.to_json())}, f, indent=2)
    report.plot(os.path.join(values.output_dir, "doctor.png"))
    print(f"wrote {values.output_dir}/doctor.txt, doctor.json and doctor.png")
    return report


def _example_inputs(module, values):
    """The example's compiled model (under --policy) and training data."""
    import keras

    from kmp.app import recipes

    config = recipes.config_from_flags(module.Config, values).check()
    keras.utils.set_random_seed(config.seed)  # data order, augmentation
    splits = module.load_splits(config)  # DataUnavailable: an InputError
    train_data, _ = module.make_datasets(splits, config)
    with kmp.policy_scope(config.policy):
        model = module.compile_model(config, steps=1)
    return model, train_data


def _saved_inputs(path, values):
    """A saved model and the arrays of --data."""
    if not path.endswith(".keras") or not os.path.isfile(path):
        raise kmp.InputError(
            f"{path!r} is neither an example ({', '.join(EXAMPLES)}) nor a "
            ".keras file."
        )
    if not values.data or not os.path.isfile(values.data):
        raise kmp.InputError(
            f"--data must name a .npz file with arrays x and y; got "
            f"{values.data!r}."
        )
    import numpy as np

    with np.load(values.data) as arrays:
        missing = {"x", "y"} - set(arrays.files)
        if missing:
            raise kmp.InputError(
                f"{values.data} has arrays {sorted(arrays.files)}; it needs "
                "x and y (np.savez(path, x=inputs, y=targets))."
            )
        need = values.batches * values.batch_size
        data = (arrays["x"][:need], arrays["y"][:need])
    import keras

    from kmp.examples import imdb  # noqa: F401  (registers its layer)

    saved_policy(path)  # a Keras archive, or one line
    return keras.saving.load_model(path, compile=True), data
