"""kmp.layer_policies: a made layer's policy recorded in its maker's
`DTypePolicyMap`, and the layers whose policy a file may not keep."""

import keras

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
