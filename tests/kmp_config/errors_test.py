"""kmp's input errors (`kmp_config.errors`, the library's `kmp.errors`):
still ValueError/TypeError for code that catches those, raised by kmp's
argument checks, and a command's end on one (`fail`)."""

import pytest

import kmp
from kmp_config import errors

pytestmark = pytest.mark.backend_independent


def test_input_errors_are_the_builtin_errors_too():
    assert issubclass(kmp.InputError, ValueError)
    assert issubclass(kmp.InputTypeError, TypeError)
    assert issubclass(kmp.InputTypeError, kmp.InputError)


def test_argument_checks_raise_them():
    with pytest.raises(kmp.InputError, match="mixed_float8"):
        kmp.enable("mixed_float8")
    with pytest.raises(kmp.InputError):
        kmp.wrap("adam", initial_scale=-1.0)
    with pytest.raises(kmp.InputTypeError):
        kmp.distribute("not a model")


def test_the_library_s_errors_are_the_leaf_s():
    assert kmp.InputError is errors.InputError
    assert kmp.InputTypeError is errors.InputTypeError


def test_fail_ends_a_command_in_one_line_with_status_2(capsys):
    with pytest.raises(SystemExit) as exited:
        errors.fail("kmp train", "--epochs must be >= 1, got 0")
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err == "kmp train: --epochs must be >= 1, got 0\n"
