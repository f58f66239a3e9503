"""Float32 islands: `kmp.pin_float32(model)` and the layers it puts in.

    float32_layers  `Float32Softmax`, `Float32Activation`,
                    `MultiHeadAttention`: Keras layers whose sensitive
                    part computes in float32 (kmp.layers)
    batch_norm      `BatchNormalization`: Keras's, its float32
                    statistics in one fused kernel on torch (kmp.layers)
    position_embedding  `broadcast_once`: KerasHub's `PositionEmbedding`
                    repeating one example's embedding over the batch,
                    so that XLA keeps a GPU's activations batch-major
    gelu            `recompute_gelu`: a layer's GELU recomputed in the
                    backward pass, which XLA fuses into the matmul
                    before it on a GPU
    einsum_bias     `flatten_bias`: an `EinsumDense`'s bias over several
                    output axes added on the flat output, which XLA
                    fuses into the matmul on a GPU
    hub_attention   KerasHub's own decoders and attentions (the Llama
                    family, Gemma): when their mask is causal, and
                    their fused call told so
    causal_attention  `attend_causally`: KerasHub's decoder self-attention
                    (its `TransformerDecoder`'s, hub_attention's) told
                    its mask is causal, so that a GPU's flash attention
                    skips the masked half
    token_ids       `float_ids`: float inputs whose token ids a 16-bit
                    cast rounds before an embedding looks them up
    feature_normalization  Keras's `Normalization` in float32, its
                    statistics included, from its `adapt` on under a
                    16-bit kmp policy; a `Rescaling` of raw values
                    in float32
    float32_outputs  a model output that a layer of layers produces,
                    in float32: the layer whole where it holds
                    probabilities, its outputs cast otherwise; what
                    counts as sensitive
    pin_mark        `kmp.pin_float32`'s mark in a `.keras` file: the
                    saved model was pinned
    pin             `kmp.pin_float32`: outputs float32, inner softmaxes
                    and sigmoids float32 inside, float token ids kept
                    exact, Normalization and Rescaling layers in
                    float32,
                    KerasHub's position embeddings broadcast
                    once, GELUs recomputed, projections' biases
                    flattened, decoders' masks known causal

Imports from kmp: backend, errors, layer_policies, model_layers,
policy.
"""

from kmp.islands.batch_norm import BatchNormalization
from kmp.islands.causal_attention import attend_causally
from kmp.islands.causal_attention import attends_causally
from kmp.islands.einsum_bias import flatten_bias
from kmp.islands.einsum_bias import flattens_bias
from kmp.islands.feature_normalization import input_dtypes
from kmp.islands.feature_normalization import is_bfloat16_spectrogram
from kmp.islands.feature_normalization import is_feature_normalization
from kmp.islands.feature_normalization import is_rescaling
from kmp.islands.feature_normalization import largest_statistic
from kmp.islands.feature_normalization import normalize_in_float32
from kmp.islands.feature_normalization import reads_raw_values
from kmp.islands.float32_layers import Float32Activation
from kmp.islands.float32_layers import Float32Softmax
from kmp.islands.float32_layers import MultiHeadAttention
from kmp.islands.float32_outputs import activation_name
from kmp.islands.float32_outputs import casts_output
from kmp.islands.float32_outputs import holds_probabilities
from kmp.islands.float32_outputs import is_sensitive
from kmp.islands.float32_outputs import returns_float32
from kmp.islands.gelu import is_gelu
from kmp.islands.gelu import recompute_gelu
from kmp.islands.gelu import recomputes_gelu
from kmp.islands.pin import pin_float32
from kmp.islands.pin_mark import mark_pinned
from kmp.islands.pin_mark import pinned_in
from kmp.islands.position_embedding import broadcast_once
from kmp.islands.position_embedding import broadcasts_once
from kmp.islands.token_ids import EXACT_UP_TO
from kmp.islands.token_ids import FloatIds
from kmp.islands.token_ids import float_ids

__all__ = [
    "BatchNormalization",
    "EXACT_UP_TO",
    "Float32Activation",
    "Float32Softmax",
    "FloatIds",
    "MultiHeadAttention",
    "activation_name",
    "attend_causally",
    "attends_causally",
    "broadcast_once",
    "broadcasts_once",
    "flatten_bias",
    "flattens_bias",
    "float_ids",
    "holds_probabilities",
    "input_dtypes",
    "is_bfloat16_spectrogram",
    "is_feature_normalization",
    "is_rescaling",
    "is_gelu",
    "is_sensitive",
    "largest_statistic",
    "normalize_in_float32",
    "reads_raw_values",
    "pin_float32",
    "mark_pinned",
    "pinned_in",
    "recompute_gelu",
    "recomputes_gelu",
    "returns_float32",
    "casts_output",
]
