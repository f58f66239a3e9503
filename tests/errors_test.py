"""kmp's input errors (`kmp.errors`): still ValueError/TypeError for code
that catches those, and raised by kmp's argument checks."""

import pytest

import kmp

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
