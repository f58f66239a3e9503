"""The folders are the architecture: these tests read every module's
imports (top-level and inside functions) and hold them to the layering
that BUILD_NOTES.md draws.

    kmp/*.py, kmp/backend/, kmp/memory/, kmp/scaling/, kmp/islands/,
    kmp/fp8/, kmp/auditing/, kmp/saving/, kmp/callbacks/
                          the core: imports no wing, no application;
                          its parts import each other without a cycle
    kmp/doctor/, kmp/distributed/
                          the wings: the core and themselves
    kmp/app/, examples/   the application: the public API, `backend`
                          and `console`
    kmp_config/           the leaf: names, errors, configs, flags; imports
                          no kmp, no launcher, no Keras, no framework
    kmp_cli/              the launcher: the leaf at load, the app (and
                          the API it registers) when it runs; nothing
                          else imports it

Each package's docstring says, on a line "Imports from kmp: ...", which
parts of kmp its modules import; the tests hold it to that. A module or
name with a leading underscore is imported only inside its own package.
"""

import ast
import pathlib
import re

import pytest

pytestmark = pytest.mark.backend_independent

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "kmp"
CORE_PACKAGES = (
    "backend",
    "memory",
    "scaling",
    "islands",
    "fp8",
    "auditing",
    "saving",
    "callbacks",
)
WINGS = ("doctor", "distributed")
LIBRARY_PACKAGES = CORE_PACKAGES + WINGS
APPLICATION = ("kmp.app", "kmp.examples")
COMMAND = ROOT / "kmp_cli"
LEAF = ROOT / "kmp_config"
FRAMEWORKS = ("keras", "tensorflow", "jax", "torch")


def _modules(folder):
    return sorted(p for p in folder.glob("*.py"))


def _source_folders():
    return [PACKAGE] + [PACKAGE / name for name in (*LIBRARY_PACKAGES, "app")]


def _is_module(name):
    parts = name.split(".")
    path = ROOT.joinpath(*parts)
    if parts[:2] == ["kmp", "examples"]:
        path = ROOT.joinpath("examples", *parts[2:])
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def _import_pairs(path):
    """`(module, name)` for every kmp import in `path`: `name` is the
    imported name for `from module import name` (None for a module)."""
    pairs = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            pairs += [(alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                # `from kmp.doctor import _view` imports kmp.doctor._view.
                submodule = f"{node.module}.{alias.name}"
                if _is_module(submodule):
                    pairs.append((submodule, None))
                else:
                    pairs.append((node.module, alias.name))
    return [
        (module, name)
        for module, name in pairs
        if module == "kmp" or module.startswith("kmp.")
    ]


def _imports(path):
    """Every kmp module `path` imports, as dotted names (`kmp` itself for
    the public API)."""
    return {module for module, _ in _import_pairs(path)}


def _every_import(path):
    """Every module `path` imports, top-level or inside a function, as
    the dotted name written (`from a.b import c` -> `a.b`)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def _top(name):
    return name.split(".")[0]


def _part(name):
    """The part of kmp a module belongs to: `kmp.fp8.convert` -> `fp8`,
    `kmp.policy` -> `policy`, `kmp` -> `kmp` (the public API)."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else "kmp"


def _part_of_path(path):
    relative = path.relative_to(PACKAGE)
    return relative.parts[0] if len(relative.parts) > 1 else relative.stem


def _declared_imports(folder):
    """The parts named on the docstring's "Imports from kmp:" line."""
    text = ast.get_docstring(ast.parse((folder / "__init__.py").read_text()))
    found = re.search(r"^Imports from kmp: (.*?)\.(\s|$)", text, re.M | re.S)
    assert found, f"kmp/{folder.name}/__init__.py has no 'Imports from kmp:'"
    named = re.sub(r"\([^)]*\)", "", found.group(1))  # drop the reasons
    return {n.strip() for n in named.replace("\n", " ").split(",")}


def _library_modules():
    """Every module of the library (core and wings), not the app."""
    paths = [p for p in _modules(PACKAGE) if p.name != "__init__.py"]
    for name in LIBRARY_PACKAGES:
        paths += _modules(PACKAGE / name)
    return paths


@pytest.mark.parametrize("path", _library_modules(), ids=str)
def test_the_library_never_imports_the_application_or_the_api(path):
    for name in _imports(path):
        assert _part(name) not in ("kmp", "app", "examples"), (
            f"{path.relative_to(ROOT)} imports {name}"
        )


@pytest.mark.parametrize("path", _library_modules(), ids=str)
def test_the_core_imports_no_wing(path):
    if _part_of_path(path) in WINGS:
        return
    for name in _imports(path):
        assert _part(name) not in WINGS, f"{path.relative_to(ROOT)} -> {name}"


@pytest.mark.parametrize("package", LIBRARY_PACKAGES)
def test_each_package_imports_what_its_docstring_says(package):
    folder = PACKAGE / package
    imported = {
        _part(name)
        for path in _modules(folder)
        for name in _imports(path)
        if _part(name) != package
    }
    assert imported == _declared_imports(folder)


def test_the_parts_of_the_library_import_each_other_without_a_cycle():
    graph = {}
    for path in _library_modules():
        part = _part_of_path(path)
        graph.setdefault(part, set()).update(
            _part(name) for name in _imports(path) if _part(name) != part
        )
    done, on_path = set(), []

    def visit(part):
        if part in on_path:
            cycle = on_path[on_path.index(part) :] + [part]
            pytest.fail("import cycle: " + " -> ".join(cycle))
        if part in done:
            return
        on_path.append(part)
        for other in sorted(graph.get(part, ())):
            visit(other)
        on_path.pop()
        done.add(part)

    for part in sorted(graph):
        visit(part)


def _private_owner(module, name):
    """The package whose privacy an import crosses, or None: for
    `kmp.backend._torch_step` it is `kmp.backend`; for `from
    kmp.doctor.numerics import _x`, `kmp.doctor`."""
    if name is not None and name.startswith("_") and name != "__version__":
        return module.rsplit(".", 1)[0] if _is_module(module) else module
    parts = module.split(".")
    for i, part in enumerate(parts):
        if part.startswith("_"):
            return ".".join(parts[:i])
    return None


def _package_of(path):
    relative = path.relative_to(ROOT).with_suffix("")
    if relative.parts[0] == "examples":
        return "kmp.examples"
    return ".".join(relative.parts[:-1])


@pytest.mark.parametrize(
    "path",
    [p for folder in _source_folders() for p in _modules(folder)]
    + _modules(ROOT / "examples")
    + _modules(COMMAND),
    ids=str,
)
def test_an_underscore_means_not_imported_outside_its_package(path):
    package = _package_of(path)
    for module, name in _import_pairs(path):
        owner = _private_owner(module, name)
        assert (
            owner is None
            or package == owner
            or (package.startswith(owner + "."))
        ), f"{path.relative_to(ROOT)} imports {module} {name or ''}"


def test_the_top_of_kmp_holds_at_most_twelve_modules():
    top = [p.name for p in _modules(PACKAGE)]
    assert len(top) <= 12, top


def _doctor_stages():
    """The module order the doctor's docstring gives."""
    text = ast.get_docstring(
        ast.parse((PACKAGE / "doctor" / "__init__.py").read_text())
    )
    return re.findall(r"^    (\w+)\s", text, re.MULTILINE)


def test_the_doctor_s_stages_import_only_earlier_stages():
    stages = _doctor_stages()
    on_disk = {p.stem for p in _modules(PACKAGE / "doctor")} - {"__init__"}
    assert set(stages) == on_disk
    for position, stage in enumerate(stages):
        path = PACKAGE / "doctor" / f"{stage}.py"
        for name in _imports(path):
            if name.startswith("kmp.doctor."):
                imported = name.split(".")[2]
                assert imported in stages[:position], (
                    f"kmp/doctor/{stage}.py imports {imported}, which the "
                    "docstring lists after it"
                )


def test_only_diagnose_imports_the_numbered_stages():
    stages = ("_inputs", "_passes", "_counts", "_verdicts")
    for path in _modules(PACKAGE / "doctor"):
        if path.stem == "diagnose":
            continue
        for name in _imports(path):
            assert not name.endswith(stages), f"{path.name} imports {name}"


def test_the_application_uses_the_library_through_its_public_api():
    # It may import kmp, its own modules, the examples, `backend`
    # (versions, devices, memory for reports) and `console`; nothing else
    # of the library.
    allowed = ("kmp", "kmp.backend", "kmp.console") + APPLICATION
    for path in _modules(PACKAGE / "app") + _modules(ROOT / "examples"):
        for name in _imports(path):
            assert name in allowed or name.startswith(
                tuple(f"{a}." for a in APPLICATION)
            ), f"{path.relative_to(ROOT)} imports {name}"


@pytest.mark.parametrize("path", _modules(COMMAND), ids=lambda p: p.name)
def test_the_command_s_start_imports_no_keras_and_no_kmp_at_load(path):
    # `kmp --help` and a refused flag answer before Keras loads
    # (tests/app/cli_test.py times nothing, it checks sys.modules): so
    # the module-level imports of kmp_cli name neither.
    for node in ast.parse(path.read_text()).body:
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        for name in names:
            top = name.split(".")[0]
            assert top not in ("kmp", "keras", "tensorflow", "jax", "torch"), (
                f"kmp_cli/{path.name} imports {name} when loaded"
            )


@pytest.mark.parametrize("path", _modules(LEAF), ids=lambda p: p.name)
def test_the_leaf_imports_no_kmp_no_launcher_and_no_framework(path):
    # What the launcher, the app, the examples and the library all
    # import: it must import none of them (no circle, no import back
    # up) and load without Keras.
    for name in _every_import(path):
        assert _top(name) not in ("kmp", "kmp_cli", *FRAMEWORKS), (
            f"kmp_config/{path.name} imports {name}"
        )


def _everything_but_the_launcher():
    return (
        [p for folder in _source_folders() for p in _modules(folder)]
        + _modules(ROOT / "examples")
        + _modules(LEAF)
    )


@pytest.mark.parametrize(
    "path",
    _everything_but_the_launcher(),
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_only_the_launcher_imports_the_launcher(path):
    # The launcher starts the app; the app, the examples, the library and
    # the leaf never reach back up to it.
    for name in _every_import(path):
        assert _top(name) != "kmp_cli", (
            f"{path.relative_to(ROOT)} imports {name}"
        )


@pytest.mark.parametrize("path", _modules(COMMAND), ids=lambda p: p.name)
def test_the_launcher_imports_the_leaf_and_the_app_s_entry_only(path):
    # Of kmp, the API (which registers kmp's Keras classes before a
    # load) and `kmp.app.cli`, the commands' dispatch.
    for name in _every_import(path):
        if _top(name) == "kmp":
            assert name in ("kmp", "kmp.app", "kmp.app.cli"), (
                f"kmp_cli/{path.name} imports {name}"
            )


def test_every_package_says_what_it_is():
    for folder in _source_folders() + [COMMAND, LEAF]:
        docstring = ast.get_docstring(
            ast.parse((folder / "__init__.py").read_text())
        )
        assert docstring and len(docstring.splitlines()) > 5, folder


def _test_file(path):
    stem = path.stem.lstrip("_")
    if path.parent == PACKAGE:
        return ROOT / "tests" / f"{stem}_test.py"
    if path.parent == ROOT / "examples":
        return ROOT / "tests" / "examples" / f"{stem}_test.py"
    if path.parent == COMMAND:  # the command's start, tested with the app
        return ROOT / "tests" / "app" / f"{stem}_test.py"
    if path.parent == LEAF:
        return ROOT / "tests" / "kmp_config" / f"{stem}_test.py"
    return ROOT / "tests" / path.parent.name / f"{stem}_test.py"


# Modules whose whole content another test file covers, and why.
NO_OWN_TEST = {
    "kmp/_version.py": "a constant; api_test.py checks kmp.__version__",
    "kmp_cli/__main__.py": "`python -m kmp_cli`; tests/app/cli_test.py runs it",
    "kmp/errors.py": "re-exports kmp_config/errors.py, whose test is "
    "tests/kmp_config/errors_test.py",
}


def test_every_module_has_a_test_file_named_after_it():
    sources = (
        [p for folder in _source_folders() for p in _modules(folder)]
        + _modules(ROOT / "examples")
        + _modules(COMMAND)
        + _modules(LEAF)
    )
    missing = [
        str(_test_file(p).relative_to(ROOT))
        for p in sources
        if p.name != "__init__.py"
        and str(p.relative_to(ROOT)) not in NO_OWN_TEST
        and not _test_file(p).exists()
    ]
    assert not missing


def test_test_files_have_distinct_names():
    # pytest imports test files by their base name (no __init__.py in
    # tests/), so two of the same name in different folders collide.
    names = [p.name for p in (ROOT / "tests").rglob("*.py")]
    assert sorted({n for n in names if names.count(n) > 1}) == []


def test_modules_stay_readable_in_size():
    # One concept per module: roughly 100-350 lines (STYLE.md); above 450
    # a module has grown a second concept.
    for folder in _source_folders():
        for path in _modules(folder):
            lines = len(path.read_text().splitlines())
            assert lines <= 450, f"{path.relative_to(ROOT)}: {lines} lines"
