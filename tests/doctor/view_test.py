"""The doctor's tables and PNG."""

import numpy as np
import pytest
from handmade import diagnose_rows
from handmade import noisy

from kmp.doctor import _view

pytestmark = pytest.mark.backend_independent


def _report(policy="mixed_float16", scale=2.0**15):
    ref = np.linspace(1, 2, 64)
    return diagnose_rows(
        [
            ("first", policy.split("_")[1], *noisy(ref, 1e-3)),
            ("jump", policy.split("_")[1], *noisy(ref, 0.5)),
        ],
        scale=scale,
        policy=policy,
    )


def test_rows_show_fractions_errors_and_verdicts():
    report = _report()
    header, rows = _view.activation_rows(report.layers, report.format)
    assert header[5:8] == ["> 65504", "< 2^-24", "< 2^-14"]
    assert rows[0][0] == "first" and rows[0][-1] == "ok"
    assert rows[1][-1] == "pin to float32"
    assert rows[1][8] == "5.0e-01"
    header, rows = _view.gradient_rows(
        report.layers, report.format, report.loss_scale
    )
    assert header[2:5] == ["<2^-24 @1", "@2^15", ">65504 @2^15"]
    assert rows[0][1] == "0.000977"  # 2^-10


def test_show_prints_tables_verdicts_and_summary(capsys):
    _report().show()
    out = capsys.readouterr().out
    assert "kmp doctor: m under mixed_float16, loss scale 32768" in out
    assert "pin jump: relative error" in out
    assert 'kmp.pin_float32(model, also=[r"jump"])' in out


def test_percent_and_number_cells():
    assert _view._percent(0) == "0"
    assert _view._percent(1e-6) == "<0.01%"
    assert _view._percent(0.0123) == "1.23%"
    assert _view._number(float("inf")) == "inf"
    assert _view._number(None) == "-"


def test_plot_writes_a_png_for_float16_and_bfloat16(tmp_path):
    for policy, scale in (("mixed_float16", 2.0**15), ("mixed_bfloat16", 1.0)):
        path = tmp_path / f"{policy}.png"
        assert _report(policy, scale).plot(str(path)) == str(path)
        assert path.read_bytes()[:4] == b"\x89PNG"


def test_plot_without_half_precision_gradients(tmp_path):
    report = _report()
    for row in report.layers:
        row.dtype = "float32"
    path = tmp_path / "empty.png"
    report.plot(str(path))
    assert path.read_bytes()[:4] == b"\x89PNG"


def test_plot_leaves_the_matplotlib_backend_alone(tmp_path):
    import matplotlib

    before = matplotlib.get_backend()
    matplotlib.use("svg")
    try:
        _report().plot(str(tmp_path / "a.png"))
        assert matplotlib.get_backend() == "svg"
    finally:
        matplotlib.use(before)


def _long_numbers_report():
    """Long layer paths and numbers with every digit the cells keep
    (`4.05e-05`, `0.000549`), as an IMDB Transformer's report has."""
    ref = np.linspace(1, 2, 64)
    paths = [
        "query_of_block_1/imdb_transformer/encoder/multi_head_attention",
        "output_of_block_1/imdb_transformer/encoder/multi_head_attention",
    ]
    return diagnose_rows(
        [(path, "float16", *noisy(ref, 4.05e-5)) for path in paths],
        grads=np.array([0.000549, 4.05e-5, 2.0**-30, 1.5]),
    )


@pytest.mark.parametrize("width", [60, 100, 160])  # narrow, doctor.txt
def test_no_number_is_cut_at_any_console_width(width, monkeypatch):
    import io

    from rich.console import Console

    shown = io.StringIO()
    monkeypatch.setattr(
        _view, "make_console", lambda: Console(width=width, file=shown)
    )
    report = _long_numbers_report()
    report.show()
    text = shown.getvalue()
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= width
    for _, rows in (
        _view.activation_rows(report.layers, report.format),
        _view.gradient_rows(report.layers, report.format, report.loss_scale),
    ):
        for row in rows:
            for cell in row[1:]:
                # Whole, in a line of this layer's row.
                assert any(
                    row[0][:12] in line and f" {cell} " in line
                    for line in lines
                ), (cell, width)
    assert ("continued" in text) == (width < 160)
