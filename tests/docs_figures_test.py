"""The figures in the docs' tables are the values of their own keys in
committed results files.

Every number in a table of BENCHMARKS.md, in a table of a guide under
docs/ whose section names a results file, in the `figure` column of
README's Results table, and in the guides' sentences that `PROSE_KEYS`
lists, must be the value at its own key of a results file that a
command in the repository wrote (JSON under `benchmarks/results/`, or
the text it printed: a `.txt` file there), one that its section (or
README row, or page) names:
`tests/figure_keys.py` holds, per table, each row's file and each
cell's keys, and a figure is checked against that key's value alone. So
a figure moved by 10 %, or two cells swapped, fails (a test below tries
both on every table, and the first on every keyed sentence). A table's
files are those its section names (a path `benchmarks/results/x.json`,
a bare `x.json`, a glob `feed_*.json`, or braces
`doctor_cost_{tensorflow,jax}.json`); a README row's those in its
`results` column (`same`: the row above's); a sentence's those its page
names.
The digests (`README.md` files under benchmarks/results/) are notes
written by hand, not results.

Which numbers are figures (the rule, and its only exceptions):
- every number in every cell, except the header row and the row's label
  cells (the first, or the first n where the keys say so), and except
  README's columns other than `figure`;
- digits inside a word or a version are not numbers: fp16, float32,
  H100, ResNet-9, CIFAR-10, 2.21.0; scientific notation is (1.53e-05).
A figure matches a value that rounds to it at the figure's decimals:
0.989 matches 0.98900, 96.3k matches 96267, 62% matches 0.6218,
1.53e-05 matches 1.5259e-05, and in a column or row that says `ms`, 890
matches 0.89039 (seconds). One column is derived, not recorded:
parity's `vs float32 (pp)`, checked as the difference of its row's test
accuracy and the float32 row's.
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
# The guides (the MkDocs site's pages), by their path: "docs/float8.md".
PAGES = {
    str(path.relative_to(ROOT)): path.read_text()
    for path in sorted((ROOT / "docs").glob("*.md"))
}

# A number not inside a word (fp16, ResNet-9) nor a version (2.21.0),
# with its sign, a `k` for thousands, and an `x` or `%` after it.
NUMBER = re.compile(
    r"(?<![\w.^])(?<![A-Za-z_]-)"
    r"(?P<sign>[+-]?)(?P<digits>\d+(?:\.\d+)?)(?P<exp>[eE][+-]?\d+)?"
    r"(?P<k>k?)(?P<unit>[x%]?)"
    r"(?!\w|\.\d)"
)
FILE_NAME = re.compile(r"[\w./{},*-]+\.(?:json|md|txt)")
DERIVED = "vs float32 (pp)"


class Figure:
    """A number as written: its value and the rounding it shows."""

    def __init__(self, match):
        digits = match["digits"]
        self.text = match.group(0)
        self.decimals = len(digits.partition(".")[2])
        scale = 1000 if match["k"] else 1
        if match["exp"]:  # 1.53e-05: the mantissa's rounding, scaled
            scale *= 10.0 ** int(match["exp"][1:])
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
        if token.startswith("/"):  # /tmp/dump/*.txt: not a results file
            continue
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


def _numbered(found):
    """`(heading, k, table)`: each table with its heading and its place
    (from 0) among the tables under that heading."""
    seen = {}
    for table in found:
        heading = table[0].removeprefix("## ").removeprefix("# ")
        seen[heading] = seen.get(heading, -1) + 1
        yield heading, seen[heading], table


def keyed_tables():
    """`((heading, k), table)` for every BENCHMARKS.md table: the k-th
    table under its `## heading`, the key of `figure_keys.BENCHMARKS_KEYS`;
    then `((page, heading, k), table)` for every table of a guide whose
    section names a results file, the key of `figure_keys.DOCS_KEYS`."""
    for heading, k, table in _numbered(BENCHMARKS_TABLES):
        yield (heading, k), table
    for page, text in PAGES.items():
        for heading, k, table in _numbered(tables(text)):
            if named_results(table[1]):
                yield (page, heading, k), table


def _keys(table_id):
    import figure_keys

    if len(table_id) == 3:
        return figure_keys.DOCS_KEYS.get(table_id)
    return figure_keys.BENCHMARKS_KEYS.get(table_id)


def keyed_problems(where, header, rows, keys, files, skip=()):
    """Lines naming each figure of the table that is not the value of its
    own key (`figure_keys`), each row or cell without keys, and keys of
    rows or columns the table does not have. `files`: the results files
    the section names (a row's file must be one); `skip`: columns checked
    otherwise (`vs float32 (pp)`)."""
    import figure_keys

    problems, width = [], keys.get("cells", 1)
    named = {str(f.relative_to(RESULTS)) for f in files}
    labels = set()
    for row in rows:
        label = row[0] if width == 1 else tuple(row[:width])
        labels.add(label)
        if label not in keys["rows"]:
            problems.append(f"{where}: no keys for row {label!r}")
            continue
        name, columns = keys["rows"][label]
        if name not in named:
            problems.append(f"{where}, row {label!r}: {name} is not named")
            continue
        for column in set(columns) - set(header):
            problems.append(f"{where}, row {label!r}: no column {column!r}")
        for j in range(width, len(header)):
            if header[j] in skip:
                continue
            found, paths = figures(row[j]), columns.get(header[j], [])
            if len(found) != len(paths):
                problems.append(
                    f"{where}, row {label!r}, column {header[j]!r}: "
                    f"{len(found)} figure(s), {len(paths)} key(s)"
                )
                continue
            ms = _says_ms(header[j]) or _says_ms(row[0])
            for figure, path in zip(found, paths):
                value = figure_keys.resolve(name, path)
                number = value if isinstance(value, (int, float)) else None
                if number is None or not figure.matches([float(number)], ms):
                    problems.append(
                        f"{where}, row {label!r}, column {header[j]!r}: "
                        f"{figure.text} is not {name} {path} = {value!r}"
                    )
    for label in set(keys["rows"]) - labels:
        problems.append(f"{where}: keys for a row it lacks, {label!r}")
    return problems


@pytest.mark.parametrize(
    "table_id, table", list(keyed_tables()), ids=lambda x: str(x)[:60]
)
def test_every_benchmarks_figure_is_the_value_of_its_own_key(table_id, table):
    # BENCHMARKS.md's tables, and the guides' (docs/*.md) with results.
    heading, section, header, rows = table
    files = named_results(section)
    assert files, f"{heading}: the section names no results file"
    keys = _keys(table_id)
    assert keys is not None, f"no keys for {table_id}"
    doc = table_id[0] if len(table_id) == 3 else "BENCHMARKS.md"
    where = f"{doc}, {heading}"
    missing = keyed_problems(where, header, rows, keys, files, skip=(DERIVED,))
    if DERIVED in header:
        missing += _derived_missing(where, header, rows)
    assert not missing, "\n".join(missing)


def test_no_keys_for_a_table_that_is_gone():
    import figure_keys

    tables_now = {table_id for table_id, _ in keyed_tables()}
    assert set(figure_keys.BENCHMARKS_KEYS) <= tables_now
    assert set(figure_keys.DOCS_KEYS) <= tables_now
    for page, _ in figure_keys.PROSE_KEYS:
        assert page in PAGES, f"PROSE_KEYS: no page {page}"


def _readme_results():
    (table,) = [t for t in tables(README) if t[0] == "## Results"]
    return table


def readme_problems(rows, header, keys):
    """Lines naming each figure of README's Results table that is not the
    value of its own key, and rows without keys."""

    figure, results = header.index("figure"), header.index("results")
    problems, files = [], []
    for row in rows:
        if row[results] != "same":
            files = named_results(row[results])
        named = {str(f.relative_to(RESULTS)) for f in files}
        pairs = keys.get(row[0])
        found = figures(row[figure])
        if pairs is None or len(pairs) != len(found):
            problems.append(
                f"README.md, Results, {row[0][:50]!r}: {len(found)} "
                f"figure(s), {len(pairs or [])} key(s)"
            )
            continue
        where = f"README.md, Results, {row[0][:50]!r}"
        problems += _value_problems(where, found, pairs, named)
    return problems


def _value_problems(where, found, pairs, named, milliseconds=False):
    """Each figure in `found` that is not the value at its key in
    `pairs` ((results file, path) each), or whose file `named` lacks."""
    import figure_keys

    problems = []
    for fig, (name, path) in zip(found, pairs):
        value = figure_keys.resolve(name, path)
        if name not in named or not fig.matches([float(value)], milliseconds):
            problems.append(
                f"{where}: {fig.text} is not {name} {path} = {value!r}"
                + ("" if name in named else " (file not named)")
            )
    return problems


def test_every_readme_results_figure_is_the_value_of_its_own_key():
    import figure_keys

    _, _, header, rows = _readme_results()
    problems = readme_problems(rows, header, figure_keys.README_KEYS)
    assert not problems, "\n".join(problems)


def _folded(text):
    return " ".join(text.split())


def _masked(text):
    return re.sub(r"\d", "9", text)


def prose_problems(pages, keys):
    """Lines naming each figure of a keyed sentence of a guide
    (`figure_keys.PROSE_KEYS`) that is not the value of its own key, a
    passage not found, and a file its page does not name. `pages`: page
    -> text."""

    problems = []
    for (page, passage), pairs in keys.items():
        text, passage = _folded(pages[page]), _folded(passage)
        at = _masked(text).find(_masked(passage))
        if at < 0:
            problems.append(f"{page}: no passage {passage!r}")
            continue
        written = text[at : at + len(passage)]
        found = figures(written)
        named = {str(f.relative_to(RESULTS)) for f in named_results(text)}
        if len(found) != len(pairs):
            problems.append(
                f"{page}, {written!r}: {len(found)} figure(s), "
                f"{len(pairs)} key(s)"
            )
            continue
        problems += _value_problems(
            f"{page}, {written!r}", found, pairs, named, _says_ms(written)
        )
    return problems


def test_every_keyed_figure_of_the_guides_prose_is_its_key_s_value():
    # Figures that moved from README's prose to the guides: each is still
    # the value at its key of the results file its page names.
    import figure_keys

    assert figure_keys.PROSE_KEYS
    problems = prose_problems(PAGES, figure_keys.PROSE_KEYS)
    assert not problems, "\n".join(problems)


def _perturbed(text, factor):
    """The cell with its one number's digits times `factor`, at the same
    rounding, its sign, exponent and unit kept (`1.042` -> `1.146`,
    `96.3k` -> `105.9k`, `1.53e-05` -> `1.68e-05`)."""
    match = NUMBER.search(text)
    decimals = len(match["digits"].partition(".")[2])
    digits = f"{float(match['digits']) * factor:.{decimals}f}"
    return text[: match.start("digits")] + digits + text[match.end("digits") :]


def test_a_figure_changed_by_ten_percent_or_two_cells_swapped_fail():
    # What ties each figure to its key: the same check on a copy of every
    # table with one figure moved by 10 %, or two of a row's cells
    # swapped, must fail (before issue 33, 54 of 341 moved figures passed
    # and swapped cells did too).
    import figure_keys

    tried = 0
    for table_id, (heading, section, header, rows) in keyed_tables():
        keys = _keys(table_id)
        files = named_results(section)
        width = keys.get("cells", 1)
        for i, row in enumerate(rows):
            for j in range(width, len(row)):
                found = figures(row[j])
                if header[j] == DERIVED or len(found) != 1:
                    continue
                if found[0].value == 0:
                    continue  # 0 moves nowhere
                changed = [list(r) for r in rows]
                changed[i][j] = _perturbed(row[j], 1.1)
                if changed[i][j] == row[j]:
                    continue
                tried += 1
                assert keyed_problems(
                    heading, header, changed, keys, files, (DERIVED,)
                ), (heading, row[0], header[j], changed[i][j])
            cells = [
                j
                for j in range(width, len(row))
                if header[j] != DERIVED and figures(row[j])
            ]
            for a, b in zip(cells, cells[1:]):
                if row[a] == row[b]:
                    continue
                swapped = [list(r) for r in rows]
                swapped[i][a], swapped[i][b] = row[b], row[a]
                assert keyed_problems(
                    heading, header, swapped, keys, files, (DERIVED,)
                ), (heading, row[0], header[a], header[b])
    # The guides' keyed sentences: each figure moved by 10 %.
    for (page, passage), pairs in figure_keys.PROSE_KEYS.items():
        text = _folded(PAGES[page])
        at = _masked(text).index(_masked(_folded(passage)))
        written = text[at : at + len(_folded(passage))]
        for match in NUMBER.finditer(written):
            start = at + match.start()
            changed = _perturbed(text[start:], 1.1)
            if changed == text[start:]:
                continue
            tried += 1
            page_text = text[:start] + changed
            assert prose_problems(
                {page: page_text}, {(page, passage): pairs}
            ), (page, passage, match.group(0))
    assert tried > 200


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


@pytest.mark.parametrize("doc", ["BENCHMARKS.md", "README.md", *PAGES])
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
        ("1.53e-05, 3E+2", ["1.53e-05", "3E+2"]),
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
    (figure,) = figures("1.53e-05")
    assert figure.matches([1.52587890625e-05])
    assert not figure.matches([1.54e-05]) and not figure.matches([1.53])


def test_digests_are_not_results():
    names = named_results(
        "`benchmarks/results/h100_2026-11-22/README.md`, `probe_keras.json`"
    )
    assert [p.name for p in names] == ["probe_keras.json"]


def test_defect_table_names_tests_and_reproductions_that_exist():
    # The defect table, "Why not Keras's own mixed_float16?" (a guide's
    # since README links to it): each row names the tests that run stock
    # Keras, or a BUILD_NOTES defect for the rows shown by a reproduction
    # only.
    defects = PAGES["docs/defects.md"]
    (table,) = [t for t in tables(defects) if t[0].startswith("## Why not")]
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


def test_every_results_file_says_when_and_from_which_commit():
    # `kmp.backend.environment()` (which every benchmark writes) records
    # both; the files written before it were given theirs from git. The
    # H100 copies of 2026-11-22 are dated by their folder and digest (kmp
    # at 76c8453), and so is `kmp train`'s results.json of 2026-11-25,
    # which records its config but not when or from which commit; so is
    # the one of 2026-11-29's second H200 session (kmp at 41f2d24), the
    # last before `kmp train` recorded both.
    h100 = RESULTS / "h100_2026-11-25"
    h200 = RESULTS / "h200_2026-11-29b"
    undated = {
        h100 / "train_cifar10_cold_results.json",
        h200 / "fit" / "train_cifar10" / "results.json",
    }
    assert "a973be9" in (h100 / "README.md").read_text()
    assert "41f2d24" in (h200 / "README.md").read_text()
    checked = 0
    for path in sorted(RESULTS.rglob("*.json")):
        if "h100_2026-11-22" in path.parts or path in undated:
            continue
        record = json.loads(path.read_text())
        assert re.fullmatch(r"20\d\d-\d\d-\d\dT[\d:]+\+00:00", record["date"])
        assert re.fullmatch(r"[0-9a-f]{40}(\+changes)?", record["commit"])
        checked += 1
    assert checked > 20


# The census's backbone class of each name in the float32-islands
# guide's table of KerasHub models.
KERAS_HUB_NAMES = {
    "GPT-2": "GPT2",
    "BERT": "Bert",
    "RoBERTa": "Roberta",
    "XLM-RoBERTa": "XLMRoberta",
    "DistilBERT": "DistilBert",
    "ALBERT": "Albert",
    "DeBERTa-v3": "DebertaV3",
    "GPT-NeoX": "GPTNeoX",
    "GPT-OSS": "GptOss",
    "Gemma 3": "Gemma3",
    "Gemma 4": "Gemma4",
    "Llama 3": "Llama3",
    "Phi-3": "Phi3",
    "Qwen3-MoE": "Qwen3Moe",
    "Qwen-MoE": "QwenMoe",
    "Qwen3.5-MoE": "Qwen3_5Moe",
    "ELECTRA": "Electra",
    "RoFormer-v2": "RoformerV2",
    "T5Gemma 2": "T5Gemma2",
    "RWKV-7": "RWKV7",
    "Qwen3.5": "Qwen3_5",
}


def test_the_guide_s_keras_hub_table_says_what_the_census_counted():
    # Its cells are words, not figures: each backbone's "yes" or "no"
    # must be whether the census counted layers of that kind, and every
    # backbone the census built is in one row.
    page = "docs/float32-islands.md"
    heading = "## Which KerasHub models the four reach"
    ((_, _, header, rows),) = [
        t for t in tables(PAGES[page]) if t[0] == heading
    ]
    census = {
        r["backbone"]: r
        for r in json.loads(
            (RESULTS / "keras_hub_islands_jax.json").read_text()
        )["records"]
    }
    kinds = [
        "position_embeddings_repeated",
        "gelus_recomputed",
        "biases_added_flat",
        "decoders_told_causal",
    ]
    seen = []
    for row in rows:
        for name in row[0].split(", "):
            backbone = KERAS_HUB_NAMES.get(name, name) + "Backbone"
            seen.append(backbone)
            for cell, kind in zip(row[1:], kinds):
                said = cell.split()[0]
                counted = "yes" if census[backbone][kind] else "no"
                assert said == counted, (name, header[1 + kinds.index(kind)])
    assert sorted(seen) == sorted(census)
