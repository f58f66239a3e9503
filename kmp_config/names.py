"""The names of precisions, one source for the library, the application
and the command line.

    POLICIES        what `kmp.enable` and `--policy` take
    MIXED_POLICIES  the mixed ones (float32 variables, half compute)
    HALF_DTYPES     the half-precision compute dtypes
    MIXED_POLICY    a half dtype -> the mixed policy that computes in it
"""

POLICIES = ("auto", "float32", "mixed_float16", "mixed_bfloat16")
MIXED_POLICIES = ("mixed_float16", "mixed_bfloat16")
HALF_DTYPES = ("float16", "bfloat16")
MIXED_POLICY = dict(zip(HALF_DTYPES, MIXED_POLICIES))
