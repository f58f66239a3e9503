"""The flags of `kmp train` and `kmp doctor`, made from the configs'
fields (`kmp_config.flags`)."""

import dataclasses

import pytest
from absl import flags as absl_flags

from kmp_config import configs
from kmp_config import flags

pytestmark = pytest.mark.backend_independent


@dataclasses.dataclass
class Config(configs.RunConfig):
    width: int = configs.flag(8, "Width.", lower_bound=8)
    rate: float = configs.flag(0.5, "A rate.")
    fast: bool = configs.flag(False, "Go fast.")


def test_flags_are_defined_from_the_fields():
    values = absl_flags.FlagValues()
    flags.define_flags(Config, values)
    values(["prog", "--width=16", "--rate=0.25", "--policy=float32", "--fast"])
    config = flags.config_from_flags(Config, values)
    assert (config.width, config.rate, config.policy) == (16, 0.25, "float32")
    assert config.fast is True
    assert config.epochs == 10 and config.data == "auto"
    assert flags.given(Config, values) == {"width", "rate", "policy", "fast"}
    with pytest.raises(absl_flags.IllegalFlagValueError):
        values(["prog", "--width=4"])
    with pytest.raises(absl_flags.IllegalFlagValueError):
        values(["prog", "--strategy=tpu"])


def test_an_example_s_flags_are_checked_as_its_config():
    config, given = flags.parse_example(
        "kmp train imdb", "imdb", ["--heads=8", "--model=bilstm"]
    )
    assert (config.heads, config.model, config.d_model) == (8, "bilstm", 128)
    assert given == {"heads", "model"}
    with pytest.raises(absl_flags.ValidationError, match="multiple of heads"):
        flags.parse_example("kmp train imdb", "imdb", ["--heads=3"])
    with pytest.raises(absl_flags.Error, match="unexpected argument 'x'"):
        flags.parse_example("kmp train imdb", "imdb", ["x"])


def test_batch_size_takes_max_and_the_memory_modes_are_checked():
    config, given = flags.parse_example(
        "kmp train lm", "lm", ["--batch_size=max", "--memory_limit=1000"]
    )
    assert config.batch_size == configs.MAX_BATCH
    assert config.memory_limit == 1000 and "batch_size" in given
    for bad in ("--batch_size=0", "--batch_size=most"):
        with pytest.raises(absl_flags.IllegalFlagValueError):
            flags.parse_example("kmp train lm", "lm", [bad])
    config, _ = flags.parse_example(
        "kmp train cifar10",
        "cifar10",
        ["--master_weights=bfloat16", "--optimizer_states=bfloat16"],
    )
    assert (config.master_weights, config.optimizer_states) == ("bfloat16",) * 2
    with pytest.raises(absl_flags.ValidationError, match="computes in bf"):
        flags.parse_example(
            "kmp train cifar10",
            "cifar10",
            ["--master_weights=bfloat16", "--policy=mixed_float16"],
        )
    with pytest.raises(absl_flags.ValidationError, match="with --float8"):
        flags.parse_example(
            "kmp train lm", "lm", ["--master_weights=bfloat16", "--float8"]
        )
    with pytest.raises(absl_flags.IllegalFlagValueError):
        flags.parse_example("kmp train lm", "lm", ["--optimizer_states=fp8"])


def test_the_lm_s_dropout_is_a_rate_below_one():
    config, given = flags.parse_example("kmp train lm", "lm", ["--dropout=0"])
    assert config.dropout == 0.0 and given == {"dropout"}
    default, _ = flags.parse_example("kmp train lm", "lm", [])
    assert default.dropout == 0.1  # KerasHub's GPT-2 default
    with pytest.raises(absl_flags.ValidationError, match=r"in \[0, 1\)"):
        flags.parse_example("kmp train lm", "lm", ["--dropout=1"])


def test_the_doctor_defaults_differ_from_training_s():
    values = flags.doctor_flags("cifar10")
    values(["kmp doctor cifar10"])
    assert (values.policy, values.batch_size, values.batches) == (
        "mixed_float16",
        128,
        2,
    )
    assert values.output_dir == "runs/doctor_cifar10"


def test_help_text_lists_every_flag_without_absl_s_own():
    text = flags.help_text("usage: x", flags.example_flags("cifar10"))
    assert text.startswith("usage: x\n\nflags (--name=value):\n")
    assert "--width" in text and "--flagfile" not in text
    assert "kmp_config" not in text  # absl's heading: the defining module


@pytest.mark.parametrize(
    "text, size",
    [
        ("1000000", 1000000),
        ("2G", 2 * 2**30),
        ("2GB", 2 * 2**30),
        ("2GiB", 2 * 2**30),
        ("512M", 512 * 2**20),
        ("512MiB", 512 * 2**20),
        ("1.5G", 3 * 2**29),
        ("64k", 64 * 1024),
    ],
)
def test_memory_limit_takes_sizes_with_units(text, size):
    assert flags.parse_bytes(text) == size
    config, _ = flags.parse_example(
        "kmp train lm", "lm", ["--batch_size=max", f"--memory_limit={text}"]
    )
    assert config.memory_limit == size


def test_a_bad_size_is_one_line_naming_the_forms_allowed():
    for bad in ("2X", "G", "-1G", "2GiBB", "1e9"):
        with pytest.raises(absl_flags.IllegalFlagValueError) as error:
            flags.parse_example("kmp train lm", "lm", [f"--memory_limit={bad}"])
        assert f"got {bad!r}" in str(error.value)
        assert "such as 2G, 512MiB" in str(error.value)
        assert "\n" not in str(error.value)
