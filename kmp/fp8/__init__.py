"""Float8 matmuls: `kmp.float8(model)` and the layers it puts in.

    quantization   the arithmetic: per-tensor scales, rounding to E4M3
                   and E5M2, the custom gradients
    matmuls        a matmul layer's sizes, an attention's projections,
                   which suit float8 tensor cores
    float8_layers  kmp's own `Float8Dense`, `Float8EinsumDense`,
                   `Float8MultiHeadAttention` (kmp.layers; what kmp 0.1's
                   `kmp.float8` put in, kept for its files)
    operands       any float8 layer, Keras's or kmp's: which they are,
                   and the operands each quantizes (for the doctor)
    convert        `kmp.float8`: which layers of a model are eligible,
                   converted in place to Keras's own float8
    scaled_matmul  kmp's own float8 matmul on JAX and torch: a GEMM on
                   two float8 operands scaled from their current amax,
                   both backward matmuls on float8 too (`dot_general`s
                   in a custom VJP; on torch `_torch_matmul`'s
                   `torch._scaled_mm`s in an autograd Function)
    scaled_layers  Keras's float8 `Dense` and `EinsumDense` computed by
                   it (`kmp.float8(model, matmul="kmp")`)

Imports from kmp: backend (the devices, for float8's default
min_size), errors, islands, layer_policies, model_layers.
"""

from kmp.fp8.convert import float8
from kmp.fp8.float8_layers import Float8Dense
from kmp.fp8.float8_layers import Float8EinsumDense
from kmp.fp8.float8_layers import Float8MultiHeadAttention
from kmp.fp8.matmuls import matmul_sizes
from kmp.fp8.operands import float8_matmuls
from kmp.fp8.operands import observe_operands

__all__ = [
    "Float8Dense",
    "Float8EinsumDense",
    "Float8MultiHeadAttention",
    "float8",
    "float8_matmuls",
    "matmul_sizes",
    "observe_operands",
]
