"""`kmp.layers`: the layers kmp puts in place of Keras's, for use in
models of your own.

Float32 islands (`kmp.pin_float32` puts them in; `kmp.islands`):
`Float32Softmax`, `Float32Activation`, `MultiHeadAttention`, and on
torch `BatchNormalization` (its float32 arithmetic in one fused kernel). Float8
matmuls (`kmp.float8` puts them in; `kmp.fp8`): `Float8Dense`,
`Float8EinsumDense`, `Float8MultiHeadAttention`. And the IMDB example's
`TokenAndPositionEmbedding` (`kmp.embedding`), so that the models kmp
writes load wherever kmp is imported. All are registered for
serialization (`kmp>ClassName`), so a `.keras` file keeps them.
"""

from kmp.embedding import TokenAndPositionEmbedding
from kmp.fp8 import Float8Dense
from kmp.fp8 import Float8EinsumDense
from kmp.fp8 import Float8MultiHeadAttention
from kmp.islands import BatchNormalization
from kmp.islands import Float32Activation
from kmp.islands import Float32Softmax
from kmp.islands import MultiHeadAttention

__all__ = [
    "BatchNormalization",
    "Float32Activation",
    "Float32Softmax",
    "Float8Dense",
    "Float8EinsumDense",
    "Float8MultiHeadAttention",
    "MultiHeadAttention",
    "TokenAndPositionEmbedding",
]
