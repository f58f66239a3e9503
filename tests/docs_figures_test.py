"""The figures in the docs' tables are in committed results files.

Every number in a table of BENCHMARKS.md, and in the `figure` column of
README's Results table, must be a value of a results file that a
command in the repository wrote: a JSON or a Markdown file under
`benchmarks/results/`, and one that its table names. A BENCHMARKS.md
table is checked against the files its section names (a path
`benchmarks/results/x.json`, a bare `x.json`, a glob `feed_*.json`, or
braces `doctor_cost_{tensorflow,jax}.json`); a README row against the
files in its `results` column (`same`: the row above's). The digests
(`README.md` files under benchmarks/results/) are notes written by hand,
not results: a figure found only there fails.

Which numbers are figures (the rule, and its only exceptions):
- every number in every cell, except the header row and the first column
  (labels: "cifar10 (width 64, batch 512)", "2 workers / 1 worker"), and
  except README's columns other than `figure` (what was measured, on
  which hardware and versions, with which command);
- digits inside a word or a version are not numbers: fp16, float32,
  H100, ResNet-9, CIFAR-10, 2.21.0.
A figure matches a value that rounds to it at the figure's decimals:
0.989 matches 0.98900, 96.3k matches 96267, 62% matches 0.6218, and in
a column or row that says `ms`, 890 matches 0.89039 (seconds). In
BENCHMARKS.md all the figures of a row must be in one file (a row is
one run); a README row may gather several (TF, JAX, torch).
One column is derived, not recorded: parity's `vs float32 (pp)`, checked
as the difference of its row's test accuracy and the float32 row's.
"""

import json
import pathlib
import re

import pytest

pytestmark = pytest.mark.backend_independent

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
BENCHMARKS = (ROOT / "BENCHMARKS.md").read_text()
README = (ROOT / "README.md").read_text()

# A number not inside a word (fp16, ResNet-9) nor a version (2.21.0),
# with its sign, a `k` for thousands, and an `x` or `%` after it.
NUMBER = re.compile(
    r"(?<![\w.^])(?<![A-Za-z_]-)"
    r"(?P<sign>[+-]?)(?P<digits>\d+(?:\.\d+)?)(?P<k>k?)(?P<unit>[x%]?)"
    r"(?!\w|\.\d)"
)
FILE_NAME = re.compile(r"[\w./{},*-]+\.(?:json|md)")
DERIVED = "vs float32 (pp)"


class Figure:
    """A number as written: its value and the rounding it shows."""

    def __init__(self, match):
        digits = match["digits"]
        self.text = match.group(0)
        self.decimals = len(digits.partition(".")[2])
        scale = 1000 if match["k"] else 1
        self.value = float(match["sign"] + digits) * scale
        self.half_step = 0.5 * 10.0**-self.decimals * scale
        self.percent = match["unit"] == "%"

    def matches(self, values, milliseconds=False):
        scales = [1.0]
        if milliseconds:
            scales.append(1000.0)
        if self.percent:
            scales.append(100.0)
        tolerance = self.half_step * (1 + 1e-9) + 1e-12
        return any(
            abs(value * scale - self.value) <= tolerance
            for value in values
            for scale in scales
        )


def figures(text):
    return [Figure(m) for m in NUMBER.finditer(text)]


def _json_values(data):
    if isinstance(data, bool) or data is None:
        return
    if isinstance(data, (int, float)):
        yield float(data)
    elif isinstance(data, str):
        try:
            yield float(data)
        except ValueError:
            pass
    elif isinstance(data, dict):
        for value in data.values():
            yield from _json_values(value)
    elif isinstance(data, list):
        for value in data:
            yield from _json_values(value)


def values(path):
    text = path.read_text()
    if path.suffix == ".json":
        return list(_json_values(json.loads(text)))
    return [f.value for f in figures(text)]


def _expand(name):
    """`a_{x,y}.json` -> `a_x.json`, `a_y.json`."""
    brace = re.search(r"\{([^{}]*)\}", name)
    if not brace:
        return [name]
    return [
        expanded
        for option in brace[1].split(",")
        for expanded in _expand(
            name[: brace.start()] + option + name[brace.end() :]
        )
    ]


def named_results(text):
    """The results files `text` names (digests excluded)."""
    found = set()
    for token in FILE_NAME.findall(text):
        for name in _expand(token):
            name = name.removeprefix("benchmarks/results/")
            paths = RESULTS.glob(name) if "/" in name else RESULTS.rglob(name)
            found.update(p for p in paths if p.name != "README.md")
    return sorted(found)


def _cells(line):
    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]


def tables(text):
    """(section heading, section text, header, rows) of every table."""
    text = re.sub(r"(?ms)^```.*?^```", "", text)  # code blocks hold none
    for section in re.split(r"(?m)^(?=## )", text):
        lines = section.splitlines()
        i = 0
        while i < len(lines) - 1:
            if lines[i].startswith("|") and re.fullmatch(
                r"\|(\s*:?-+:?\s*\|)+", lines[i + 1].strip()
            ):
                header, rows = _cells(lines[i]), []
                i += 2
                while i < len(lines) and lines[i].startswith("|"):
                    rows.append(_cells(lines[i]))
                    i += 1
                yield lines[0], section, header, rows
            else:
                i += 1


def _says_ms(text):
    return re.search(r"\bms\b", text) is not None


def _unmatched(header, row, columns, numbers):
    """(column, figure) of each figure of `row` not among `numbers`."""
    return [
        (header[j], figure.text)
        for j in columns
        for figure in figures(row[j])
        if not figure.matches(numbers, _says_ms(header[j]) or _says_ms(row[0]))
    ]


def _missing(where, header, row, columns, files, one_file):
    """Lines naming the figures of `row` (in `columns`) that are not in
    `files`; with `one_file`, not all in the same one of them."""
    groups = [[f] for f in files] if one_file else [files]
    tries = []
    for group in groups:
        numbers = [v for f in group for v in values(f)]
        tries.append((group, _unmatched(header, row, columns, numbers)))
    group, unmatched = min(tries, key=lambda t: len(t[1]))
    names = [str(f.relative_to(RESULTS)) for f in group]
    return [
        f"{where}, row {row[0]!r}, column {column!r}: {text} is not in "
        f"{names[0] if one_file else names}"
        + (" (the file holding most of the row)" if one_file else "")
        for column, text in unmatched
    ]


def _derived_missing(where, header, rows):
    """The `vs float32 (pp)` cells that are not the difference of their
    row's test accuracy and the float32 row's."""
    gap, accuracy = header.index(DERIVED), header.index("test accuracy")
    example, policy = 0, header.index("policy")
    float32 = {r[example]: r for r in rows if r[policy] == "float32"}
    missing = []
    for row in rows:
        expected = 100 * (
            float(row[accuracy]) - float(float32[row[example]][accuracy])
        )
        (figure,) = figures(row[gap])
        # Both accuracies are rounded to 4 decimals: 0.01 pp either way.
        if abs(figure.value - expected) > figure.half_step + 0.01 + 1e-9:
            missing.append(
                f"{where}, row {row[:3]}: {DERIVED} {figure.text} is not "
                f"{row[accuracy]} - {float32[row[example]][accuracy]}"
            )
    return missing


BENCHMARKS_TABLES = list(tables(BENCHMARKS))


def _table_id(table):
    heading, _, header, _ = table
    return f"{heading[3:40]}|{header[0][:20]}"


@pytest.mark.parametrize("table", BENCHMARKS_TABLES, ids=_table_id)
def test_every_benchmarks_table_figure_is_in_its_section_s_results(table):
    heading, section, header, rows = table
    files = named_results(section)
    assert files, f"{heading}: the section names no results file"
    where = f"BENCHMARKS.md, {heading}"
    columns = [j for j in range(1, len(header)) if header[j] != DERIVED]
    missing = [
        line
        for row in rows
        for line in _missing(where, header, row, columns, files, True)
    ]
    if DERIVED in header:
        missing += _derived_missing(where, header, rows)
    assert not missing, "\n".join(missing)


def _readme_results():
    (table,) = [t for t in tables(README) if t[0] == "## Results"]
    return table


def test_every_readme_results_figure_is_in_its_row_s_results():
    _, _, header, rows = _readme_results()
    figure, results = header.index("figure"), header.index("results")
    missing, files = [], []
    for row in rows:
        if row[results] != "same":
            files = named_results(row[results])
        assert files, f"README.md, Results, {row[0]!r} names no results file"
        missing += _missing(
            "README.md, Results", header, row, [figure], files, False
        )
    assert not missing, "\n".join(missing)


def test_the_parser_finds_every_table_and_figure():
    # Every separator line outside code blocks starts a table the tests
    # above check, and every table holds figures: a parser that found
    # nothing would pass them all.
    text = re.sub(r"(?ms)^```.*?^```", "", BENCHMARKS)
    separators = re.findall(r"(?m)^\|(?:\s*:?-+:?\s*\|)+\s*$", text)
    assert len(BENCHMARKS_TABLES) == len(separators) > 10
    for heading, _, _, rows in BENCHMARKS_TABLES:
        assert any(figures(cell) for row in rows for cell in row[1:]), heading
    _, _, header, rows = _readme_results()
    assert len(rows) > 10
    assert all(figures(row[header.index("figure")]) for row in rows)


@pytest.mark.parametrize("doc", ["BENCHMARKS.md", "README.md"])
def test_every_results_path_in_the_docs_exists(doc):
    text = (ROOT / doc).read_text()
    paths = [
        token
        for token in FILE_NAME.findall(text)
        if token.startswith("benchmarks/results/")
    ]
    for token in paths:
        for name in _expand(token):
            assert list(ROOT.glob(name)), f"{doc} names {name}: no such file"


@pytest.mark.parametrize(
    "text, expected",
    [
        ("0.956-1.065", ["0.956", "1.065"]),
        ("96.3k (1.86x)", ["96.3k", "1.86x"]),
        ("-0.38", ["-0.38"]),
        ("fp16+kmp, bf16, float32, H100, ResNet-9, CIFAR-10", []),
        ("Keras 3.15.1, torch 2.13.0+cpu", []),
        ("**2.20**; 62%.", ["2.20", "62%"]),
    ],
)
def test_what_counts_as_a_number(text, expected):
    assert [f.text for f in figures(text)] == expected


def test_a_figure_matches_a_value_at_its_rounding_only():
    (figure,) = figures("0.989")
    assert figure.matches([0.98900282])
    assert figure.matches([0.9894999])
    assert not figure.matches([0.9896])
    (figure,) = figures("96.3k")
    assert figure.matches([96267.2]) and not figure.matches([96.3])
    (figure,) = figures("890")
    assert figure.matches([0.8903866], milliseconds=True)
    assert not figure.matches([0.8903866])
    (figure,) = figures("62%")
    assert figure.matches([0.6218]) and figure.matches([62.18])


def test_digests_are_not_results():
    names = named_results(
        "`benchmarks/results/h100_2026-11-22/README.md`, `probe_keras.json`"
    )
    assert [p.name for p in names] == ["probe_keras.json"]


def test_defect_table_names_tests_and_reproductions_that_exist():
    # README's "Why not Keras's own mixed_float16?": each row names the
    # tests that run stock Keras, or a BUILD_NOTES defect for the rows
    # shown by a reproduction only.
    (table,) = [t for t in tables(README) if t[0].startswith("## Why not")]
    _, _, header, rows = table
    shown_by = header.index("stock Keras side shown by")
    defined = {
        name
        for path in (ROOT / "tests").rglob("*.py")
        for name in re.findall(r"(?m)^\s*def (test_\w+)", path.read_text())
    }
    notes = (ROOT / "BUILD_NOTES.md").read_text()
    for row in rows[:-1]:  # the last row: what Keras lacks
        cell = row[shown_by]
        named = re.findall(r"`(test_\w+)`", cell)
        for name in named:
            assert name in defined, f"{row[0][:50]!r}: no test {name}"
        reproductions = re.findall(r"BUILD_NOTES defect (\d+)", cell)
        for number in reproductions:
            assert re.search(rf"(?m)^### {number}\. ", notes), number
        assert named or reproductions, f"{row[0][:50]!r} names neither"
        assert ("reproduction only" in cell) == bool(reproductions), cell
