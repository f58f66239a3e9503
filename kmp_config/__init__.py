"""What every part of kmp agrees on, importable without Keras.

    names    the dtype policies kmp takes, the mixed ones, the half dtypes
    errors   `InputError` (what a user can fix) and `fail` (a command
             ending on it: one line, exit status 2)
    configs  the examples' settings, dataclasses whose fields are flags
    flags    those fields as absl flags, parsed and checked

The leaf of kmp's layering (BUILD_NOTES.md draws it): the library
(`kmp`), the application (`kmp.app`), the examples and the command's
start (`kmp_cli`) import it, and it imports none of them, nor Keras nor a
framework (absl only), so that `kmp --help` and a refused flag answer
before Keras loads, and each name has one source.
"""
