"""`kmp doctor cifar10|imdb|PATH.keras`: `kmp.diagnose` from the shell.

On an example, the doctor diagnoses exactly the model and data pipeline
that `kmp train` trains (the example's own `compile_model` and
`make_datasets`, under its flags, at the same CPU sizes where no GPU is
found, said in one line); on a saved model, the arrays of a `.npz`
file. A line says each stage as it starts (`--verbose=0`: none). It
writes what it printed (doctor.txt), the report as JSON (with the
command, and an example's config as diagnosed) and the gradient
histogram (PNG). Bad input is one line, not a traceback.
"""

import contextlib
import dataclasses
import io
import json
import os

import kmp
from kmp.app._commands import load_saved
from kmp_config.errors import fail


def doctor(args):
    """Runs `kmp.diagnose` on an example model or a saved one (flags
    parsed and checked by `kmp_config.flags.parse_doctor`); prints the
    table and writes doctor.txt, doctor.json and doctor.png."""
    name = f"kmp doctor {args.target}"
    values, config = args.flag_values, args.config
    example, verbose = config is not None, bool(values.verbose)
    if verbose:
        print(f"{name}: building the model, reading the data", flush=True)
    try:
        if example:
            config, model, data = _example_inputs(
                args.target, config, args.given
            )
        else:
            model, data = _saved_inputs(args.target, values)
    except (kmp.InputError, OSError) as error:
        fail(name, error)
    try:
        report = kmp.diagnose(
            model,
            data,
            loss=None if example else (values.loss or None),
            batches=values.batches,
            batch_size=config.batch_size if example else values.batch_size,
            loss_scale=values.loss_scale or None,
            policy=None if example else (values.policy or None),
            verbose=verbose,
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
        if example:  # with the CPU sizes it took
            record["config"] = dataclasses.asdict(config)
        json.dump({**record, **json.loads(report.to_json())}, f, indent=2)
    report.plot(os.path.join(values.output_dir, "doctor.png"))
    print(f"wrote {values.output_dir}/doctor.txt, doctor.json and doctor.png")
    return report


def _example_inputs(example, config, given):
    """`(config, model, data)`: the config as `kmp train` sizes it, the
    example's compiled model (under --policy and --master_weights) and
    its training data."""
    import keras

    from kmp.app import protocol
    from kmp.app import startup

    module = protocol.load_example(example)
    config.check()
    # As `kmp train` does, before the devices are listed (TensorFlow
    # reads its cache's setting when it starts): the cache, then the CPU
    # sizes for the sizes not given. Width 64, the GPU's ResNet-9, took
    # 25 to 75 minutes on a 2-core CPU (issue 40); width 16, 198 to
    # 303 s there (117 to 135 s of CPU time), with other jobs on it.
    startup.use_compile_cache(config)
    config, note = startup.device_sized(config, given)
    if note:
        print(note, flush=True)
    keras.utils.set_random_seed(config.seed)  # data order, augmentation
    splits = module.load_data(config)  # DataUnavailable: an InputError
    train_data, _ = module.make_datasets(splits, config)
    with kmp.policy_scope(config.policy, config.master_weights):
        model = module.compile_model(config, steps=1)
    return config, model, train_data


def _saved_inputs(path, values):
    """A saved model (after the modules of --import) and the arrays of
    --data (both files are there: `kmp_cli` checked)."""
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
    # Loaded as trained: a layer made inside another one (keras-io's
    # TransformerBlock's attention) records no policy of its own and
    # would be float32 beside its float16 parent. `diagnose` then
    # switches the half-precision layers to --policy.
    model, _ = load_saved(
        f"kmp doctor {path}", path, values["import"].value or ()
    )
    return model, data
