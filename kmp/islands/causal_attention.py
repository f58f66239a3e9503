"""KerasHub's decoder self-attention told that its mask is causal, so
that a GPU's flash attention skips the masked half (JAX).

KerasHub's `TransformerDecoder` (GPT-2, OPT, Bart's and Whisper's
decoders) builds its self-attention mask itself, the causal mask and the
padding mask combined, and hands it to Keras's `MultiHeadAttention` as a
mask. Keras passes a mask to `ops.dot_product_attention` as it is, and on
a GPU cuDNN's flash attention then computes every block of the scores
and masks them (`mask_type` `NO_MASK`, the mask as a bias), though
half of them are masked for every example. Told `is_causal=True` as well
(Keras's `use_causal_mask`, which its `_compute_attention` takes with a
mask too), cuDNN's kernel skips the blocks above the diagonal (`mask_type`
`CAUSAL`) and still applies the mask within the others. On an H200
(2026-11-28, `benchmarks/lm_speed.py`) KerasHub's GPT-2 at width 1024,
batch 32 took 61.8 ms a step with the mask alone and 55.4 ms with
`is_causal` and no mask.

The values are the same: the mask given is causal already, so the
causal mask changes none of its entries (XLA's attention on a CPU, and
Keras's own path when it computes the scores, combine the two: the same
mask). One exception, on cuDNN only: a query that may attend no key at
all (with left padding, a padded position whose keys up to it are all
padding) gets what each kernel gives a row with nothing to attend, the
mean of the values over every key with the mask alone and over the keys
up to it with the causal type; no other position attends to a padded
one, so only the padded positions' outputs differ (their loss weight is
0 with KerasHub's preprocessors, which pad on the right anyway).
`attend_causally(decoder)` applies only where the mask is causal: an
exact `TransformerDecoder` called with `use_causal_mask=True` (its
default) and no cache (training, and a full sequence's forward pass),
whose self-attention is a Keras `MultiHeadAttention` running Keras's
`_compute_attention`; its cross-attention, an encoder's attention, a
call with a cache (generation's steps) and a call with
`use_causal_mask=False` keep their masks alone.

KerasHub's Llama family (Llama and Llama 3, Mistral, Qwen and Qwen2,
Qwen3, Qwen3-MoE, Qwen3.5's and Qwen3.5-MoE's full-attention layers,
Phi-3, SmolLM3, and Mixtral and GPT-NeoX) has decoders and attentions of
its own, and the same mask: each decoder builds the causal mask combined
with the padding (and Mistral's and Mixtral's sliding window) whenever
it has no cache, and its attention's `_compute_attention` runs on JAX
what KerasHub calls its fused branch, whole:

    mask = cast(expand_dims(attention_mask, 1), bool)
    return ops.dot_product_attention(
        query, key, value, mask=mask, scale=attention._inv_norm_factor)

(KerasHub takes it wherever `jax.nn.dot_product_attention` exists;
Mixtral's only on a GPU that supports it and without dropout,
GPT-NeoX's without dropout: `_GATES`, asked as KerasHub asks). In
those calls the attention runs that same call with `is_causal=True`
added, and KerasHub's own `_compute_attention` everywhere else. Compiled
for an H200 (`benchmarks/gpu_compile.py --programs llama`), KerasHub's
Llama at width 2048 then gets cuDNN's `CAUSAL` mask type instead of
`NO_MASK`, the same bytes outside the matmuls. `_FAMILY` lists the
decoders and `_FUSED_BRANCH` the attentions, by module and class name
(KerasHub exports neither), with a digest of each attention's
`_compute_attention` as kmp read it. A decoder or attention of another
class (a subclass included), and an attention whose method's code is
not the code read (a KerasHub that changed it), keep their masks alone.

How: an instance-level `call` on the decoder marks its calls that build
a causal mask, and an instance-level `_compute_attention` on its
self-attention adds `use_causal_mask=True` (Keras's attention) or
`is_causal=True` (the family's) inside them. `get_config` and
`.keras` files are unchanged; `kmp.pin_float32` applies it on JAX and
`kmp.load_model` again. `del decoder.call` undoes it (the attention's
wrapper then adds nothing, and applying it again reuses it).
"""

import ast
import contextvars
import functools
import hashlib
import inspect
import io
import re
import sys
import textwrap
import tokenize

import keras
from keras import ops

from kmp import backend

# The self-attention layer whose mask is causal in the decoder call now
# running, if any (set by the decoder's wrapper for the call only).
_CAUSAL = contextvars.ContextVar("kmp_causal_attention", default=None)

_HUB = "keras_hub.src.models."
# Most decoders': their attention's attribute, their cache argument.
_SELF = ("_self_attention_layer", "self_attention_cache")
# The Llama family's decoders (module docstring), by class: the attribute
# that holds the self-attention, and the call argument of its cache.
_FAMILY = {
    _HUB + "llama.llama_decoder.LlamaTransformerDecoder": _SELF,
    _HUB
    + "mistral.mistral_transformer_decoder.MistralTransformerDecoder": _SELF,
    _HUB + "qwen.qwen_decoder.QwenTransformerDecoder": _SELF,
    _HUB + "qwen3.qwen3_decoder.Qwen3TransformerDecoder": _SELF,
    _HUB + "qwen3_moe.qwen3_moe_decoder.Qwen3MoeTransformerDecoder": _SELF,
    _HUB + "qwen3_5.qwen3_5_decoder.Qwen3_5TransformerDecoder": _SELF,
    _HUB
    + "qwen3_5_moe.qwen3_5_moe_decoder.Qwen3_5MoeTransformerDecoder": _SELF,
    _HUB + "mixtral.mixtral_decoder.MixtralTransformerDecoder": _SELF,
    _HUB + "gpt_neo_x.gpt_neo_x_decoder.GPTNeoXDecoder": _SELF,
    _HUB + "phi3.phi3_decoder.Phi3Decoder": ("attention", "attention_cache"),
    _HUB + "smollm3.smollm3_layers.SmolLM3DecoderLayer": (
        "self_attn",
        "self_attention_cache",
    ),
}
# The attentions (exactly these classes) whose `_compute_attention` runs
# on JAX the fused call of the module docstring, each with the digests of
# that method's code in the KerasHub releases read (`_digest`): 0.32.0
# and keras-hub-nightly 0.33.0.dev202610250352 (the same). A
# KerasHub that changes the method (say, its fused call takes a sliding
# window) leaves the attention alone until the change is read.
_FUSED_BRANCH = {
    _HUB + name: digests
    for name, digests in (
        ("llama.llama_attention.LlamaAttention", {"841331709dae"}),
        ("mistral.mistral_attention.CachedMistralAttention", {"841331709dae"}),
        ("qwen.qwen_attention.QwenAttention", {"301f0c703a54"}),
        ("qwen3.qwen3_attention.Qwen3Attention", {"441ab2c8bc64"}),
        ("qwen3_moe.qwen3_moe_attention.Qwen3MoeAttention", {"441ab2c8bc64"}),
        ("qwen3_5.qwen3_5_attention.Qwen3_5Attention", {"1b1336d81bfb"}),
        ("phi3.phi3_attention.Phi3Attention", {"e63b90d112b7"}),
        ("smollm3.smollm3_layers.SmolLM3Attention", {"2fb1cebfecd7"}),
        ("mixtral.mixtral_attention.CachedMixtralAttention", {"8ee3bbda3ac6"}),
        ("gpt_neo_x.gpt_neo_x_attention.GPTNeoXAttention", {"2036f586d959"}),
    )
}
# The attentions that take the fused call only where a test of their own
# passes (the rest take it on JAX always): Mixtral's asks its
# `_use_fused_attention_op` (a GPU that supports it, dropout 0), GPT-NeoX's
# its dropout.
_GATES = {
    _HUB + "mixtral.mixtral_attention.CachedMixtralAttention": (
        lambda attention: attention._use_fused_attention_op()
    ),
    _HUB + "gpt_neo_x.gpt_neo_x_attention.GPTNeoXAttention": (
        lambda attention: attention.dropout == 0
    ),
}


def _name(obj):
    return f"{obj.__module__}.{obj.__qualname__}"


@functools.cache
def _digest(function):
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


def is_keras_hub_decoder(layer):
    """Whether `layer` is exactly KerasHub's `TransformerDecoder` (a
    subclass keeps its own call). KerasHub is not imported here: a model
    that has the layer has imported it."""
    keras_hub = sys.modules.get("keras_hub")
    cls = getattr(
        getattr(keras_hub, "layers", None), "TransformerDecoder", None
    )
    return cls is not None and type(layer) is cls


def is_causal_decoder(layer):
    """Whether `layer` is a decoder `attend_causally` knows: exactly
    KerasHub's `TransformerDecoder`, or exactly one of the Llama family's
    (module docstring)."""
    return is_keras_hub_decoder(layer) or _name(type(layer)) in _FAMILY


def attends_causally(layer):
    """Whether `attend_causally` has been applied to decoder `layer`: its
    `call` is the instance's own, kmp's wrapper."""
    own = vars(layer).get("call")
    return getattr(own, "_kmp_attends_causally", False)


def _hosts(decoder):
    """`(attention, causal, telling)` for a decoder `attend_causally` can
    change, else None: its self-attention, `causal(arguments)` (whether a
    call with those bound arguments builds a causal mask), and
    `telling(attention)`, the instance `_compute_attention` that adds the
    flag in those calls."""
    if is_keras_hub_decoder(decoder):
        attention = getattr(decoder, "_self_attention_layer", None)
        stock = keras.layers.MultiHeadAttention._compute_attention
        if (
            not isinstance(attention, keras.layers.MultiHeadAttention)
            or type(attention)._compute_attention is not stock
            or "use_causal_mask" not in inspect.signature(stock).parameters
        ):
            return None

        def causal(arguments):
            return (
                arguments.get("use_causal_mask", True) is True
                and arguments.get("self_attention_cache") is None
            )

        return attention, causal, _telling_keras
    attribute, cache = _FAMILY.get(_name(type(decoder)), (None, None))
    attention = getattr(decoder, attribute, None) if attribute else None
    compute = getattr(type(attention), "_compute_attention", None)
    # The class itself (a subclass may call it otherwise), its method as
    # read.
    if _digest(compute) not in _FUSED_BRANCH.get(_name(type(attention)), ()):
        return None

    def causal(arguments):
        return arguments.get(cache) is None

    return attention, causal, _telling_hub


def _telling_keras(attention):
    """Keras's `_compute_attention`, given `use_causal_mask=True` in a
    causal call of its decoder."""

    @functools.wraps(attention._compute_attention)
    def compute_attention(query, key, value, *args, **kwargs):
        if (
            _CAUSAL.get() is attention
            and query.shape[1] == key.shape[1]  # a square mask
            # Not given already (after attention_mask, training and
            # return_attention_scores, it is the fourth of `args`).
            and "use_causal_mask" not in kwargs
            and len(args) < 4
        ):
            kwargs["use_causal_mask"] = True
        # The class's `_compute_attention` as it is when the layer runs.
        return type(attention)._compute_attention(
            attention, query, key, value, *args, **kwargs
        )

    return compute_attention


def _telling_hub(attention):
    """The Llama family's `_compute_attention`: in a causal call of its
    decoder on JAX, its fused call with `is_causal=True` (the module
    docstring); KerasHub's own everywhere else."""

    gate = _GATES.get(_name(type(attention)), lambda attention: True)

    @functools.wraps(attention._compute_attention)
    def compute_attention(query, key, value, attention_mask=None, *a, **k):
        if (
            _CAUSAL.get() is attention
            and attention_mask is not None
            and query.shape[1] == key.shape[1]  # a square mask
            and backend.name() == "jax"
            and gate(attention)
        ):
            mask = ops.cast(ops.expand_dims(attention_mask, axis=1), "bool")
            return ops.dot_product_attention(
                query,
                key,
                value,
                mask=mask,
                scale=attention._inv_norm_factor,
                is_causal=True,
            )
        return type(attention)._compute_attention(
            attention, query, key, value, attention_mask, *a, **k
        )

    return compute_attention


def attend_causally(decoder):
    """Tells decoder `decoder`'s self-attention that the mask it builds
    is causal (module docstring).

    Applies to an exact KerasHub `TransformerDecoder` running its class's
    call, whose self-attention is a Keras `MultiHeadAttention` (KerasHub's
    cached subclass included) running Keras's `_compute_attention`, which
    takes `use_causal_mask`; and to an exact decoder of KerasHub's Llama
    family whose attention runs its class's `_compute_attention`.
    Applying it twice changes nothing.

    Args:
        decoder: A layer (see `is_causal_decoder`).

    Returns:
        Whether the decoder attends causally now.
    """
    if attends_causally(decoder):
        return True
    if "call" in vars(decoder):  # another wrapper: it would be bypassed
        return False
    hosts = _hosts(decoder)
    if hosts is None:
        return False
    attention, causal, telling = hosts
    own = vars(attention).get("_compute_attention")
    # Someone else's instance method; kmp's (left by an undo) is used
    # again.
    if not (own is None or getattr(own, "_kmp_causal_for", None) is True):
        return False
    stock_call = decoder.call
    signature = inspect.signature(stock_call)
    # A call that takes its cache in `**kwargs` (SmolLM3's).
    extra = [
        p.name
        for p in signature.parameters.values()
        if p.kind is inspect.Parameter.VAR_KEYWORD
    ]

    @functools.wraps(stock_call)
    def call(*args, **kwargs):
        arguments = dict(signature.bind(*args, **kwargs).arguments)
        for name in extra:
            arguments.update(arguments.pop(name, {}))
        token = _CAUSAL.set(attention if causal(arguments) else None)
        try:
            return stock_call(*args, **kwargs)
        finally:
            _CAUSAL.reset(token)

    call._kmp_attends_causally = True
    decoder.call = call
    if own is None:
        compute_attention = telling(attention)
        compute_attention._kmp_causal_for = True
        attention._compute_attention = compute_attention
    return True
