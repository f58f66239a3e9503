"""Memory, the other half of mixed precision: the same model in fewer
bytes.

    optimizer_state  16-bit optimizer state: an optimizer's slots stored
                     in bfloat16, its update computed in float32
                     (`kmp.wrap(..., state_dtype="bfloat16")`)

What a model holds (bytes of weights and state, a compiled step's
buffers) is measured in `kmp.backend.memory`.

Imports from kmp: backend, errors.
"""

from kmp.memory.optimizer_state import STATE_DTYPES
from kmp.memory.optimizer_state import state_dtype_of
from kmp.memory.optimizer_state import with_state_dtype

__all__ = ["STATE_DTYPES", "state_dtype_of", "with_state_dtype"]
