"""The names of precisions, one source for the library, the application
and the command line.

    POLICIES        what `kmp.enable` and `--policy` take
    MIXED_POLICIES  the mixed ones (float32 variables, half compute)
    HALF_DTYPES     the half-precision compute dtypes
    MIXED_POLICY    a half dtype -> the mixed policy that computes in it
    MASTER_WEIGHTS  what `master_weights` (and `--master_weights`) take:
                    the dtype trainable variables are stored in
    STATE_DTYPES    what `--optimizer_states` takes: the optimizer's slots
"""

POLICIES = ("auto", "float32", "mixed_float16", "mixed_bfloat16")
MIXED_POLICIES = ("mixed_float16", "mixed_bfloat16")
HALF_DTYPES = ("float16", "bfloat16")
MIXED_POLICY = dict(zip(HALF_DTYPES, MIXED_POLICIES))
MASTER_WEIGHTS = ("float32", "bfloat16")
STATE_DTYPES = ("float32", "bfloat16", "int8")
