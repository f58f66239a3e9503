"""kmp.fp8.operands: which layers are float8 (Keras's and kmp's), and the
operands each quantizes, observed inside a `with` block only."""

import keras
import numpy as np
from keras import ops

import kmp
from kmp.fp8.operands import float8_matmuls
from kmp.fp8.operands import observe_operands


def _keras_float8_dense():
    dense = keras.layers.Dense(16)
    dense.build((None, 16))
    dense.quantize("float8")
    return dense


def test_float8_matmuls_finds_keras_s_and_kmp_s_once():
    ours = kmp.layers.Float8Dense(16)
    ours.build((None, 16))
    theirs = _keras_float8_dense()
    plain = keras.layers.Dense(16)
    plain.build((None, 16))
    assert float8_matmuls([ours, plain, theirs, ours]) == [ours, theirs]
    attention = kmp.layers.Float8MultiHeadAttention(num_heads=2, key_dim=16)
    x = np.ones((1, 3, 32), "float32")
    attention(x, x)
    assert len(float8_matmuls([attention, attention._query_dense])) == 4


def test_each_operand_is_observed_in_the_block_and_nothing_after():
    theirs = _keras_float8_dense()
    ours = kmp.layers.Float8Dense(16)
    ours.build((None, 16))
    seen = []

    def observer(layer, operand, x, limit):
        seen.append((layer, operand, tuple(x.shape), limit))

    x = ops.ones((2, 16))
    with observe_operands([theirs, ours], observer):
        theirs(x)
        ours(x)
    assert [(s[0], s[1], s[2]) for s in seen] == [
        (theirs, "inputs", (2, 16)),
        (theirs, "kernel", (16, 16)),
        (ours, "inputs", (2, 16)),
        (ours, "kernel", (16, 16)),
    ]
    # Keras's: the |x| its delayed scale maps to E4M3's largest value (its
    # scales start at 1); kmp's, with no history yet: None.
    assert [s[3] for s in seen] == [448.0, 448.0, None, None]
    # The wrapper of Keras's `quantized_call` is gone with the block.
    assert "quantized_call" not in vars(theirs)
    theirs(x)
    ours(x)
    assert len(seen) == 4
