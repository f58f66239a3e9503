"""`kmp.layers`, the namespace of kmp's layers: every class there is the
one `pin_float32` or `float8` puts in (or the IMDB example's embedding),
registered under `kmp>Name`."""

import keras

import kmp
from kmp import embedding
from kmp import fp8
from kmp import islands

NAMES = {
    "BatchNormalization": islands,
    "Float32Activation": islands,
    "Float32Softmax": islands,
    "MultiHeadAttention": islands,
    "Float8Dense": fp8,
    "Float8EinsumDense": fp8,
    "Float8MultiHeadAttention": fp8,
    "TokenAndPositionEmbedding": embedding,
}


def test_the_namespace_holds_kmp_s_layers_each_registered():
    assert sorted(kmp.layers.__all__) == sorted(NAMES)
    for name, home in NAMES.items():
        cls = getattr(kmp.layers, name)
        assert cls is getattr(home, name)
        assert keras.saving.get_registered_object(f"kmp>{name}") is cls
