"""The flags of `kmp train` and `kmp doctor`: absl flags made from the
configs' fields (`kmp_config.configs`), parsed and checked without Keras.

    define_flags       one absl flag per config field
    config_from_flags  the config the parsed flags describe
    example_flags      an example's flags; doctor_flags: the doctor's
                       (an example's, or `SavedModelDoctor`, + `Doctor`)
    parse_example      `kmp train EXAMPLE --flags`: config, flags given
    parse_doctor       `kmp doctor TARGET --flags`: config or None, flags
    help_text          what `--help` after an example or model prints

Every refusal is an absl `flags.Error` (an unknown flag, a value out of
range or not among the choices, a config whose fields do not fit
together, a file that is not there) whose message is one line; the
command prints it and exits with status 2.
"""

import dataclasses
import os
import re

from absl import flags

from kmp_config import configs
from kmp_config import names


def define_flags(config_class, flag_values=None, exclude=()):
    """Defines one absl flag per field of `config_class` (in absl's
    global `flags.FLAGS` unless `flag_values` is given), but for the
    fields named in `exclude`."""
    where = flags.FLAGS if flag_values is None else flag_values
    for field in dataclasses.fields(config_class):
        meta, name = field.metadata, field.name
        if name in exclude:
            continue
        help_text = meta.get("help", name)
        if meta.get("choices"):
            flags.DEFINE_enum(
                name,
                field.default,
                list(meta["choices"]),
                help_text,
                flag_values=where,
            )
        elif field.type in (bool, "bool"):
            flags.DEFINE_boolean(
                name, field.default, help_text, flag_values=where
            )
        elif meta.get("unit") == "bytes":
            flags.DEFINE(
                _Bytes(), name, field.default, help_text, flag_values=where
            )
        elif meta.get("words"):
            flags.DEFINE(
                _NumberOrWords(meta["words"], meta.get("lower_bound")),
                name,
                field.default,
                help_text,
                flag_values=where,
            )
        elif field.type in (int, "int", float, "float"):
            define = (
                flags.DEFINE_integer
                if field.type in (int, "int")
                else flags.DEFINE_float
            )
            define(
                name,
                field.default,
                help_text,
                lower_bound=meta.get("lower_bound"),
                flag_values=where,
            )
        else:
            flags.DEFINE_string(
                name, field.default, help_text, flag_values=where
            )


class _NumberOrWords(flags.IntegerParser):
    """An integer flag that also takes words (`--batch_size=max`)."""

    def __init__(self, words, lower_bound):
        super().__init__(lower_bound=lower_bound)
        self.words = words

    def parse(self, argument):
        if isinstance(argument, str) and argument in self.words:
            return self.words[argument]
        if argument in self.words.values():
            return argument  # the default, already parsed
        return super().parse(argument)

    def flag_type(self):
        return f"int or {' or '.join(self.words)}"


# A size's units: powers of 1024, as `docker run --memory` reads them
# (and as the G of a GPU's "80GB" is meant), whatever the suffix.
BYTE_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
_SIZE = re.compile(r"(\d+(?:\.\d*)?|\.\d+) ?(?:([KMGT])(?:i?B)?|B)?", re.I)


def parse_bytes(text) -> int:
    """Bytes from `text`: a number, with or without a unit (K, M, G or T:
    powers of 1024, alone or followed by B or iB): `"2G"`, `"2GB"` and
    `"2GiB"` are `2 * 2**30`, `"1.5G"` rounds down to a byte, `"512"`
    is 512.

    Raises:
        ValueError: naming the text and the forms allowed.
    """
    match = _SIZE.fullmatch(str(text).strip())
    if match is None:
        raise ValueError(
            f"expected a size in bytes, got {text!r}: a number, with or "
            "without K, M, G or T (powers of 1024, alone or with B or "
            "iB), such as 2G, 512MiB, 1.5GB or 1000000."
        )
    number, unit = match.group(1), (match.group(2) or "").upper()
    return int(float(number) * BYTE_UNITS[unit])


class _Bytes(flags.ArgumentParser):
    """A size flag (`--memory_limit=2G`): `parse_bytes`."""

    def parse(self, argument):
        if isinstance(argument, int):
            return argument  # the default, already parsed
        return parse_bytes(argument)

    def flag_type(self):
        return "bytes"


def config_from_flags(config_class, flag_values):
    """The `config_class` instance that parsed `flag_values` describe
    (its defaults for the fields they define no flag for)."""
    names = [field.name for field in dataclasses.fields(config_class)]
    return config_class(
        **{
            name: flag_values[name].value
            for name in names
            if name in flag_values
        }
    )


def given(config_class, flag_values) -> set:
    """The names of the config's flags set on the command line."""
    return {
        field.name
        for field in dataclasses.fields(config_class)
        if field.name in flag_values and flag_values[field.name].present
    }


def _parse(values, command, argv):
    """Parses `argv` into `values`; an argument that is no flag is an
    error (absl would hand it back, and the command would drop it)."""
    rest = values([command, *argv])[1:]
    if rest:
        raise flags.Error(
            f"unexpected argument {rest[0]!r}: flags take the form "
            "--name=value (`--help` lists them)."
        )


def _checked(config):
    problem = config.problem()
    if problem:
        raise flags.ValidationError(problem)
    return config


def example_flags(example):
    """The flags of `kmp train EXAMPLE`: its config's fields."""
    values = flags.FlagValues()
    define_flags(configs.EXAMPLES[example], values)
    return values


def parse_example(command, example, argv):
    """`(config, given)` for `kmp train EXAMPLE ARGV`: the example's
    config from its flags, checked, and the names of the flags given
    (the sizes a CPU run may pick are the others')."""
    config_class = configs.EXAMPLES[example]
    values = example_flags(example)
    _parse(values, command, argv)
    config = _checked(config_from_flags(config_class, values))
    return config, given(config_class, values)


# The doctor's help where an example's field says what it does in training.
VERBOSE_HELP = "Progress lines as each stage starts and ends (0: none)."
OUTPUT_HELP = "Where doctor.txt, doctor.json and doctor.png go."
POLICY_HELP = "The mixed policy to test: mixed_float16 or mixed_bfloat16."


@dataclasses.dataclass
class SavedModelDoctor:
    """The flags of `kmp doctor PATH.keras` or `kmp doctor DIRECTORY` (an
    OrbaxCheckpoint's; an example's are its config's)."""

    data: str = configs.flag("", "A .npz file with arrays x and y.")
    policy: str = configs.flag(
        "", "Mixed policy to test (default: the model's own)."
    )
    batch_size: int = configs.flag(128, "Batch size.", lower_bound=1)
    loss: str = configs.flag(
        "", "A Keras loss name (default: the saved model's compiled loss)."
    )
    output_dir: str = configs.flag("runs/doctor", OUTPUT_HELP)
    verbose: int = configs.flag(1, VERBOSE_HELP, lower_bound=0)


@dataclasses.dataclass
class Doctor:
    """The doctor's own flags, whatever it diagnoses."""

    batches: int = configs.flag(2, "Batches to run.", lower_bound=1)
    loss_scale: float = configs.flag(
        0.0,
        "Loss scale to test (0: the model's optimizer's current one).",
        lower_bound=0.0,
    )


# An example's flags that change nothing the doctor measures, and why:
# it runs --batches batches through the model twice, in one process on
# one device, and takes no training step. Refused, not dropped.
_TRAINS_NOTHING = "the doctor takes no training step"
_ONE_DEVICE = "the doctor runs in one process on one device"
NOT_FOR_THE_DOCTOR = {
    "epochs": _TRAINS_NOTHING,
    "steps": _TRAINS_NOTHING,
    "eval_steps": _TRAINS_NOTHING,
    "learning_rate": _TRAINS_NOTHING,
    "optimizer_states": _TRAINS_NOTHING + " (no optimizer update)",
    "memory_limit": "it bounds --batch_size=max, which the doctor does "
    "not take",
    "restart": "the doctor keeps no backup to resume from",
    "strategy": _ONE_DEVICE,
    "distribution": _ONE_DEVICE,
    "coordinator": _ONE_DEVICE,
    "num_processes": _ONE_DEVICE,
    "process_id": _ONE_DEVICE,
    "process_timeout": _ONE_DEVICE,
}


def doctor_flags(target):
    """The doctor's flags for `target`: an example's flags with the
    doctor's defaults (less `NOT_FOR_THE_DOCTOR`), or those for a saved
    model; then its own."""
    values = flags.FlagValues()
    if target in configs.CLASSIFIERS:
        define_flags(configs.EXAMPLES[target], values, NOT_FOR_THE_DOCTOR)
        # Two batches need little data; the CIFAR cost figure is at 128.
        values.set_default("policy", "mixed_float16")
        values.set_default("batch_size", 128)
        values.set_default("synthetic_size", 2048)
        values.set_default("output_dir", f"runs/doctor_{target}")
        values["verbose"].help = VERBOSE_HELP
        values["output_dir"].help = OUTPUT_HELP
        values["policy"].help = POLICY_HELP
    else:
        define_flags(SavedModelDoctor, values)
        # Not a config field: `import` is a Python keyword.
        flags.DEFINE_multi_string(
            "import",
            [],
            "A module or .py file that defines the model's own classes, "
            "imported before the load (repeatable).",
            flag_values=values,
        )
    define_flags(Doctor, values)
    return values


def parse_doctor(command, target, argv):
    """`(config, values)` for `kmp doctor TARGET ARGV`: the example's
    config (`None` for a saved model) and every parsed flag, checked as
    far as that takes no Keras."""
    example = target in configs.CLASSIFIERS
    # A directory: an OrbaxCheckpoint's, which kmp.load_model checks.
    saved = target.endswith(".keras") or os.path.isdir(target)
    if not example and not saved:
        raise flags.Error(
            f"{target!r} is neither an example "
            f"({', '.join(configs.CLASSIFIERS)}) nor a .keras file or an "
            "OrbaxCheckpoint directory."
        )
    values = doctor_flags(target)
    try:
        _parse(values, command, argv)
    except flags.UnrecognizedFlagError as error:
        name = error.flagname
        if name.startswith("no") and name[2:] in NOT_FOR_THE_DOCTOR:
            name = name[2:]  # --norestart
        if example and name in NOT_FOR_THE_DOCTOR:
            raise flags.Error(
                f"--{name} does not apply to kmp doctor: "
                f"{NOT_FOR_THE_DOCTOR[name]}; remove it."
            ) from None
        raise
    except flags.IllegalFlagValueError:
        data = [a for a in argv if a.startswith("--data=")]
        if example and data and data[-1].endswith(".npz"):
            raise flags.Error(
                f"{data[-1]}: a .npz file is for saved models (kmp doctor "
                "PATH.keras --data=PATH.npz); an example takes --data="
                "auto, tfds or synthetic."
            ) from None
        raise
    if values.policy and values.policy not in names.MIXED_POLICIES:
        raise flags.ValidationError(
            f"--policy must be one of {', '.join(names.MIXED_POLICIES)} "
            f"(the mixed policy under test); got {values.policy!r}."
        )
    if example:
        if values.batch_size == configs.MAX_BATCH:
            raise flags.ValidationError(
                "--batch_size=max sizes a training step; the doctor runs "
                "batches of the size given: give a number (--batch_size=128)."
            )
        config_class = configs.EXAMPLES[target]
        return _checked(config_from_flags(config_class, values)), values
    if not os.path.isfile(target) and not os.path.isdir(target):
        raise flags.Error(f"{target} does not exist (no such file).")
    if not values.data or not os.path.isfile(values.data):
        raise flags.Error(
            f"--data must name a .npz file with arrays x and y; got "
            f"{values.data!r}."
        )
    return None, values


def help_text(usage, values) -> str:
    """`usage`, then every flag of `values` with its help and default."""
    listed = values.get_help(include_special_flags=False)
    # absl heads the list with the defining module's name (the one line
    # not indented): not the user's business.
    lines = [line for line in listed.splitlines() if line.startswith(" ")]
    return usage + "\n\nflags (--name=value):\n" + "\n".join(lines)
