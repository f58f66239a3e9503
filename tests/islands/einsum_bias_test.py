"""kmp.islands.flatten_bias: an `EinsumDense`'s bias over several output
axes added on the flat output (what `kmp.pin_float32` does on JAX to
`MultiHeadAttention`'s query, key and value projections): which layers
change, the same values and gradients, the same config, a `.keras` file
without it and `kmp.load_model` applying it again, together with the
GELU's wrapper, and KerasHub's GPT-2 trained with it."""

import keras
import keras_hub
import numpy as np
import pytest
from keras import ops
from util import fit_small_gpt2
from util import loss_and_gradients
from util import small_gpt2_backbone

import kmp
from kmp import backend
from kmp.islands import flatten_bias
from kmp.islands import flattens_bias
from kmp.islands import recomputes_gelu

# What kmp.pin_float32 applies it on.
ON_JAX = backend.name() == "jax"


def numpy(x):
    return ops.convert_to_numpy(ops.cast(x, "float32"))


def einsum(equation, shape, bias_axes, **kwargs):
    return keras.layers.EinsumDense(
        equation, shape, bias_axes=bias_axes, **kwargs
    )


@pytest.mark.parametrize(
    "equation, shape, bias_axes, inputs, changes",
    [
        # MultiHeadAttention's query, key and value projections.
        ("abc,cde->abde", (5, 4, 3), "de", (2, 5, 6), True),
        ("ab,bcd->acd", (4, 3), "cd", (2, 6), True),
        ("abc,cdef->abdef", (5, 2, 2, 3), "def", (2, 5, 6), True),
        ("abc,cde->abde", (5, 4, 3), "e", (2, 5, 6), False),  # one axis
        ("abc,cde->abde", (5, 4, 3), None, (2, 5, 6), False),  # no bias
        ("abc,cd->abd", (5, 4), "d", (2, 5, 6), False),  # fused already
        # MultiHeadAttention's output projection: two axes contracted.
        ("abcd,cde->abe", (5, 3), "e", (2, 5, 4, 6), False),
        ("abc,cde->abed", (5, 3, 4), "ed", (2, 5, 6), False),  # reordered
        # The kernel's contracted axis is not its first.
        ("abc,dce->abde", (5, 4, 3), "de", (2, 5, 6), False),
        ("...c,cde->...de", (4, 3), "de", (2, 5, 6), False),  # ellipsis
    ],
)
def test_it_changes_projections_to_several_axes_with_their_bias(
    equation, shape, bias_axes, inputs, changes
):
    layer = einsum(equation, shape, bias_axes)
    layer.build(inputs)
    if layer.bias is not None:  # not zero: where it is added shows
        size = int(np.prod(layer.bias.shape))
        layer.bias.assign(np.linspace(-1, 1, size).reshape(layer.bias.shape))
    assert flatten_bias(layer) is changes
    assert flatten_bias(layer) is changes  # a second time: the same
    assert flattens_bias(layer) is changes
    assert ("call" in vars(layer)) is changes
    x = np.linspace(-1.0, 1.0, int(np.prod(inputs)), dtype="float32")
    x = x.reshape(inputs)
    np.testing.assert_allclose(
        numpy(layer(x)),
        numpy(keras.layers.EinsumDense.call(layer, x)),
        rtol=1e-6,
    )


def test_subclasses_and_other_wrappers_keep_keras_s_call():
    class Shifted(keras.layers.EinsumDense):
        def call(self, inputs, training=None):
            return super().call(inputs) + 1.0

    layer = Shifted("abc,cde->abde", (5, 4, 3), bias_axes="de")
    layer.build((2, 5, 6))
    assert flatten_bias(layer) is False
    assert flatten_bias(keras.layers.Dense(3)) is False
    # A call of the instance's own (another wrapper, or the GELU's set
    # first) would be bypassed: left alone.
    layer = einsum("abc,cde->abde", (5, 4, 3), "de")
    layer.build((2, 5, 6))
    layer.call = lambda inputs, training=None: inputs
    assert flatten_bias(layer) is False
    assert not flattens_bias(layer)


# As a matrix product the kernel's gradient may sum over batch and
# length in another order: float32's last bits (1.2e-6 relative, seen
# once in 8 runs on a CPU), and in bfloat16 (8 bits) a few units in the
# last place of the gradient's largest values (0.309 against 0.375 where
# the largest is about 3, TensorFlow on a loaded CPU, 2 runs in 9): the
# tolerance is relative to each gradient's largest value.
@pytest.mark.parametrize(
    "policy, rtol", [("float32", 1e-5), ("mixed_bfloat16", 5e-2)]
)
def test_values_gradients_and_config_are_unchanged(policy, rtol):
    kmp.enable(policy)
    inputs = keras.Input((5, 6))
    x = einsum("abc,cde->abde", (5, 4, 3), "de", name="qkv")(inputs)
    outputs = keras.layers.Reshape((5, 12))(x)
    model = keras.Model(inputs, keras.layers.Dense(2)(outputs))
    layer = model.get_layer("qkv")
    # A bias that is not zero, so that where it is added shows.
    layer.bias.assign(np.linspace(-1.0, 1.0, 12).reshape(4, 3))
    x = np.linspace(-3.0, 3.0, 60, dtype="float32").reshape(2, 5, 6)
    config = layer.get_config()

    want, forward = loss_and_gradients(model, x), numpy(model(x))
    assert flatten_bias(layer)
    got = loss_and_gradients(model, x)
    np.testing.assert_allclose(numpy(model(x)), forward, rtol=rtol)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, atol=rtol * np.abs(w).max())
    assert layer.get_config() == config
    assert [w.shape for w in layer.weights] == [(6, 4, 3), (4, 3)]
    del layer.call  # undone
    assert not flattens_bias(layer)


@pytest.mark.skipif(not ON_JAX, reason="JAX's program")
def test_on_jax_the_bias_is_added_to_the_flat_product():
    import jax

    layer = einsum("abc,cde->abde", (5, 4, 3), "de")
    layer.build((2, 5, 6))
    x = np.ones((2, 5, 6), "float32")

    def adds():
        """The shapes of the operands added in the layer's call."""
        text = str(jax.make_jaxpr(layer.call)(x))
        lines = [line for line in text.splitlines() if " add " in line]
        return [line.split(":")[1].split("=")[0].strip() for line in lines]

    assert adds() == ["f32[2,5,4,3]"]
    flatten_bias(layer)
    assert adds() == ["f32[2,5,12]"]


def test_a_quantized_layer_and_a_lora_layer():
    layer = einsum("abc,cde->abde", (5, 4, 3), "de")
    layer.build((2, 5, 6))
    layer.bias.assign(np.full((4, 3), 0.5))
    x = np.linspace(-1.0, 1.0, 60, dtype="float32").reshape(2, 5, 6)
    want = numpy(layer(x))
    assert flatten_bias(layer)
    layer.enable_lora(2)
    layer.lora_kernel_b.assign(np.full(layer.lora_kernel_b.shape, 0.1))
    stock = keras.layers.EinsumDense.call(layer, x)  # LoRA's kernel too
    np.testing.assert_allclose(numpy(layer(x)), numpy(stock), rtol=1e-6)
    assert not np.allclose(numpy(layer(x)), want)
    # A quantized layer runs Keras's `quantized_call`, as without it.
    twins = [einsum("abc,cde->abde", (5, 4, 3), "de") for _ in range(2)]
    for twin in twins:
        twin.build((2, 5, 6))
        twin.set_weights(layer.get_weights()[:2])
    assert flatten_bias(twins[0])
    for twin in twins:
        twin.quantize("int8")
    np.testing.assert_array_equal(numpy(twins[0](x)), numpy(twins[1](x)))
    # `call` itself, called directly on a quantized layer, is Keras's
    # (which on torch cannot multiply int8 codes: the same error).
    stock = keras.layers.EinsumDense.call
    try:
        want = numpy(stock(twins[1], x))
    except RuntimeError as error:
        with pytest.raises(RuntimeError, match="same dtype"):
            twins[0].call(x)
        assert "same dtype" in str(error)
    else:
        np.testing.assert_array_equal(numpy(twins[0].call(x)), want)


@pytest.mark.skipif(not ON_JAX, reason="kmp's float8 matmul: JAX")
def test_kmp_s_float8_layer_after_it_runs_as_without_it():
    from kmp.fp8 import scaled_layers

    kmp.enable("mixed_bfloat16")
    x = np.linspace(-1.0, 1.0, 60, dtype="float32").reshape(2, 5, 6)
    twins = [einsum("abc,cde->abde", (5, 4, 3), "de") for _ in range(2)]
    for twin in twins:
        twin.build((2, 5, 6))
        twin.set_weights(twins[0].get_weights())
    assert flatten_bias(twins[0])
    for twin in twins:  # kmp.float8(model) after kmp.pin_float32
        twin.quantize("float8")
        scaled_layers.use_kmp_matmul(twin)
    assert type(twins[0]) is not keras.layers.EinsumDense
    np.testing.assert_array_equal(numpy(twins[0](x)), numpy(twins[1](x)))
    np.testing.assert_array_equal(
        numpy(twins[0].call(x)), numpy(twins[1].call(x))
    )


@pytest.mark.skipif(
    backend.name() != "tensorflow", reason="a batch unknown when traced"
)
def test_leading_sizes_unknown_when_traced_take_keras_s_call():
    import tensorflow as tf

    layer = einsum("abc,cde->abde", (5, 4, 3), "de")
    layer.build((None, 5, 6))
    layer.bias.assign(np.full((4, 3), 0.5))
    assert flatten_bias(layer)
    traced = tf.function(
        layer.call, input_signature=[tf.TensorSpec((None, 5, 6))]
    )
    x = np.linspace(-1.0, 1.0, 60, dtype="float32").reshape(2, 5, 6)
    np.testing.assert_array_equal(
        numpy(traced(x)), numpy(keras.layers.EinsumDense.call(layer, x))
    )


def attention_block():
    inputs = keras.Input((6, 8))
    x = keras.layers.MultiHeadAttention(2, 4, name="mha")(inputs, inputs)
    x = keras.layers.EinsumDense(
        "abc,cde->abde",
        (6, 2, 8),
        bias_axes="de",
        activation="gelu",
        name="gelu",
    )(x)
    return keras.Model(inputs, keras.layers.Reshape((6, 16))(x))


def test_a_keras_file_does_not_keep_it_and_load_model_applies_it(tmp_path):
    kmp.enable("mixed_bfloat16")
    model = kmp.pin_float32(attention_block())
    mha = model.get_layer("mha")
    projections = [mha._query_dense, mha._key_dense, mha._value_dense]
    gelu = model.get_layer("gelu")
    assert [flattens_bias(p) for p in projections] == [ON_JAX] * 3
    assert not flattens_bias(mha._output_dense)
    # Both wrappers on one layer: the GELU's runs this one.
    assert flattens_bias(gelu) is ON_JAX
    assert recomputes_gelu(gelu) is ON_JAX
    x = np.linspace(-3.0, 3.0, 96, dtype="float32").reshape(2, 6, 8)
    want = numpy(model(x))
    path = str(tmp_path / "bias.keras")
    model.save(path)
    stock = keras.saving.load_model(path)
    loaded = kmp.load_model(path)
    for layer in (stock.get_layer("gelu"), stock.get_layer("mha")._key_dense):
        assert not flattens_bias(layer)
    for layer in (loaded.get_layer("gelu"), loaded.get_layer("mha")._key_dense):
        assert flattens_bias(layer) is ON_JAX
    np.testing.assert_array_equal(numpy(loaded(x)), want)
    np.testing.assert_allclose(numpy(stock(x)), want, rtol=1e-2, atol=1e-2)


def test_gpt2_flattens_each_block_s_projections_and_trains():
    kmp.enable("mixed_bfloat16")
    backbone = small_gpt2_backbone()
    model = keras_hub.models.GPT2CausalLM(backbone, preprocessor=None)
    kmp.pin_float32(model)
    flat = [layer for layer in model._flatten_layers() if flattens_bias(layer)]
    assert len(flat) == (6 if ON_JAX else 0)  # query, key, value a block
    fit_small_gpt2(model)
