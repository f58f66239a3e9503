"""kmp.islands.hub_attention, through `attend_causally`: the Llama
family's and Gemma's decoders tell their attention that the mask they
build is causal (`is_causal` beside the mask in KerasHub's fused call):
each family's values and gradients with its own scale and window,
`is_causal` reaching JAX's attention, generation, a `.keras` file, the
gates and the calls that are left alone."""

import functools

import keras
import keras_hub
import numpy as np
import pytest
from keras import ops
from util import is_causal_calls
from util import loss_and_gradients
from util import padded_tokens
from util import random_weights
from util import window_calls

import kmp
from kmp import backend
from kmp.islands import attend_causally
from kmp.islands import attends_causally
from kmp.islands import causal_attention
from kmp.islands import hub_attention
from kmp.model_layers import all_layers

# What kmp.pin_float32 applies it on.
jax_only = pytest.mark.skipif(
    backend.name() != "jax", reason="pin_float32's JAX walk"
)


def numpy(x):
    return ops.convert_to_numpy(ops.cast(x, "float32"))


@pytest.fixture
def is_causal_flags(monkeypatch):
    return is_causal_calls(monkeypatch)


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
    # Their fused call only on a GPU or a TPU (the tests open their gate).
    "MixtralBackbone": {**GROUPED, "num_experts": 2, "top_k": 1},
    "QwenMoeBackbone": {
        **GROUPED,
        "moe_intermediate_dim": 32,
        "shared_expert_intermediate_dim": 32,
        "num_experts": 2,
        "top_k": 1,
    },
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
    # Gemma's fused call only on a GPU or a TPU (the tests open its
    # gate). A head narrower than hidden_dim / num_query_heads (the value
    # test has Gemma take its scale from the latter: a call with the
    # default 1/sqrt(head_dim) would differ).
    "GemmaBackbone": {**GROUPED, "head_dim": 8},
    # Gemma 2's sliding window, cut into the mask in the attention: 4
    # tokens of 16.
    "Gemma2": {
        **GROUPED,
        "head_dim": 16,
        "use_sliding_window_attention": True,
        "sliding_window_size": 4,
    },
    "Gemma3Backbone": {
        **GROUPED,
        "head_dim": 16,
        "image_size": 16,
        "use_sliding_window_attention": True,
        "sliding_window_size": 4,
    },
    # Its window is in the decoder's mask; its key and value repeated.
    "Gemma4Backbone": {
        **GROUPED,
        "head_dim": 16,
        "image_size": 16,
        "sliding_window_size": 4,
    },
}
# The backbone class of a name that is a config, not a class.
CLASS = {"Gemma2": "GemmaBackbone"}


def family_backbone(name, **changes):
    keras.utils.set_random_seed(0)
    arguments = {**SMALL, **FAMILY[name], **changes}
    if "moe_intermediate_dim" in arguments and "Qwen3_5" in name:
        del arguments["intermediate_dim"]  # experts' widths only
    backbone = getattr(keras_hub.models, CLASS.get(name, name))(**arguments)
    return random_weights(backbone)


def inputs(name, side="right"):
    """`padded_tokens(side)`, with the positions Gemma 4 takes too."""
    x = padded_tokens(side)
    if name == "Gemma4Backbone":
        x["position_ids"] = np.tile(np.arange(16, dtype="int32"), (2, 1))
    return x


def told(model):
    return [layer for layer in all_layers(model) if attends_causally(layer)]


def set_gates(monkeypatch, fused):
    """Mixtral's, Qwen-MoE's and Gemma's attentions asking their own test
    of the device (`_use_fused_attention_op`) and hearing `fused`."""
    from keras_hub.src.models.gemma import gemma_attention
    from keras_hub.src.models.gemma3 import gemma3_attention
    from keras_hub.src.models.gemma4 import gemma4_attention
    from keras_hub.src.models.mixtral import mixtral_attention
    from keras_hub.src.models.qwen_moe import qwen_moe_attention

    for cls in (
        mixtral_attention.CachedMixtralAttention,
        qwen_moe_attention.QwenMoeAttention,
        gemma_attention.CachedGemmaAttention,
        gemma3_attention.CachedGemma3Attention,
        gemma4_attention.Gemma4TextAttention,
    ):
        monkeypatch.setattr(cls, "_use_fused_attention_op", lambda self: fused)


@pytest.fixture
def gates_open(monkeypatch):
    """Those attentions taking their fused call on this CPU, as on a GPU
    (KerasHub's own test of the device says no here)."""
    set_gates(monkeypatch, True)


@jax_only
@pytest.mark.parametrize("name", list(FAMILY))
def test_each_family_keeps_its_values_and_gets_is_causal(
    name, is_causal_flags, gates_open
):
    kmp.enable("mixed_bfloat16")
    backbone = family_backbone(name)
    for layer in all_layers(backbone):  # float32 arithmetic: exact
        layer.dtype_policy = "float32"
    kmp.pin_float32(backbone)
    decoders = told(backbone)
    assert len(decoders) == 1
    for decoder in decoders:
        attention = hub_attention.host(decoder)[0]
        # Not the default 1/sqrt(head_dim), which a call without the
        # layer's scale would get right too.
        if hasattr(attention, "_inv_norm_factor"):  # the Llama family's
            attention._inv_norm_factor = 0.3
        if hasattr(attention, "query_head_dim_normalize"):  # Gemma's
            attention.query_head_dim_normalize = False
    # Left padding: queries with no key to attend (see the GPT-2 test).
    x = inputs(name, "left")
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


# Each family's windows, decoder by decoder (FAMILY's configs: 4 keys of
# the 16 tokens; Mixtral's 512 by default and a window of 16 are not
# shorter than the tokens: nothing to skip): what cuDNN is told. Gemma
# 2's global layers are the odd ones, Gemma 3's each sixth, Gemma 4's as
# its pattern says.
WINDOWS = [
    ("MistralBackbone", {}, [4]),
    ("MistralBackbone", {"sliding_window": 15}, [15]),
    ("MistralBackbone", {"sliding_window": 16}, [None]),
    ("MistralBackbone", {"sliding_window": None}, [None]),
    ("MixtralBackbone", {"sliding_window": 4}, [4]),
    ("MixtralBackbone", {}, [None]),
    ("Gemma2", {"num_layers": 2}, [4, None]),
    ("Gemma3Backbone", {"num_layers": 6}, [4] * 5 + [None]),
    ("Gemma3Backbone", {"use_sliding_window_attention": False}, [None]),
    (
        "Gemma4Backbone",
        {"num_layers": 2, "sliding_window_pattern": 2},
        [4, None],
    ),
    (
        "Gemma4Backbone",
        {"num_layers": 2, "use_sliding_window_attention": False},
        [None, None],
    ),
    ("LlamaBackbone", {}, [None]),
]


@jax_only
@pytest.mark.parametrize("name, changes, want", WINDOWS)
def test_windowed_families_tell_cudnn_their_window(
    name, changes, want, gates_open, monkeypatch
):
    # As on a GPU whose cuDNN takes a window (kmp.backend.attention),
    # with JAX's own attention standing in for cuDNN's on this CPU.
    from kmp.backend import attention

    monkeypatch.setattr(attention, "_takes_window", lambda *args: True)
    monkeypatch.setattr(attention, "IMPLEMENTATION", "xla")
    windows = window_calls(monkeypatch)
    kmp.enable("mixed_bfloat16")
    backbone = family_backbone(name, **changes)
    for layer in all_layers(backbone):  # float32 arithmetic: exact
        layer.dtype_policy = "float32"
    kmp.pin_float32(backbone)
    decoders = told(backbone)
    assert len(decoders) == len(want)
    x = inputs(name, "left")
    got = loss_and_gradients(backbone, x)
    # Each pass's calls (the loss's and the gradients'), decoder by
    # decoder.
    told_windows = [None if w is None else (w - 1, 0) for w in want]
    passes = len(windows) // len(want)
    assert passes and windows == told_windows * passes
    windows.clear()
    for decoder in decoders:
        del decoder.call
    want_values = loss_and_gradients(backbone, x)
    assert set(windows) == {None}  # KerasHub's own call
    # The window is in KerasHub's mask already: the same values.
    for a, b in zip(got, want_values):
        np.testing.assert_array_equal(a, b)


@jax_only
@pytest.mark.parametrize(
    # Four names of the cache argument: `self_attention_cache`,
    # `attention_cache`, `self_attention_cache` in `**kwargs` and `cache`.
    "name",
    ["LlamaBackbone", "Phi3Backbone", "SmolLM3Backbone", "GemmaBackbone"],
)
def test_generation_is_keras_hub_s_and_told_nothing(
    name, is_causal_flags, gates_open
):
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
    [
        ("MixtralBackbone", {}),
        ("Gemma3Backbone", {}),
        ("GPTNeoXBackbone", {"dropout": 0.1}),
    ],
)
def test_a_closed_gate_leaves_keras_hub_s_attention(
    name, changes, is_causal_flags, monkeypatch
):
    # Mixtral's and Gemma 3's test of the device saying no (as on a CPU,
    # or with dropout), GPT-NeoX with dropout: KerasHub computes the
    # scores itself, and kmp's wrapper calls it.
    set_gates(monkeypatch, False)
    kmp.enable("mixed_bfloat16")
    backbone = family_backbone(name, **changes)
    kmp.pin_float32(backbone)
    (decoder,) = told(backbone)
    x = inputs(name, "left")
    got = numpy(backbone(x))
    del decoder.call
    np.testing.assert_array_equal(got, numpy(backbone(x)))
    assert not is_causal_flags  # no fused call either time


@jax_only
def test_qwen_moe_s_further_arguments_keep_keras_hub_s_path(
    is_causal_flags, gates_open
):
    # Its method passes keyword arguments it does not name on to the
    # fused call: kmp's call would drop them.
    kmp.enable("mixed_bfloat16")
    (decoder,) = told(kmp.pin_float32(family_backbone("QwenMoeBackbone")))
    attention = decoder._self_attention_layer
    told_call = attention._compute_attention
    x = np.ones((2, 4, 2, 16), "float32")
    mask = np.tril(np.ones((2, 4, 4), bool))
    token = causal_attention._CAUSAL.set((attention, None))  # a causal call
    try:
        told_call(x, x, x, mask)
        told_call(x, x, x, mask, is_causal=False)
    finally:
        causal_attention._CAUSAL.reset(token)
    assert is_causal_flags == [(True, True), (False, True)]


@jax_only
def test_a_call_past_the_start_without_a_cache_is_not_told(
    is_causal_flags, gates_open
):
    # Its causal mask is shifted by the index: each token sees two ahead.
    kmp.enable("mixed_bfloat16")
    (decoder,) = told(kmp.pin_float32(family_backbone("GemmaBackbone")))
    x = np.random.default_rng(0).normal(size=(2, 5, 32)).astype("float32")
    decoder(x)
    assert is_causal_flags == [(True, True)]
    is_causal_flags.clear()
    got = numpy(decoder(x, cache_update_index=2))
    assert is_causal_flags == [(False, True)]  # KerasHub's own call
    del decoder.call
    np.testing.assert_array_equal(got, numpy(decoder(x, cache_update_index=2)))


@jax_only
def test_gemma_2_s_soft_cap_keeps_keras_hub_s_path(gates_open):
    # A GPU never takes Gemma's fused call with a soft cap (KerasHub's
    # test, which the fixture opened, asks for a TPU's): kmp's gate
    # closes, whatever that test says.
    kmp.enable("mixed_bfloat16")
    backbone = family_backbone("Gemma2", attention_logit_soft_cap=50.0)
    kmp.pin_float32(backbone)
    (decoder,) = told(backbone)
    attention = hub_attention.host(decoder)[0]
    gate = hub_attention.GATES[hub_attention.name(type(attention))]
    assert attention._use_fused_attention_op() and not gate(attention)
    attention.logit_soft_cap = None
    assert gate(attention)


@jax_only
def test_gemma_3_s_and_4_s_causal_calls_are_text_ones(
    is_causal_flags, gates_open
):
    # Image tokens attend each other both ways, and an embedding model's
    # tokens all others: neither mask is causal.
    kmp.enable("mixed_bfloat16")
    for name in ("Gemma3Backbone", "Gemma4Backbone"):
        (decoder,) = told(kmp.pin_float32(family_backbone(name)))
        _, causal, _ = hub_attention.host(decoder)
        assert causal(decoder, {"cache": None})
        assert not causal(decoder, {"cache": np.zeros(1)})
        assert not causal(decoder, {"vision_mask": np.zeros(1)})
        decoder.use_bidirectional_attention = True
        assert not causal(decoder, {"cache": None})
    embedding = family_backbone(
        "Gemma3Backbone", use_bidirectional_attention=True
    )
    (decoder,) = told(kmp.pin_float32(embedding))
    embedding(padded_tokens())
    assert set(is_causal_flags) == {(False, True)}  # KerasHub's own call


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
