"""Memory, the other half of mixed precision: the same model in fewer
bytes.

    optimizer_state  16-bit optimizer state (an optimizer's slots stored
                     in bfloat16, its update computed in float32) and
                     16-bit master weights written by stochastic rounding
    modes            `low_precision`: which of those modes an optimizer
                     is in (`kmp.wrap(..., state_dtype=..., rounding=...)`),
                     decided now or, for the rounding, when it is built
    quantized_state  8-bit optimizer state (`state_dtype="int8"`): the
                     slots in block codes, dequantized for the update,
                     requantized stochastically
    block_codes      the 8-bit format: int8 codes of a dynamic map in
                     blocks with a float32 scale each
    rounding         stochastic rounding to bfloat16: unbiased, the same
                     bits on every backend, no random state
    grouped_update   the 16-bit update on eager torch, a group of
                     variables at a time over float32 copies
    remat            `kmp.rematerialize`: layers recomputed in the
                     backward pass, under their dtype policy

What a model holds (bytes of weights and state, a compiled step's
buffers) is measured in `kmp.backend.memory`.

Imports from kmp: backend, errors.
"""

from kmp.memory.modes import low_precision
from kmp.memory.optimizer_state import ROUNDINGS
from kmp.memory.optimizer_state import STATE_DTYPES
from kmp.memory.optimizer_state import rounding_of
from kmp.memory.optimizer_state import state_dtype_of
from kmp.memory.remat import recomputes_in_policy
from kmp.memory.remat import rematerialize
from kmp.memory.remat import rematerialized_layers
from kmp.memory.rounding import stochastic_round

__all__ = [
    "ROUNDINGS",
    "STATE_DTYPES",
    "low_precision",
    "recomputes_in_policy",
    "rematerialize",
    "rematerialized_layers",
    "rounding_of",
    "state_dtype_of",
    "stochastic_round",
]
