"""What an example declares (`kmp.app.protocol`): every registered
example declares it, and the commands reach examples through it alone."""

import ast
import io
import pathlib
import tokenize
import types

import pytest

from kmp.app import protocol
from kmp_config import configs

pytestmark = pytest.mark.backend_independent

APP = pathlib.Path(protocol.__file__).parent
EXAMPLES = APP.parents[1] / "examples"


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
    assert "declares no make_datasets" in found
    # Every example declares compile_model and bench_inputs
    # (`--batch_size=max` compiles its step), the classifiers more.
    assert protocol.problems("lm", module) == [
        "declares no compile_model",
        "declares no bench_inputs",
        "its Config is not configs.EXAMPLES['lm']",
    ]


def test_the_commands_name_no_example():
    # `kmp train`, `kmp bench` and `kmp doctor` hold no per-example code:
    # a new example is its module, its config and its test.
    for source in ("_commands.py", "_doctor_command.py", "bench.py"):
        text = (APP / source).read_text()
        for name in configs.EXAMPLES:
            assert f'"{name}"' not in text, (source, name)
        assert "kmp.examples" not in text, source


def _app_names(path):
    """The names of kmp.app an example uses: `module.name` through an
    imported module of kmp.app, and each name imported from one."""
    tree = ast.parse(path.read_text())
    modules, names = {}, set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                if node.module == "kmp.app":
                    modules[alias.asname or alias.name] = alias.name
                elif node.module.startswith("kmp.app."):
                    names.add(f"{node.module[8:]}.{alias.name}")
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in modules
        ):
            names.add(f"{modules[node.value.id]}.{node.attr}")
    return names


@pytest.mark.parametrize("name", sorted(configs.EXAMPLES))
def test_an_example_teaches_with_at_most_six_names_of_the_app(name):
    # An example reads like a keras-io tutorial: its own data, model and
    # fit; the app does the run around them (a `Run`, and `run.main` for
    # the script) and the backend's feed, in a handful of names.
    used = _app_names(EXAMPLES / f"{name}.py")
    assert 0 < len(used) <= 6, sorted(used)


def test_the_names_of_the_app_are_counted():
    used = _app_names(EXAMPLES / "cifar10.py")
    assert {"run.Run", "run.main", "feeding.Feeding", "data.load"} <= used


def code_lines(source) -> int:
    """Lines of code in `source`: not blank, not comments, not the
    docstrings of the module, its classes and functions."""
    docstrings = set()
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(
                node,
                (
                    ast.Module,
                    ast.ClassDef,
                    ast.FunctionDef,
                    ast.AsyncFunctionDef,
                ),
            )
            and ast.get_docstring(node, clean=False) is not None
        ):
            first = node.body[0]
            docstrings.update(range(first.lineno, first.end_lineno + 1))
    lines = set()
    skipped = {
        tokenize.COMMENT,
        tokenize.NL,
        tokenize.NEWLINE,
        tokenize.INDENT,
        tokenize.DEDENT,
        tokenize.ENDMARKER,
    }
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in skipped:
            spanned = range(token.start[0], token.end[0] + 1)
            lines.update(line for line in spanned if line not in docstrings)
    return len(lines)


def test_code_lines_count_neither_comments_nor_docstrings():
    source = '"""Doc\nstring."""\n\n# a comment\ndef f(x):\n    """Doc."""\n'
    source += "    return (x +\n            1)  # why\n"
    assert code_lines(source) == 3  # def, and the return's two lines


@pytest.mark.parametrize("name", sorted(configs.EXAMPLES))
def test_an_example_is_a_tutorial_of_kmp_s_calls_in_150_lines(name):
    # keras-io's tutorials run 35-62 lines of code; an example shows its
    # data, model and fit, and the three calls it teaches: the policy
    # before the model is built, the float32 islands, the wrapped
    # optimizer. What every run does around them is kmp.app's.
    source = (EXAMPLES / f"{name}.py").read_text()
    assert code_lines(source) <= 150
    for call in ("kmp.enable(", "kmp.pin_float32(", "kmp.wrap("):
        assert call in source, call
    train = source[source.index("def train(") :]
    assert train.index("kmp.enable(") < train.index("compile_model(")
