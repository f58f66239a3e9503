"""Which KerasHub backbones `kmp.pin_float32` changes on JAX for a GPU.

    KERAS_BACKEND=jax python benchmarks/keras_hub_islands.py

On JAX, pinning makes four kinds of layer run differently, with the
same values: KerasHub's `PositionEmbedding` repeats one example's
embedding over the batch (`kmp.islands.broadcast_once`), a layer's GELU
recomputes itself in the backward pass (`recompute_gelu`), an
`EinsumDense` projecting to several axes adds its bias flat
(`flatten_bias`), and KerasHub's `TransformerDecoder` and the Llama
family's and Gemma's decoders tell their self-attention that its mask
is causal (`attend_causally`). They are
Keras's and KerasHub's layers, so they reach the models built from them
and only those. This script builds each
KerasHub backbone that builds from a vocabulary size, widths and a
layer count, whatever it names them (the text and audio ones; a
multimodal one's text backbone), with 2 layers (an encoder-decoder's 2
of each), under `mixed_bfloat16`, pins it and counts
the layers of each kind pinning changed. No timing: which layers change
is the same on any machine. `tests/model_zoo_test.py` checks values and
gradients on eight of them.
"""

import argparse
import os

os.environ.setdefault("KERAS_BACKEND", "jax")

import common  # noqa: E402
import keras  # noqa: E402
import keras_hub  # noqa: E402

import kmp  # noqa: E402
from kmp.model_layers import all_layers  # noqa: E402

SMALL = {
    "vocabulary_size": 64,
    "num_layers": 2,
    "hidden_dim": 32,
    "intermediate_dim": 64,
}
HEADS = {"num_heads": 2}
POSITIONS = {"num_heads": 2, "max_sequence_length": 32}
GROUPED = {"num_query_heads": 2, "num_key_value_heads": 1}
EXPERTS = {"num_experts": 2, "top_k": 1}
# Each backbone's arguments besides SMALL.
BACKBONES = {
    "AlbertBackbone": {**POSITIONS, "embedding_dim": 32, "num_groups": 1},
    "BartBackbone": POSITIONS,
    "BertBackbone": POSITIONS,
    "BloomBackbone": HEADS,
    "DebertaV3Backbone": POSITIONS,
    "DistilBertBackbone": POSITIONS,
    "ESMBackbone": POSITIONS,
    "ESM2Backbone": POSITIONS,
    "FNetBackbone": {"max_sequence_length": 32},
    "FalconBackbone": {"num_attention_heads": 2},
    "GPT2Backbone": POSITIONS,
    "GPTNeoXBackbone": POSITIONS,
    "GemmaBackbone": {**GROUPED, "head_dim": 16},
    # Their text backbones (no vision encoder).
    "Gemma3Backbone": {**GROUPED, "head_dim": 16, "image_size": 16},
    "Gemma4Backbone": {**GROUPED, "head_dim": 16, "image_size": 16},
    "GptOssBackbone": {**GROUPED, **EXPERTS, "head_dim": 16},
    "LlamaBackbone": GROUPED,
    "Llama3Backbone": GROUPED,
    "MistralBackbone": {**GROUPED, "head_dim": 16},
    "MixtralBackbone": {**GROUPED, **EXPERTS},
    "OPTBackbone": POSITIONS,
    "Phi3Backbone": {**GROUPED, "max_sequence_length": 32},
    "QwenBackbone": GROUPED,
    "Qwen2Backbone": GROUPED,
    "QwenMoeBackbone": {
        **GROUPED,
        **EXPERTS,
        "moe_intermediate_dim": 32,
        "shared_expert_intermediate_dim": 32,
    },
    "Qwen3Backbone": {**GROUPED, "head_dim": 16},
    "Qwen3MoeBackbone": {
        **GROUPED,
        **EXPERTS,
        "head_dim": 16,
        "moe_intermediate_dim": 32,
    },
    # A linear-attention layer and a full-attention one, as its presets
    # mix them (its default puts a full one fourth).
    "Qwen3_5Backbone": {
        **GROUPED,
        "head_dim": 16,
        "layer_types": ["linear_attention", "full_attention"],
    },
    "RobertaBackbone": POSITIONS,
    "RoformerV2Backbone": {**HEADS, "head_size": 16},
    "SmolLM3Backbone": {
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "rope_layer_enabled_list": [True, True],
        "layer_types": ["attention", "attention"],
        "mlp_bias": False,
        "layer_norm_epsilon": 1e-6,
        "max_position_embeddings": 32,
        "rope_theta": 10000.0,
        "partial_rotary_factor": 1.0,
    },
    "T5Backbone": {**HEADS, "key_value_dim": 16},
    "WhisperBackbone": HEADS,
    "XLMRobertaBackbone": POSITIONS,
    "XLNetBackbone": HEADS,
}
# Backbones whose arguments are named otherwise (or that take no
# intermediate_dim): their whole config, SMALL's sizes under their names.
OWN_NAMES = {
    "EdRecBackbone": {
        "vocab_size": 64,
        "num_layers_enc": 2,
        "num_layers_dec": 2,
        "hidden_dim": 32,
        "intermediate_dim": 64,
        "num_heads": 2,
    },
    "ElectraBackbone": {
        "vocab_size": 64,
        "num_layers": 2,
        "num_heads": 2,
        "hidden_dim": 32,
        "embedding_dim": 32,
        "intermediate_dim": 64,
        "max_sequence_length": 32,
    },
    "MoonshineBackbone": {
        "vocabulary_size": 64,
        "filter_dim": 32,
        "encoder_num_layers": 2,
        "decoder_num_layers": 2,
        "hidden_dim": 32,
        "intermediate_dim": 64,
        "encoder_num_heads": 2,
        "decoder_num_heads": 2,
    },
    "Qwen3_5MoeBackbone": {
        "vocabulary_size": 64,
        "num_layers": 2,
        "hidden_dim": 32,
        **GROUPED,
        **EXPERTS,
        "head_dim": 16,
        "moe_intermediate_dim": 32,
        "shared_expert_intermediate_size": 32,
        "layer_types": ["linear_attention", "full_attention"],
    },
    "RWKV7Backbone": {
        "vocabulary_size": 64,
        "num_layers": 2,
        "hidden_size": 32,
        "head_size": 16,
        "intermediate_dim": 64,
    },
    "T5GemmaBackbone": {
        "vocabulary_size": 64,
        **{
            f"{part}_{key}": value
            for part in ("encoder", "decoder")
            for key, value in {
                "hidden_dim": 32,
                "intermediate_dim": 64,
                "num_layers": 2,
                "num_attention_heads": 2,
                "num_key_value_heads": 1,
                "head_dim": 16,
                "layer_types": ["full_attention"] * 2,
            }.items()
        },
    },
}
# Its text backbone (no vision encoder): T5Gemma's arguments.
OWN_NAMES["T5Gemma2Backbone"] = OWN_NAMES["T5GemmaBackbone"]
KINDS = {
    "position_embeddings_repeated": kmp.islands.broadcasts_once,
    "gelus_recomputed": kmp.islands.recomputes_gelu,
    "biases_added_flat": kmp.islands.flattens_bias,
    "decoders_told_causal": kmp.islands.attends_causally,
}


def census(name):
    """How many layers of each kind pinning changes in backbone `name`."""
    with kmp.policy_scope("mixed_bfloat16"):
        keras.utils.set_random_seed(0)
        config = OWN_NAMES.get(name) or {**SMALL, **BACKBONES[name]}
        backbone = getattr(keras_hub.models, name)(**config)
        kmp.pin_float32(backbone)
    layers = all_layers(backbone)
    counts = {kind: sum(map(test, layers)) for kind, test in KINDS.items()}
    keras.backend.clear_session()
    return counts


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--backbones",
        default=",".join(sorted({*BACKBONES, *OWN_NAMES})),
        help="comma-separated KerasHub backbone classes",
    )
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if keras.backend.backend() != "jax":
        parser.error("pin_float32 changes these layers on JAX only")
    names = [n for n in args.backbones.split(",") if n]
    known = {*BACKBONES, *OWN_NAMES}
    unknown = sorted(set(names) - known)
    if unknown:
        parser.error(f"--backbones takes {sorted(known)}; got {unknown}")
    records = []
    print(f"{'backbone':22} " + " ".join(f"{k:>28}" for k in KINDS))
    for name in names:
        counts = census(name)
        records.append({"backbone": name, **counts})
        print(f"{name:22} " + " ".join(f"{v:>28}" for v in counts.values()))
    common.write_result(
        {
            "benchmark": "keras_hub_islands",
            "keras_hub": keras_hub.__version__,
            "config": SMALL,
            "records": records,
        },
        "keras_hub_islands_jax.json",
        args.out,
    )


if __name__ == "__main__":
    main()
