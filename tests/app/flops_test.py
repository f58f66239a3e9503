"""FLOPs counted per layer (`kmp.app.flops`), by hand on small layers,
and per token for a causal language model (PaLM's count)."""

import math

import keras
import pytest

from kmp.app import flops

pytestmark = pytest.mark.backend_independent


def _model(inputs, outputs):
    return keras.Model(inputs, outputs)


def test_dense_and_conv_count_two_flops_per_multiply_add():
    inputs = keras.Input((8,))
    dense = _model(inputs, keras.layers.Dense(4)(inputs))
    assert flops.forward_flops(dense) == 2 * 8 * 4
    images = keras.Input((32, 32, 3))
    conv = keras.layers.Conv2D(8, 3, padding="same")(images)
    pooled = keras.layers.MaxPooling2D()(conv)  # not counted
    assert flops.forward_flops(_model(images, pooled)) == (
        2 * (3 * 3 * 3) * 8 * 32 * 32
    )
    assert flops.training_flops(_model(images, pooled)) == (
        3 * 2 * 27 * 8 * 1024
    )


def test_attention_counts_projections_and_both_products():
    tokens = keras.Input((5, 8))
    mixed = keras.layers.MultiHeadAttention(2, key_dim=4)(tokens, tokens)
    projections = 3 * (2 * 8 * 8 * 5) + 2 * 8 * 8 * 5
    products = 2 * (2 * 2 * 5 * 5 * 4)
    assert flops.forward_flops(_model(tokens, mixed)) == (
        projections + products
    )


def test_the_resnet9_matches_its_published_count():
    from kmp.examples import cifar10

    # 2.28 GFLOP per training image (../shared/gpu-results/2026-11-22).
    per_image = flops.training_flops(cifar10.build_model(64))
    assert per_image == pytest.approx(2.28e9, rel=0.01)


def test_peaks_are_known_for_listed_gpus_only():
    assert flops.peak_tflops("NVIDIA H100 80GB HBM3", "mixed_bfloat16", True)
    assert flops.peak_tflops("NVIDIA H100", "float32", True) == 494.0
    assert flops.peak_tflops("NVIDIA H100", "float32", False) == 67.0
    assert flops.peak_tflops("AMD EPYC", "mixed_float16", None) is None


def test_peaks_of_16_bit_policies_are_the_16_bit_peak():
    # bfloat16 master weights: Keras's "bfloat16" policy, 16-bit compute.
    assert flops.peak_tflops("NVIDIA H200", "bfloat16", False) == 989.0
    assert flops.peak_tflops("NVIDIA A100-SXM4-40GB", "float16", None) == 312.0


def test_a_causal_lm_token_is_counted_as_palm_counts_it():
    # 2 blocks of width 8, feed-forward 32, 16 tokens of vocabulary,
    # sequences of 4. Matmul parameters: per block 4 * 8 * 8 (query,
    # key, value, output) + 2 * 8 * 32 (feed-forward) = 768; two blocks
    # 1536, and the logits 16 * 8 = 128: N = 1664. 6 N = 9984; the
    # attention products 12 * 2 * 4 * 8 = 768.
    assert flops.causal_lm_flops_per_token(2, 8, 4, 16, 32) == 10752
    # GPT-2's feed-forward is 4 d wide unless told otherwise.
    assert flops.causal_lm_flops_per_token(2, 8, 4, 16) == 10752
    assert flops.causal_lm_flops_per_token(2, 8, 4, 16, 16) == (
        10752 - 6 * 2 * 2 * 8 * 16
    )
    # The attention term grows with the sequence, the rest does not.
    assert flops.causal_lm_flops_per_token(2, 8, 8, 16) == 10752 + 768


def _tiny_gpt2(dropout=0.1):
    keras_hub = pytest.importorskip("keras_hub")
    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=16,
        num_layers=2,
        num_heads=2,
        hidden_dim=8,
        intermediate_dim=32,
        max_sequence_length=4,
        dropout=dropout,
    )
    return keras_hub.models.GPT2CausalLM(backbone, preprocessor=None)


def test_kerashub_s_gpt2_is_counted_per_token_from_its_sizes():
    # The per-layer walk cannot open KerasHub's decoder blocks; a
    # GPT2CausalLM is counted per token instead, times its sequence.
    model = _tiny_gpt2()
    assert 3 * flops.forward_flops(model) == 0
    assert flops.training_flops(model) == 10752 * 4
    assert flops.training_flops(model, sequence_length=8) == (10752 + 768) * 8
    # N is the model's own matmul kernels, and the tied logits matmul.
    kernels = sum(
        math.prod(layer.kernel.shape)
        for layer in model._flatten_layers()
        if isinstance(layer, keras.layers.Dense | keras.layers.EinsumDense)
    )
    assert kernels + 16 * 8 == 1664


def test_utilization_is_model_flops_over_the_devices_peak(monkeypatch):
    from kmp import backend

    model = _tiny_gpt2()
    results = {"examples_per_s": 1e6, "policy": "mixed_bfloat16"}
    figures = flops.utilization(model, dict(results, replicas=1))
    assert figures["model_tflops"] == pytest.approx(10752 * 4 * 1e6 / 1e12)
    if backend.list_devices()[0].platform == "cpu":
        assert figures["mfu"] is None  # kmp knows no CPU's peak
    h100 = backend.Device("gpu", "NVIDIA H100 80GB HBM3", (9, 0))
    monkeypatch.setattr(backend, "list_devices", lambda: [h100])
    figures = flops.utilization(model, dict(results, replicas=2))
    assert figures["mfu"] == pytest.approx(10752 * 4 * 1e-6 / (2 * 989.0))
