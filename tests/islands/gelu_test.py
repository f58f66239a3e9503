"""kmp.islands.recompute_gelu: a `Dense`, `EinsumDense` or `Activation`
layer's GELU (Keras's, KerasHub's `gelu_approximate`) recomputed in the
backward pass (what `kmp.pin_float32` does on JAX): the same values and
gradients, the same config, other layers and activations left alone; a
`.keras` file does not keep it and `kmp.load_model` applies it again;
KerasHub's GPT-2 gets it in every decoder block and trains."""

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
from kmp.islands import is_gelu
from kmp.islands import recompute_gelu
from kmp.islands import recomputes_gelu

# What kmp.pin_float32 and recompute_gelu do: on JAX only.
ON_JAX = backend.name() == "jax"
HUB_GELU = keras.saving.get_registered_object("keras_hub>gelu_approximate")


def numpy(x):
    return ops.convert_to_numpy(ops.cast(x, "float32"))


def test_it_knows_keras_s_and_keras_hub_s_gelu_only():
    assert is_gelu(keras.activations.gelu)
    assert is_gelu(keras.activations.get("gelu"))
    assert is_gelu(HUB_GELU)
    assert not is_gelu(keras.activations.relu)
    assert not is_gelu(lambda x: keras.activations.gelu(x))
    assert not is_gelu(None)


def three_gelu_layers():
    """A model with a GELU in each kind of layer it changes, and a ReLU."""
    inputs = keras.Input((5, 6))
    x = keras.layers.Dense(8, activation="gelu", name="dense")(inputs)
    x = keras.layers.Activation(HUB_GELU, name="activation")(x)
    x = keras.layers.EinsumDense(
        "abc,cd->abd", (5, 4), activation="gelu", name="einsum"
    )(x)
    outputs = keras.layers.Dense(3, activation="relu", name="relu")(x)
    return keras.Model(inputs, outputs)


GELU_LAYERS = ("dense", "activation", "einsum")


def test_it_changes_gelu_layers_only_and_reports_it():
    model = three_gelu_layers()
    for name in GELU_LAYERS:
        layer = model.get_layer(name)
        activation = layer.activation
        assert recompute_gelu(layer) is ON_JAX
        assert recompute_gelu(layer) is ON_JAX  # a second time: the same
        assert recomputes_gelu(layer) is ON_JAX
        assert ("call" in vars(layer)) is ON_JAX
        # Outside a call the attribute is the GELU itself.
        assert layer.activation is activation
    relu = model.get_layer("relu")
    assert recompute_gelu(relu) is False
    assert "call" not in vars(relu)
    # A layer that holds a GELU it hands to its sublayers keeps it.
    decoder = keras_hub.layers.TransformerDecoder(8, 2, activation="gelu")
    assert recompute_gelu(decoder) is False
    assert decoder.activation is keras.activations.gelu


# Recomputed, the GELU may be fused differently by XLA: float32
# gradients a few units in their last places apart, summed over a
# matmul (on a CPU, weights drawn after other tests: 3.3e-6 of 0.5). The
# weights are seeded: how far apart depends on them.
@pytest.mark.parametrize(
    "policy, rtol", [("float32", 1e-5), ("mixed_bfloat16", 1e-2)]
)
def test_values_gradients_and_configs_are_unchanged(policy, rtol):
    kmp.enable(policy)
    keras.utils.set_random_seed(0)
    model = three_gelu_layers()
    x = np.linspace(-3.0, 3.0, 60, dtype="float32").reshape(2, 5, 6)
    configs = [model.get_layer(name).get_config() for name in GELU_LAYERS]

    want, forward = loss_and_gradients(model, x), numpy(model(x))
    for name in GELU_LAYERS:
        recompute_gelu(model.get_layer(name))
    got = loss_and_gradients(model, x)
    np.testing.assert_array_equal(numpy(model(x)), forward)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol * 0.1)
    assert configs == [model.get_layer(n).get_config() for n in GELU_LAYERS]


def gelu_counts(loss, argument):
    """How often the gradient of `loss` at `argument` computes `erfc` and
    `tanh` (JAX's program): Keras's exact GELU computes `erfc`,
    KerasHub's approximate one `tanh`, once each, and again in the
    backward pass when recomputed."""
    import jax

    text = str(jax.make_jaxpr(jax.grad(loss))(argument))
    return text.count(" erfc "), text.count(" tanh ")


@pytest.mark.skipif(not ON_JAX, reason="JAX's program")
def test_on_jax_the_backward_pass_recomputes_the_gelu_until_undone():
    kmp.enable("mixed_bfloat16")
    model = three_gelu_layers()
    x = np.linspace(-3.0, 3.0, 60, dtype="float32").reshape(2, 5, 6)
    frozen = [v.value for v in model.non_trainable_variables]

    def loss(values):
        out, _ = model.stateless_call(values, frozen, x)
        return ops.sum(ops.square(ops.cast(out, "float32")))

    def tanh_count():
        return gelu_counts(loss, [v.value for v in model.trainable_variables])

    assert tanh_count() == (2, 1)
    for name in GELU_LAYERS:
        recompute_gelu(model.get_layer(name))
    assert tanh_count() == (4, 2)
    # An activation changed since: as written.
    model.get_layer("einsum").activation = keras.activations.relu
    assert tanh_count() == (2, 2)
    for name in ("dense", "activation"):
        del model.get_layer(name).call
        assert not recomputes_gelu(model.get_layer(name))
    assert tanh_count() == (1, 1)


def gradient_erfc_count(layer, x):
    """`gelu_counts`'s `erfc` count for `layer.call` (the instance's: what
    Keras's `__call__` runs for an unquantized layer)."""
    erfc, _ = gelu_counts(
        lambda x: ops.sum(ops.cast(layer.call(x), "float32")), x
    )
    return erfc


@pytest.mark.skipif(not ON_JAX, reason="JAX's program")
def test_layers_whose_call_is_not_keras_s_keep_the_gelu_as_written():
    from kmp.fp8 import float8_layers

    kmp.enable("mixed_bfloat16")
    x = np.linspace(-3.0, 3.0, 32, dtype="float32").reshape(2, 16)

    class Shifted(keras.layers.Dense):
        def call(self, inputs):
            return super().call(inputs) + 1.0

    # kmp 0.1's float8 layer (its own call writes XLA's float8 pattern)
    # and a user's subclass: never wrapped.
    for layer in (
        kmp.layers.Float8Dense(16, activation="gelu"),
        Shifted(16, activation="gelu"),
    ):
        layer.build((None, 16))
        assert recompute_gelu(layer) is False
        assert gradient_erfc_count(layer, x) == 1
    # A layer wrapped, then given kmp 0.1's float8 class: as written.
    layer = keras.layers.Dense(16, activation="gelu")
    layer.build((None, 16))
    assert recompute_gelu(layer)
    assert gradient_erfc_count(layer, x) == 2
    float8_layers.convert(layer)
    assert gradient_erfc_count(layer, x) == 1


@pytest.mark.skipif(not ON_JAX, reason="JAX's program")
def test_a_quantized_layer_s_call_keeps_the_gelu_as_written():
    kmp.enable("mixed_bfloat16")
    x = np.linspace(-3.0, 3.0, 32, dtype="float32").reshape(2, 16)
    layer = keras.layers.Dense(16, activation="gelu")
    layer.build((None, 16))
    recompute_gelu(layer)
    layer.quantize("float8")  # Keras then runs `quantized_call`
    assert gradient_erfc_count(layer, x) == 1


@pytest.mark.skipif(not ON_JAX, reason="wraps on JAX only")
def test_an_error_in_the_call_leaves_the_gelu_in_place():
    layer = keras.layers.Dense(4, activation="gelu")
    layer.build((None, 3))
    assert recompute_gelu(layer)
    with pytest.raises(TypeError, match="dot_general"):
        layer.call(np.ones((2, 5), "float32"))  # not 3 features
    assert layer.activation is keras.activations.gelu


def test_a_keras_file_does_not_keep_it_and_load_model_applies_it(tmp_path):
    kmp.enable("mixed_bfloat16")
    model = kmp.pin_float32(three_gelu_layers())
    for name in GELU_LAYERS:
        assert recomputes_gelu(model.get_layer(name)) is ON_JAX
    x = np.linspace(-3.0, 3.0, 60, dtype="float32").reshape(2, 5, 6)
    want = numpy(model(x))
    path = str(tmp_path / "gelu.keras")
    model.save(path)
    stock = keras.saving.load_model(path)
    loaded = kmp.load_model(path)
    for name in GELU_LAYERS:
        assert not recomputes_gelu(stock.get_layer(name))
        assert recomputes_gelu(loaded.get_layer(name)) is ON_JAX
    assert stock.get_layer("activation").activation is HUB_GELU
    np.testing.assert_array_equal(numpy(loaded(x)), want)


def test_gpt2_recomputes_each_block_s_gelu_and_trains():
    kmp.enable("mixed_bfloat16")
    backbone = small_gpt2_backbone()
    dense = [
        layer
        for layer in backbone._flatten_layers()
        if isinstance(layer, keras.layers.Dense)
        and layer.activation is HUB_GELU
    ]
    assert len(dense) == 2  # one feed-forward layer a decoder block
    model = keras_hub.models.GPT2CausalLM(backbone, preprocessor=None)
    kmp.pin_float32(model)
    assert [recomputes_gelu(layer) for layer in dense] == [ON_JAX] * 2
    fit_small_gpt2(model)
