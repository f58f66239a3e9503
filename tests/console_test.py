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
