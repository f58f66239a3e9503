"""The library's input errors: `kmp_config.errors`'s, the one definition
that the command line, the application and the library share (a
`kmp.InputError` raised anywhere is the one the `kmp` command turns into
one line)."""

from kmp_config.errors import InputError
from kmp_config.errors import InputTypeError

__all__ = ["InputError", "InputTypeError"]
