"""The examples' settings (`kmp_config.configs`): checks, CPU sizes, and
what an interrupted run must keep to resume."""

import dataclasses

import pytest

import kmp
from kmp_config import configs

pytestmark = pytest.mark.backend_independent


@dataclasses.dataclass
class Config(configs.RunConfig):
    width: int = configs.flag(8, "Width.", lower_bound=8)
    CPU_SIZES = {"width": 16, "batch_size": 32}


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"width": 4}, "width must be >= 8, got 4"),
        ({"policy": "fp16"}, "policy must be one of auto, float32"),
        ({"learning_rate": -1.0}, "learning_rate must be > 0"),
        ({"verbose": -1}, "verbose must be >= 0"),
    ],
)
def test_a_bad_field_is_named_and_check_raises_kmp_s_error(changes, message):
    config = Config(**changes)
    assert message in config.problem()
    with pytest.raises(kmp.InputError, match=message):
        config.check()
    assert Config().problem() is None
    assert Config().check() == Config()


def test_imdb_heads_must_divide_d_model():
    config = configs.ImdbConfig(d_model=10, heads=3)
    assert config.problem().startswith(
        "d_model (10) must be a multiple of heads (3)"
    )
    with pytest.raises(kmp.InputError, match="Change --d_model or --heads"):
        config.check()
    assert configs.ImdbConfig(d_model=12, heads=3).problem() is None


def test_cpu_sizes_fill_in_what_was_not_given():
    sized, changes = Config().cpu_sized({"batch_size"})
    assert changes == {"width": 16}
    assert (sized.width, sized.batch_size) == (16, 64)
    # Given flags win, whatever their value.
    unchanged, none = Config(width=64).cpu_sized({"width", "batch_size"})
    assert none == {} and unchanged.width == 64
    # A CPU d_model that the given heads do not divide: no change at all.
    imdb = configs.ImdbConfig(heads=128, d_model=128)
    assert imdb.cpu_sized({"heads"}) == (imdb, {})


def test_gpu_sized_defaults_have_cpu_sizes():
    cifar10, changes = configs.Cifar10Config().cpu_sized()
    assert changes == {"batch_size": 128, "width": 16}
    imdb, changes = configs.ImdbConfig().cpu_sized()
    assert changes == {"batch_size": 32, "d_model": 64, "sequence_length": 128}
    assert imdb.problem() is None


def test_a_resumed_run_may_change_how_long_it_runs_not_what_it_trains():
    key = Config().resume_key()
    assert {"width", "batch_size", "policy", "seed", "data", "steps"} <= set(
        key
    )
    for name in ("epochs", "verbose", "output_dir", "restart", "eval_steps"):
        assert name not in key
    assert Config(epochs=3).resume_key() == Config(epochs=9).resume_key()
    assert Config(width=16).resume_key() != key
