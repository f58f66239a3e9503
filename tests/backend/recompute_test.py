"""`kmp.backend.recompute`: a rematerialized call's writes, the same in
its recomputation (TensorFlow, torch: the state put back before it runs
again) or carried out of `jax.checkpoint` (JAX: outputs of the
function, stored in the step's scope)."""

import keras
from keras import ops

from kmp import backend


class Counter(keras.layers.Layer):
    """Adds one to a non-trainable count at every call, and returns its
    inputs times the count."""

    def build(self, input_shape):
        self.count = self.add_weight(
            shape=(), initializer="zeros", trainable=False
        )

    def call(self, inputs):
        self.count.assign(self.count + 1.0)
        return inputs * self.count


def _value(variable):
    return float(ops.convert_to_numpy(variable))


def test_the_recomputation_starts_from_the_forward_s_state():
    layer = Counter()
    layer.build((2,))
    x = ops.ones((2,))
    if backend.name() == "jax":
        # Inside a step's stateless scope the write is carried out.
        mapping = [(layer.count, ops.convert_to_tensor(3.0))]
        with keras.StatelessScope(state_mapping=mapping) as scope:
            state = backend.RecomputedState(layer)
            with state.run():
                outputs = layer.call(x)
            packed = state.pack(outputs)
            assert len(packed[1]) == 1  # the count's new value
            assert _value(scope.get_current_value(layer.count)) == 3.0
            outputs = state.unpack(packed)
        assert _value(scope.get_current_value(layer.count)) == 4.0
        assert ops.convert_to_numpy(outputs).tolist() == [4.0, 4.0]
        return
    state = backend.RecomputedState(layer)
    for _ in range(3):  # the forward run, then two recomputations
        with state.run():
            outputs = state.unpack(state.pack(layer.call(x)))
        assert _value(layer.count) == 1.0
        assert ops.convert_to_numpy(outputs).tolist() == [1.0, 1.0]
    # A new call (the next step) starts from where the last one ended.
    with backend.RecomputedState(layer).run():
        layer.call(x)
    assert _value(layer.count) == 2.0
