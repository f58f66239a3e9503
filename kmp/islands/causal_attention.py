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
`attend_causally(decoder)` applies only where the mask is causal: a
`TransformerDecoder` whose call and mask are KerasHub's (the class
itself, or a subclass that overrides neither, as Whisper's decoder,
which changes only its attention layers' class) called with
`use_causal_mask=True` (its default) and no cache (training, and a full
sequence's forward pass),
whose self-attention is a Keras `MultiHeadAttention` running Keras's
`_compute_attention`; its cross-attention, an encoder's attention, a
call with a cache (generation's steps) and a call with
`use_causal_mask=False` keep their masks alone.

KerasHub's Llama family and Gemma have decoders and attentions of their
own, and the same mask; in their causal calls their attention makes
KerasHub's own fused call with `is_causal=True` added
(`kmp.islands.hub_attention`, which lists them). Compiled for an H200
(`benchmarks/gpu_compile.py --programs llama,gemma`), KerasHub's Llama
at width 2048 and Gemma 3 in its 1B shape then get cuDNN's `CAUSAL`
mask type instead of `NO_MASK`, the same bytes outside the matmuls.

How: an instance-level `call` on the decoder marks its calls that build
a causal mask, and an instance-level `_compute_attention` on its
self-attention adds `use_causal_mask=True` (Keras's attention) or
`is_causal=True` (KerasHub's own attentions) inside them. Both run on
the layer running them (`kmp.backend.layer_call`): under Keras's NNX
mode, a transform's copies of the decoder and its attention, the copy
told by the copied decoder. `get_config` and `.keras` files are
unchanged; `kmp.pin_float32` applies it on JAX
and `kmp.load_model` again. `del decoder.call` undoes it (the attention's
wrapper then adds nothing, and applying it again reuses it).
"""

import contextvars
import inspect
import sys

import keras

from kmp import backend
from kmp.islands import hub_attention

# The self-attention layer whose mask is causal in the decoder call now
# running and the sliding window cut into that mask (None: none), as
# `(attention, window)`, if any (set by the decoder's wrapper for the
# call only).
_CAUSAL = contextvars.ContextVar("kmp_causal_attention", default=None)


def _causal_window(attention):
    """None outside a causal call of `attention`'s decoder, else
    `(window,)`: `attention` is the one running, compared with the one
    the decoder running told (NNX's transforms run copies of both)."""
    told = _CAUSAL.get()
    if told is None or told[0] is not attention:
        return None
    return told[1:]


def is_keras_hub_decoder(layer):
    """Whether `layer` is KerasHub's `TransformerDecoder` running its
    class's `call` and `_compute_self_attention_mask`: the class itself,
    or a subclass that overrides neither (Whisper's decoder changes its
    `build`); a subclass with a call or mask of its own (Moonshine's) is
    not. KerasHub is not imported here: a model that has the layer has
    imported it."""
    keras_hub = sys.modules.get("keras_hub")
    cls = getattr(
        getattr(keras_hub, "layers", None), "TransformerDecoder", None
    )
    return (
        cls is not None
        and isinstance(layer, cls)
        and type(layer).call is cls.call
        and type(layer)._compute_self_attention_mask
        is cls._compute_self_attention_mask
    )


def is_causal_decoder(layer):
    """Whether `layer` is a decoder `attend_causally` knows: KerasHub's
    `TransformerDecoder` (`is_keras_hub_decoder`), or exactly one of the
    Llama family's or Gemma's (`hub_attention.DECODERS`)."""
    return (
        is_keras_hub_decoder(layer)
        or hub_attention.name(type(layer)) in hub_attention.DECODERS
    )


def attends_causally(layer):
    """Whether `attend_causally` has been applied to decoder `layer`: its
    `call` is the instance's own, kmp's wrapper."""
    own = vars(layer).get("call")
    return getattr(own, "_kmp_attends_causally", False)


def _hosts(decoder):
    """`(attention, causal, window, telling)` for a decoder
    `attend_causally` can change, else None: its self-attention,
    `causal(decoder, arguments)` (whether a call with those bound
    arguments builds a causal mask), `window(decoder)` (the sliding
    window cut into it), and `telling(attention, causal_window)`, the
    instance `_compute_attention` that adds the flag in those calls.
    Each is given the layer running (`kmp.backend.layer_call`)."""
    if is_keras_hub_decoder(decoder):
        attention = getattr(decoder, "_self_attention_layer", None)
        stock = keras.layers.MultiHeadAttention._compute_attention
        if (
            not isinstance(attention, keras.layers.MultiHeadAttention)
            or type(attention)._compute_attention is not stock
            or "use_causal_mask" not in inspect.signature(stock).parameters
        ):
            return None
        return attention, _keras_causal, _no_window, _telling_keras
    hosted = hub_attention.host(decoder)
    if hosted is None:
        return None
    return (*hosted, hub_attention.telling)


def _keras_causal(decoder, arguments):
    return (
        arguments.get("use_causal_mask", True) is True
        # (With a cache index and no cache, KerasHub's attention raises.)
        and arguments.get("self_attention_cache") is None
    )


def _no_window(decoder):
    return None


def _telling_keras(attention, causal_window):
    """Keras's `_compute_attention`, given `use_causal_mask=True` in a
    causal call of its decoder."""
    return backend.layer_call(
        attention,
        _compute_telling_keras,
        causal_window,
        method="_compute_attention",
    )


def _compute_telling_keras(
    attention, causal_window, query, key, value, *args, **kwargs
):
    if (
        causal_window(attention) is not None
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


def attend_causally(decoder):
    """Tells decoder `decoder`'s self-attention that the mask it builds
    is causal (module docstring).

    Applies to a KerasHub `TransformerDecoder` running that class's call
    and mask (`is_keras_hub_decoder`), whose self-attention is a Keras
    `MultiHeadAttention` (KerasHub's cached subclasses included) running
    Keras's `_compute_attention`, which takes `use_causal_mask`; and to
    an exact decoder of KerasHub's Llama family or Gemma whose attention
    runs its class's `_compute_attention` (`hub_attention`).
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
    attention, causal, window, telling = hosts
    own = vars(attention).get("_compute_attention")
    # Someone else's instance method; kmp's (left by an undo) is used
    # again.
    if not (own is None or getattr(own, "_kmp_causal_for", None) is True):
        return False
    signature = inspect.signature(decoder.call)
    # A call that takes its cache in `**kwargs` (SmolLM3's).
    extra = tuple(
        p.name
        for p in signature.parameters.values()
        if p.kind is inspect.Parameter.VAR_KEYWORD
    )
    # On the decoder and attention running, an NNX transform's copies
    # too (`kmp.backend.layer_call`), which `_causal_window` compares.
    call = backend.layer_call(
        decoder,
        _call_telling,
        attention,
        causal,
        window,
        signature,
        extra,
    )
    call._kmp_attends_causally = True
    decoder.call = call
    if own is None:
        compute_attention = telling(attention, _causal_window)
        compute_attention._kmp_causal_for = True
        attention._compute_attention = compute_attention
    return True


def _call_telling(
    decoder, attention, causal, window, signature, extra, *args, **kwargs
):
    """The decoder's class's call, telling `attention` whether its mask
    is causal (`_CAUSAL`) while it runs."""
    arguments = dict(signature.bind(*args, **kwargs).arguments)
    for name in extra:
        arguments.update(arguments.pop(name, {}))
    told = (attention, window(decoder)) if causal(decoder, arguments) else None
    token = _CAUSAL.set(told)
    try:
        return type(decoder).call(decoder, *args, **kwargs)
    finally:
        _CAUSAL.reset(token)
