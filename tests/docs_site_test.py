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


def test_the_home_page_lists_every_guide():
    home = (ROOT / "docs" / "index.md").read_text()
    linked = set(re.findall(r"\]\(([\w-]+\.md)[)#]", home))
    pages = {p.name for p in (ROOT / "docs").glob("*.md")} - {"index.md"}
    assert pages <= linked, pages - linked


def _defect_rows():
    """The first cell of each row of the defect table (docs/defects.md)."""
    text = (ROOT / "docs" / "defects.md").read_text()
    rows = re.findall(r"(?m)^\| (.*?) \| .* \|$", text)
    assert rows[0] == "#", "the table's first column is the defect number"
    return rows[1:]


def test_the_defect_table_carries_build_notes_numbers_with_anchors():
    notes = (ROOT / "BUILD_NOTES.md").read_text()
    numbered = [int(n) for n in re.findall(r"(?m)^### (\d+)\. ", notes)]
    found = []
    for cell in _defect_rows():
        anchors = re.findall(r'<a id="defect-(\d+)"></a>', cell)
        shown = re.sub(r"<[^>]+>", "", cell)
        if shown == "–":  # what Keras lacks: no defect of BUILD_NOTES
            continue
        numbers = [int(n) for n in shown.split(", ")]
        assert [int(n) for n in anchors] == numbers, cell
        found += numbers
    assert found == numbered  # each once, in order


def test_a_defect_cited_in_a_guide_links_to_its_row(site):
    for page in (ROOT / "docs").glob("*.md"):
        if page.name == "defects.md":
            continue
        text = re.sub(r"\s+", " ", page.read_text())
        for cited in re.finditer(r"\[?defects? (\d+)", text):
            first = cited.group(1)
            assert text[cited.start()] == "[", (page.name, cited.group(0))
            link = text[cited.start() :].split("](", 1)[1]
            assert link.startswith(f"defects.md#defect-{first})"), page.name
    html = (site / "defects" / "index.html").read_text()
    assert 'id="defect-29"' in html and 'id="defect-30"' in html


def test_tables_fit_the_page(site):
    # A test's name in code would widen its column past the page (the
    # defect table ran a 1280-pixel page off its edge): the site's
    # stylesheet lets code in a table break anywhere, which also lowers
    # the width a table asks for.
    css = (site / "extra.css").read_text()
    rule = re.search(r'\[role="main"\] table code \{([^}]*)\}', css)
    assert rule and "overflow-wrap: anywhere" in rule.group(1)
    for page in ("defects", "api", "reference"):
        assert 'href="../extra.css"' in (site / page / "index.html").read_text()


def test_each_returns_table_is_one_row_and_each_raises_row_an_error(site):
    # griffe's default starts a row at each line of a Returns sentence
    # (mkdocs.yml: returns_multiple_items: false).
    html = (site / "reference" / "index.html").read_text()
    tables = re.findall(
        r'doc-section-title">(Returns|Yields|Raises):</span>.*?<tbody>'
        r"(.*?)</tbody>",
        html,
        re.S,
    )
    assert len(tables) >= 20
    for kind, body in tables:
        rows = re.findall(r"<tr.*?</tr>", body, re.S)
        if kind != "Raises":
            assert len(rows) == 1, (kind, body[:300])
            continue
        for row in rows:
            first = re.sub(r"<[^>]+>", "", row.split("</td>")[0]).strip()
            assert first.endswith("Error"), row[:300]
