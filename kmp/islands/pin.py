"""Float32 islands: `kmp.pin_float32(model)`.

Mixed precision is safe only if the few numerically sensitive places stay
in float32. Keras already computes BatchNormalization, LayerNormalization,
GroupNormalization and RMSNormalization in float32, so kmp does not pin
them (on torch it computes BatchNormalization's float32 arithmetic in one
fused kernel instead of Keras's many: `batch_norm`). What it pins:

- Layers that produce model outputs get a float32 dtype policy (KerasHub
  idiom (a), `dtype="float32"`): the output is float32, and a softmax or
  sigmoid there computes in float32 and keeps Keras's link to its logits,
  which crossentropy uses. So does a softmax or sigmoid whose
  probabilities such an output passes on (a loss layer's input).
- Softmax, log-softmax and sigmoid layers inside the model, and the
  attention softmax of `MultiHeadAttention`, compute in float32 and hand
  the compute dtype to the next matmul (idiom (b), `kmp.layers`).
- Token ids declared as floats keep their values: a layer that would
  cast them to 16 bits before an embedding looks them up computes in
  float32 (`token_ids`).
- Keras's `Normalization` layers compute in float32, their statistics
  included, and so do its `Rescaling` layers of raw values, which they
  cast to the compute dtype before they scale them
  (`feature_normalization`).

And, not a float32 matter but a layer pinning already walks: on JAX,
KerasHub's `PositionEmbedding` repeats one example's embedding over the
batch (`position_embedding`), which spares a Transformer's activations
the batch-innermost layout XLA gives them on a GPU for the table's
gradient; and a `Dense`, `EinsumDense` or `Activation` layer's GELU
recomputes itself in the backward pass (`gelu`), which lets XLA fuse it
into the matmul before it on a GPU; and an attention's query, key and
value projections add their bias on the flat output (`einsum_bias`),
which XLA fuses into their matmul on a GPU; and KerasHub's
`TransformerDecoder` and the Llama family's and Gemma's decoders tell
their self-attention that the mask they build is causal
(`causal_attention`), so that a GPU's flash attention skips the masked
half of the scores, and their sliding window where cuDNN takes one
(`kmp.backend.causal_attention`), so that it skips the blocks below the
window too.
"""

import functools
from typing import Iterable

import keras

from kmp import backend
from kmp.errors import InputError
from kmp.islands import float32_layers
from kmp.islands.batch_norm import BatchNormalization
from kmp.islands.causal_attention import attend_causally
from kmp.islands.causal_attention import is_causal_decoder
from kmp.islands.einsum_bias import flatten_bias
from kmp.islands.feature_normalization import is_bfloat16_spectrogram
from kmp.islands.feature_normalization import is_feature_normalization
from kmp.islands.feature_normalization import is_rescaling
from kmp.islands.feature_normalization import normalize_in_float32
from kmp.islands.feature_normalization import rescale_in_float32
from kmp.islands.float32_outputs import casts_output
from kmp.islands.float32_outputs import is_sensitive
from kmp.islands.float32_outputs import return_float32
from kmp.islands.gelu import recompute_gelu
from kmp.islands.pin_mark import mark_pinned
from kmp.islands.position_embedding import broadcast_once
from kmp.islands.position_embedding import is_keras_hub_position_embedding
from kmp.islands.token_ids import float_ids
from kmp.layer_policies import float32_policy
from kmp.layer_policies import pin_to_float32
from kmp.layer_policies import record_policies
from kmp.model_layers import all_layers
from kmp.model_layers import check_patterns
from kmp.model_layers import fed_outputs
from kmp.model_layers import has_own_call
from kmp.model_layers import held_models
from kmp.model_layers import matches
from kmp.model_layers import nested_layers
from kmp.model_layers import output_feeders
from kmp.model_layers import output_layers
from kmp.model_layers import retrace_steps
from kmp.model_layers import swap_class
from kmp.policy import warn_if_reset

# Exact Keras classes and the kmp class that computes their sensitive part
# in float32. Subclasses written by users are left alone (pin them with
# `also=` instead), since swapping their class would drop their code.
_ISLAND_CLASSES = {
    keras.layers.Softmax: float32_layers.Float32Softmax,
    keras.layers.Activation: float32_layers.Float32Activation,
    keras.layers.MultiHeadAttention: float32_layers.MultiHeadAttention,
}


def pin_float32(
    model: keras.Model, also: Iterable[str | type] = ()
) -> keras.Model:
    """Keeps a mixed-precision model's numerically sensitive layers in
    float32.

    Call it after building the model under `kmp.enable(...)` and before
    `compile`; it changes the model in place and returns it. Variables keep
    their dtype (float32, or bfloat16 master weights: then a layer pinned
    to float32 gets `Float32Compute`, float32 compute over bfloat16
    variables, which a `.keras` file keeps), and everything not listed
    below keeps its policy.

    - Each layer that produces a model output gets `dtype_policy="float32"`
      (KerasHub idiom (a)): every output is float32, and an output softmax
      or sigmoid computes in float32 and keeps Keras's logits path, so
      crossentropy equals the float32 model's. When the output layer is a
      `Dense` with a fused softmax, its matmul runs in float32 too. An
      output layer with layers of its own computes in float32 whole
      where it holds a softmax, log-softmax or sigmoid (a head,
      `TimeDistributed(Dense(..., activation="softmax"))`); any other (a
      Transformer block returned beside the logits, as keras-io's
      miniature GPT does, an attention, a `Bidirectional` LSTM) keeps
      its 16 bits and returns float32 (`kmp.islands.float32_outputs`):
      by its policy alone its arithmetic would mix float32 with its
      layers' 16 bits, which TensorFlow refuses. So does an output that
      another layer of the model takes (a feature extractor's, which
      returns every layer's output), unless it ends in a softmax,
      log-softmax or sigmoid: by its policy the whole network would
      compute in float32. A layer ending in a softmax, log-softmax or
      sigmoid whose probabilities an output with no weights takes and
      passes on in float32 computes in float32 too, its matmul included
      (a loss layer's input: keras-io's captcha OCR's `Dense(softmax)`
      before its CTC layer, which takes the log of them).
    - Every other `Softmax` layer, `Activation` layer with softmax,
      log-softmax or sigmoid, and the attention softmax of each
      `MultiHeadAttention` computes in float32 and returns the compute
      dtype (idiom (b)), so the next matmul stays on tensor cores. They
      become the matching `kmp.layers` classes, which keep their weights
      and are restored from `.keras` files.
    - Token ids that a float input carries to an embedding (keras-io's
      `layers.Input(shape=(maxlen,))` before its
      `TokenAndPositionEmbedding`) stay exact: each layer on the way that
      would cast them to 16 bits (float16 holds integers exactly only up
      to 2048, bfloat16 up to 256) gets `dtype_policy="float32"`, when
      the table is larger than that. Declaring the input
      `dtype="int32"` is the better fix.
    - Each Keras `Normalization` layer (`(x - mean) / sqrt(variance)`
      on raw features) computes in float32 and returns float32, its mean
      and variance made again in float32: in float16 a variance over
      65504 is infinite, which zeroes that feature, and bfloat16 keeps
      8 significant bits of a raw input (`feature_normalization`;
      under a kmp policy `adapt` does this before it reads the data).
      Each Keras `Rescaling` of raw values (its input neither a 16-bit
      float nor an 8-bit integer) computes in float32 too: Keras casts
      its input to the compute dtype first, and a 16-bit image's 65535
      (`Rescaling(1 / 65535)`) is infinite in float16. So does each
      `STFTSpectrogram` under bfloat16, which it refuses.
    - Layers matched by `also` get `dtype_policy="float32"`, with the
      layers they hold.
    - Not a float32 matter, but on the same walk: on JAX each exact
      KerasHub `PositionEmbedding` repeats one example's embedding over
      the batch, so that in 16 bits its table's gradient is not a sum
      over the batch, for which XLA lays a Transformer's activations
      out batch-innermost on a GPU at a batch of 32 or more
      (`kmp.islands.position_embedding`; the same values); and each
      `Dense`, `EinsumDense` or `Activation` whose activation is a GELU
      recomputes it from its input in the backward pass, so that XLA
      fuses the GELU into the matmul before it on a GPU instead of
      writing its inner `tanh` for the backward pass
      (`kmp.islands.gelu`; the same values, to 16-bit rounding on a
      GPU); and each `EinsumDense` that projects to several axes with a
      bias over them (the query, key and value projections of
      `MultiHeadAttention`) adds its bias on the flattened output, which
      a GPU's matmul adds in its epilogue (`kmp.islands.einsum_bias`;
      the same values, to 16-bit rounding on a GPU); and each KerasHub
      `TransformerDecoder` (Whisper's included), and each decoder of
      KerasHub's Llama family (Llama, Mistral, Mixtral, Qwen, Qwen-MoE,
      Phi-3, SmolLM3, GPT-NeoX) and of Gemma (Gemma 1 to 4's text
      decoders), tells its self-attention that the mask it builds is causal
      (`is_causal` beside the mask), so that a GPU's flash attention
      skips the blocks the mask hides (`kmp.islands.causal_attention`,
      `kmp.islands.hub_attention`; the same values, but on cuDNN for a
      left-padded query with no key to attend), and Mistral's,
      Mixtral's and Gemma's tell cuDNN their sliding window too, where
      it takes one (cuDNN 9.10.2 or later; `kmp.backend.causal_attention`).

    BatchNormalization, LayerNormalization, GroupNormalization and
    RMSNormalization keep their policy: Keras computes them in float32
    already. On torch each exact `BatchNormalization` becomes
    `kmp.layers.BatchNormalization`, the same float32 arithmetic in one
    fused kernel (eager torch runs each of Keras's ops, and each of their
    gradients, as a kernel of its own). For subclassed models, the
    outputs are not recorded by Keras, so output layers are not pinned
    (the inner softmaxes are): the model's outputs are cast to float32
    on the way out (`kmp.islands.float32_outputs`), and `kmp.audit`
    reports a fused softmax its layers compute in 16 bits, which may be
    what it returns (give that layer `dtype="float32"` or name it in
    `also`).
    One not built yet is pinned again once Keras builds it, for the
    layers it makes in `build` (keras-io's Perceiver). A subclassed
    model with no `call` of its own that holds Functional or Sequential
    models (keras-io's VAE's `encoder` and `decoder`, a GAN's
    `discriminator` and `generator`) trains them: each is pinned as a
    model of its own, its outputs float32, since its train step's loss
    reads them. Calling `pin_float32` again changes nothing; under a
    float32 global policy it does nothing. A Functional model's
    symbolic `model.outputs` (and its `compute_output_spec`) keep the
    dtype Keras recorded when it built them, float16; the model returns
    float32, and a `.keras` file of it loads with float32 outputs.

    Args:
        model: A Keras model (Sequential, Functional or subclassed), built
            or not.
        also: Extra layers to run entirely in float32: layer classes, or
            regular expressions matched against a layer's `path` or `name`.

    Returns:
        The same model.

    Example:

    ```python
    kmp.enable("mixed_float16")
    model = kmp.pin_float32(build_model())
    model.compile(optimizer=kmp.wrap("adam"), loss="categorical_crossentropy")
    ```
    """
    if not isinstance(model, keras.layers.Layer):
        raise InputError(
            f"pin_float32 expects a Keras model or layer, got {model!r}."
        )
    also = check_patterns(also)
    if _float32_only(all_layers(model)):
        warn_if_reset("pin_float32")  # built in float32 after kmp.enable
        return model
    _pin(model, also)
    # A model that ran already has its steps traced unpinned: on JAX and
    # TensorFlow `predict` went on returning float16 after pinning.
    retrace_steps(model)
    return model


def _float32_only(layers) -> bool:
    """Under a float32 global policy, no layer computes in 16 bits: there
    is nothing to pin."""
    return keras.config.dtype_policy().compute_dtype == "float32" and not any(
        layer.compute_dtype != "float32" for layer in layers
    )


def _pin(model, also):
    """`pin_float32`'s work, which leaves the model's traced steps be:
    pinned as Keras builds it, it may be inside the trace of one."""
    for _, inner in held_models(model):
        # A trainer's models (keras-io's VAE's decoder, a GAN's
        # generator): their outputs are what its train step's loss reads.
        pin_float32(inner, also=also)
    layers = all_layers(model)
    if _float32_only(layers):
        return
    outputs = output_layers(model)  # None for a subclassed model
    for layer in layers:
        # A layer not built yet may make its layers in `build` (keras-io's
        # Perceiver): the model, or a layer of the user's in it.
        subclassed = layer is model and outputs is None
        if not layer.built and (subclassed or backend.is_users(type(layer))):
            _pin_again_when_built(layer, also)

    pinned = []  # what a .keras file must keep in float32
    cast = []  # outputs of layers of layers in 16 bits: float32_outputs
    if outputs is None and has_own_call(model):
        # A subclassed model records no output layers: its outputs are
        # cast, as a nested one's (a float16 output crashed TensorFlow's
        # top-k metrics in keras-io's Perceiver, Keras's policy alike).
        cast.append(model)
    fed = fed_outputs(model)
    for layer in outputs or []:
        if casts_output(layer, fed):
            cast.append(layer)
        else:
            pinned += _pin_whole(layer)
    pinned_ids = {id(each) for each in pinned}
    for layer, output in output_feeders(model):
        # Probabilities that an output with no weights passes on in
        # float32: a loss layer's (keras-io's captcha OCR's CTC reads the
        # log of its float16 softmax, whose gradient took the loss scale
        # down to 64; 512 computed in float32), a `Reshape`'s. Not those
        # an output's matmul reads as features (a hidden sigmoid before
        # the head), nor those an output of 16 bits takes (cast on the
        # way out): it would only cast them back.
        # (Built: an unbuilt Sequential's Dense has no weights yet.)
        passes_on = id(output) in pinned_ids  # a layer (an op is none)
        passes_on = passes_on and output.built and not output.weights
        if passes_on and id(layer) not in pinned_ids and is_sensitive(layer):
            whole = _pin_whole(layer)
            pinned += whole
            pinned_ids.update(map(id, whole))
    # Left alone below: an output that now computes in float32 (one whose
    # outputs are only cast goes on, its attention to be pinned).
    output_ids = pinned_ids
    for ids in float_ids(model):
        if ids.rounded:
            for layer in ids.casts:
                pin_to_float32(layer)
                pinned.append(layer)
    for layer in layers:
        # Before the policy branches: how the layer runs, whatever its
        # policy (JAX's program only; elsewhere it would be the same
        # broadcast and the same GELU).
        if backend.name() == "jax":
            if is_keras_hub_position_embedding(layer):
                broadcast_once(layer)
            if is_causal_decoder(layer):
                attend_causally(layer)
            flatten_bias(layer)  # first: the GELU's wrapper runs it
            recompute_gelu(layer)
        if is_feature_normalization(layer):
            # An output's too: pinned above, its statistics still 16-bit.
            normalize_in_float32(layer)
            pinned.append(layer)
            continue
        if id(layer) in output_ids:
            continue
        if also and matches(layer, also):
            whole = _pin_whole(layer)
            pinned += whole
            output_ids.update(map(id, whole))
            continue
        if is_rescaling(layer):
            if rescale_in_float32(layer):
                pinned.append(layer)
            continue
        if is_bfloat16_spectrogram(layer):
            pin_to_float32(layer)
            pinned.append(layer)
            continue
        if type(layer) is keras.layers.BatchNormalization:
            if backend.name() == "torch":
                swap_class(layer, BatchNormalization)
            continue
        island = _ISLAND_CLASSES.get(type(layer))
        if island is None:
            pinned += _pin_subclassed_attention(layer)
            continue
        activation = island is float32_layers.Float32Activation
        if activation and not is_sensitive(layer):
            continue
        swap_class(layer, island)
        softmax = getattr(layer, "_softmax", None)  # an attention's
        pinned.append(layer if softmax is None else softmax)
    for layer in cast:
        # Last: it wraps the call the walk gave the layer (a decoder's
        # `attend_causally`, which stands aside for another's wrapper).
        return_float32(layer)
    if isinstance(model, keras.Model):
        # A pinned layer that another layer's code makes is rebuilt
        # unpinned on load, unless its policy is in that layer's config:
        # there it computes in float32 and returns float32 (idiom (a)).
        record_policies(
            model, {layer: float32_policy(layer) for layer in pinned}
        )
        # For what no config keeps (`pin_mark`). The models it holds are
        # pinned too, and may be saved on their own (keras-io's
        # pretraining saves its encoder).
        for layer in layers:
            if isinstance(layer, keras.Model):
                mark_pinned(layer)


def _pin_again_when_built(model, also) -> None:
    """Has an unbuilt subclassed model, or a layer of the user's, pinned
    again, once, right after Keras builds it (its first call, or
    `fit`'s): one that makes its layers in `build` (keras-io's
    Perceiver) has none to pin before, and pinning said nothing
    (helper, 2026-11-30: its float16 logits and attention softmax as
    under Keras's own policy). A layer it makes there that makes its
    own in its `build` is found then, and waits for its own build."""
    build = model.build
    if getattr(build, "_kmp_pins_when_built", False):
        return

    @functools.wraps(build)
    def build_then_pin(*args, **kwargs):
        build(*args, **kwargs)  # a build that raises keeps the wrapper
        model.build = build  # once: Keras's build as it was
        _pin(model, also)

    build_then_pin._kmp_pins_when_built = True
    model.build = build_then_pin


def _pin_whole(layer) -> list:
    """Pins `layer` and the layers it holds (by its policy alone, a layer
    of layers would mix float32 with its layers' 16 bits); returns them."""
    whole = [layer, *nested_layers(layer)]
    for each in whole:
        pin_to_float32(each)
    return whole


def _pin_subclassed_attention(layer) -> list:
    """A built `MultiHeadAttention` subclass keeps its class (its code
    would be lost); its attention softmax, a Keras `Softmax` it built,
    becomes a `Float32Softmax`. Returns the softmax pinned, if any."""
    if not isinstance(layer, keras.layers.MultiHeadAttention) or isinstance(
        layer, float32_layers.MultiHeadAttention
    ):
        return []
    softmax = getattr(layer, "_softmax", None)
    if type(softmax) is keras.layers.Softmax:
        swap_class(softmax, float32_layers.Float32Softmax)
    if isinstance(softmax, float32_layers.Float32Softmax):
        return [softmax]
    return []
