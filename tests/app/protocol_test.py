"""What an example declares (`kmp.app.protocol`): every registered
example declares it, and the commands reach examples through it alone."""

import pathlib
import types

import pytest

from kmp.app import protocol
from kmp_config import configs

pytestmark = pytest.mark.backend_independent

APP = pathlib.Path(protocol.__file__).parent


@pytest.mark.parametrize("name", sorted(configs.EXAMPLES))
def test_every_registered_example_declares_the_protocol(name):
    module = protocol.load_example(name)
    assert protocol.problems(name, module) == []
    assert module.Config is configs.EXAMPLES[name]


def test_what_a_module_lacks_is_named():
    def train(config):
        return {}

    module = types.ModuleType("half_written")
    module.Config = configs.EXAMPLES["cifar10"]
    module.train = train
    module.load_data = lambda config, extra: None  # one argument too many
    found = protocol.problems("cifar10", module)
    assert "load_data takes 2 argument(s), not 1" in found
    assert "declares no bench_inputs" in found
    assert protocol.problems("lm", module) == [
        "its Config is not configs.EXAMPLES['lm']"
    ]


def test_the_commands_name_no_example():
    # `kmp train`, `kmp bench` and `kmp doctor` hold no per-example code:
    # a new example is its module, its config and its test.
    for source in ("_commands.py", "_doctor_command.py", "bench.py"):
        text = (APP / source).read_text()
        for name in configs.EXAMPLES:
            assert f'"{name}"' not in text, (source, name)
        assert "kmp.examples" not in text, source
