"""`kmp.backend.optimizer_updates`: how an optimizer's update reads a
16-bit variable (as float32, or as stored) and writes it."""

import keras
import numpy as np
import pytest

from kmp import backend


def test_a_bfloat16_variable_reads_as_float32_and_is_written_rounded():
    variable = keras.Variable(np.ones(3), dtype="bfloat16")
    with backend.float32_reads():
        assert str(keras.ops.convert_to_tensor(variable).dtype).endswith(
            "float32"
        )
        # The write goes through the stored variable, rounded to nearest:
        # 1 + 2^-10 is below half a bfloat16 ulp at 1 (2^-8).
        with backend.stored_reads(), backend.outside_autograd():
            variable.assign(np.full(3, 1 + 2**-10, "float32"))
    assert str(variable.dtype) == "bfloat16"
    values = keras.ops.convert_to_numpy(keras.ops.cast(variable, "float32"))
    assert values.tolist() == [1.0, 1.0, 1.0]
    with backend.float32_reads(), backend.stored_reads():
        variable.assign(np.full(3, 1.5, "float32"))  # written, not a copy
    assert (
        keras.ops.convert_to_numpy(keras.ops.cast(variable, "float32")).tolist()
        == [1.5] * 3
    )


def test_only_tensorflow_updates_through_its_replicas():
    assert backend.updates_per_replica() == (backend.name() == "tensorflow")


def test_the_stored_dtype_is_read_in_any_scope():
    variable = keras.Variable(np.ones(3), dtype="bfloat16")
    with backend.float32_reads():
        assert variable.dtype == "float32"  # what Keras says in the scope
        assert backend.stored_dtype(variable) == "bfloat16"


def test_the_scope_in_force_is_entered_again_later():
    variable = keras.Variable(np.ones(3), dtype="bfloat16")

    def read():  # `value` is what a layer's ops read
        return keras.backend.standardize_dtype(variable.value.dtype)

    with backend.float32_reads():
        again = backend.reads_in_force()
    with again:
        assert read() == "float32"
    with backend.reads_in_force():  # none was in force: as stored
        assert read() == "bfloat16"


def test_only_torch_updates_groups_of_variables_and_not_statelessly():
    variable = keras.Variable(np.ones(3))
    assert backend.updates_in_groups() == (backend.name() == "torch")
    with keras.StatelessScope([(variable, np.zeros(3, "float32"))]):
        assert not backend.updates_in_groups()


def test_float32_working_copies_take_in_place_updates_on_torch():
    variable = keras.Variable(np.full(3, 1.0), dtype="bfloat16")
    if backend.name() != "torch":
        with pytest.raises(NotImplementedError, match="float32_reads"):
            with backend.float32_working_copies([variable]):
                pass
        return
    stored = variable.value
    with backend.float32_working_copies([variable]) as (copy,):
        assert variable.value is copy and str(copy.dtype) == "torch.float32"
        with backend.outside_autograd():
            variable.value.add_(2**-10)  # a torch optimizer's update
    # The storage is back, unchanged; the copy holds what bfloat16 loses.
    assert variable.value is stored
    assert (
        keras.ops.convert_to_numpy(keras.ops.cast(variable, "float32")).tolist()
        == [1.0] * 3
    )
    assert keras.ops.convert_to_numpy(copy).tolist() == [1 + 2**-10] * 3


def test_the_optimizer_class_is_what_keras_makes():
    for stock in (keras.optimizers.Adam, keras.optimizers.Muon):
        made = backend.optimizer_class(stock)
        assert made is type(stock())
        assert issubclass(made, stock)
        assert (made is stock) == (
            backend.name() != "torch" or stock is keras.optimizers.Muon
        )


@pytest.mark.skipif(
    backend.name() != "tensorflow",
    reason="Keras's optimizers take a tf.Variable on TensorFlow alone",
)
@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
@pytest.mark.parametrize("state_dtype", [None, "int8"])
def test_kmp_s_optimizers_update_a_tf_variable_as_keras_s_do(
    policy, state_dtype
):
    # keras-io's neural style transfer optimizes a tf.Variable image:
    # kmp's optimizers read `variable.value.dtype`, a method's there
    # (AttributeError); Keras's SGD updates it.
    import tensorflow as tf

    import kmp

    kmp.enable(policy)
    try:
        optimizer = kmp.wrap(keras.optimizers.SGD(0.1), state_dtype=state_dtype)
        variable = tf.Variable([1.0, 2.0])
        with tf.GradientTape() as tape:
            loss = optimizer.scale_loss(tf.reduce_sum(variable * variable))
        optimizer.apply_gradients([(tape.gradient(loss, variable), variable)])
    finally:
        kmp.disable()
    assert backend.stored_dtype(variable) == "float32"
    np.testing.assert_allclose(variable.numpy(), [0.8, 1.6], rtol=1e-6)
