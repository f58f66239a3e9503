"""kmp.fp8.matmuls: a kernel's contracting and output sizes, an
attention's projections, and which suit float8 tensor cores."""

import keras
import numpy as np

from kmp.fp8.matmuls import is_eligible_einsum
from kmp.fp8.matmuls import matmul_sizes
from kmp.fp8.matmuls import projections


def test_dense_and_einsum_sizes_are_the_kernel_s_summed_and_kept_dims():
    dense = keras.layers.Dense(48)
    dense.build((None, 32))
    assert matmul_sizes(dense) == (32, 48)
    # "abc,cde->abde": sums over c (32), keeps d and e (4 x 8).
    einsum = keras.layers.EinsumDense("abc,cde->abde", (None, 4, 8))
    einsum.build((None, 5, 32))
    assert matmul_sizes(einsum) == (32, 32)
    assert is_eligible_einsum(einsum)
    odd = keras.layers.EinsumDense("abc,cd->abd", (None, 24))
    odd.build((None, 5, 32))
    assert not is_eligible_einsum(odd)  # 24 is no multiple of 16


def test_an_attention_has_four_projections():
    attention = keras.layers.MultiHeadAttention(num_heads=2, key_dim=16)
    x = np.ones((1, 3, 32), "float32")
    attention(x, x)
    found = projections(attention)
    assert len(found) == 4
    assert found[0] is attention._query_dense
    assert matmul_sizes(attention._query_dense) == (32, 32)
