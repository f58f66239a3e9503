"""kmp.islands.attend_causally: KerasHub's `TransformerDecoder` tells its
self-attention that the mask it builds is causal (what `kmp.pin_float32`
does on JAX): which layers change, which calls pass `use_causal_mask`,
`is_causal` reaching JAX's attention, the same values and gradients with
padding, generation, a `.keras` file without it and `kmp.load_model`
applying it again, and KerasHub's GPT-2 trained with it; then the Llama
family's decoders (`is_causal` beside the mask in their fused call): each
family's values and gradients, generation, a `.keras` file and what is
left alone."""

import functools

import keras
import keras_hub
import numpy as np
import pytest
from keras import ops
from util import fit_small_gpt2
from util import loss_and_gradients
from util import random_weights
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


def padded_tokens(side="right"):
    """Two sequences of 16 tokens, the second padded after 10 (or, on
    the left, before 6)."""
    ids = np.random.default_rng(0).integers(1, 64, (2, 16)).astype("int32")
    mask = np.ones((2, 16), bool)
    if side == "right":
        mask[1, 10:] = False
    else:
        mask[1, :6] = False
    return {"token_ids": ids, "padding_mask": mask}


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
    class Decoder(keras_hub.layers.TransformerDecoder):
        pass

    x = np.zeros((1, 4, 8), "float32")
    subclass = Decoder(intermediate_dim=8, num_heads=2)
    subclass(x)
    assert not attend_causally(subclass)
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
    """The `is_causal` each `jax.nn.dot_product_attention` call gets, and
    whether it got a mask, in order (what Keras's JAX attention calls)."""
    import jax

    calls = []
    stock = jax.nn.dot_product_attention

    def spy(*args, **kwargs):
        calls.append((kwargs.get("is_causal"), kwargs.get("mask") is not None))
        return stock(*args, **kwargs)

    monkeypatch.setattr(jax.nn, "dot_product_attention", spy)
    return calls


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


# ------------------------------------------------------- the Llama family

SMALL = {"vocabulary_size": 64, "hidden_dim": 32, "intermediate_dim": 64}
GROUPED = {"num_layers": 1, "num_query_heads": 2, "num_key_value_heads": 1}
# Each backbone of the family (module docstring) from a small config, with
# one attention decoder: its arguments besides SMALL.
FAMILY = {
    # Llama 3's and Qwen2's backbones build these two's decoders and
    # attentions (the same classes: the census counts them).
    "LlamaBackbone": GROUPED,
    "MistralBackbone": {**GROUPED, "sliding_window": 4},
    "QwenBackbone": GROUPED,
    "Qwen3Backbone": {**GROUPED, "head_dim": 16},
    "Qwen3MoeBackbone": {
        **GROUPED,
        "head_dim": 16,
        "num_experts": 2,
        "top_k": 1,
        "moe_intermediate_dim": 32,
    },
    "Qwen3_5Backbone": {
        **GROUPED,
        "head_dim": 16,
        "layer_types": ["full_attention"],
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 2,
        "linear_key_head_dim": 8,
        "linear_value_head_dim": 8,
    },
    "Qwen3_5MoeBackbone": {
        **GROUPED,
        "head_dim": 16,
        "layer_types": ["full_attention"],
        "moe_intermediate_dim": 32,
        "shared_expert_intermediate_size": 32,
        "num_experts": 2,
        "top_k": 1,
    },
    "Phi3Backbone": {**GROUPED, "max_sequence_length": 32},
    # Its fused call only on a GPU (the test opens its gate).
    "MixtralBackbone": {**GROUPED, "num_experts": 2, "top_k": 1},
    # Its fused call only without dropout (its default).
    "GPTNeoXBackbone": {
        "num_layers": 1,
        "num_heads": 2,
        "max_sequence_length": 32,
    },
    "SmolLM3Backbone": {
        "num_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "rope_layer_enabled_list": [True],
        "layer_types": ["attention"],
        "mlp_bias": False,
        "layer_norm_epsilon": 1e-6,
        "max_position_embeddings": 64,
        "rope_theta": 10000.0,
        "partial_rotary_factor": 1.0,
    },
}


# The attribute holding each family's self-attention (its decoder's).
FAMILY_ATTENTION = {
    name: "attention"
    if name == "Phi3Backbone"
    else "self_attn"
    if name == "SmolLM3Backbone"
    else "_self_attention_layer"
    for name in FAMILY
}


def family_backbone(name):
    keras.utils.set_random_seed(0)
    arguments = {**SMALL, **FAMILY[name]}
    if "moe_intermediate_dim" in arguments and "Qwen3_5" in name:
        del arguments["intermediate_dim"]  # experts' widths only
    backbone = getattr(keras_hub.models, name)(**arguments)
    return random_weights(backbone)


def told(model):
    return [layer for layer in all_layers(model) if attends_causally(layer)]


@pytest.fixture
def mixtral_fused(monkeypatch):
    """Mixtral's attention taking its fused call on this CPU, as on a GPU
    (KerasHub's own test of the device says no here)."""
    from keras_hub.src.models.mixtral import mixtral_attention

    cls = mixtral_attention.CachedMixtralAttention
    monkeypatch.setattr(cls, "_use_fused_attention_op", lambda self: True)


@jax_only
@pytest.mark.parametrize("name", list(FAMILY))
def test_each_family_keeps_its_values_and_gets_is_causal(
    name, is_causal_flags, mixtral_fused
):
    kmp.enable("mixed_bfloat16")
    backbone = family_backbone(name)
    for layer in all_layers(backbone):  # float32 arithmetic: exact
        layer.dtype_policy = "float32"
    kmp.pin_float32(backbone)
    decoders = told(backbone)
    assert len(decoders) == 1
    for decoder in decoders:
        # Not the default 1/sqrt(head_dim), which a call without the
        # layer's scale would get right too.
        vars(decoder)[FAMILY_ATTENTION[name]]._inv_norm_factor = 0.3
    # Left padding: queries with no key to attend (see the GPT-2 test).
    x = padded_tokens("left")
    got = loss_and_gradients(backbone, x)
    assert set(is_causal_flags) == {(True, True)}
    is_causal_flags.clear()
    for decoder in decoders:
        del decoder.call
    want = loss_and_gradients(backbone, x)
    assert set(is_causal_flags) == {(False, True)}  # KerasHub's own call
    # The same arithmetic on the same mask: the same float32 values.
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


@jax_only
@pytest.mark.parametrize(
    # Three names of the cache argument: `self_attention_cache`,
    # `attention_cache` and `self_attention_cache` in `**kwargs`.
    "name",
    ["LlamaBackbone", "Phi3Backbone", "SmolLM3Backbone"],
)
def test_generation_is_keras_hub_s_and_told_nothing(name, is_causal_flags):
    kmp.enable("mixed_bfloat16")
    task = getattr(keras_hub.models, name.replace("Backbone", "CausalLM"))
    model = task(family_backbone(name), preprocessor=None)
    kmp.pin_float32(model)
    assert len(told(model)) == 1
    x = padded_tokens()
    x["padding_mask"][:, 4:] = False  # a prompt of 4 tokens
    model.compile(sampler="greedy")
    is_causal_flags.clear()
    got = model.generate(x, max_length=12, stop_token_ids=None)
    # Every step of generation has a cache (the prompt's pass included):
    # no call is told.
    assert is_causal_flags and not any(c for c, _ in is_causal_flags)
    (decoder,) = told(model)
    del decoder.call
    model.compile(sampler="greedy")
    want = model.generate(x, max_length=12, stop_token_ids=None)
    np.testing.assert_array_equal(got["token_ids"], want["token_ids"])


@jax_only
def test_llama_s_file_comes_back_told(tmp_path):
    kmp.enable("mixed_bfloat16")
    model = keras_hub.models.LlamaCausalLM(
        family_backbone("LlamaBackbone"), preprocessor=None
    )
    kmp.pin_float32(model)
    x = padded_tokens()
    want = numpy(model(x))
    path = str(tmp_path / "llama.keras")
    model.save(path)
    assert not told(keras.saving.load_model(path))
    loaded = kmp.load_model(path)
    assert len(told(loaded)) == 1
    np.testing.assert_array_equal(numpy(loaded(x)), want)


@jax_only
@pytest.mark.parametrize(
    "name, changes",
    [("MixtralBackbone", {}), ("GPTNeoXBackbone", {"dropout": 0.1})],
)
def test_a_closed_gate_leaves_keras_hub_s_attention(
    name, changes, is_causal_flags
):
    # Mixtral on a CPU, GPT-NeoX with dropout: KerasHub computes the
    # scores itself, and kmp's wrapper calls it.
    kmp.enable("mixed_bfloat16")
    keras.utils.set_random_seed(0)
    backbone = getattr(keras_hub.models, name)(
        **SMALL, **FAMILY[name], **changes
    )
    random_weights(backbone)
    kmp.pin_float32(backbone)
    (decoder,) = told(backbone)
    x = padded_tokens("left")
    got = numpy(backbone(x))
    del decoder.call
    np.testing.assert_array_equal(got, numpy(backbone(x)))
    assert not is_causal_flags  # no fused call either time


def test_the_family_s_subclasses_and_other_wrappers_are_left_alone():
    backbone = family_backbone("LlamaBackbone")
    (decoder,) = [
        layer
        for layer in all_layers(backbone)
        if type(layer).__name__ == "LlamaTransformerDecoder"
    ]
    attention = decoder._self_attention_layer

    class Attention(type(attention)):
        def _compute_attention(self, *args, **kwargs):
            return super()._compute_attention(*args, **kwargs)

    stock = type(attention)
    attention.__class__ = Attention  # a method of its own
    assert not attend_causally(decoder)
    attention.__class__ = stock
    assert attend_causally(decoder) and attends_causally(decoder)
    del decoder.call
    assert attend_causally(decoder)  # again after an undo
    del decoder.call
    attention._compute_attention = functools.partial(  # someone else's
        stock._compute_attention, attention
    )
    assert not attend_causally(decoder)

    class Decoder(type(decoder)):
        pass

    decoder.__class__ = Decoder  # not in the family's list
    del attention._compute_attention
    assert not attend_causally(decoder)
    decoder.__class__ = Decoder.__mro__[1]

    class Calls(stock):  # a call of its own, which may mask otherwise
        def call(self, *args, **kwargs):
            return super().call(*args, **kwargs)

    attention.__class__ = Calls
    assert not attend_causally(decoder)
    attention.__class__ = stock

    def rewritten(self, query, key, value, attention_mask=None):
        # KerasHub's method changed (a window in its fused call, say).
        return stock_compute(self, query, key, value, attention_mask)

    stock_compute = stock._compute_attention
    stock._compute_attention = rewritten
    try:
        assert not attend_causally(decoder)
    finally:
        stock._compute_attention = stock_compute
    assert attend_causally(decoder)
    # Qwen3.5's linear-attention decoders: the family's class, no
    # self-attention (built, not run: its scan compiles slowly).
    arguments = dict(FAMILY["Qwen3_5Backbone"])
    arguments["layer_types"] = ["linear_attention"]
    linear = keras_hub.models.Qwen3_5Backbone(**SMALL, **arguments)
    assert not any(attend_causally(layer) for layer in all_layers(linear))
