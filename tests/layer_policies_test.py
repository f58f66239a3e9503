"""kmp.layer_policies: a made layer's policy recorded in its maker's
`DTypePolicyMap`, the layers whose policy a file may not keep, and a
float32 island over bfloat16 master weights."""

import keras
import numpy as np

import kmp
from kmp import layer_policies


def test_record_policies_puts_made_layers_in_their_maker_s_map():
    float32 = keras.dtype_policies.DTypePolicy("float32")
    inputs = keras.Input((4, 8))
    attention = keras.layers.MultiHeadAttention(2, 4, name="attention")
    dense = keras.layers.Dense(8, name="dense")
    model = keras.Model(inputs, dense(attention(inputs, inputs)))
    query = attention._query_dense
    # A listed layer's own config keeps its policy: nothing to record.
    assert layer_policies.record_policies(model, {dense: float32}) == []
    assert not isinstance(
        dense.dtype_policy, keras.dtype_policies.DTypePolicyMap
    )
    # A projection is made by the attention's code: the attention's map.
    assert layer_policies.record_policies(model, {query: float32}) == []
    policy = attention.dtype_policy
    assert isinstance(policy, keras.dtype_policies.DTypePolicyMap)
    assert policy[query.path].name == "float32"
    assert policy["attention/key"].name == policy.default_policy.name
    # Its softmax has no path for a map to name: returned, not recorded.
    assert attention._softmax.path is None
    assert layer_policies.record_policies(
        model, {attention._softmax: float32}
    ) == [attention._softmax]


def test_record_policies_returns_layers_of_a_user_s_own_maker():
    class Block(keras.layers.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.inner = keras.layers.Dense(4)

        def call(self, x):
            return self.inner(x)

    inputs = keras.Input((4,))
    block = Block()
    model = keras.Model(inputs, block(inputs))
    float32 = keras.dtype_policies.DTypePolicy("float32")
    # Recorded in the block's map, but its code does not pass it on.
    assert layer_policies.record_policies(model, {block.inner: float32}) == [
        block.inner
    ]
    assert block.dtype_policy[block.inner.path].name == "float32"


def test_a_float32_island_over_bfloat16_masters_keeps_them_in_its_file(
    tmp_path,
):
    kmp.enable("mixed_bfloat16", master_weights="bfloat16")
    inputs = keras.Input((8,))
    hidden = keras.layers.Dense(8)(inputs)
    model = kmp.pin_float32(
        keras.Model(inputs, keras.layers.Dense(2, name="head")(hidden))
    )
    head = model.get_layer("head")
    assert isinstance(
        head.dtype_policy.default_policy, layer_policies.Float32Compute
    )
    assert (head.compute_dtype, head.variable_dtype) == ("float32", "bfloat16")
    assert str(head.kernel.dtype) == "bfloat16"
    assert (
        keras.backend.standardize_dtype(model(np.ones((2, 8), "float32")).dtype)
        == "float32"
    )
    path = str(tmp_path / "m.keras")
    model.save(path)
    loaded = keras.saving.load_model(path).get_layer("head")
    assert loaded.compute_dtype == "float32"
    assert str(loaded.kernel.dtype) == "bfloat16"
    # Under float32 masters an island is Keras's own "float32", as before.
    kmp.enable("mixed_bfloat16")
    plain = keras.layers.Dense(2)
    plain.build((None, 8))
    assert type(layer_policies.float32_policy(plain)) is keras.DTypePolicy
