"""kmp.islands.attend_causally: KerasHub's `TransformerDecoder` tells its
self-attention that the mask it builds is causal (what `kmp.pin_float32`
does on JAX): which layers change, which calls pass `use_causal_mask`,
`is_causal` reaching JAX's attention, the same values and gradients with
padding, generation, a `.keras` file without it and `kmp.load_model`
applying it again, and KerasHub's GPT-2 trained with it, and GPT-2 and
Llama in keras-io's NNX loop. The Llama family's and Gemma's decoders:
hub_attention_test.py."""

import functools

import keras
import keras_hub
import numpy as np
import pytest
from keras import ops
from util import fit_small_gpt2
from util import is_causal_calls
from util import loss_and_gradients
from util import nnx_only
from util import padded_tokens
from util import random_weights
from util import run_under_nnx
from util import small_gpt2_backbone

import kmp
from kmp import backend
from kmp.islands import attend_causally
from kmp.islands import attends_causally
from kmp.model_layers import all_layers

# What kmp.pin_float32 applies it on.
ON_JAX = backend.name() == "jax"
jax_only = pytest.mark.skipif(not ON_JAX, reason="pin_float32's JAX walk")


def numpy(x):
    return ops.convert_to_numpy(ops.cast(x, "float32"))


def decoders(model):
    return [
        layer
        for layer in all_layers(model)
        if type(layer) is keras_hub.layers.TransformerDecoder
    ]


def gpt2():
    """`small_gpt2_backbone` without dropout (Keras's fused attention
    path, the example's `--dropout=0`) under a causal LM head, with
    random weights."""
    keras.utils.set_random_seed(0)
    backbone = small_gpt2_backbone(dropout=0.0)
    model = keras_hub.models.GPT2CausalLM(backbone, preprocessor=None)
    return random_weights(model)


@pytest.fixture
def causal_flags(monkeypatch):
    """The `use_causal_mask` each Keras `_compute_attention` call gets,
    by layer name, in order."""
    seen = []
    stock = keras.layers.MultiHeadAttention._compute_attention

    @functools.wraps(stock)  # its signature: attend_causally reads it
    def spy(self, *args, **kwargs):
        seen.append((self.name, kwargs.get("use_causal_mask", False)))
        return stock(self, *args, **kwargs)

    monkeypatch.setattr(
        keras.layers.MultiHeadAttention, "_compute_attention", spy
    )
    return seen


def test_pin_float32_applies_it_to_keras_hub_s_decoders_only():
    kmp.enable("mixed_bfloat16")
    model = kmp.pin_float32(gpt2())
    assert [attends_causally(d) for d in decoders(model)] == [ON_JAX] * 2
    bert = keras_hub.models.BertBackbone(
        vocabulary_size=64,
        num_layers=1,
        num_heads=2,
        hidden_dim=32,
        intermediate_dim=64,
        max_sequence_length=16,
    )
    kmp.pin_float32(bert)  # encoders: bidirectional masks
    assert not any(attends_causally(layer) for layer in all_layers(bert))


def test_subclasses_other_wrappers_and_other_layers_keep_their_call():
    stock = keras_hub.layers.TransformerDecoder

    class Calls(stock):  # a call of its own, which may mask otherwise
        def call(self, decoder_sequence, encoder_sequence=None, **kwargs):
            return super().call(decoder_sequence, encoder_sequence, **kwargs)

    class Masks(stock):  # a mask of its own
        def _compute_self_attention_mask(self, *args, **kwargs):
            return super()._compute_self_attention_mask(*args, **kwargs)

    class Builds(stock):  # KerasHub's call and mask (Whisper's decoder)
        pass

    x = np.zeros((1, 4, 8), "float32")
    told = []
    for cls in (Calls, Masks, Builds):
        subclass = cls(intermediate_dim=8, num_heads=2)
        subclass(x)
        told.append(attend_causally(subclass))
    assert told == [False, False, True]
    wrapped = keras_hub.layers.TransformerDecoder(
        intermediate_dim=8, num_heads=2
    )
    wrapped(x)
    wrapped.call = wrapped.call  # someone else's instance call
    assert not attend_causally(wrapped)
    unbuilt = keras_hub.layers.TransformerDecoder(
        intermediate_dim=8, num_heads=2
    )
    assert not attend_causally(unbuilt)  # no self-attention yet
    assert not attend_causally(keras.layers.Dense(2))
    decoder = keras_hub.layers.TransformerDecoder(
        intermediate_dim=8, num_heads=2
    )
    decoder(x)
    assert attend_causally(decoder) and attend_causally(decoder)  # again
    assert attends_causally(decoder)
    del decoder.call
    assert not attends_causally(decoder)
    assert attend_causally(decoder)  # again after an undo
    attention = decoder._self_attention_layer
    del decoder.call
    attention._compute_attention = functools.partial(  # someone else's
        type(attention)._compute_attention, attention
    )
    assert not attend_causally(decoder)


def test_the_self_attention_is_told_in_causal_calls_only(causal_flags):
    x = np.random.default_rng(0).normal(size=(2, 5, 8)).astype("float32")
    memory = np.random.default_rng(1).normal(size=(2, 3, 8)).astype("float32")
    decoder = keras_hub.layers.TransformerDecoder(
        intermediate_dim=8, num_heads=2
    )
    decoder(x, memory)
    attend_causally(decoder)
    self_name = decoder._self_attention_layer.name
    cross_name = decoder._cross_attention_layer.name
    causal_flags.clear()
    decoder(x, memory)  # self-attention causal, cross-attention not
    assert causal_flags == [(self_name, True), (cross_name, False)]
    causal_flags.clear()
    decoder(x, memory, use_causal_mask=False)
    assert causal_flags == [(self_name, False), (cross_name, False)]
    causal_flags.clear()
    del decoder.call  # undone: the attention's wrapper adds nothing
    decoder(x, memory)
    assert causal_flags == [(self_name, False), (cross_name, False)]


@pytest.fixture
def is_causal_flags(monkeypatch):
    return is_causal_calls(monkeypatch)


@jax_only
def test_on_jax_the_attention_gets_is_causal_and_the_mask(is_causal_flags):
    kmp.enable("mixed_bfloat16")
    model = kmp.pin_float32(gpt2())
    model(padded_tokens())
    # Each block: Keras's fused path (dropout 0), the mask and is_causal.
    assert is_causal_flags == [(True, True)] * 2


@pytest.mark.parametrize(
    "policy, side",
    [
        ("float32", "right"),
        ("mixed_bfloat16", "right"),
        # Queries with no key to attend (the padded ones): the same
        # here, where XLA combines the two masks into the same one; on
        # cuDNN their rows differ (the module docstring), no other.
        ("float32", "left"),
    ],
)
def test_values_and_gradients_with_padding_are_keras_hub_s(policy, side):
    kmp.enable("mixed_bfloat16")
    model = gpt2()
    for decoder in decoders(model):
        assert attend_causally(decoder)
    if policy == "float32":
        for layer in all_layers(model):
            layer.dtype_policy = "float32"
    x = padded_tokens(side)
    got, forward = loss_and_gradients(model, x), numpy(model(x))
    for decoder in decoders(model):
        del decoder.call
    want = loss_and_gradients(model, x)
    np.testing.assert_allclose(numpy(model(x)), forward, rtol=0, atol=0)
    # The mask is causal already: the causal mask changes none of it.
    # The same arithmetic, so the same float32 values; bfloat16 to its
    # rounding, against the largest gradient.
    tolerance = 1e-6 if policy == "float32" else 1e-2
    np.testing.assert_allclose(got[0], want[0], rtol=tolerance)
    largest = max(np.abs(g).max() for g in want[1:])
    for a, b in zip(got[1:], want[1:]):
        np.testing.assert_allclose(a, b, rtol=0, atol=tolerance * largest)


def test_generation_with_a_cache_is_keras_hub_s(causal_flags):
    kmp.enable("mixed_bfloat16")
    model = gpt2()
    for decoder in decoders(model):
        attend_causally(decoder)
    x = padded_tokens()
    x["padding_mask"][:, 4:] = False  # a prompt of 4 tokens
    model.compile(sampler="greedy")
    got = model.generate(x, max_length=16, stop_token_ids=None)
    # KerasHub generates with a cache from the prompt's pass on: no call
    # is told (a cached step's mask is not the square causal one).
    assert causal_flags and not any(flag for _, flag in causal_flags)
    for decoder in decoders(model):
        del decoder.call
    model.compile(sampler="greedy")
    want = model.generate(x, max_length=16, stop_token_ids=None)
    np.testing.assert_array_equal(got["token_ids"], want["token_ids"])


def test_a_keras_file_does_not_keep_it_and_load_model_applies_it(tmp_path):
    kmp.enable("mixed_bfloat16")
    model = kmp.pin_float32(gpt2())
    x = padded_tokens()
    want = numpy(model(x))
    path = str(tmp_path / "causal.keras")
    model.save(path)
    stock = keras.saving.load_model(path)
    loaded = kmp.load_model(path)
    assert not any(attends_causally(d) for d in decoders(stock))
    assert [attends_causally(d) for d in decoders(loaded)] == [ON_JAX] * 2
    np.testing.assert_array_equal(numpy(loaded(x)), want)


@jax_only
def test_gpt2_trains_with_it():
    kmp.enable("mixed_bfloat16")
    model = keras_hub.models.GPT2CausalLM(
        small_gpt2_backbone(), preprocessor=None
    )
    kmp.pin_float32(model)
    assert [attends_causally(d) for d in decoders(model)] == [True] * 2
    fit_small_gpt2(model)


@nnx_only
@pytest.mark.parametrize(
    "name, flag",
    [("gpt2", "use_causal_mask"), ("llama", "is_causal")],
)
def test_keras_hub_s_decoders_train_in_keras_io_s_nnx_loop(
    name, flag, tmp_path_factory
):
    # nnx.grad runs a copy of the model, whose decoder's call closed
    # over the original: GPT-2's GELU raised Flax's TraceContextError,
    # and Llama's decoder weights got no gradient in 20 steps (loss
    # 3.706 against 3.693 in float32). Now as in float32, the copied
    # attention told by the copied decoder (Keras's `use_causal_mask`,
    # KerasHub's fused call's `is_causal`).
    result = run_under_nnx(name, tmp_path_factory)
    reference, pinned = result["float32"], result["mixed_bfloat16"]
    assert "error" not in pinned, pinned.get("error")
    assert pinned["attend_causally"] and not reference["attend_causally"]
    assert pinned[flag] == ["True"]
    for path, moved in reference["moved"].items():
        if moved > 1e-4:  # (GPT-2's key bias: the softmax ignores it)
            assert pinned["moved"][path] == pytest.approx(moved, rel=0.1)
    assert pinned["loss"] == pytest.approx(reference["loss"], abs=1e-3)
