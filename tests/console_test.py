"""The console kmp's tables print to (`kmp.console`)."""

import pytest

from kmp.console import make_console

pytestmark = pytest.mark.backend_independent


def test_a_pipe_gets_160_columns_a_terminal_its_own_width(monkeypatch):
    # Under pytest, stdout is captured: not a terminal.
    assert make_console().width == 160
    monkeypatch.setenv("FORCE_COLOR", "1")  # rich: treat as a terminal
    monkeypatch.setenv("COLUMNS", "97")
    assert make_console().width == 97


def test_no_colour_codes_in_a_pipe_nor_under_no_color(monkeypatch, capsys):
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    monkeypatch.delenv("NO_COLOR", raising=False)
    console = make_console()
    console.print("[bold red]loss[/]")
    assert capsys.readouterr().out == "loss\n"
    # A terminal (rich's FORCE_COLOR) with NO_COLOR: no colours either.
    monkeypatch.setenv("FORCE_COLOR", "1")
    monkeypatch.setenv("NO_COLOR", "1")
    console = make_console()
    assert console.is_terminal and console.no_color
