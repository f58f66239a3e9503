"""The documentation site (`mkdocs.yml`, the pages under docs/) builds
with `mkdocs build --strict`: no warning, no broken link or anchor, and
an API reference generated from the docstrings of every public name."""

import inspect
import pathlib
import re
import subprocess
import sys
from html import escape as html_escape

import pytest

import kmp

pytestmark = pytest.mark.backend_independent

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "-f",
            str(ROOT / "mkdocs.yml"),
            "-d",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stderr[-4000:]
    return out


def test_the_site_builds_strictly_with_every_page(site):
    pages = {p.stem for p in (ROOT / "docs").glob("*.md")} - {"index"}
    assert (site / "index.html").is_file()
    for page in pages:
        assert (site / page / "index.html").is_file(), page
    # The recorded doctor run the guide shows stays where tests read it.
    assert (site / "doctor_cifar10" / "doctor.png").is_file()


def test_the_api_page_holds_every_public_name_s_docstring(site):
    html = (site / "reference" / "index.html").read_text()
    assert "LossScaleOptimizer" in html
    # `kmp.wrap`'s docstring, rendered: the first line of each of its
    # first two paragraphs, as Markdown renders it (`x` as <code>x</code>).
    for paragraph in inspect.getdoc(kmp.wrap).split("\n\n")[:2]:
        line = html_escape(paragraph.splitlines()[0], quote=False)
        line = re.sub(r"`([^`]*)`", r"<code>\1</code>", line)
        assert line in html, line
    reference = (ROOT / "docs" / "reference.md").read_text()
    listed = re.findall(r"(?m)^::: kmp\.(\w+)$", reference)
    assert sorted(listed) == sorted(kmp.__all__)
    for name in kmp.__all__:
        assert f'id="kmp.{name}"' in html, name


def test_readme_links_every_guide():
    readme = (ROOT / "README.md").read_text()
    linked = set(re.findall(r"\]\((docs/[\w-]+\.md)[)#]", readme))
    pages = {
        str(p.relative_to(ROOT))
        for p in (ROOT / "docs").glob("*.md")
        if p.name != "index.md"
    }
    assert pages <= linked, pages - linked
    for link in linked:
        assert (ROOT / link).is_file(), link
