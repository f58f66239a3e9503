"""The folders are the architecture: these tests read every module's
imports (top-level and inside functions) and hold them to the layering
that BUILD_NOTES.md draws.

    kmp/*.py          the core: imports no wing, no application
    kmp/doctor/       a wing: the core and itself; its stages in order
    kmp/distributed/  a wing: the core and itself
    kmp/app/, examples/  the application: anything above
"""

import ast
import pathlib
import re

import pytest

pytestmark = pytest.mark.backend_independent

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "kmp"
WINGS = ("doctor", "distributed")
APPLICATION = ("kmp.app", "kmp.examples")


def _modules(folder):
    return sorted(p for p in folder.glob("*.py"))


def _is_module(name):
    parts = name.split(".")
    path = ROOT.joinpath(*parts)
    if parts[:2] == ["kmp", "examples"]:
        path = ROOT.joinpath("examples", *parts[2:])
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def _imports(path):
    """Every kmp module `path` imports, as dotted names (`kmp` itself for
    the public API)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                # `from kmp.doctor import _view` imports kmp.doctor._view;
                # `from kmp.policy import enable` imports kmp.policy.
                submodule = f"{node.module}.{alias.name}"
                names.add(submodule if _is_module(submodule) else node.module)
    return {n for n in names if n == "kmp" or n.startswith("kmp.")}


def _is_core(name):
    parts = name.split(".")
    return len(parts) == 2 and (PACKAGE / f"{parts[1]}.py").exists()


CORE = [p for p in _modules(PACKAGE) if p.name != "__init__.py"]


@pytest.mark.parametrize("path", CORE, ids=lambda p: p.name)
def test_the_core_imports_no_wing_no_application_and_not_the_api(path):
    for name in _imports(path):
        assert _is_core(name), f"{path.name} imports {name}"


@pytest.mark.parametrize("wing", WINGS)
def test_a_wing_imports_the_core_and_itself_only(wing):
    for path in _modules(PACKAGE / wing):
        for name in _imports(path):
            assert _is_core(name) or name.startswith(f"kmp.{wing}."), (
                f"kmp/{wing}/{path.name} imports {name}"
            )


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
    # It may import kmp, its own modules, the examples, and `backend`
    # (versions, devices, memory for reports); no private core module and
    # no wing module.
    allowed = ("kmp", "kmp.backend", "kmp._console") + APPLICATION
    for path in _modules(PACKAGE / "app") + _modules(ROOT / "examples"):
        for name in _imports(path):
            assert name in allowed or name.startswith(
                tuple(f"{a}." for a in APPLICATION)
            ), f"{path.relative_to(ROOT)} imports {name}"


def test_every_package_says_what_it_is():
    for folder in [PACKAGE] + [PACKAGE / w for w in (*WINGS, "app")]:
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
    return ROOT / "tests" / path.parent.name / f"{stem}_test.py"


# Modules whose whole content another test file covers, and why.
NO_OWN_TEST = {
    "_version.py": "a constant; api_test.py checks kmp.__version__",
}


def test_every_module_has_a_test_file_named_after_it():
    sources = [
        p
        for folder in [PACKAGE] + [PACKAGE / w for w in (*WINGS, "app")]
        for p in _modules(folder)
    ] + _modules(ROOT / "examples")
    missing = [
        str(_test_file(p).relative_to(ROOT))
        for p in sources
        if p.name != "__init__.py"
        and p.name not in NO_OWN_TEST
        and not _test_file(p).exists()
    ]
    assert not missing


def test_modules_stay_readable_in_size():
    # One concept per module: roughly 100-350 lines (STYLE.md); above 450
    # a module has grown a second concept.
    for folder in [PACKAGE] + [PACKAGE / w for w in (*WINGS, "app")]:
        for path in _modules(folder):
            lines = len(path.read_text().splitlines())
            assert lines <= 450, f"{path.relative_to(ROOT)}: {lines} lines"
