"""KerasHub's own decoders and attentions that `attend_causally` tells
(JAX): the Llama family and Gemma, when their mask is causal, and their
fused call with `is_causal=True`.

KerasHub's Llama family (Llama and Llama 3, Mistral, Qwen and Qwen2,
Qwen3, Qwen3-MoE, Qwen3.5's and Qwen3.5-MoE's full-attention layers,
Phi-3, SmolLM3, and Mixtral, Qwen-MoE and GPT-NeoX) and Gemma (Gemma
and Gemma 2, Gemma 3's and Gemma 4's text decoders) have decoders and
attentions of their own. Each decoder builds the causal mask combined
with the padding (and a sliding window: Mistral's, Mixtral's and Gemma
4's) whenever it has no cache, and its attention's `_compute_attention`
runs on JAX what KerasHub calls its fused branch:

    query, key, value, mask, scale = operands(attention, ...)
    mask = cast(expand_dims(mask, 1), bool)
    return ops.dot_product_attention(
        query, key, value, mask=mask, scale=scale)

The operands are the attention's own, except: the Llama family's scale
is the layer's `_inv_norm_factor`; Gemma's (and Gemma 3's) is `1 /
sqrt(head_dim)` or `1 / sqrt(hidden_dim // num_query_heads)` as its
`query_head_dim_normalize` says, and its sliding window is cut into the
mask there (`_mask_sliding_window`); Gemma 4's is 1 (its query and key
are normalized) and its key and value are repeated to the query's heads.
In a causal call of its decoder the attention makes that call with
`is_causal=True` added (the mask stays: padding, and a window, within
the causal blocks) through `kmp.backend.causal_attention`, which tells
cuDNN the decoder's sliding window too where cuDNN takes one (`DECODERS`
says each decoder's), and KerasHub's own `_compute_attention` runs
everywhere else: in the decoder's other calls, and where the fused
branch would not run. KerasHub takes it on JAX wherever
`jax.nn.dot_product_attention` exists for most of the family; Mixtral,
Qwen-MoE and every Gemma only where their `_use_fused_attention_op()`
says (a GPU that supports it, or a TPU; no dropout), GPT-NeoX without
dropout (`GATES`). Qwen-MoE's method passes any further keyword
arguments to the fused call; a call that gets some keeps KerasHub's
path. Gemma 2's logit soft cap keeps KerasHub's own path: a GPU never
takes the fused call with it, and a TPU's kernel was not read.

A causal call: one without a cache, at the sequence's start (a cache
index of 0 or None: past it, the mask is shifted, each token seeing as
many ahead; no KerasHub task calls so); for Gemma 3 and 4 also without a
vision mask (image tokens attend each other both ways) and not an
embedding model's (`use_bidirectional_attention`). `DECODERS` lists the
decoders and `ATTENTIONS` the attentions, by module and class name
(KerasHub exports neither), with a digest of each attention's
`_compute_attention` as kmp read it. A decoder or attention of another
class (a subclass included), and an attention whose method's code is
not the code read (a KerasHub that changed it), keep their masks alone.
"""

import ast
import functools
import hashlib
import inspect
import io
import re
import textwrap
import tokenize

import numpy as np
from keras import ops

from kmp import backend

_HUB = "keras_hub.src.models."


def at_start(index):
    """Whether a decoder call's cache index (None, KerasHub's default, or
    a number) is the sequence's start: the causal mask it builds is
    shifted by the index, so a call at 2 without a cache lets each token
    see two ahead. A tensor index is not read (generation's, which
    always comes with a cache)."""
    return index is None or (type(index) is int and index == 0)


def _without(cache):
    """A decoder call's test: whether it builds a causal mask, that is,
    runs without its cache argument `cache` (whose index argument is
    named after it) at the sequence's start."""

    def causal(decoder, arguments):
        return arguments.get(cache) is None and at_start(
            arguments.get(cache + "_update_index")
        )

    return causal


_no_cache = _without("cache")  # Gemma's


def _text(decoder, arguments):
    """Gemma 3's and 4's test: no cache, at the start, no vision mask,
    and causal at all (not an embedding model's bidirectional mask)."""
    return (
        _no_cache(decoder, arguments)
        and arguments.get("vision_mask") is None
        and getattr(decoder, "use_bidirectional_attention", None) is False
    )


def _no_window(decoder):
    return None


def _decoder_window(decoder):
    """Mistral's and Mixtral's window, cut into the mask by the decoder
    (None: none)."""
    return decoder.sliding_window


def _attention_window(decoder):
    """Gemma's and Gemma 3's window, cut into the mask by the attention
    where it has one."""
    attention = decoder.attention
    windowed = attention.use_sliding_window_attention
    return attention.sliding_window_size if windowed else None


def _gemma4_window(decoder):
    """Gemma 4's, cut into the mask by the decoder in its local layers."""
    local = decoder.use_sliding_window_attention
    local = local and not decoder.is_global_attention
    return decoder.attention.sliding_window_size if local else None


# Most decoders': their attention's attribute, their call's test, their
# window.
_SELF = ("_self_attention_layer", _without("self_attention_cache"), _no_window)
_WINDOWED = (*_SELF[:2], _decoder_window)
# The decoders, by class: the attribute that holds the self-attention,
# whether a call (its bound arguments) builds a causal mask, and the
# sliding window cut into that mask (how many keys each query sees, or
# None), which `kmp.backend.causal_attention` tells cuDNN.
DECODERS = {
    _HUB + name: host
    for name, host in (
        ("llama.llama_decoder.LlamaTransformerDecoder", _SELF),
        (
            "mistral.mistral_transformer_decoder.MistralTransformerDecoder",
            _WINDOWED,
        ),
        ("qwen.qwen_decoder.QwenTransformerDecoder", _SELF),
        ("qwen3.qwen3_decoder.Qwen3TransformerDecoder", _SELF),
        ("qwen3_moe.qwen3_moe_decoder.Qwen3MoeTransformerDecoder", _SELF),
        ("qwen3_5.qwen3_5_decoder.Qwen3_5TransformerDecoder", _SELF),
        (
            "qwen3_5_moe.qwen3_5_moe_decoder.Qwen3_5MoeTransformerDecoder",
            _SELF,
        ),
        ("mixtral.mixtral_decoder.MixtralTransformerDecoder", _WINDOWED),
        ("qwen_moe.qwen_moe_decoder.QwenMoeTransformerDecoder", _SELF),
        ("gpt_neo_x.gpt_neo_x_decoder.GPTNeoXDecoder", _SELF),
        (
            "phi3.phi3_decoder.Phi3Decoder",
            ("attention", _without("attention_cache"), _no_window),
        ),
        (
            "smollm3.smollm3_layers.SmolLM3DecoderLayer",
            ("self_attn", _without("self_attention_cache"), _no_window),
        ),
        (
            "gemma.gemma_decoder_block.GemmaDecoderBlock",
            ("attention", _no_cache, _attention_window),
        ),
        (
            "gemma3.gemma3_decoder_block.Gemma3DecoderBlock",
            ("attention", _text, _attention_window),
        ),
        (
            "gemma4.gemma4_decoder_block.Gemma4TextDecoderBlock",
            ("attention", _text, _gemma4_window),
        ),
    )
}


def _llama(attention, query, key, value, mask, arguments):
    return query, key, value, mask, attention._inv_norm_factor


def _qwen_moe(attention, query, key, value, mask, arguments):
    if arguments.get("kwargs"):  # passed on to the fused call as well
        return None
    return _llama(attention, query, key, value, mask, arguments)


def _gemma(attention, query, key, value, mask, arguments):
    if attention.use_sliding_window_attention:
        mask = attention._mask_sliding_window(
            mask, cache_update_index=arguments.get("cache_update_index", 0)
        )
    if attention.query_head_dim_normalize:
        scale = 1 / np.sqrt(attention.head_dim)
    else:
        scale = 1 / np.sqrt(attention.hidden_dim // attention.num_query_heads)
    return query, key, value, mask, scale


def _gemma4(attention, query, key, value, mask, arguments):
    groups = attention.num_key_value_groups
    if groups > 1:
        key = ops.repeat(key, repeats=groups, axis=2)
        value = ops.repeat(value, repeats=groups, axis=2)
    return query, key, value, mask, 1.0


# The attentions (exactly these classes) whose `_compute_attention` runs
# the fused call of the module docstring, each with its operands (a
# function that may say None: KerasHub's path) and the digests of that
# method's code in the KerasHub releases read (`digest`): 0.32.0 and
# keras-hub-nightly 0.33.0.dev202610250352 (the same). A KerasHub that
# changes the method (say, its fused call takes a sliding window) leaves
# the attention alone until the change is read.
ATTENTIONS = {
    _HUB + name: (operands, digests)
    for name, operands, digests in (
        ("llama.llama_attention.LlamaAttention", _llama, {"841331709dae"}),
        (
            "mistral.mistral_attention.CachedMistralAttention",
            _llama,
            {"841331709dae"},
        ),
        ("qwen.qwen_attention.QwenAttention", _llama, {"301f0c703a54"}),
        ("qwen3.qwen3_attention.Qwen3Attention", _llama, {"441ab2c8bc64"}),
        (
            "qwen3_moe.qwen3_moe_attention.Qwen3MoeAttention",
            _llama,
            {"441ab2c8bc64"},
        ),
        (
            "qwen3_5.qwen3_5_attention.Qwen3_5Attention",
            _llama,
            {"1b1336d81bfb"},
        ),
        ("phi3.phi3_attention.Phi3Attention", _llama, {"e63b90d112b7"}),
        ("smollm3.smollm3_layers.SmolLM3Attention", _llama, {"2fb1cebfecd7"}),
        (
            "mixtral.mixtral_attention.CachedMixtralAttention",
            _llama,
            {"8ee3bbda3ac6"},
        ),
        (
            "qwen_moe.qwen_moe_attention.QwenMoeAttention",
            _qwen_moe,
            {"d1fab5c04def"},
        ),
        (
            "gpt_neo_x.gpt_neo_x_attention.GPTNeoXAttention",
            _llama,
            {"2036f586d959"},
        ),
        (
            "gemma.gemma_attention.CachedGemmaAttention",
            _gemma,
            {"549507998050"},
        ),
        (
            "gemma3.gemma3_attention.CachedGemma3Attention",
            _gemma,
            {"57931310aeb7"},
        ),
        (
            "gemma4.gemma4_attention.Gemma4TextAttention",
            _gemma4,
            {"74cf662f929b"},
        ),
    )
}


def _fused_and_uncapped(attention):
    return attention._use_fused_attention_op() and not attention.logit_soft_cap


# The attentions that take the fused call only where a test of their own
# passes (the rest take it on JAX always): Mixtral's, Qwen-MoE's and
# Gemma's ask their `_use_fused_attention_op` (a GPU that supports it or
# a TPU, dropout 0), Gemma's without a soft cap too; GPT-NeoX's its
# dropout.
GATES = {
    **{
        _HUB + name: lambda attention: attention._use_fused_attention_op()
        for name in (
            "mixtral.mixtral_attention.CachedMixtralAttention",
            "qwen_moe.qwen_moe_attention.QwenMoeAttention",
        )
    },
    _HUB + "gpt_neo_x.gpt_neo_x_attention.GPTNeoXAttention": (
        lambda attention: attention.dropout == 0
    ),
    **{
        _HUB + name: _fused_and_uncapped
        for name in (
            "gemma.gemma_attention.CachedGemmaAttention",
            "gemma3.gemma3_attention.CachedGemma3Attention",
            "gemma4.gemma4_attention.Gemma4TextAttention",
        )
    },
}


def name(obj):
    """`obj`'s module and qualified name: the tables' keys."""
    return f"{obj.__module__}.{obj.__qualname__}"


@functools.cache
def digest(function):
    """A short hash of `function`'s code: its source without docstring,
    comments or whitespace (so the same on every Python that reads the
    file), or None where its source cannot be read."""
    try:
        source = textwrap.dedent(inspect.getsource(function))
        first = ast.parse(source).body[0].body[0]
    except (OSError, TypeError, SyntaxError, AttributeError, IndexError):
        return None  # no source, or not a `def` (a lambda, say)
    lines = source.splitlines()
    if isinstance(getattr(first, "value", None), ast.Constant) and (
        isinstance(first.value.value, str)
    ):
        for number in range(first.lineno, first.end_lineno + 1):
            lines[number - 1] = ""
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            row, column = token.start
            lines[row - 1] = lines[row - 1][:column]
    code = re.sub(r"\s+", "", "".join(lines))
    return hashlib.sha256(code.encode()).hexdigest()[:12]


def host(decoder):
    """`(attention, causal, window)` for a decoder of `DECODERS` whose
    attention is one of `ATTENTIONS` running the method read, else None:
    `causal(decoder, arguments)` says whether a call of the decoder with
    those bound arguments builds a causal mask, and `window(decoder)`
    the sliding window cut into it (None: none); each is given the
    decoder running (an NNX transform's copy, `kmp.backend.layer_call`)."""
    attribute, test, window = DECODERS.get(
        name(type(decoder)), (None, None, None)
    )
    attention = getattr(decoder, attribute, None) if attribute else None
    compute = getattr(type(attention), "_compute_attention", None)
    # The class itself (a subclass may call it otherwise), its method as
    # read.
    _, digests = ATTENTIONS.get(name(type(attention)), (None, ()))
    if digest(compute) not in digests:
        return None
    return attention, test, window


def telling(attention, causal_window):
    """The instance `_compute_attention` for `attention` (one of
    `ATTENTIONS`): in a causal call of its decoder, on JAX, where the
    attention's gate passes, its fused call with `is_causal=True` and
    the decoder's sliding window told to cuDNN where it takes it (the
    module docstring); KerasHub's own everywhere else.
    `causal_window(attention)`, given the attention running (an NNX
    transform's copy, `kmp.backend.layer_call`), says None outside a
    causal call, else `(window,)` (None: no window)."""
    cls = type(attention)
    operands, _ = ATTENTIONS[name(cls)]
    gate = GATES.get(name(cls), _open)
    signature = inspect.signature(cls._compute_attention)
    return backend.layer_call(
        attention,
        _compute_telling,
        operands,
        gate,
        signature,
        causal_window,
        method="_compute_attention",
    )


def _open(attention):
    return True


def _compute_telling(
    attention,
    operands,
    gate,
    signature,
    causal_window,
    query,
    key,
    value,
    attention_mask=None,
    *a,
    **k,
):
    told = causal_window(attention)
    if (
        told is not None
        and attention_mask is not None
        and query.shape[1] == key.shape[1]  # a square mask
        and backend.name() == "jax"
        and gate(attention)
    ):
        arguments = signature.bind(
            attention, query, key, value, attention_mask, *a, **k
        ).arguments
        fused = operands(
            attention, query, key, value, attention_mask, arguments
        )
        if fused is not None:
            query, key, value, mask, scale = fused
            mask = ops.cast(ops.expand_dims(mask, axis=1), "bool")
            return backend.causal_attention(
                query, key, value, mask, scale, told[0]
            )
    # The class's `_compute_attention` as it is when the layer runs.
    return type(attention)._compute_attention(
        attention, query, key, value, attention_mask, *a, **k
    )
